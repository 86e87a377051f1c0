"""Benchmark: the fused transform program against a naive op-by-op chain.

Usage::

    .venv/bin/python bench/kernels.py [--rows 1000000,10000000] [--repeat 3] [--gpu] [--chunk 32768]

Runs the derived features of ``schemas/credit_applicant.yaml`` (income_log,
debt_to_income, score_bucket, employment_status_hash, customer_tenure_days; an
identical Feature list built in code when the YAML parser cannot be imported) over
generated batches, and measures in one run:

- ``numpy fused``: the NumPy program (``NumpyBackend.run``): chunks of ``--chunk`` rows,
  every step in place, in cache;
- ``numpy naive``: the same semantics written op by op, each op a full-array pass
  with temporaries and its own mask handling (what one writes without fusing);
- ``end to end``: ``TransformProgram.run(batch)`` (host preparation: decimal ->
  float64, hashing, time differences; kernel; Arrow assembly);
- with ``--gpu``: ``cupy fused`` (the generated kernel) and ``cupy unfused`` (the naive
  chain on CuPy arrays), each with and without the host<->device transfers.

The kernel timings start from the same prepared inputs (``prepare_slots``) and end
with typed outputs plus row status; every variant's outputs are checked equal to the
fused NumPy program's before timing. Times are the best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:
    import yaml  # noqa: F401
except ImportError:  # features/schema/__init__.py imports the YAML parser; the model needs none
    _pkg = types.ModuleType("features.schema")
    _pkg.__path__ = [str(ROOT / "features" / "schema")]
    sys.modules.setdefault("features.schema", _pkg)

from features.kernels import compile_transforms  # noqa: E402 - after the sys.path/yaml setup
from features.kernels.columns import SlotValues, prepare_slots  # noqa: E402
from features.kernels.numpy_backend import (  # noqa: E402
    DEFAULT_CHUNK_ROWS,
    NUMPY_DTYPES,
    KernelOutput,
    NumpyBackend,
    log1p,
)
from features.kernels.ops import (  # noqa: E402
    INT_BOUNDS,
    INVALID_BASE,
    NULL,
    OK,
    Bucketize,
    Cast,
    Clip,
    FillNull,
    Log1p,
    MinMax,
    ProgramPlan,
    Ratio,
    TimeSince,
    ZScore,
    plan_program,
)
from features.schema.model import (  # noqa: E402
    Constraints,
    Feature,
    Field,
    FieldType,
    Schema,
    Step,
    TypeKind,
)

SEED = 20240611


def applicant_schema() -> Schema:
    """credit_applicant.yaml, or the same fields and features built in code."""
    try:
        from features.schema.parse import load_schema

        return load_schema(ROOT / "schemas" / "credit_applicant.yaml")
    except ImportError:
        pass

    def f(name: str, kind: str, **kw: Any) -> Field:
        values = kw.pop("values", ())
        return Field(name, FieldType(TypeKind(kind), **kw), Constraints(), values=values)

    def feat(name: str, source: str, steps: list[Step], dtype: str, on_invalid: str = "null") -> Feature:
        return Feature(name, source, tuple(steps), FieldType(TypeKind(dtype)), frozenset({"hot"}),
                       on_invalid)  # type: ignore[arg-type]

    fields = (
        f("application_id", "string"), f("submitted_at", "timestamp", unit="us", tz="UTC"),
        f("income_monthly", "decimal", precision=18, scale=2), f("employment_duration_months", "int32"),
        f("employment_status", "enum",
          values=("employed", "self_employed", "unemployed", "retired", "student")),
        f("age", "int16"), f("existing_debt", "decimal", precision=18, scale=2), f("credit_score", "int32"),
        f("requested_amount", "decimal", precision=18, scale=2), f("region", "string"),
        f("customer_since", "date"),
    )
    features = (
        feat("income_log", "income_monthly", [Step("fill_null", (("value", 0),)), Step("log1p")], "float64"),
        feat("debt_to_income", "existing_debt",
             [Step("fill_null", (("value", 0),)),
              Step("ratio", (("denominator", "income_monthly"), ("on_zero", 0))),
              Step("clip", (("lo", 0), ("hi", 100)))], "float64", "reject"),
        feat("score_bucket", "credit_score", [Step("bucketize", (("boundaries", (580, 670, 740, 800)),))],
             "int32"),
        feat("employment_status_hash", "employment_status", [Step("hash_bucket", (("n", 64),))], "int32"),
        feat("customer_tenure_days", "customer_since", [Step("time_since", (("unit", "days"),))], "float64"),
    )
    return Schema("credit_applicant", (3, 2, 1), fields, entity="application_id", event_time="submitted_at",
                  features=features)


def generate(rows: int, seed: int = SEED) -> pa.RecordBatch:
    """The columns the applicant features read, in their declared Arrow types (valid rows)."""
    rng = np.random.default_rng(seed)
    n = rows

    def decimal(cents: npt.NDArray[np.int64], null_share: float) -> pa.Array:
        words = np.stack([cents, cents >> 63], axis=1).astype(np.int64)
        valid = np.packbits(rng.random(n) >= null_share, bitorder="little")
        return pa.Array.from_buffers(pa.decimal128(18, 2), n, [pa.py_buffer(valid.tobytes()),
                                                               pa.py_buffer(words.tobytes())])

    income = np.exp(rng.normal(8.0, 0.7, n)).astype(np.int64) * 100 + rng.integers(0, 100, n)
    debt = (np.exp(rng.normal(8.5, 1.5, n)) * 100).astype(np.int64)
    statuses = pa.array(["employed", "self_employed", "unemployed", "retired", "student"])
    status = pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, 5, n).astype(np.int32)), statuses)
    start = np.datetime64("2023-01-01T00:00:00", "us").astype(np.int64)
    submitted = start + rng.integers(0, 365 * 86_400 * 10**6, n)
    return pa.RecordBatch.from_pydict({
        "submitted_at": pa.array(submitted, pa.timestamp("us", "UTC")),
        "income_monthly": decimal(income, 0.0),
        "existing_debt": decimal(debt, 0.3),
        "credit_score": pa.array(rng.integers(300, 851, n).astype(np.int32), mask=rng.random(n) < 0.1),
        "employment_status": status.cast(pa.string()),
        "customer_since": pa.array(rng.integers(10_000, 19_300, n).astype(np.int32), pa.date32(),
                                   mask=rng.random(n) < 0.2),
    })


# --- the naive chain: one full-array pass per op, temporaries and masks per op ----------------------


def naive_inputs(slots: Sequence[SlotValues], xp: Any) -> list[Any]:
    """Each slot as a float64 array with NaN for null (full-array conversion)."""
    out = []
    for s in slots:
        x = s.values.astype(np.float64)
        if s.null is not None:
            x[s.null] = np.nan
        out.append(xp.asarray(x))
    return out


def naive_chain(plan: ProgramPlan, inputs: Sequence[Any], xp: Any) -> tuple[list[Any], Any]:
    """The plan's kernel features, op by op over whole arrays; returns (values, status)."""
    values, status = [], []
    for fidx in plan.kernel:
        fp = plan.features[fidx]
        assert fp.slot is not None
        x = inputs[fp.slot]
        st = xp.isnan(x).astype(xp.int8)
        for op in fp.ops:
            bad_code = INVALID_BASE + op.step
            if isinstance(op, FillNull):
                null = st == NULL
                x = xp.where(null, op.value, x)
                st = xp.where(null, OK, st).astype(xp.int8)
            elif isinstance(op, Clip):
                if op.lo is not None:
                    x = xp.where(x < op.lo, op.lo, x)
                if op.hi is not None:
                    x = xp.where(x > op.hi, op.hi, x)
            elif isinstance(op, Log1p):
                st = xp.where((x <= -1.0) & (st == OK), bad_code, st).astype(xp.int8)
                x = log1p(x, xp)
            elif isinstance(op, ZScore | MinMax):
                shift, scale = (op.mean, op.std) if isinstance(op, ZScore) else (op.lo, op.span)
                x = (x - shift) / scale
                st = xp.where(~xp.isfinite(x) & (st == OK), bad_code, st).astype(xp.int8)
            elif isinstance(op, Bucketize):
                x = xp.searchsorted(xp.asarray(op.boundaries), x, side="right").astype(xp.float64)
            elif isinstance(op, Ratio):
                d = inputs[op.slot]
                st = xp.where(xp.isnan(d) & (st == OK), NULL, st).astype(xp.int8)
                zero = d == 0.0
                if op.on_zero is None:
                    st = xp.where(zero & (st == OK), NULL, st).astype(xp.int8)
                    x = x / d
                else:
                    x = xp.where(zero, op.on_zero, x / d)
                st = xp.where(~xp.isfinite(x) & (st == OK), bad_code, st).astype(xp.int8)
            elif isinstance(op, TimeSince):
                x = x / op.divisor
            elif isinstance(op, Cast):
                if op.kind in INT_BOUNDS:
                    lo, hi = INT_BOUNDS[op.kind]
                    x = xp.rint(x) + 0.0
                    st = xp.where(~((x >= lo) & (x < hi)) & (st == OK), bad_code, st).astype(xp.int8)
                elif op.kind is TypeKind.FLOAT32:
                    x = x.astype(xp.float32).astype(xp.float64)
                    st = xp.where(~xp.isfinite(x) & (st == OK), bad_code, st).astype(xp.int8)
                elif op.kind is TypeKind.BOOL:
                    x = (x != 0.0).astype(xp.float64)
        values.append(x.astype(NUMPY_DTYPES[fp.dtype.kind]))
        status.append(st)
    return values, xp.stack(status) if status else xp.zeros((0, 0), dtype=xp.int8)


