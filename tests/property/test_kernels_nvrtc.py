"""The fused GPU kernel, checked without a GPU.

- **Compiles**: the exact translation unit ``cupy.RawKernel`` gets, with CuPy's options
  (ours plus the ``-ftz=true`` CuPy appends), compiled by NVRTC from the
  ``nvidia-cuda-nvrtc-cu12`` wheel for compute_80 and compute_90: for every shipped
  schema and a few hundred property-generated programs (every op, extreme constants,
  overflowing ``minmax`` spans, float32 and float64 outputs). Any error or warning
  fails, and so does any single-precision instruction in the PTX (``-ftz`` would flush
  its subnormals; the kernel must have none).
- **Runs like NumPy**: the same translation unit built by g++ (``tests/kernel_emulation.py``)
  over the property inputs equals the NumPy program bit for bit; ``fl_to_float32``
  equals NumPy's float32 rounding on edge cases, subnormals included.
- **Can fail**: a generator that writes ``(inf)`` (what ``c_double`` emitted for an
  overflowing span before) is refused by NVRTC.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kernel_emulation
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kernels_props import OUT_KINDS, _schema, steps, x_values, y_values

from features.kernels import cupy_backend
from features.kernels.columns import prepare_slots
from features.kernels.cupy_backend import KernelSource, generate_source
from features.kernels.numpy_backend import NumpyBackend, load_slot
from features.kernels.nvrtc import CUPY_APPENDS, compile_ptx, library_path
from features.kernels.ops import plan_program
from features.schema import load_schemas

ROOT = Path(__file__).resolve().parents[2]
ARCHS = ("compute_80", "compute_90")
#: a single-precision PTX instruction (``add.f32``, ``cvt.rn.ftz.f32.f64``, ...)
F32 = re.compile(r"^\s*[a-z]+(\.[a-z0-9]+)*\.f32\b", re.MULTILINE)


def _nvrtc() -> None:
    library_path()  # a missing wheel is a failure: it is in the dev extra and the lock


def check_compiles(source: KernelSource) -> None:
    code = source.translation_unit()
    for arch in ARCHS:
        out = compile_ptx(code, [*source.options, *CUPY_APPENDS, f"--gpu-architecture={arch}"],
                          name=f"{source.name}.cu")
        assert out.ok, f"NVRTC ({arch}) refused the kernel:\n{out.log}\n{code}"
        assert not out.log, f"NVRTC ({arch}) warned:\n{out.log}"
        f32 = F32.search(out.ptx)
        assert f32 is None, f"a single-precision instruction in the PTX ({arch}): {f32.group(0)!r}"
        assert f".entry {source.name}(" in out.ptx


def test_the_kernel_of_every_shipped_schema_compiles_with_nvrtc() -> None:
    _nvrtc()
    compiled = 0
    for _name, schema in sorted(load_schemas(ROOT / "schemas").items()):
        plan = plan_program(schema)
        if plan.kernel:
            check_compiles(generate_source(plan))
            compiled += 1
    assert compiled >= 2, "the shipped schemas with derived features"


@pytest.mark.slow  # the longest property test (~40 s): `make test`, not `make check`
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain=st.lists(steps(), min_size=1, max_size=6), dtype=st.sampled_from(OUT_KINDS),
       on_invalid=st.sampled_from(["null", "reject"]))
def test_property_generated_kernels_compile_with_nvrtc(chain: list[Any], dtype: str, on_invalid: str) -> None:
    _nvrtc()
    check_compiles(generate_source(plan_program(_schema(chain, dtype, on_invalid))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(chain=st.lists(steps(), min_size=1, max_size=6), dtype=st.sampled_from(OUT_KINDS),
       rows=st.lists(st.tuples(x_values, y_values), min_size=1, max_size=40))
def test_the_kernel_built_by_gxx_equals_the_numpy_program_bit_for_bit(
        chain: list[Any], dtype: str, rows: list[tuple[Any, Any]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    plan = plan_program(_schema(chain, dtype, "null"))
    source = generate_source(plan)
    lib = kernel_emulation.build(source, tmp_path_factory.getbasetemp())
    batch = pa.RecordBatch.from_pydict({"x": pa.array([r[0] for r in rows], pa.float64()),
                                        "y": pa.array([r[1] for r in rows], pa.int64())})
    n = batch.num_rows
    slots = prepare_slots(plan, batch, None)
    packed = np.empty((len(plan.slots), n))
    for s, sv in enumerate(slots):
        load_slot(packed[s], sv, 0, n)
    values, status = kernel_emulation.run(lib, packed, len(plan.kernel))
    ref = NumpyBackend(plan, chunk_rows=7).run(slots, n)
    assert np.array_equal(status, ref.status)
    for j in range(len(plan.kernel)):
        ok = ref.status[j] == 0
        want = ref.values[j][ok]
        got = values[j][ok].astype(want.dtype)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), f"feature {j}: {got} != {want}"


def test_to_float32_equals_numpy_on_edge_cases_and_subnormals(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    tiny = np.float64(np.finfo(np.float32).smallest_subnormal)
    edges = [0.0, -0.0, 1.0, -1.0, 1e-45, 1.4e-45, 7e-46, 7.006e-46, 2.1e-45, 1.17549435e-38, 1.1754942e-38,
             float(np.finfo(np.float32).max), 3.4028235e38, 3.40282357e38, 3.4028236e38, 1e308, -1e308,
             5e-324, float("inf"), float("-inf"), 2.0**-149, 2.0**-150, 2.0**-150 * 1.5, 3 * 2.0**-151,
             1 + 2.0**-24, 1 + 3 * 2.0**-24, 1 + 2.0**-24 + 2.0**-52]
    subnormal = tiny * rng.uniform(0, 2**23, 20_000)
    halves = (np.floor(rng.uniform(0, 2**23, 20_000)) + 0.5) * tiny  # exact ties among float32 subnormals
    anything = rng.integers(0, 2**63, 40_000, dtype=np.int64).view(np.float64)
    normal = rng.normal(0, 1, 20_000) * np.exp2(rng.integers(-130, 130, 20_000))
    x = np.concatenate([np.array(edges), subnormal, -subnormal, halves, anything, normal])
    x = x[~np.isnan(x)]
    lib = kernel_emulation.build(("", "fl_unused"), tmp_path, extra=cupy_backend._TO_FLOAT32 + """
