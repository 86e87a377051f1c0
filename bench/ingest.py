"""Benchmark: the HTTP ingest service (``features serve``) against a plain Kafka producer.

Usage::

    .venv/bin/python bench/ingest.py [--events 50000] [--single 5000] [--rounds 3]
                                     [--workers 2] [--clients 8] [--batch 1000]

Records are ``features.ops.examples.applicant_events`` (JSON for ``schemas/credit_applicant.yaml``,
~2% breaking a rule, some duplicates; no undecodable payloads or tombstones), keyed by
entity. One server runs for the whole benchmark (``--workers``, ``--no-access-log``), on a
fresh 2-partition topic and its dead-letter topic, with its rejects table in a fresh
``bench_ingest_*`` Postgres schema; everything is dropped at the end.

Contenders, in interleaved rounds (each round runs each once, in this order):

- **producer** (the baseline): one confluent-kafka ``Producer`` with the service's own
  settings (``enable.idempotence``, ``acks=all``, ``linger.ms`` 5) produces the
  ``--events`` records keyed by entity and flushes; records / wall time;
- **ndjson**: ``--clients`` threads, each with one keep-alive ``http.client`` connection,
  post the same records as NDJSON bodies of ``--batch`` records until all are sent;
  records / wall time (the clock stops at the last response: every record acknowledged
  by Kafka, every reject in the rejects table and the dead-letter topic), requests/s and
  the latency of each request (p50, p99);
- **single**: the same threads post ``--single`` records one per request (a JSON object
  body); requests/s and p50/p99.

Each run prints one line as soon as it is measured; the summary gives per contender the
median, min and max over the rounds and the ratio ndjson / producer records/s per round
and its median (target: >= 0.5). The client threads run in this process on the same
machine as the server, the broker and Postgres: they take CPU from the server. After each
run a ``CPU:`` line gives the CPU seconds each kind of process used during it (server,
bench, Kafka, Postgres, Redis; ``/proc/<pid>/stat``) and per record.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from features.config import Settings, resolve_settings  # noqa: E402
from features.ops.examples import applicant_events  # noqa: E402
from features.stream.kafka import client_config, ensure_topic, entity_keys  # noqa: E402

TOKEN = "bench-token-" + uuid.uuid4().hex[:8]


@dataclass
class Run:
    contender: str
    round: int
    records: int
    requests: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    def quantile(self, q: float) -> float | None:
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)]

    def line(self) -> str:
        text = (f"{self.contender:<9} round {self.round}: {self.records:>7,} records in "
                f"{self.seconds:7.2f} s = {self.records_per_s:>9,.0f} records/s")
        if self.latencies_ms:
            text += (f", {self.requests_per_s:>7,.0f} requests/s, latency p50 {self.quantile(0.5):.1f} ms, "
                     f"p99 {self.quantile(0.99):.1f} ms, statuses {dict(sorted(self.statuses.items()))}")
        return text


def produce_baseline(settings: Settings, topic: str, values: list[bytes], keys: list[bytes | None],
                     rnd: int) -> Run:
    from confluent_kafka import Producer

    t0 = time.perf_counter()
    p = Producer(client_config(settings.kafka_bootstrap, settings.kafka_properties, **{
        "enable.idempotence": True, "acks": "all", "linger.ms": 5}))
    errors: list[str] = []

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        while True:
            try:
                p.produce(topic, value=v, key=k, on_delivery=delivered)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(60)
    seconds = time.perf_counter() - t0
    if left or errors:
        raise RuntimeError(f"baseline: {left} unacknowledged, {errors[:1]}")
    return Run("producer", rnd, len(values), 0, seconds)


def post_all(host: str, port: int, bodies: list[tuple[bytes, str, int]], clients: int, name: str,
             rnd: int) -> Run:
    """Post every body (body, content type, records) from ``clients`` keep-alive connections."""
    lock = threading.Lock()
    nxt = [0]
    lat: list[float] = []
    statuses: dict[int, int] = {}
    failures: list[str] = []

    def worker() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=120)
        mine: list[float] = []
        seen: dict[int, int] = {}
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(bodies):
                break
            body, ctype, _ = bodies[i]
            t = time.perf_counter()
            try:
                conn.request("POST", "/v1/schemas/credit_applicant/events", body=body,
                             headers={"Content-Type": ctype, "Authorization": f"Bearer {TOKEN}"})
                r = conn.getresponse()
                r.read()
            except (OSError, http.client.HTTPException) as exc:
                failures.append(repr(exc))
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=120)
                continue
            mine.append((time.perf_counter() - t) * 1000)
            seen[r.status] = seen.get(r.status, 0) + 1
        conn.close()
        with lock:
            lat.extend(mine)
            for s, c in seen.items():
                statuses[s] = statuses.get(s, 0) + c

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if failures:
        raise RuntimeError(f"{name}: {len(failures)} requests failed, e.g. {failures[0]}")
    bad = {s: c for s, c in statuses.items() if s not in (202, 422)}
    if bad:
        raise RuntimeError(f"{name}: unexpected statuses {bad}")
    return Run(name, rnd, sum(b[2] for b in bodies), len(bodies), seconds, lat, statuses)


def start_server(env: dict[str, str], schemas: Path, topic_template: str, workers: int
                 ) -> tuple[subprocess.Popen[bytes], str, int]:
    exe = Path(sys.executable).parent / "features"
    cmd = [str(exe), "serve", "--schemas", str(schemas), "--port", "0", "--workers", str(workers),
           "--topic-template", topic_template, "--no-access-log"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("features serve: listening on "):
        proc.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    url = line.split()[4]
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return proc, host, int(port)


def summary(runs: list[Run]) -> None:
    print("\nsummary (median [min..max] over rounds):", flush=True)
    names = list(dict.fromkeys(r.contender for r in runs))
    for name in names:
        mine = [r for r in runs if r.contender == name]
        rec = [r.records_per_s for r in mine]
        text = (f"  {name:<9} records/s {statistics.median(rec):>9,.0f} [{min(rec):,.0f}..{max(rec):,.0f}]")
        if mine[0].latencies_ms:
            req = [r.requests_per_s for r in mine]
            p50 = [r.quantile(0.5) or 0.0 for r in mine]
            p99 = [r.quantile(0.99) or 0.0 for r in mine]
            text += (f"  requests/s {statistics.median(req):>7,.0f} [{min(req):,.0f}..{max(req):,.0f}]"
                     f"  p50 {statistics.median(p50):.1f} ms  p99 {statistics.median(p99):.1f} ms")
        print(text, flush=True)
    base = {r.round: r for r in runs if r.contender == "producer"}
    ratios = [r.records_per_s / base[r.round].records_per_s for r in runs
              if r.contender == "ndjson" and r.round in base]
    if ratios:
        print(f"  ndjson / producer records/s per round: {', '.join(f'{x:.2f}' for x in ratios)}; "
              f"median {statistics.median(ratios):.2f} (target >= 0.5)", flush=True)


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_by_process(server_pid: int | None) -> dict[str, float]:
    """CPU seconds (user + system) so far per kind of process on this machine: the
    server (its parent and workers: the session ``server_pid`` leads), this bench (the
    clients and the baseline producer), Kafka, Postgres, Redis, other."""
    out: dict[str, float] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        seconds = (int(fields[11]) + int(fields[12])) / _TICK
        session = int(fields[3])
        pid = int(entry)
        if pid == me:
            kind = "bench (clients, baseline producer)"
        elif server_pid is not None and (pid == server_pid or session == server_pid):
            kind = "features serve (parent + workers)"
        elif b"kafka" in cmd and b"java" in cmd:
            kind = "kafka"
        elif cmd.startswith(b"postgres"):
            kind = "postgres"
        elif cmd.startswith(b"redis-server"):
            kind = "redis"
        else:
            kind = "other"
        out[kind] = out.get(kind, 0.0) + seconds
    return out


def cpu_line(before: dict[str, float], after: dict[str, float], records: int) -> str:
    used = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    parts = [f"{k} {v:.2f} s ({v / records * 1e6:.1f} us/record)" for k, v in
             sorted(used.items(), key=lambda kv: -kv[1]) if v >= 0.01]
    return "    CPU: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=50_000, help="records per producer / ndjson run")
    ap.add_argument("--single", type=int, default=5_000, help="records (= requests) per single run")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="server workers (default: cores)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent client connections (default 8)")
    ap.add_argument("--batch", type=int, default=1000, help="records per NDJSON request (default 1000)")
    args = ap.parse_args(argv)

    import psycopg
    from confluent_kafka.admin import AdminClient

    settings = resolve_settings(root=ROOT)
    values = [v for v in applicant_events(args.events, seed=17, undecodable_every=0) if v is not None]
    values = values[: args.events]
    keys = entity_keys(values, "application_id")
    single = values[: args.single]
    ndjson = [(b"\n".join(values[i:i + args.batch]) + b"\n", "application/x-ndjson",
               len(values[i:i + args.batch])) for i in range(0, len(values), args.batch)]
    singles = [(v, "application/json", 1) for v in single]

    tag = uuid.uuid4().hex[:8]
    pg_schema = f"bench_ingest_{tag}"
    served = f"bench_ingest_{tag}_credit_applicant"
    baseline_topic = f"bench_ingest_{tag}_baseline"
    for t, parts in ((served, 2), (served + ".rejects", 1), (baseline_topic, 2)):
        ensure_topic(settings.kafka_bootstrap, t, partitions=parts)
    tmp = Path(tempfile.mkdtemp(prefix="bench_ingest_"))
    (tmp / "schemas").mkdir()
    shutil.copy(ROOT / "schemas" / "credit_applicant.yaml", tmp / "schemas")
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(f'CREATE SCHEMA "{pg_schema}"')
    sep = "&" if "?" in settings.postgres_dsn else "?"
    dsn = f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}"
    env = {**os.environ, "FEATURES_POSTGRES_DSN": dsn,
           "FEATURES_INGEST_TOKENS": TOKEN, "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
    print(f"records: {len(values):,} ({len(ndjson)} NDJSON bodies of {args.batch}), "
          f"single: {len(singles):,}; server workers {args.workers}, clients {args.clients}, "
          f"cores {os.cpu_count()}", flush=True)
    proc = None
    runs: list[Run] = []
    try:
        proc, host, port = start_server(env, tmp / "schemas", f"bench_ingest_{tag}_{{schema}}", args.workers)
        # warm up: each worker's decoder, connections and producer
        post_all(host, port, ndjson[:4] + singles[:50], args.clients, "warmup", 0)
        for rnd in range(1, args.rounds + 1):
            for name in ("producer", "ndjson", "single"):
                before = cpu_by_process(proc.pid)
                if name == "producer":
                    run = produce_baseline(settings, baseline_topic, values, keys, rnd)
                else:
                    bodies = ndjson if name == "ndjson" else singles
                    run = post_all(host, port, bodies, args.clients, name, rnd)
                runs.append(run)
                print(run.line(), flush=True)
                print(cpu_line(before, cpu_by_process(proc.pid), run.records), flush=True)
        summary(runs)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).delete_topics(
            [served, served + ".rejects", baseline_topic])
        admin.execute(f'DROP SCHEMA "{pg_schema}" CASCADE')
        admin.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
