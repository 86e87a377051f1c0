"""Benchmark: the compiled validator against Parquet reading and Great Expectations.

Usage::

    .venv/bin/python bench/validate.py [--rows 1000000] [--repeat 7] [--no-gx] [--profile]

Generates (once, seeded, cached under ``.cache/bench/``) a Parquet file of applicant
rows matching ``schemas/credit_applicant.yaml`` in its declared Arrow types, with
about 2% invalid rows spread over the columns and rules, then measures in one run:

1. ``pq.read_table`` alone;
2. ``validate(batch, compiled)`` in memory on the file as one record batch (all rules,
   rejects built), and on the table as read (8 chunks);
3. read + validate: ``validate(pq.read_table(path))`` (and, for comparison, one
   ``validate`` call per record batch of the table);
4. the generated GX suite (``features.compile.expectations.run_suite``) on the same
   table, including its conversion to pandas (GX needs a DataFrame).

Prints rows/s for each and the ratios; ``--profile`` adds the CPU time per field and
per rule and a cProfile of one validation. Timings are the best of ``--repeat`` rounds,
in which the measurements take turns (so a change of machine load hits all alike);
GX runs once. CPU is the process time of all threads.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "credit_applicant.yaml"
CACHE = ROOT / ".cache" / "bench"
SEED = 20240611
INVALID_SHARE = 0.02


def compiled_schema() -> Any:
    from features.compile import compile_schema
    from features.schema.parse import load_schema

    return compile_schema(load_schema(SCHEMA))


def generate(rows: int, seed: int = SEED) -> pa.Table:
    """Applicant rows in the declared types; ~2% of rows carry one or two faults
    (the generator the demo and the other benchmarks share)."""
    from features.ops.examples import applicants

    return applicants(rows, seed, invalid_share=INVALID_SHARE, compiled=compiled_schema())


def dataset(rows: int) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"credit_applicant_{rows}_{SEED}.parquet"
    if not path.exists():
        table = generate(rows)
        tmp = path.with_suffix(".tmp")
        pq.write_table(table, tmp)
        tmp.rename(path)
    return path


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times = []
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def interleaved(fns: dict[str, Callable[[], Any]], repeat: int) -> tuple[dict[str, float], dict[str, float]]:
    """Best wall time and best process CPU time (all threads) of each function, the
    functions taking turns in every round so a change of machine load hits all alike."""
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for key, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[key].append(time.perf_counter() - t0)
            cpu[key].append(time.process_time() - c0)
    return {k: min(v) for k, v in wall.items()}, {k: min(v) for k, v in cpu.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-gx", action="store_true", help="skip the Great Expectations run")
    parser.add_argument("--profile", action="store_true", help="time per field and a cProfile")
    args = parser.parse_args(argv)

    from features.validation import validate

    compiled = compiled_schema()
    t0 = time.perf_counter()
    path = dataset(args.rows)
    print(f"data: {path.relative_to(ROOT)} ({path.stat().st_size / 2**20:.1f} MiB, "
          f"ready in {time.perf_counter() - t0:.1f} s)")
    table = pq.read_table(path)
    batch = table.combine_chunks().to_batches()[0]
    n = table.num_rows
    validate(batch, compiled)  # warm-up: plan compiled, regexes built
    load = os.getloadavg()

    def read_validate_batches() -> list[Any]:
        # a streaming loader's way: one validate call per record batch of the table
        return [validate(b, compiled) for b in pq.read_table(path).to_batches()]

    wall, cpu = interleaved(
        {
            "read": lambda: pq.read_table(path),
            "validate": lambda: validate(batch, compiled),
            "table": lambda: validate(table, compiled),
            "both": lambda: validate(pq.read_table(path), compiled),
            "batches": read_validate_batches,
        },
        args.repeat,
    )
    t_read, t_val, t_table, t_both = wall["read"], wall["validate"], wall["table"], wall["both"]
    result = validate(batch, compiled)
    counts = result.counts
    print(f"rows: {n:,}  valid: {counts.valid_rows:,}  rejected: {counts.rejected_rows:,} "
          f"({counts.rejected_rows / n:.2%})  reject rows: {result.rejects.num_rows:,}")

    print(f"load average before the timings: {' '.join(f'{x:.2f}' for x in load)}")
    print(f"  {'':<30} {'wall (best)':>12} {'rows/s':>12} {'CPU (best)':>11}")

    def line(label: str, seconds: float, cpu_seconds: float | None = None) -> None:
        cpu_text = f"{cpu_seconds * 1000:8.1f} ms" if cpu_seconds is not None else ""
        print(f"  {label:<30} {seconds * 1000:9.1f} ms {n / seconds / 1e6:8.2f} M/s  {cpu_text}")

    line("parquet read (pq.read_table)", t_read, cpu["read"])
    line("validate (1 batch in memory)", t_val, cpu["validate"])
    line(f"validate ({table.column(0).num_chunks}-chunk table)", t_table, cpu["table"])
    line("read + validate (the table)", t_both, cpu["both"])
    line(f"read + validate {table.column(0).num_chunks} batches", wall["batches"], cpu["batches"])
    t_gx = None
    if not args.no_gx:
        try:
            from features.compile.expectations import run_suite
        except ImportError as exc:  # pragma: no cover - depends on the tree
            print(f"  GX skipped: {exc}")
        else:
            t0 = time.perf_counter()
            gx_counts = run_suite(compiled, table)
            t_gx = time.perf_counter() - t0
            line("great expectations suite", t_gx)
            differ = {
                rule: (count, counts.by_rule.get(rule, 0))
                for rule, count in gx_counts.items() if count != counts.by_rule.get(rule, 0)
            }
            print(f"  GX vs validator per-rule counts: {'equal' if not differ else differ}")
    print("ratios:")
    print(f"  read + validate / read alone   {t_both / t_read:6.2f}x  (target <= 2)")
    if t_gx is not None:
        print(f"  validator speed-up over GX     {t_gx / t_val:6.1f}x  (target >= 20)")
    print(f"  validator rows/s               {n / t_val / 1e6:6.2f} M  (target >= 5 M)")

    if args.profile:
        _profile(batch, compiled)
    return 0


def _profile(table: pa.RecordBatch, compiled: Any) -> None:
    from features.validation import validator as v
    from features.validation.masks import filter_rows

    plan = v._plan(compiled)
    source = v._Input(table)
    def cpu_ms(fn: Callable[[], Any]) -> float:
        times = []
        for _ in range(5):
            t0 = time.thread_time()
            fn()
            times.append(time.thread_time() - t0)
        return min(times) * 1000

    print("CPU time per field (conversion, rules, messages) and per rule (its mask), one thread:")
    for fp in plan.fields:
        values, _ = v._validate_field(fp, source, table.num_rows)
        field_ms = cpu_ms(partial(v._validate_field, fp, source, table.num_rows))
        print(f"  {fp.field.name:<36} {field_ms:7.1f} ms")
        for check in fp.checks:
            print(f"    {check.rule.id:<34} {cpu_ms(partial(check.evaluate, values)):7.1f} ms")
    keep = np.random.default_rng(0).random(table.num_rows) > INVALID_SHARE
    keep_arrow = pa.array(keep)
    filtered = cpu_ms(lambda: [filter_rows(c, keep, keep_arrow) for c in table.columns])
    print(f"  {'filter valid rows (all columns)':<36} {filtered:7.1f} ms")
    sequential = v.PARALLEL_MIN_ROWS
    v.PARALLEL_MIN_ROWS = table.num_rows + 1  # on this thread, so cProfile sees the work
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3):
        v.validate(table, compiled)
    prof.disable()
    v.PARALLEL_MIN_ROWS = sequential
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    sys.exit(main())
