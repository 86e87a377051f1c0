"""Benchmark: what the quality gates cost a batch load (issue 34).

Usage::

    .venv/bin/python bench/gates.py [--rows 1000000] [--batch-rows 131072] [--repeat 3]

On ``--rows`` applicant rows (``bench/batch_load.py``'s file: deterministic, ~2% invalid,
``schemas/credit_applicant.yaml``), against the local services:

1. **gate check alone**: ``features.load.gates.check_gates(..., dry_run=True)`` (what
   ``features load --check-gates`` runs): read the Parquet file and validate every row,
   judge the gates; rows/s of that pass;
2. **load without gates**: ``features.load.load`` of the example schema;
3. **load with gates**: the same schema plus a ``quality:`` section that passes
   (``max_reject_rate``, two ``max_rule_rate`` gates, ``min_rows``), so the load checks
   the whole input first and then loads it.

The steps run ``--repeat`` times, interleaved; it prints each round, the medians, and
the ratio of the medians of 3 to 2 (issue 34's target: <= 1.1).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batch_load import dataset, ours  # noqa: E402

from features.compile import compile_schema  # noqa: E402
from features.config import resolve_settings  # noqa: E402
from features.lineage import new_run_id  # noqa: E402
from features.load.gates import check_gates  # noqa: E402
from features.ops.examples import EXAMPLE_SCHEMAS, applicant_schema  # noqa: E402
from features.schema import parse_schema  # noqa: E402

QUALITY = """
quality:
  max_reject_rate: 0.5
  max_rule_rate:
    income_monthly.max: 0.5
    age.min: 0.5
  min_rows: 1
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch-rows", type=int, default=131_072)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    base = resolve_settings(root=ROOT)
    settings = dataclasses.replace(base, redis_url=base.redis_url.rsplit("/", 1)[0] + "/12")
    plain = applicant_schema()
    gated = compile_schema(parse_schema((EXAMPLE_SCHEMAS / "credit_applicant.yaml").read_text() + QUALITY))
    assert gated.fingerprint == plain.fingerprint and len(gated.gates) == 4
    path = dataset(args.rows)
    n = args.rows
    print(f"{n:,} applicant rows, {path.stat().st_size / 1e6:.0f} MB Parquet ({path.name}); "
          f"{args.repeat} rounds", flush=True)
    runs: list[tuple[float, float, float]] = []
    for r in range(args.repeat):
        t0 = time.perf_counter()
        verdict = check_gates([path], gated, settings, run_id=new_run_id(), batch_rows=args.batch_rows,
                              dry_run=True)
        check_s = time.perf_counter() - t0
        assert verdict.counts.read == n and not verdict.failed
        plain_s, s1 = ours(path, plain, settings, args.batch_rows)
        gated_s, s2 = ours(path, gated, settings, args.batch_rows)
        assert s2.gates is not None and (s1.stored, s1.rejected) == (s2.stored, s2.rejected)
        runs.append((check_s, plain_s, gated_s))
        print(f"round {r + 1}: gate check {check_s:.2f}s ({n / check_s:,.0f} rows/s), load {plain_s:.2f}s, "
              f"load with gates {gated_s:.2f}s: {gated_s / plain_s:.3f}x", flush=True)
    med = [statistics.median(run[i] for run in runs) for i in range(3)]
    for name, seconds in zip(("gate check alone (read + validate)", "load without gates", "load with gates"),
                             med, strict=True):
        print(f"{name:<38}{seconds:>9.2f}s{n / seconds:>14,.0f} rows/s")
    print(f"load with gates / without = {med[2] / med[1]:.3f} (medians; target <= 1.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
