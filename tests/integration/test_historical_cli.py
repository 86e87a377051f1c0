"""``features historical`` end to end against the real Postgres: a subprocess reads a
frame file in chunks and writes the training set, equal to ``fs.historical`` in-process;
a bad request exits 2 and writes nothing."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import cli_environment

from features.compile import compile_schema
from features.config import Settings
from features.lineage import RunContext
from features.schema.parse import parse_schema
from features.sdk.store import FeatureStore
from features.sinks.base import REJECTED_ROWS_SCHEMA, WriteUnit
from features.sinks.postgres import PostgresSink

pytestmark = pytest.mark.services

REDIS_DB = 13
SCHEMA = """
name: cli_hist
version: 1.0.0
entity: key
event_time: at
fields:
  - {name: key, type: int64, store: cold, constraints: {required: true}}
  - {name: at, type: "timestamp(us, UTC)", store: cold, constraints: {required: true}}
  - {name: score, type: float64, store: cold}
  - {name: tag, type: string, store: cold}
"""
BASE_US = 1_700_000_000 * 10**6


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "features.cli", "historical", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_features_historical_writes_the_training_set_in_chunks(tmp_path: Path, settings: Settings,
                                                                pg_schema: str) -> None:
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "cli_hist.yaml").write_text(SCHEMA)
    c = compile_schema(parse_schema(SCHEMA, "cli_hist.yaml"))
    rng = np.random.default_rng(5)
    n = 400
    keys = rng.integers(0, 60, n)
    at = BASE_US + rng.choice(10**6, n, replace=False) * 10**6
    hist = pa.table({"key": pa.array(keys, pa.int64()),
                     "at": pa.array(at, pa.int64()).view(pa.timestamp("us", "UTC")),
                     "score": pa.array(rng.normal(size=n)), "tag": pa.array([f"t{k}" for k in range(n)])})
    ctx = RunContext(c.name, c.schema.version_str, c.fingerprint, "run-cli",
                     dt.datetime(2025, 1, 1, tzinfo=dt.UTC))
    for name, col in ctx.columns(pa.array([f"file:///h.parquet#{i}" for i in range(n)])).items():
        hist = hist.append_column(name, col)
    sink = PostgresSink(settings.postgres_dsn, c, search_path=pg_schema)
    sink.open()
    sink.write(WriteUnit(hist, REJECTED_ROWS_SCHEMA.empty_table(), None, n))
    sink.close()

    m = 250  # frame: stored and unknown keys, at and between event times, a label passed through
    pick = rng.integers(0, n, m)
    frame = pa.table({"key": pa.array(np.where(rng.random(m) < 0.1, 999, keys[pick]), pa.int64()),
                      "ts": pa.array(at[pick] + rng.integers(-2, 3, m) * 10**6, pa.int64()).view(
                          pa.timestamp("us", "UTC")),
                      "label": pa.array(rng.integers(0, 2, m), pa.int8())})
    frame_path, out = tmp_path / "frame.parquet", tmp_path / "train.parquet"
    pq.write_table(frame, frame_path)
    fs = FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn, schemas=schemas,
                      search_path=pg_schema)
    want = fs.historical("cli_hist", frame, ["tag", "score"], timestamp_column="ts",
                         max_age=dt.timedelta(days=3))
    fs.close()
    with cli_environment(settings, pg_schema, REDIS_DB) as env:
        base = ["--schema", "cli_hist", "--schemas-dir", str(schemas), "--entities", str(frame_path),
                "--out", str(out), "--timestamp-column", "ts"]
        done = _cli(env, *base, "--features", "tag,score", "--max-age", "3d", "--chunk-rows", "64", "--json")
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        got = pq.read_table(out)
        assert got.equals(want)
        assert pq.ParquetFile(out).metadata.num_row_groups == 4  # 250 rows in chunks of 64
        hits = m - want.column("_event_time").null_count
        assert 0 < hits < m
        assert summary == {"schema": "cli_hist", "entities": str(frame_path), "out": str(out), "rows": m,
                           "matched": hits, "seconds": summary["seconds"]}

        # An unknown feature, a bad --max-age, a missing column: exit 2, nothing written.
        out.unlink()
        for extra, message in ((["--features", "nope"], "no feature"),
                               (["--max-age", "soon"], "not a duration"),
                               (["--timestamp-column", "when"], "no column 'when'")):
            bad = _cli(env, *base, *extra)
            assert bad.returncode == 2, bad.stderr
            assert message in bad.stderr
            assert not out.exists() and not list(tmp_path.glob(".train.parquet.*"))
