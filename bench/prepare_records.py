"""Benchmark: ``features.pipeline.prepare.prepare_records`` alone (no stores, no Kafka).

Usage::

    .venv/bin/python bench/prepare_records.py [--events 20000] [--repeat 5]

Records are ``features.ops.examples.applicant_events`` (JSON for
``schemas/credit_applicant.yaml``, ~2% breaking a rule, some undecodable payloads),
prepared in chunks as the stream and HTTP ingest prepare them, on three paths: the
per-record path (``decoder=None``: ``json.loads`` per record, then one batch) in chunks of
1,000 and of 100 records (HTTP ingest's small requests), and the stream's default
(``ColumnarDecoder``, chunks of 5,000). Prints per path the median and min µs per record
over ``--repeat`` runs, the rows and rejects, and a digest of the rejects (row index,
raw, errors) and their structured entries, so two versions can be compared for identical
output as well as speed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from features.lineage import RunContext
from features.ops.examples import applicant_events, applicant_schema
from features.pipeline.prepare import PreparedRecords, prepare_records
from features.sources.columnar import ColumnarDecoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=20_000, help="records (default 20000)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per path (default 5)")
    args = ap.parse_args()
    compiled = applicant_schema()
    n = args.events
    values = applicant_events(n)
    now = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "bench", now)
    uris = pa.array([f"kafka://t/0/{i}" for i in range(n)])
    offsets = np.arange(n, dtype=np.int64)
    columnar = ColumnarDecoder(compiled.schema, max_bytes=compiled.schema.payload.max_bytes)

    def run(decoder: ColumnarDecoder | None, chunk: int) -> list[PreparedRecords]:
        return [prepare_records(values[s:s + chunk], uris.slice(s, min(chunk, n - s)), offsets[s:s + chunk],
                                compiled, None, ctx, now, decoder=decoder) for s in range(0, n, chunk)]

    for name, decoder, chunk in [("per-record, chunks of 1000", None, 1000),
                                 ("per-record, chunks of 100", None, 100),
                                 ("default (columnar), chunks of 5000", columnar, 5000)]:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            out = run(decoder, chunk)
            times.append(time.perf_counter() - start)
        digest = hashlib.sha256()
        for part in out:
            rejects = part.prepared.rejects.select(["row_index", "raw", "errors"])
            digest.update(json.dumps(rejects.to_pylist()).encode())
            digest.update(json.dumps(part.entries.select(["group", "row", "field", "rule", "reason",
                                                          "message"]).to_pylist()).encode())
        rows = sum(p.prepared.rows.num_rows for p in out)
        rejected = sum(p.prepared.rejects.num_rows for p in out)
        print(f"{name}: median {statistics.median(times) * 1e6 / n:.2f} µs/record "
              f"(min {min(times) * 1e6 / n:.2f}), rows {rows}, rejects {rejected}, "
              f"digest {digest.hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    main()
