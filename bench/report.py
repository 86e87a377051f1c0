"""Benchmark: ``features report`` on the 1M-row example against plain GX on the same data.

Usage::

    .venv/bin/python bench/report.py [--rows 1000000]

On ``--rows`` applicant rows (the batch-load benchmark's cached file, ~2% invalid) it
times, each in a fresh child process (so peak RSS is that step's own):

1. **features report**: ``features report --schema credit_applicant --parquet FILE``
   (validator + GX suite batch by batch, field statistics, rejects examples, the HTML
   page and the JSON);
2. **GX alone**: the same generated suite (``features.compile.expectations``) run once by
   Great Expectations (ephemeral context, pandas) over the whole file read into one
   DataFrame: no validator, no statistics, no page; what "plain GX on the same data" costs.

It prints seconds, rows/s and peak RSS for both, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_GX_ALONE = """
import sys, time, json
import pyarrow.parquet as pq
sys.path.insert(0, {root!r})
from features.ops.examples import applicant_schema
from features.compile.expectations import run_suite_detailed
t0 = time.perf_counter()
table = pq.read_table({path!r})
run = run_suite_detailed(applicant_schema(), table)
print(json.dumps({{"seconds": time.perf_counter() - t0,
                  "failed": sum(1 for v in run.counts.values() if v)}}))
"""


def _child(cmd: list[str]) -> tuple[float, int, str]:
    """(seconds, this child's own peak RSS in bytes, its stdout)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}):\n{err.read()[-3000:]}")
        return seconds, usage.ru_maxrss * 1024, out.read()


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT / "bench"))
    from batch_load import dataset

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    args = ap.parse_args(argv)
    path = dataset(args.rows)
    print(f"{args.rows:,} applicant rows, {path.stat().st_size / 1e6:.0f} MB Parquet ({path.name})")
    with tempfile.TemporaryDirectory() as out:
        script = _GX_ALONE.format(root=str(ROOT), path=str(path))
        gx_s, gx_rss, gx_out = _child([sys.executable, "-c", script])
        gx_inner = json.loads(gx_out.strip().splitlines()[-1])
        ours_s, ours_rss, _ = _child([str(ROOT / ".venv" / "bin" / "features"), "report", "--schema",
                                      "credit_applicant", "--parquet", str(path), "--out", out,
                                      "--no-progress"])
        numbers = json.loads((Path(out) / "report.json").read_text())
    n = args.rows
    print(f"{'step':<44}{'seconds':>9}{'rows/s':>12}{'peak RSS MB':>13}")
    print(f"{'GX alone (whole file in one DataFrame)':<44}{gx_s:>9.1f}{n / gx_s:>12,.0f}"
          f"{gx_rss / 2**20:>13,.0f}   (GX itself {gx_inner['seconds']:.1f}s)")
    print(f"{'features report (validator + GX, batches)':<44}{ours_s:>9.1f}{n / ours_s:>12,.0f}"
          f"{ours_rss / 2**20:>13,.0f}")
    print(f"features report / GX alone = {ours_s / gx_s:.2f}; verdict {numbers['verdict']}, "
          f"{numbers['counts']['rejected_rows']:,} rows rejected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