extern "C" void fl_unused(const double*, long long, double*) {}
extern "C" void fl_many(const double* x, long long n, double* out) {
    for (long long i = 0; i < n; ++i) out[i] = fl_to_float32(x[i]);
}""")
    out = np.empty_like(x)
    import ctypes

    ptr = ctypes.POINTER(ctypes.c_double)
    lib.fl_many(x.ctypes.data_as(ptr), ctypes.c_longlong(len(x)), out.ctypes.data_as(ptr))
    with np.errstate(over="ignore"):
        want = x.astype(np.float32).astype(np.float64)
    bad = np.flatnonzero(out.view(np.uint64) != want.view(np.uint64))
    assert len(bad) == 0, [(x[i], out[i], want[i]) for i in bad[:5]]
    assert (np.abs(want[np.abs(x) < 1.1754942e-38]) > 0).any()  # subnormal results were compared


def test_a_generator_writing_inf_is_refused_by_nvrtc(monkeypatch: pytest.MonkeyPatch) -> None:
    _nvrtc()
    from features.schema.model import Step

    chain = [Step("minmax", (("lo", -1e308), ("hi", 1e308)))]  # the span overflows to inf
    plan = plan_program(_schema(chain, "float64", "null"))
    check_compiles(generate_source(plan))  # as generated: the bit pattern of inf
    monkeypatch.setattr(cupy_backend, "c_double", lambda v: f"({float(v)})")  # "(inf)": the old bug
    with pytest.raises(AssertionError, match=r"NVRTC \(compute_80\) refused"):
        check_compiles(generate_source(plan))


def test_strings_in_comments_cannot_end_them() -> None:
    assert "*/" not in cupy_backend.c_comment("fill_null 'a*/b' \n /* x")
    assert cupy_backend.c_comment("ok (x)") == "ok (x)"


def _cross_column_schema() -> Any:
    from features.schema.model import Constraints, Feature, Field, FieldType, Schema, Step, TypeKind

    def f(name: str, steps: list[Step], dtype: str = "float64") -> Feature:
        return Feature(name, "x", tuple(steps), FieldType(TypeKind(dtype)), frozenset({"hot"}))

    fields = (Field("x", FieldType(TypeKind.FLOAT64), Constraints()),
              Field("y", FieldType(TypeKind.INT64), Constraints()))
    return Schema("cross", (1, 0, 0), fields, features=(
        f("d", [Step("difference", (("other", "y"),))]),
        f("d0", [Step("difference", (("other", "y"), ("on_null", -1.5)))]),
        f("p", [Step("product", (("other", "y"),))], "float32"),
        f("p0", [Step("product", (("other", "y"), ("on_null", 0)))], "int32"),
        f("chain", [Step("fill_null", (("value", 2.0),)), Step("product", (("other", "y"),)),
                    Step("difference", (("other", "y"), ("on_null", 7)))]),
    ))


def test_difference_and_product_compile_with_nvrtc_and_the_gxx_kernel_equals_numpy(tmp_path: Path) -> None:
    """The ops across columns, fixed cases: null on either side (with and without
    ``on_null``), overflow to inf (invalid), float32 and int32 outputs."""
    _nvrtc()
    plan = plan_program(_cross_column_schema())
    source = generate_source(plan)
    check_compiles(source)
    xs = [1.5, None, 1e308, -1e308, 3.0, None, 0.0, 2.0**60]
    ys = [2, 3, -(2**62), 2**62, None, None, 0, 2**62]
    batch = pa.RecordBatch.from_pydict({"x": pa.array(xs, pa.float64()), "y": pa.array(ys, pa.int64())})
    slots = prepare_slots(plan, batch, None)
    packed = np.empty((len(plan.slots), batch.num_rows))
    for s, sv in enumerate(slots):
        load_slot(packed[s], sv, 0, batch.num_rows)
    values, status = kernel_emulation.run(kernel_emulation.build(source, tmp_path), packed, len(plan.kernel))
    ref = NumpyBackend(plan, chunk_rows=3).run(slots, batch.num_rows)
    assert np.array_equal(status, ref.status)
    for j in range(len(plan.kernel)):
        ok = ref.status[j] == 0
        want = ref.values[j][ok]
        assert np.array_equal(values[j][ok].astype(want.dtype).view(np.uint8), want.view(np.uint8))
    d, d0 = ref.values[0], ref.values[1]
    assert d[0] == -0.5 and ref.status[0][1] == 1 and ref.status[0][4] == 1  # null on either side: null
    assert d0[1] == -1.5 and d0[4] == -1.5 and d0[5] == -1.5                 # ... or on_null
    assert ref.status[2][2] >= 2 and ref.status[2][3] >= 2                     # 1e308 * -2**62: invalid


def test_the_kernels_of_the_shipped_views_compile_with_nvrtc() -> None:
    from features.compile import compile_schema
    from features.views import compile_view, load_views

    _nvrtc()
    schemas = load_schemas(ROOT / "schemas")
    compiled = {name: compile_schema(s) for name, s in schemas.items()}
    count = 0
    for view in load_views(ROOT / "views", schemas).values():
        for level in compile_view(view, compiled, device="cpu").levels:
            check_compiles(generate_source(plan_program(level)))
            count += 1
    assert count >= 1
