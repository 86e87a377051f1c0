"""Benchmark (issue 31): featureline's feature views against Feast, side by side in one run.

Usage::

    bench/feast_venv.sh            # once: the Feast venv .cache/bench-feast-venv (pinned)
    PYTHONPATH=$PWD .venv/bin/python bench/views.py [--events 1000000] [--entity-rows 1000000]
        [--small-rows 100000] [--rounds 3] [--reps 1000] [--reps-100 200] [--quick] [--reload]
        [--no-http] [--no-historical] [--no-feast]

Data (seeded, ``--seed``; cached as Parquet under ``.cache/bench-views/<tag>/``): three
schemas over two entity kinds (``bench/views/schemas/``): ``card_txn`` (``--events``
transactions over events/10 cards, entity ``card_id`` string, with three windowed
aggregations ``txn_24h``, ``amount_mean_7d``, ``amount_max_24h``), ``card_profile`` (one
row per card: ``credit_limit``, ``account_age_days``, ``card_tier``) and ``merchant``
(entity ``merchant_id`` int64, ``--merchants`` x 3 snapshots: ``risk_score``, ``mcc``):
8 features, read through the view ``bench/views/views/card_scoring.yaml``.

- featureline: ``features load`` of each file (Postgres ``search_path`` bench_views, Redis
  db 8; the loader computes the aggregations);
- Feast (``bench/feast_side.py``, a long-lived worker in the Feast venv driven over
  stdin/stdout): three FeatureViews over FileSources of the same rows (the aggregations
  computed here, vectorised, by the aggregation semantics of docs/aggregations.md;
  decimals as float64, Feast has no decimal), one FeatureService ``card_scoring``,
  ``apply`` + ``materialize`` into Redis db 8 (Feast's keys are its serialized entity
  keys, never ``features:...``: the bench counts both key spaces and checks each).

Both sides load once per data set (remembered in ``.cache/bench-views/loaded.json``; a
changed data set or ``--reload`` drops the schema and flushes db 8 first). Feast's worker
log: ``.cache/bench-views/feast_side.log``, its server's: ``feast_serve.log``. The Feast
side is checked against featureline's stores: the online values of 100 rows against
featureline's Redis hashes, and (once the view API exists) every historical value of the
large frame against ``historical_view``'s, and the frame rows Feast's file store drops
(it returns no row where an entity has stored rows but none at or before the time).

Measured in ``--rounds`` interleaved rounds (the contenders' order rotates each round),
every result printed as soon as it is measured, then median [min..max] per contender:

1. historical: an entity frame of ``--entity-rows`` random (card_id, merchant_id) rows of
   distinct transactions, timestamps an hour after or a day before the event, plus a ``row``
   label: ``fs.historical_view`` vs Feast ``get_historical_features(features=service)
   .to_arrow()``; rows/s and featureline / Feast; also ``--small-rows``.
2. online, 1 row and 100 rows: ``fs.online_view`` and ``fs.online_view_dicts`` vs Feast
   ``get_online_features(features=service, entity_rows=...).to_dict()``, and the raw
   baseline: a pipelined HMGET (redis-py + hiredis, ``transaction=False``) of the same
   three hashes per row and the view's fields; p50/p99 per round of ``--reps`` calls.
3. HTTP, 1 row: ``features serve``'s ``POST /v1/views/card_scoring/online`` vs ``feast
   serve``'s ``POST /get-online-features``, one keep-alive ``http.client`` connection each.

Until featureline's view API exists (``FeatureStore.online_view`` etc.), its rows print
"featureline view API not present" and the Feast side and the baselines still run.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from features.config import resolve_settings  # noqa: E402

BENCH = ROOT / "bench" / "views"
SCHEMAS = BENCH / "schemas"
VIEWS = BENCH / "views"
VIEW = "card_scoring"
CACHE = ROOT / ".cache" / "bench-views"
FEAST_PY = ROOT / ".cache" / "bench-feast-venv" / "bin" / "python"
PG_SCHEMA = "bench_views"
REDIS_DB = 8
#: 2026-01-01T00:00:00Z in microseconds: the transactions span the 30 days after it
T0 = 1_767_225_600_000_000
DAY = 86_400_000_000
HOUR = 3_600_000_000
#: the view's features per source (bench/views/views/card_scoring.yaml)
SOURCES = {"card_txn": ["txn_24h", "amount_mean_7d", "amount_max_24h"],
           "card_profile": ["credit_limit", "account_age_days", "card_tier"],
           "merchant": ["risk_score", "mcc"]}
MISSING = "featureline view API not present"
RAW = "raw HMGET (hiredis)"


# --------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class Data:
    tag: str
    dir: Path
    featureline: dict[str, Path]   # schema -> Parquet in the schema's Arrow types
    feast: dict[str, Path]         # view -> Parquet for Feast's FileSource (aggregations included)
    events: pa.Table               # (card_id, merchant_id, event_time) of every transaction


def card_ids(idx: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise("c", pc.utf8_lpad(pa.array(idx).cast(pa.string()), 7, "0"), "")


def decimal_cents(cents: np.ndarray) -> pa.Array:
    """Non-negative int64 cents as decimal(12,2), exactly (the 128-bit little-endian words)."""
    words = np.zeros((len(cents), 2), dtype=np.int64)
    words[:, 0] = cents
    return pa.Array.from_buffers(pa.decimal128(12, 2), len(cents), [None, pa.py_buffer(words.tobytes())])


def window_index(key: np.ndarray, size: int) -> np.ndarray:
    """For events sorted by ``key`` (entity * 2^40 + time), the first index of each
    event's sliding window ``(t - size, t]`` within its entity."""
    return np.searchsorted(key, key - size, side="right")