#: labels whose outputs differed from the fused NumPy program's (main exits 1 when any did)
MISMATCHES: list[str] = []


def check_equal(plan: ProgramPlan, ref: KernelOutput, values: Sequence[Any], status: Any, label: str) -> None:
    """Print whether ``label``'s outputs equal the fused NumPy program's, bit for bit."""
    differ = [] if np.array_equal(ref.status, status) else ["status"]
    for j, fidx in enumerate(plan.kernel):
        ok = ref.status[j] == OK
        a, b = ref.values[j][ok], np.asarray(values[j])[ok]
        if a.shape != b.shape or not np.array_equal(a.view(np.uint8), b.view(np.uint8)):
            differ.append(plan.features[fidx].name)
    verdict = "identical" if not differ else f"DIFFERENT in {', '.join(differ)}"
    if differ:
        MISMATCHES.append(label)
    print(f"  check: {label} outputs vs numpy fused: {verdict}", flush=True)


def best_of(repeat: int, fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def report(label: str, rows: int, seconds: float, baseline: float | None = None) -> None:
    ratio = f"  {baseline / seconds:5.2f}x vs numpy naive" if baseline else ""
    print(f"  {label:<34} {seconds * 1e3:9.1f} ms  {rows / seconds / 1e6:8.2f} M rows/s{ratio}", flush=True)


def bench_rows(schema: Schema, rows: int, repeat: int, chunk: int, gpu: bool) -> None:
    batch = generate(rows)
    plan = plan_program(schema)
    program = compile_transforms(schema, device="cpu", chunk_rows=chunk)
    slots = prepare_slots(plan, batch, None)
    fused = NumpyBackend(plan, chunk_rows=chunk)
    ref = fused.run(slots, rows)
    print(f"{rows:,} rows, {len(plan.kernel)} kernel features ({', '.join(f.name for f in plan.features)})")
    with np.errstate(all="ignore"):
        naive_values, naive_status = naive_chain(plan, naive_inputs(slots, np), np)
    check_equal(plan, ref, naive_values, naive_status, "numpy naive")

    def run_naive() -> None:
        with np.errstate(all="ignore"):
            naive_chain(plan, naive_inputs(slots, np), np)

    t_naive = best_of(repeat, run_naive)
    t_fused = best_of(repeat, lambda: fused.run(slots, rows))
    report("numpy naive (op by op)", rows, t_naive)
    report(f"numpy fused (chunks of {chunk})", rows, t_fused, t_naive)
    report("host prepare (prepare_slots)", rows, best_of(repeat, lambda: prepare_slots(plan, batch, None)))
    report("end to end, cpu (program.run)", rows, best_of(repeat, lambda: program.run(batch)))
    if gpu:
        bench_gpu(schema, plan, batch, slots, ref, rows, repeat, t_naive)


def bench_gpu(schema: Schema, plan: ProgramPlan, batch: pa.RecordBatch, slots: Sequence[SlotValues],
              ref: KernelOutput, rows: int, repeat: int, t_naive: float) -> None:
    import cupy as cp

    program = compile_transforms(schema, device="gpu")
    backend: Any = program.backend
    out = backend.run(slots, rows)  # compiles the kernel, sizes the buffers
    check_equal(plan, ref, out.values, out.status, "cupy fused")
    sync = cp.cuda.Device().synchronize

    def fused_kernel_only() -> None:
        backend.launch(rows)
        sync()

    dev_inputs = naive_inputs(slots, cp)
    values, status = naive_chain(plan, dev_inputs, cp)
    check_equal(plan, ref, [cp.asnumpy(v) for v in values], cp.asnumpy(status), "cupy unfused")

    def unfused_compute_only() -> None:
        naive_chain(plan, dev_inputs, cp)
        sync()

    def unfused_with_transfers() -> None:
        vals, st = naive_chain(plan, naive_inputs(slots, cp), cp)
        [cp.asnumpy(v) for v in vals]
        cp.asnumpy(st)

    report("cupy fused, kernel only", rows, best_of(repeat, fused_kernel_only), t_naive)
    report("cupy fused, with transfers", rows, best_of(repeat, lambda: backend.run(slots, rows)), t_naive)
    report("cupy unfused, compute only", rows, best_of(repeat, unfused_compute_only), t_naive)
    report("cupy unfused, with transfers", rows, best_of(repeat, unfused_with_transfers), t_naive)
    report("end to end, gpu (program.run)", rows, best_of(repeat, lambda: program.run(batch)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1000000,10000000", help="comma-separated batch sizes")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (best is kept)")
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK_ROWS,
                        help="rows per chunk of the NumPy program")
    parser.add_argument("--gpu", action="store_true", help="also time the CuPy kernels (needs a GPU)")
    args = parser.parse_args(argv)
    schema = applicant_schema()
    print(f"numpy {np.__version__}, pyarrow {pa.__version__}, python {sys.version.split()[0]}")
    for rows in (int(r) for r in args.rows.split(",")):
        bench_rows(schema, rows, args.repeat, args.chunk, args.gpu)
    if MISMATCHES:
        print(f"MISMATCH: outputs differ from the fused NumPy program in: {', '.join(MISMATCHES)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
