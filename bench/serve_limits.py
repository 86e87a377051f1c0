"""Benchmark (issue 45, items 1 and 3): what one request can cost a ``features serve`` view
worker, and whether the worker keeps answering ``/healthz`` while it works.

Usage::

    PYTHONPATH=$PWD .venv/bin/python bench/serve_limits.py [--rounds 3] [--events 100000]

Data: bench/views.py's three schemas and its view ``card_scoring`` (``--events``
transactions, ``--merchants`` merchants), loaded once into Postgres ``search_path``
bench_serve_limits and Redis db 9 (remembered in ``.cache/bench-serve-limits/loaded.json``).

Each scenario runs on a fresh ``features serve --no-ingest --workers 1`` (default limits:
16 MiB bodies, ``--max-view-rows`` 1,000, ``--max-errors`` 1,000), so that the worker's
peak resident memory (``VmHWM``) above its state after one warm-up request is the
scenario's own. Scenarios (``--requests`` each, the order rotating by round):

- ``valid 1000``: 1,000 valid request rows (the row limit): 200;
- ``invalid 1000 x 16 KB``: 1,000 rows whose key holds 16 KB of text (a 16 MB body): 422;
- ``2M {}``: ``{"rows": [{}, {}, ...]}`` with 2,000,000 objects (6 MB): 413;
- ``1001 rows``: one row past the limit: 413;
- ``nested 100k``: ``[`` 100,000 deep: 400.

Per scenario: the status, the answer's size, seconds per request, the worker's peak memory
above its warm state (MB), and ``/healthz`` latency on a second connection polled every
5 ms during the requests (p50 / max, ms); the baseline is ``/healthz`` on an idle worker.
Every result is printed as it is measured, then median [min..max] over rounds.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from features.config import resolve_settings  # noqa: E402
from views import generate, load_featureline, start_features_serve, stop  # noqa: E402

PG_SCHEMA = "bench_serve_limits"
REDIS_DB = 9
CACHE = ROOT / ".cache" / "bench-serve-limits"
ROUTE = "/v1/views/card_scoring/online"


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def worker_pid(server_pid: int) -> int:
    """The process answering requests: the descendant with the largest resident set, or
    the server itself (one worker runs in the server's process)."""
    return max([server_pid, *descendants(server_pid)], key=lambda p: status_kb(p, "VmRSS"))


def post(conn: http.client.HTTPConnection, body: bytes) -> tuple[int, int]:
    conn.request("POST", ROUTE, body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    return r.status, len(data)


def bodies(cards: list[str], merchants: list[int]) -> dict[str, tuple[bytes, int]]:
    """Each scenario's body and the status it must get."""
    valid = [{"card_id": c, "merchant_id": m} for c, m in zip(cards[:1000], merchants[:1000], strict=True)]
    invalid = [{"card_id": c, "merchant_id": "x" * 16_000} for c in cards[:1000]]
    return {
        "valid 1000": (json.dumps({"rows": valid}).encode(), 200),
        "invalid 1000 x 16 KB": (json.dumps({"rows": invalid}).encode(), 422),
        "2M {}": (b'{"rows": [' + b",".join([b"{}"] * 2_000_000) + b"]}", 413),
        "1001 rows": (json.dumps({"rows": valid + valid[:1]}).encode(), 413),
        "nested 100k": (b'{"rows": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400),
    }


def healthz_poll(host: str, port: int, stop_at: threading.Event, out: list[float]) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    while not stop_at.is_set():
        t0 = time.perf_counter()
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        out.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.005)
    conn.close()


def run_scenario(name: str, body: bytes, want: int, requests: int, redis_url: str, dsn: str
                 ) -> dict[str, float]:
    proc, host, port = start_features_serve(redis_url, dsn)
    try:
        pid = worker_pid(proc.pid)
        conn = http.client.HTTPConnection(host, port, timeout=120)
        status, _ = post(conn, b'{"rows": [{"card_id": "c1", "merchant_id": 1}]}')
        assert status == 200, status
        idle: list[float] = []
        for _ in range(50):
            t0 = time.perf_counter()
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            idle.append((time.perf_counter() - t0) * 1000)
        warm_kb = status_kb(pid, "VmRSS")
        lat: list[float] = []
        stop_at = threading.Event()
        poller = threading.Thread(target=healthz_poll, args=(host, port, stop_at, lat))
        poller.start()
        t0 = time.perf_counter()
        size = 0
        for _ in range(requests):
            status, size = post(conn, body)
            if status != want:
                raise RuntimeError(f"{name}: status {status}, expected {want}")
        seconds = (time.perf_counter() - t0) / requests
        stop_at.set()
        poller.join()
        peak_kb = status_kb(pid, "VmHWM")
        conn.close()
    finally:
        stop(proc)
    lat.sort()
    return {"status": status, "answer_kb": size / 1024, "s_per_request": seconds,
            "peak_mb_above_warm": (peak_kb - warm_kb) / 1024,
            "healthz_p50_ms": statistics.median(lat) if lat else float("nan"),
            "healthz_max_ms": lat[-1] if lat else float("nan"), "healthz_polls": len(lat),
            "idle_healthz_p50_ms": statistics.median(idle)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--merchants", type=int, default=1_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=5, help="requests per scenario and round")
    ap.add_argument("--seed", type=int, default=31)
    args = ap.parse_args(argv)
    import numpy as np
    import redis

    CACHE.mkdir(parents=True, exist_ok=True)
    base = resolve_settings(root=ROOT)
    redis_url = base.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    sep = "&" if "?" in base.postgres_dsn else "?"
    dsn = f"{base.postgres_dsn}{sep}options=-csearch_path%3D{PG_SCHEMA}"
    print(f"bench/serve_limits.py: events {args.events:,}, rounds {args.rounds}, {args.requests} requests "
          f"per scenario; {os.cpu_count()} cores (shared), load average {os.getloadavg()[0]:.2f}", flush=True)
    data = generate(args.events, args.merchants, args.seed)
    stamp = CACHE / "loaded.json"
    if not stamp.exists() or json.loads(stamp.read_text()).get("tag") != data.tag:
        import psycopg

        with psycopg.connect(base.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE")
            conn.execute(f"CREATE SCHEMA {PG_SCHEMA}")
        client = redis.Redis.from_url(redis_url)
        client.flushdb()
        client.close()
        load_featureline(data, base, redis_url, dsn)
        stamp.write_text(json.dumps({"tag": data.tag}))
    rng = np.random.default_rng(args.seed)
    idx = rng.integers(0, data.events.num_rows, 1001)
    cards = [str(c) for c in data.events.column("card_id").take(idx).to_pylist()]
    merchants = [int(m) for m in data.events.column("merchant_id").take(idx).to_pylist()]
    scenarios = bodies(cards, merchants)
    names = list(scenarios)
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for rnd in range(args.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for name in order:
            body, want = scenarios[name]
            r = run_scenario(name, body, want, args.requests, redis_url, dsn)
            results[name].append(r)
            print(f"round {rnd + 1} {name:<22} {int(r['status'])}  body {len(body) / 1e6:6.2f} MB  answer "
                  f"{r['answer_kb']:8.1f} KB  {r['s_per_request'] * 1000:8.1f} ms/request  peak +"
                  f"{r['peak_mb_above_warm']:6.1f} MB  /healthz p50 {r['healthz_p50_ms']:.2f} ms max "
                  f"{r['healthz_max_ms']:.2f} ms ({int(r['healthz_polls'])} polls; idle p50 "
                  f"{r['idle_healthz_p50_ms']:.2f} ms)", flush=True)
    print("\nmedian [min..max] over rounds")
    for name in names:
        rs = results[name]

        def agg(key: str, rs: list[dict[str, float]] = rs) -> str:
            xs = [r[key] for r in rs]
            return f"{statistics.median(xs):.2f} [{min(xs):.2f}..{max(xs):.2f}]"

        print(f"{name:<22} s/request {agg('s_per_request')}  peak MB above warm {agg('peak_mb_above_warm')}  "
              f"/healthz p50 ms {agg('healthz_p50_ms')}  max ms {agg('healthz_max_ms')}  "
              f"idle p50 ms {agg('idle_healthz_p50_ms')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