def range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo[i]:hi[i] + 1]) for every i (a sparse table; lo <= hi)."""
    table = [values]
    span = 1
    while span * 2 <= int((hi - lo).max()) + 1:
        prev = table[-1]
        table.append(np.maximum(prev[:-span], prev[span:]))
        span *= 2
    length = hi - lo + 1
    level = np.floor(np.log2(length)).astype(np.int64)
    out = np.empty(len(lo), dtype=values.dtype)
    for k in np.unique(level):
        m = level == k
        t = table[k]
        out[m] = np.maximum(t[lo[m]], t[hi[m] - (1 << k) + 1])
    return out


def generate(events: int, merchants: int, seed: int) -> Data:
    """The three tables (cached by ``events``, ``merchants``, ``seed``)."""
    cards = max(events // 10, 1)
    tag = f"e{events}_m{merchants}_s{seed}"
    out = CACHE / tag
    fl = {n: out / f"{n}.parquet" for n in SOURCES}
    fe = {n: out / f"feast_{n}.parquet" for n in SOURCES}
    ev = out / "events.parquet"
    if all(p.exists() for p in [*fl.values(), *fe.values(), ev]):
        return Data(tag, out, fl, fe, pq.read_table(ev))
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    us = pa.timestamp("us", "UTC")

    # card_txn: unique event seconds (so (card, time) is unique), random micros
    card = rng.integers(0, cards, events)
    seconds = rng.choice(30 * 86_400, events, replace=False).astype(np.int64)
    t = T0 + seconds * 1_000_000 + rng.integers(0, 1_000_000, events)
    merchant = rng.integers(0, merchants, events).astype(np.int64)
    cents = np.clip(np.round(rng.lognormal(3.5, 1.2, events) * 100), 1, 10**9).astype(np.int64)
    txn = pa.table({"card_id": card_ids(card), "merchant_id": merchant,
                    "amount": decimal_cents(cents), "event_time": pa.array(t).cast(us)})
    # the aggregations, as of each event, per card over (t - window, t]
    order = np.lexsort((t, card))
    key = (card[order].astype(np.int64) << 42) + (t[order] - T0)
    c = cents[order]
    lo24 = window_index(key, DAY)
    lo7 = window_index(key, 7 * DAY)
    idx = np.arange(events)
    cs = np.concatenate([[0], np.cumsum(c)])
    count_24h = idx - lo24 + 1
    mean_7d = ((cs[idx + 1] - cs[lo7]) / (idx - lo7 + 1)) / 100.0
    max_24h = range_max(c, lo24, idx) / 100.0
    feast_txn = pa.table({"card_id": txn.column("card_id").take(pa.array(order)),
                          "event_time": pa.array(t[order]).cast(us),
                          "txn_24h": pa.array(count_24h.astype(np.int64)),
                          "amount_mean_7d": pa.array(mean_7d), "amount_max_24h": pa.array(max_24h)})

    # card_profile: one row per card, most before the transactions, 10% within them
    updated = np.where(rng.random(cards) < 0.9, T0 - rng.integers(0, 365 * DAY, cards),
                       T0 + rng.integers(0, 30 * DAY, cards))
    limit = rng.integers(5, 500, cards).astype(np.int64) * 10_000
    age = rng.integers(0, 5000, cards).astype(np.int32)
    tiers = np.array(["standard", "gold", "platinum"], dtype=object)[rng.choice(3, cards, p=[0.7, 0.2, 0.1])]
    profile = pa.table({"card_id": card_ids(np.arange(cards)), "updated_at": pa.array(updated).cast(us),
                        "credit_limit": decimal_cents(limit),
                        "account_age_days": pa.array(age), "card_tier": pa.array(tiers, pa.string())})
    feast_profile = profile.set_column(2, "credit_limit", pa.array(limit / 100.0))

    # merchant: 3 snapshots each (a month before, and two within the transactions' month)
    mid = np.repeat(np.arange(merchants, dtype=np.int64), 3)
    offset = np.stack([-rng.integers(1, 30 * DAY, merchants), rng.integers(0, 15 * DAY, merchants),
                       rng.integers(15 * DAY, 30 * DAY, merchants)], axis=1).reshape(-1)
    risk = np.round(rng.random(len(mid)), 4)
    mcc = rng.integers(1000, 9999, len(mid)).astype(np.int32)
    merch = pa.table({"merchant_id": mid, "updated_at": pa.array(T0 + offset).cast(us),
                      "risk_score": pa.array(risk), "mcc": pa.array(mcc)})

    for name, table in (("card_txn", txn), ("card_profile", profile), ("merchant", merch)):
        pq.write_table(table, fl[name], row_group_size=262_144)
    for name, table in (("card_txn", feast_txn), ("card_profile", feast_profile), ("merchant", merch)):
        pq.write_table(table, fe[name])
    events_table = txn.select(["card_id", "merchant_id", "event_time"])
    pq.write_table(events_table, ev)
    return Data(tag, out, fl, fe, events_table)


def entity_frame(data: Data, n: int, seed: int) -> Path:
    """``n`` random transactions' (card_id, merchant_id), an hour after or a day before
    the event, and a ``row`` label; cached. Distinct transactions while ``n`` <= the events
    (sampled without replacement), so no two frame rows share keys and timestamp."""
    path = data.dir / f"frame_{n}_s{seed}_u.parquet"
    if path.exists():
        return path
    rng = np.random.default_rng(seed + 1)
    events = data.events.num_rows
    take = pa.array(rng.choice(events, n, replace=False) if n <= events else rng.integers(0, events, n))
    ev = data.events.take(take)
    t = ev.column("event_time").cast(pa.int64()).to_numpy()
    shift = np.where(rng.random(n) < 0.5, HOUR, -DAY)
    frame = pa.table({"row": pa.array(np.arange(n, dtype=np.int64)), "card_id": ev.column("card_id"),
                      "merchant_id": ev.column("merchant_id"),
                      "timestamp": pa.array(t + shift).cast(pa.timestamp("us", "UTC"))})
    pq.write_table(frame, path)
    return path


# --------------------------------------------------------------------------- stores


def stamp_path() -> Path:
    return CACHE / "loaded.json"


def load_featureline(data: Data, settings: Any, redis_url: str, dsn: str) -> dict[str, float]:
    """``features load`` of each file; idempotent (the loader's ledger makes a re-run a no-op)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEATURES_POSTGRES_DSN": dsn,
           "FEATURES_REDIS_URL": redis_url}
    exe = Path(sys.executable).parent / "features"
    seconds: dict[str, float] = {}
    for name, path in data.featureline.items():
        t0 = time.perf_counter()
        proc = subprocess.run([str(exe), "load", "--schema", name, "--schemas-dir", str(SCHEMAS),
                               "--no-progress", str(path)], env=env, capture_output=True, text=True)
        seconds[name] = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"features load {name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        last = [line for line in proc.stdout.splitlines() if line.strip()][-1:]
        print(f"  features load {name}: {seconds[name]:.1f} s  {last[0] if last else ''}", flush=True)
    return seconds


