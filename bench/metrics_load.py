"""Benchmark: what the metrics cost a real load, ``features load --metrics-port`` against
no metrics (issue 21).

Usage::

    .venv/bin/python bench/metrics_load.py [--rows 1000000] [--rounds 5] [--scrape-every 1.0]
                                           [--old-rev 264a422]

The same generated Parquet (``bench/batch_load.py``'s applicants, cached in
``.cache/bench``) is loaded by the library ``load`` into both stores, in one process, as
``features load`` does it. Contenders:

- ``no metrics``: ``load(...)`` without ``metrics``;
- ``--metrics-port``: what the CLI does with ``--metrics-port``: a ``Registry``, a
  ``RunMetrics`` passed to ``load`` and the endpoint (``serve``, port 0), scraped over HTTP
  every ``--scrape-every`` seconds (0: never) by a thread of this process, as a Prometheus
  at that interval would;
- ``hand-written (--old-rev)``: the same with ``features/metrics.py`` as of ``--old-rev``
  (the registry and server before prometheus_client), with ``--old-rev ''`` left out.

Rounds are interleaved, in a rotating order. Each load writes into a Postgres schema and
under a Redis key prefix of its own, both removed after it (outside the timing), so every
load stores everything. Prints each load's rows/s as soon as it is measured, then the
median, min and max per contender and the ratio of each to ``no metrics``: of the
medians, the median of the rounds' ratios, and each round's.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batch_load import dataset  # noqa: E402
from metrics import load_old  # noqa: E402

from features.config import resolve_settings  # noqa: E402
from features.ops.examples import applicant_schema  # noqa: E402

BASE = "no metrics"


def scraper(port: int, every: float, stop: threading.Event, counts: list[int]) -> None:
    while not stop.wait(every):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
            counts[0] += 1
        finally:
            conn.close()


def one_load(path: Path, compiled: Any, settings: Any, batch_rows: int, tag: str, module: Any,
             scrape_every: float) -> tuple[float, Any, int]:
    """One load into fresh namespaces; (seconds, summary, scrapes)."""
    import psycopg
    import redis

    from features.load import load

    schema = f"bench_metrics_{os.getpid()}_{tag}"
    prefix = f"bench-metrics-{os.getpid()}-{tag}:"
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"CREATE SCHEMA {schema}")
    metrics = server = None
    stop = threading.Event()
    scrapes = [0]
    thread = None
    if module is not None:  # as features.cli.load does with --metrics-port
        registry = module.Registry()
        metrics = module.RunMetrics(registry, compiled.name)
        server = module.serve(registry, 0)
        if scrape_every > 0:
            thread = threading.Thread(target=scraper, args=(server.port, scrape_every, stop, scrapes))
            thread.start()
    try:
        t0 = time.perf_counter()
        summary = load([path], compiled, settings, batch_rows=batch_rows, search_path=schema,
                       key_prefix=prefix, metrics=metrics)
        seconds = time.perf_counter() - t0
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        if server is not None:
            server.close()
    assert summary.adds_up and summary.stored + summary.rejected == summary.read
    if metrics is not None:  # the endpoint counted the run
        text = registry.exposition()
        assert f'schema="{compiled.name}"' in text
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    client = redis.Redis.from_url(settings.redis_url)
    keys: list[bytes] = []
    for key in client.scan_iter(match=prefix + "*", count=10_000):
        keys.append(key)
        if len(keys) >= 10_000:
            client.unlink(*keys)
            keys.clear()
    if keys:
        client.unlink(*keys)
    client.close()
    return seconds, summary, scrapes[0]


def main(argv: list[str] | None = None) -> int:
    import features.observe.metrics as current

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch-rows", type=int, default=131_072)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scrape-every", type=float, default=1.0, help="seconds between scrapes (0: none)")
    ap.add_argument("--old-rev", default="264a422",
                    help="also the hand-written metrics of this commit ('': leave them out)")
    args = ap.parse_args(argv)

    settings = resolve_settings(root=ROOT)
    compiled = applicant_schema()
    path = dataset(args.rows)
    contenders: dict[str, Any] = {BASE: None, "--metrics-port": current}
    if args.old_rev:
        contenders[f"hand-written ({args.old_rev})"] = load_old(args.old_rev)
    names = list(contenders)
    print(f"{args.rows:,} applicant rows ({path.name}), batches of {args.batch_rows:,}; "
          f"{args.rounds} rounds; scraped every {args.scrape_every:g} s; contenders: {', '.join(names)}",
          flush=True)
    results: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for i, name in enumerate(order):
            seconds, summary, scrapes = one_load(path, compiled, settings, args.batch_rows, f"{r}_{i}",
                                                 contenders[name], args.scrape_every)
            results[name].append(summary.read / seconds)
            print(f"round {r + 1}: {name:<24} {seconds:7.2f} s {summary.read / seconds:>10,.0f} rows/s"
                  f"  ({scrapes} scrapes)", flush=True)
        base = results[BASE][-1]
        print(f"round {r + 1}: ratio to {BASE}: " + ", ".join(
            f"{n} {results[n][-1] / base:.3f}" for n in names if n != BASE), flush=True)
    print(f"\n{'contender (rows/s)':<26}{'median':>10}{'min':>10}{'max':>10}{'medians':>9}"
          f"{'rounds':>8}  ratio to {BASE}: of the medians, median of the rounds', each round")
    base_med = statistics.median(results[BASE])
    for name in names:
        v = results[name]
        ratios = [x / b for x, b in zip(v, results[BASE], strict=True)]
        print(f"{name:<26}{statistics.median(v):>10,.0f}{min(v):>10,.0f}{max(v):>10,.0f}"
              f"{statistics.median(v) / base_med:>9.3f}{statistics.median(ratios):>8.3f}  "
              + ", ".join(f"{x:.3f}" for x in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
