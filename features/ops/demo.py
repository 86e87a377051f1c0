"""``features demo``: the README's main job, end to end on the shipped example data.

Steps: start the local services (``features dev up``; external ones are only
checked), compile the example schemas (a checkout's ``schemas/``; installed, the copies
the package ships), generate the example applicant data (deterministic, with about 2%
invalid rows) under the project's ``data/demo/``, load it into Redis
and Postgres with the batch loader, stream example events (invalid, out-of-order,
duplicated and undecodable ones among them) through Kafka and the PyFlink job, read a
few features back, and print the summary of both paths. Running it twice stores
nothing twice: the second run reports every row as already present.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import redis

from features.compile import compile_schema, find_schema
from features.compile.layout import entity_key, key_slot
from features.compile.postgres import rejects_table_name
from features.config import resolve_settings
from features.flink import job_file
from features.home import project_home
from features.load import load, render_summary
from features.ops.dev import services
from features.ops.examples import EXAMPLE_SCHEMAS, applicant_events, applicants
from features.schema import load_schemas
from features.sinks import pg
from features.sinks.redis_cluster import Cluster
from features.sinks.redis_wire import RedisEndpoint
from features.stream.kafka import ensure_topic, entity_keys, produce, topic_size
from features.stream.summary import render as render_stream_summary

ROOT = Path(__file__).resolve().parents[2]


def _schemas_dir() -> Path:
    """The demo's schemas: a checkout's own ``schemas/`` (every schema, the example ones
    among them), else the example schemas the installed package ships."""
    checkout = ROOT / "schemas"
    return checkout if (checkout / "credit_applicant.yaml").is_file() else EXAMPLE_SCHEMAS


def _step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def generate_files(out: Path, rows: int, files: int) -> list[Path]:
    """Write the example applicant data as ``files`` Parquet files (cached by size)."""
    out.mkdir(parents=True, exist_ok=True)
    per = -(-rows // files)
    paths = []
    for i in range(files):
        n = min(per, rows - i * per)
        path = out / f"applicants-{i:02d}-of-{files:02d}-{rows}.parquet"
        if not path.exists():
            table = applicants(n, seed=1000 + i, first_id=10**9 + i * per)
            tmp = path.with_suffix(".tmp")
            pq.write_table(table, tmp, row_group_size=50_000)
            tmp.rename(path)
        paths.append(path)
    return paths


def run(*, rows: int = 300_000, files: int = 3, out: str | None = None, events: int = 20_000,
        topic: str = "featureline-demo-applications", services_first: bool = True) -> int:
    """The demo (the module's docstring); the exit code: 0 when both paths add up."""
    t0 = time.perf_counter()
    settings = resolve_settings()
    schemas = _schemas_dir()
    where = Path(out) if out else project_home() / "data" / "demo"
    if services_first:
        _step("services (features dev up)")
        report = services.up(settings)
        for line in report.lines():
            print(line)
        # the demo needs the servers, and the stream's parts when it streams (not Chromium)
        if report.servers_down() or (events and not report.stream_ready):
            print("features demo: a service is down or the stream is not ready; see above", file=sys.stderr)
            return 2
    _step(f"compile {_shown(schemas)}/")
    for name, schema in sorted(load_schemas(schemas).items()):
        compiled = compile_schema(schema)
        kind = "loadable" if schema.loadable else "validation-only"
        print(f"{name:<20} {schema.version_str:<8} {compiled.fingerprint[:12]}  {len(compiled.rules)} rules, "
              f"{len(schema.features)} derived features ({kind})")
    _step(f"example data ({rows:,} applicant rows, ~2% invalid)")
    paths = generate_files(where, rows, files)
    for p in paths:
        print(_shown(p))
    _step("batch load: Parquet -> validate -> transform -> Redis (hot) + Postgres (cold)")
    compiled = find_schema("credit_applicant", schemas)
    summary = load(paths, compiled, settings, progress=True)
    print(render_summary(summary, rejects_table=rejects_table_name(compiled.schema)))
    stream: dict[str, Any] | None = None
    if events:
        _step(f"stream: {events:,} events -> Kafka {topic} -> PyFlink job -> Redis + Postgres")
        stream = _stream(settings, topic, events, schemas)
        if stream is None:
            return 1
    _step("read back")
    _read_back(settings, compiled)
    print(f"\ndemo finished in {time.perf_counter() - t0:.1f}s")
    print(f"  batch  (Parquet): read {summary.read:,} = stored {summary.stored:,} + rejected "
          f"{summary.rejected:,} + already present {summary.already_present:,}")
    if stream is not None:
        print(f"  stream (Kafka):   read {stream['read']:,} = stored {stream['stored']:,} + rejected "
              f"{stream['rejected']:,} + already present {stream['already_present']:,} "
              f"(dead-letter topic {topic}.rejects: {stream['dead_letters']:,} messages)")
    return 0 if summary.adds_up and (stream is None or stream["adds_up"]) else 1


def _shown(path: Path) -> Path:
    """``path`` relative to the current folder when it is below it."""
    here = Path.cwd()
    return path.relative_to(here) if path.is_absolute() and path.is_relative_to(here) else path


def _stream(settings: Any, topic: str, events: int, schemas: Path) -> dict[str, Any] | None:
    """Produce the example events once (a topic that already holds them is reused), then
    run the bounded stream job over the whole topic with a fresh consumer group."""
    ensure_topic(settings.kafka_bootstrap, topic, partitions=2)
    ensure_topic(settings.kafka_bootstrap, f"{topic}.rejects", partitions=1)
    have = topic_size(settings.kafka_bootstrap, topic)
    if have == 0:
        values = applicant_events(events)
        produce(settings.kafka_bootstrap, topic, values, keys=entity_keys(values, "application_id"))
        print(f"produced {len(values):,} records ({events:,} events, duplicates and undecodable ones "
              f"among them) to {topic}")
    else:
        print(f"{topic} already holds {have:,} records: reusing them")
    job = job_file("stream")
    args = ["--schema", "credit_applicant", "--schemas-dir", str(_shown(schemas)), "--topic", topic,
            "--bounded", "--group-id", f"featureline-demo-{uuid.uuid4().hex[:8]}", "--json"]
    print("$ " + " ".join(["python", str(_shown(job)), *args]), flush=True)
    proc = subprocess.run([sys.executable, str(job), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        print(f"features demo: the stream job failed (exit {proc.returncode})", file=sys.stderr)
        return None
    summary: dict[str, Any] = json.loads(proc.stdout)
    print(render_stream_summary(summary, "credit_applicant"))
    return summary


def _read_back(settings: Any, compiled: Any) -> None:
    key = entity_key(compiled.name, "APP-001000000007")
    endpoint = RedisEndpoint.from_url(settings.redis_url)
    if endpoint.cluster:  # a Redis Cluster: ask the slot's primary
        cluster = Cluster(endpoint, timeout_s=10)
        try:
            flat = cluster.call(key_slot(key), ["HGETALL", key])
        finally:
            cluster.close()
        raw = dict(zip(flat[::2], flat[1::2], strict=True))
    else:
        r = redis.Redis.from_url(settings.redis_url, **endpoint.redis_py_options())
        raw = r.hgetall(key)  # type: ignore[assignment]  # sync client
    hot = {k.decode(): v.decode() for k, v in raw.items()}
    shown = {k: hot[k] for k in ("income_monthly", "income_log", "debt_to_income", "_source") if k in hot}
    print(f"redis    HGETALL {key}: {shown}")
    with pg.connect(settings.postgres_dsn) as conn:
        n = conn.execute(f'SELECT count(*) FROM "{compiled.name}"').fetchone()[0]  # type: ignore[index]
        nr = conn.execute(f'SELECT count(*) FROM "{compiled.name}__rejects"').fetchone()[0]  # type: ignore[index]
        sample = conn.execute(f'SELECT _source, errors->0->>\'message\' FROM "{compiled.name}__rejects" '
                              "ORDER BY id LIMIT 1").fetchone()
    print(f"postgres {compiled.name}: {n:,} rows; {compiled.name}__rejects: {nr:,} rows")
    if sample:
        print(f"         e.g. reject {sample[0]}: {sample[1]}")