def reset(settings: Any, client: Any) -> None:
    import psycopg

    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {PG_SCHEMA}")
    client.flushdb()
    if (p := stamp_path()).exists():
        p.unlink()


def key_spaces(client: Any) -> tuple[int, int]:
    """(featureline keys ``features:*``, other keys) in the benchmark's Redis database."""
    ours = other = 0
    for key in client.scan_iter(count=10_000):
        if key.startswith(b"features:"):
            ours += 1
        else:
            other += 1
    return ours, other


class Feast:
    """The worker (bench/feast_side.py) in the Feast venv."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([str(FEAST_PY), str(ROOT / "bench" / "feast_side.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     stderr=open(CACHE / "feast_side.log", "a"))

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the Feast worker died; see {CACHE / 'feast_side.log'}")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"Feast {op}: {reply['error']} (see {CACHE / 'feast_side.log'})")
        return reply

    def close(self) -> None:
        try:
            self.call_quit()
        finally:
            self.proc.wait(timeout=30)

    def call_quit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write('{"op": "quit"}\n')
        self.proc.stdin.flush()
        self.proc.stdin.close()


# --------------------------------------------------------------------------- measuring


def pct(ns: list[int]) -> tuple[float, float]:
    us = np.asarray(ns, dtype=np.float64) / 1000.0
    return float(np.percentile(us, 50)), float(np.percentile(us, 99))


class Results:
    def __init__(self) -> None:
        #: (measure, contender) -> list of per-round values (rows/s or (p50, p99) in us)
        self.values: dict[tuple[str, str], list[Any]] = {}

    def rate(self, rnd: int, measure: str, who: str, rows: int, seconds: float) -> None:
        self.values.setdefault((measure, who), []).append(rows / seconds)
        print(f"round {rnd + 1}  {measure:<22} {who:<24} {seconds:8.2f} s  {rows / seconds:12,.0f} rows/s",
              flush=True)

    def latency(self, rnd: int, measure: str, who: str, ns: list[int]) -> None:
        p50, p99 = pct(ns)
        self.values.setdefault((measure, who), []).append((p50, p99))
        print(f"round {rnd + 1}  {measure:<22} {who:<24} p50 {p50:9.1f} us  p99 {p99:9.1f} us  "
              f"({len(ns)} calls)", flush=True)

    def summary(self) -> None:
        print("\nsummary (median [min..max] over rounds):", flush=True)
        measures = list(dict.fromkeys(m for m, _ in self.values))
        for m in measures:
            mine = {who: v for (mm, who), v in self.values.items() if mm == m}
            for who, v in mine.items():
                if isinstance(v[0], tuple):
                    p50 = [x[0] for x in v]
                    p99 = [x[1] for x in v]
                    print(f"  {m:<22} {who:<24} p50 {statistics.median(p50):9.1f} us "
                          f"[{min(p50):.1f}..{max(p50):.1f}]  p99 {statistics.median(p99):9.1f} us "
                          f"[{min(p99):.1f}..{max(p99):.1f}]", flush=True)
                else:
                    print(f"  {m:<22} {who:<24} {statistics.median(v):12,.0f} rows/s "
                          f"[{min(v):,.0f}..{max(v):,.0f}]", flush=True)
            self.ratios(m, mine)

    @staticmethod
    def ratios(measure: str, mine: dict[str, list[Any]]) -> None:
        feast = mine.get("feast") or mine.get("feast serve")
        if not feast:
            return
        for who, v in mine.items():
            if who.startswith("feast") or len(v) != len(feast):
                continue
            if isinstance(v[0], tuple):  # latency: Feast's p50 / ours (> 1: we are faster)
                r = [f[0] / x[0] for x, f in zip(v, feast, strict=True)]
                label = "Feast p50 / this p50"
            else:
                r = [x / f for x, f in zip(v, feast, strict=True)]
                label = "this rows/s / Feast's"
            print(f"  {measure:<22} {who:<24} {label} per round: {', '.join(f'{x:.2f}' for x in r)}; "
                  f"median {statistics.median(r):.2f}", flush=True)
        raw = mine.get(RAW)
        for who, v in mine.items():
            if raw and who.startswith("featureline") and len(v) == len(raw):
                r = [x[0] / b[0] for x, b in zip(v, raw, strict=True)]
                print(f"  {measure:<22} {who:<24} this p50 / raw HMGET p50 per round: "
                      f"{', '.join(f'{x:.2f}' for x in r)}; median {statistics.median(r):.2f}", flush=True)


def rotate(items: list[Any], rnd: int) -> list[Any]:
    k = rnd % len(items)
    return items[k:] + items[:k]


def timed_calls(fn: Callable[[Any], Any], batches: list[Any], warmup: int) -> list[int]:
    for b in batches[:warmup]:
        fn(b)
    ns: list[int] = []
    for b in batches[warmup:]:
        t0 = time.perf_counter_ns()
        fn(b)
        ns.append(time.perf_counter_ns() - t0)
    return ns


def raw_reader(redis_url: str) -> Callable[[list[tuple[str, int]]], Any]:
    """The baseline: redis-py (+ hiredis) pipelining one HMGET per source hash per row, of the
    view's fields plus the checked ones (as bench/online.py asks for one schema)."""
    import redis

    from features.compile.layout import aggregates_key, entity_key

    client = redis.Redis.from_url(redis_url)
    extra = ["_enc", "_schema_fingerprint", "_event_time"]
    txn_f = SOURCES["card_txn"] + extra
    prof_f = SOURCES["card_profile"] + extra
    merch_f = SOURCES["merchant"] + extra

    def read(rows: list[tuple[str, int]]) -> Any:
        pipe = client.pipeline(transaction=False)
        for card, merchant in rows:
            pipe.hmget(aggregates_key("card_txn", card), txn_f)
            pipe.hmget(entity_key("card_profile", card), prof_f)
            pipe.hmget(entity_key("merchant", str(merchant)), merch_f)
        return pipe.execute()

    return read


class Http:
    """One keep-alive connection; ``post`` returns the decoded JSON body. A connection the
    server closed while idle (uvicorn's keep-alive timeout is 5 s: the other contender's
    round takes longer) is opened again, as any keep-alive client does."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conn = http.client.HTTPConnection(host, port, timeout=30)

    def post(self, path: str, body: bytes) -> Any:
        try:
            self.conn.request("POST", path, body, {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            self.conn.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            self.conn.request("POST", path, body, {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST {path}: {resp.status} {data[:300]!r}")
        return data


def wait_http(host: str, port: int, path: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            conn = http.client.HTTPConnection(host, port, timeout=2)
            conn.request("GET", path)
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_feast_serve(repo: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    feast = FEAST_PY.parent / "feast"
    # one worker as featureline's server; no worker recycling every 1,000 requests
    cmd = [str(feast), "-c", str(repo), "serve", "-h", "127.0.0.1", "-p", str(port), "--no-access-log",
           "-w", "1", "--max-requests", "0"]
    proc = subprocess.Popen(cmd, stdout=open(CACHE / "feast_serve.log", "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    wait_http("127.0.0.1", port, "/health", 60)
    return proc, port


def start_features_serve(redis_url: str, dsn: str) -> tuple[subprocess.Popen[bytes], str, int]:
    """``features serve`` as bench/ingest.py starts it, with the benchmark's stores and views."""
    exe = Path(sys.executable).parent / "features"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEATURES_POSTGRES_DSN": dsn,
           "FEATURES_REDIS_URL": redis_url, "FEATURES_VIEWS_DIR": str(VIEWS)}
    help_text = subprocess.run([str(exe), "serve", "--help"], env=env, capture_output=True, text=True).stdout
    cmd = [str(exe), "serve", "--schemas", str(SCHEMAS), "--port", "0", "--workers", "1", "--no-access-log",
           "--insecure-no-auth"]
    if "--views" in help_text:
        cmd += ["--views", str(VIEWS)]
    if "--no-ingest" in help_text:  # a feature server: views only, no Kafka producer
        cmd += ["--no-ingest"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("features serve: listening on "):
        proc.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    host, port = line.split()[4].removeprefix("http://").rsplit(":", 1)
    return proc, host, int(port)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --------------------------------------------------------------------------- checks


def check_historical(frame: Path, feast_out: Path, ours: pa.Table | None) -> None:
    """Feast's result against the frame and, with featureline's, value by value on the rows
    both returned (floats to 1e-9 relative; decimals compared as floats).

    Feast's file (dask) offline store returns fewer rows than the frame has: it left-merges
    every stored row of the entity, drops those after the frame row's time, and so loses a
    frame row whose entity has stored rows but none at or before that time (null features
    expected), and it keeps one row per duplicate (join keys, timestamp) of the frame."""
    fe = pq.read_table(feast_out)
    fr = pq.read_table(frame)
    dup = fr.num_rows - fr.group_by(["card_id", "merchant_id", "timestamp"]).aggregate([]).num_rows
    nulls = {f: fe.column(f).null_count for fs in SOURCES.values() for f in fs}
    print(f"  Feast historical: {fe.num_rows:,} rows of the frame's {fr.num_rows:,} "
          f"({fr.num_rows - fe.num_rows:,} dropped; {dup:,} of the frame's rows repeat another's keys "
          "and timestamp); nulls per feature "
          f"{nulls}", flush=True)
    if ours is None:
        return
    assert ours.num_rows == fr.num_rows, (ours.num_rows, fr.num_rows)
    both = ours.join(fe.select(["row", *(f for fs in SOURCES.values() for f in fs)]), "row",
                     join_type="inner", right_suffix="__feast")
    # the rows Feast dropped must be rows where featureline found nothing for some source
    dropped = ours.filter(pc.invert(pc.is_in(ours.column("row"), fe.column("row"))))
    complete = np.ones(dropped.num_rows, dtype=bool)
    for names in SOURCES.values():
        complete &= dropped.column(names[0]).is_valid().to_numpy(zero_copy_only=False)
    print(f"  rows Feast dropped: {dropped.num_rows:,}; of them featureline found every source for "
          f"{int(complete.sum()):,} (expected 0)", flush=True)
    bad: dict[str, int] = {}
    for feature in (f for fs in SOURCES.values() for f in fs):
        a = both.column(feature)
        b = both.column(feature + "__feast")
        if pa.types.is_decimal(a.type) or pa.types.is_floating(a.type):
            x = pc.fill_null(a.cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
            y = pc.fill_null(b.cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
            same = np.isclose(x, y, rtol=1e-9, atol=0) | (np.isnan(x) & np.isnan(y))
        else:
            eq = pc.equal(a.cast(pa.string()), b.cast(pa.string()))
            same = pc.fill_null(pc.or_kleene(eq, pc.and_(pc.is_null(a), pc.is_null(b))), False).to_numpy(
                zero_copy_only=False)
        bad[feature] = int((~same).sum())
    print(f"  featureline vs Feast historical on the {both.num_rows:,} rows both returned, rows that differ "
          f"per feature: {bad}", flush=True)


def check_online(feast: dict[str, list[Any]], rows: list[list[Any]], raw: list[list[bytes | None]]) -> None:
    """Feast's online values for ``rows`` against featureline's Redis hashes of the same rows
    (read raw): the two stores hold the same newest values."""
    features = [f for fs in SOURCES.values() for f in fs]
    bad = dict.fromkeys(features, 0)
    missing = 0
    for i in range(len(rows)):
        for j, (_, names) in enumerate(SOURCES.items()):
            stored = raw[3 * i + j]
            for k, f in enumerate(names):
                theirs, ours = feast[f][i], stored[k]
                if ours is None or theirs is None:
                    missing += ours is None or theirs is None
                    continue
                text = ours.decode()
                same = (text == theirs if isinstance(theirs, str)
                        else bool(np.isclose(float(text), theirs, rtol=1e-9)))
                bad[f] += not same
    print(f"  online values, Feast vs featureline's Redis hashes, {len(rows)} rows: missing {missing}, "
          f"differing per feature {bad}", flush=True)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="card_txn events (cards: events / 10)")
    ap.add_argument("--merchants", type=int, default=10_000)
    ap.add_argument("--entity-rows", type=int, default=1_000_000, help="historical frame rows (large)")
    ap.add_argument("--small-rows", type=int, default=100_000, help="historical frame rows (small)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=1000, help="online/HTTP calls per round, 1 row")
    ap.add_argument("--reps-100", type=int, default=200, help="online calls per round, 100 rows")
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--quick", action="store_true",
                    help="a 1-minute smoke run: 100k events, 1k merchants, 20k/5k frames, 2 rounds")
    ap.add_argument("--reload", action="store_true",
                    help="drop and reload both sides' stores (default: load once per data set, "
                         "remembered in .cache/bench-views/loaded.json)")
    ap.add_argument("--no-http", action="store_true")
    ap.add_argument("--no-historical", action="store_true")
    ap.add_argument("--no-feast", action="store_true",
                    help="featureline and the raw baselines only (no Feast venv needed)")
    if ap.parse_args(argv).quick:  # smaller defaults; flags given still win
        ap.set_defaults(events=100_000, merchants=1_000, entity_rows=20_000, small_rows=5_000, rounds=2,
                        reps=300, reps_100=50)
    args = ap.parse_args(argv)
    if not args.no_feast and not FEAST_PY.exists():
        print(f"no Feast venv at {FEAST_PY}: run bench/feast_venv.sh first", file=sys.stderr)
        return 2
    import redis

    CACHE.mkdir(parents=True, exist_ok=True)
    base = resolve_settings(root=ROOT)
    redis_url = base.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    sep = "&" if "?" in base.postgres_dsn else "?"
    dsn = f"{base.postgres_dsn}{sep}options=-csearch_path%3D{PG_SCHEMA}"
    client = redis.Redis.from_url(redis_url)
    from redis.utils import HIREDIS_AVAILABLE

    print(f"bench/views.py: events {args.events:,}, cards {max(args.events // 10, 1):,}, merchants "
          f"{args.merchants:,} x 3, frames {args.entity_rows:,} / {args.small_rows:,}, rounds {args.rounds}; "
          f"Redis db {REDIS_DB}, Postgres search_path {PG_SCHEMA}; redis-py hiredis: {HIREDIS_AVAILABLE}; "
          f"{os.cpu_count()} cores (shared), load average {os.getloadavg()[0]:.2f}", flush=True)

    t0 = time.perf_counter()
    data = generate(args.events, args.merchants, args.seed)
    sizes = dict.fromkeys([args.small_rows, args.entity_rows])
    frames = {n: entity_frame(data, n, args.seed) for n in sizes if n}
    print(f"data {data.tag}: {time.perf_counter() - t0:.1f} s ({data.dir})", flush=True)

    stamp = stamp_path()
    loaded = json.loads(stamp.read_text()) if stamp.exists() else {}
    fresh = args.reload or loaded.get("tag") != data.tag
    if fresh:
        print("stores: reset (drop schema, flush db)", flush=True)
        reset(base, client)
    if fresh or not loaded.get("featureline"):
        load_s = load_featureline(data, base, redis_url, dsn)
        stamp.write_text(json.dumps({"tag": data.tag, "featureline": True}))
    else:  # the keys are counted below: a store emptied since fails that check
        load_s = {}
        print(f"  featureline: {data.tag} already loaded into db {REDIS_DB} / {PG_SCHEMA} (--reload to redo)",
              flush=True)

    repo = CACHE / "feast_repo"
    if fresh and repo.exists():
        shutil.rmtree(repo)
    feast = None if args.no_feast else Feast()
    try:
        if feast is not None:
            files = {k: str(v) for k, v in data.feast.items()}
            feast_redis = f"{redis_url.split('//', 1)[1].rsplit('/', 1)[0].split('@')[-1]},db={REDIS_DB}"
            setup = feast.call("setup", repo=str(repo), files=files, redis=feast_redis,
                               materialize=fresh or not loaded.get("feast"))
            if setup["materialize_s"] is not None:
                print(f"  feast apply {setup['apply_s']:.1f} s, materialize {setup['materialize_s']:.1f} s "
                      f"(featureline features load: {sum(load_s.values()):.1f} s)", flush=True)
            stamp.write_text(json.dumps({"tag": data.tag, "featureline": True, "feast": True}))
        ours_keys, feast_keys = key_spaces(client)
        print(f"  Redis db {REDIS_DB}: {ours_keys:,} featureline keys (features:*), {feast_keys:,} "
              "Feast keys", flush=True)
        cards = max(args.events // 10, 1)
        # one hash per card with transactions (its card_txn hot fields, its aggregations), per
        # card (its profile) and per merchant, plus one more key per schema; Feast: one hash per
        # entity key (card, merchant)
        active = pc.count_distinct(data.events.column("card_id")).as_py()
        assert ours_keys == 2 * active + cards + args.merchants + 3, (ours_keys, active)
        assert feast is None or feast_keys == cards + args.merchants, feast_keys

        from features import FeatureStore

        fs = FeatureStore(redis_url=redis_url, postgres_dsn=dsn, schemas=SCHEMAS, views=VIEWS,
                          search_path=PG_SCHEMA) if _accepts_views(FeatureStore) else None
        has_api = fs is not None and all(hasattr(fs, a) for a in ("online_view", "online_view_dicts",
                                                                  "historical_view"))
        if not has_api:
            print(MISSING, flush=True)
        res = Results()
        rng = np.random.default_rng(args.seed + 2)
        ev = data.events
        pairs_c = ev.column("card_id").to_numpy(zero_copy_only=False)
        pairs_m = ev.column("merchant_id").to_numpy()

        def sample(batch: int, count: int) -> list[list[list[Any]]]:
            idx = rng.integers(0, len(pairs_c), (count, batch))
            return [[[str(pairs_c[i]), int(pairs_m[i])] for i in row] for row in idx]

        bench = Rounds(res, feast, fs if has_api else None, raw_reader(redis_url), sample, data)
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}  load average {os.getloadavg()[0]:.2f} (1 min, {os.cpu_count()} cores)",
                  flush=True)
            if not args.no_historical:
                for n, frame in frames.items():
                    bench.historical(rnd, n, frame, check=n == max(frames))
            for batch, reps in ((1, args.reps), (100, args.reps_100)):
                bench.online(rnd, batch, reps)
        # ---- HTTP, 1 row
        if not args.no_http:
            http_rounds(args, res, rng, sample, repo, redis_url, dsn, has_api)
        res.summary()
    finally:
        if feast is not None:
            feast.close()
        client.close()
    return 0


class Rounds:
    """One round of each in-process measure, the contenders in an order rotating by round."""

    def __init__(self, res: Results, feast: Feast | None, fs: Any, raw: Callable[[Any], Any],
                 sample: Callable[[int, int], list[list[list[Any]]]], data: Data) -> None:
        self.res, self.feast, self.fs, self.raw, self.sample, self.data = res, feast, fs, raw, sample, data
        self.checked = False
        self.online_checked = False

    def historical(self, rnd: int, n: int, frame: Path, *, check: bool) -> None:
        measure = f"historical {n:,}"
        table = pq.read_table(frame)
        ours: list[pa.Table] = []
        feast_out = self.data.dir / f"feast_hist_{n}.parquet"

        def run_ours() -> None:
            if self.fs is None:
                print(f"round {rnd + 1}  {measure:<22} featureline: {MISSING}", flush=True)
                return
            t = time.perf_counter()
            out = self.fs.historical_view(VIEW, table, timestamp_column="timestamp")
            self.res.rate(rnd, measure, "featureline", n, time.perf_counter() - t)
            ours.append(out)

        def run_feast() -> None:
            if self.feast is None:
                return
            want = check and not self.checked
            r = self.feast.call("historical", frame=str(frame), out=str(feast_out) if want else None)
            self.res.rate(rnd, measure, "feast", n, r["seconds"])

        for fn in rotate([run_ours, run_feast], rnd):
            fn()
        if check and not self.checked and self.feast is not None:
            check_historical(frame, feast_out, ours[0] if ours else None)
            self.checked = True

    def online(self, rnd: int, batch: int, reps: int) -> None:
        measure = f"online {batch} row{'s' if batch > 1 else ''}"
        warm = max(reps // 10, 5)
        batches = self.sample(batch, reps + warm)
        tuples = [[(c, m) for c, m in b] for b in batches]
        rows = [[{"card_id": c, "merchant_id": m} for c, m in b] for b in batches]
        fs = self.fs
        def feast() -> list[int]:
            assert self.feast is not None
            reply = self.feast.call("online", batches=batches, warmup=warm)
            if not self.online_checked and batch > 1:
                check_online(reply["sample"], batches[warm], self.raw(tuples[warm]))
                self.online_checked = True
            ns: list[int] = reply["ns"]
            return ns

        runners: list[tuple[str, Callable[[], list[int]]]] = [
            *([("feast", feast)] if self.feast is not None else []),
            (RAW, lambda: timed_calls(self.raw, tuples, warm))]
        if fs is not None:
            runners += [("featureline online_view",
                         lambda: timed_calls(lambda x: fs.online_view(VIEW, x), rows, warm)),
                        ("featureline online_view_dicts",
                         lambda: timed_calls(lambda x: fs.online_view_dicts(VIEW, x), rows, warm))]
        elif rnd == 0:
            print(f"round {rnd + 1}  {measure:<22} featureline: {MISSING}", flush=True)
        for who, fn in rotate(runners, rnd):
            self.res.latency(rnd, measure, who, fn())


def _accepts_views(cls: type) -> bool:
    import inspect

    return "views" in inspect.signature(cls.__init__).parameters


def http_rounds(args: Any, res: Results, rng: np.random.Generator, sample: Callable[[int, int], Any],
                repo: Path, redis_url: str, dsn: str, has_api: bool) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    runners: list[tuple[str, Callable[[list[Any]], Any]]] = []
    try:
        try:
            if args.no_feast:
                raise RuntimeError("--no-feast")
            fproc, fport = start_feast_serve(repo)
            procs.append(fproc)
            fconn = Http("127.0.0.1", fport)

            def feast_post(b: list[Any]) -> Any:
                body = json.dumps({"feature_service": VIEW, "entities": {
                    "card_id": [c for c, _ in b], "merchant_id": [m for _, m in b]}}).encode()
                return fconn.post("/get-online-features", body)

            reply = feast_post(sample(1, 1)[0])
            print(f"  feast serve: 127.0.0.1:{fport}; a reply: {reply[:300]!r}", flush=True)
            runners.append(("feast serve", feast_post))
        except Exception as exc:  # recorded: the comparison runs without Feast's server
            print(f"  feast serve did not start: {exc!r} (see {CACHE / 'feast_serve.log'})", flush=True)
        if has_api:
            try:
                proc, host, port = start_features_serve(redis_url, dsn)
                procs.append(proc)
                conn = Http(host, port)

                def ours_post(b: list[Any]) -> Any:
                    body = json.dumps({"rows": [{"card_id": c, "merchant_id": m} for c, m in b]}).encode()
                    return conn.post(f"/v1/views/{VIEW}/online", body)

                reply = ours_post(sample(1, 1)[0])
                print(f"  features serve: {host}:{port}; a reply: {reply[:300]!r}", flush=True)
                runners.append(("features serve", ours_post))
            except Exception as exc:  # recorded: the summary of the other measures still prints
                print(f"  features serve (views) did not answer: {exc!r}", flush=True)
        else:
            print(f"  HTTP 1 row: featureline: {MISSING}", flush=True)
        for rnd in range(args.rounds):
            warm = max(args.reps // 10, 5)
            batches = sample(1, args.reps + warm)
            for who, fn in rotate(runners, rnd):
                res.latency(rnd, "HTTP 1 row", who, timed_calls(fn, batches, warm))
    finally:
        for p in procs:
            stop(p)


if __name__ == "__main__":
    raise SystemExit(main())
