"""Benchmark: the metrics calls featureline makes on its paths, hand-written registry vs
``prometheus_client`` (issue 21).

Usage::

    .venv/bin/python bench/metrics.py [--rounds 7] [--old-rev 264a422]

No services. Contenders, each running featureline's own metric classes (``RunMetrics``,
``SdkMetrics``) so that the calls are exactly the ones the code paths make:

- ``hand-written``: ``features/metrics.py`` as of ``--old-rev`` (the registry, families
  and text writer this issue replaces), loaded from git;
- ``prometheus_client``: the same classes of ``--old-rev`` over ``prometheus_client``
  metrics in a ``CollectorRegistry`` (a duck-typed factory: ``counter()`` ...), rendered by
  ``generate_latest``; its histogram has no batch observe, so the stream's latencies are
  observed one by one;
- ``features.observe.metrics``: the module as it is in this checkout (after the replacement: what
  ships).

Cases (per operation, in ns):

- ``sdk lookup``: ``SdkMetrics.lookup`` as ``FeatureStore.online`` calls it once per call
  (one histogram observe, one counter inc; children bound once);
- ``sdk lookup + fallback + miss``: the same with the two other counters;
- ``ingest request``: what ``features serve`` does per request: ``requests.labels(route,
  status).inc()``, ``seconds.labels(route).observe()``, two ``records.labels(..).inc()``
  (label values resolved on every call);
- ``run unit``: ``RunMetrics.unit`` (5 rules), two ``write`` and ``event_time``, per batch
  of the loader or the stream;
- ``stream latency (2,000)``: ``RunMetrics.latency`` of one 2,000-record micro-batch;
- ``exposition``: rendering a registry holding a stream job's ``RunMetrics`` (20 rules, 2
  partitions) and an ``SdkMetrics`` with 4 methods, as a scrape does.

Rounds are interleaved (every contender's case in a rotating order within a round); each
result is printed when measured, then the median, min and max per case and contender.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import prometheus_client  # noqa: E402

import features.observe.metrics as current  # noqa: E402

RULES = {f"field_{i}.min": 3 for i in range(5)}


def load_old(rev: str) -> types.ModuleType:
    """``features/metrics.py`` at git ``rev`` as a module of its own."""
    source = subprocess.run(["git", "show", f"{rev}:features/metrics.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("_metrics_at_" + rev, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:features/metrics.py", "exec"), module.__dict__)
    return module


class PromFactory:
    """The hand-written ``Registry``'s factory methods over ``prometheus_client``."""

    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Any:
        return prometheus_client.Counter(name, help, labelnames, registry=self.registry)

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Any:
        return prometheus_client.Gauge(name, help, labelnames, registry=self.registry)

    def histogram(self, name: str, help: str, labelnames: Sequence[str] = (),
                  buckets: Sequence[float] = ()) -> Any:
        return prometheus_client.Histogram(name, help, labelnames, registry=self.registry,
                                           buckets=sorted(buckets))

    def exposition(self) -> str:
        return prometheus_client.generate_latest(self.registry).decode()


class _LoopLatency:
    """``observe_many`` for a prometheus_client histogram child: one observe per value."""

    def __init__(self, child: Any) -> None:
        self.child = child

    def observe_many(self, values: Any) -> None:
        observe = self.child.observe
        for v in np.asarray(values, dtype=np.float64).tolist():
            observe(v)


def contenders(old: types.ModuleType) -> dict[str, tuple[Callable[[], Any], types.ModuleType]]:
    """name -> (a fresh registry, the module whose RunMetrics/SdkMetrics run over it)."""
    return {"hand-written": (old.Registry, old),
            "prometheus_client": (PromFactory, old),
            "features.observe.metrics": (current.Registry, current)}


def case_sdk(make: Callable[[], Any], mod: types.ModuleType, n: int, *, fallback: int = 0,
             missed: int = 0) -> float:
    sdk = mod.SdkMetrics(make())
    lookup = sdk.lookup
    lookup("s", "online", 0.00017, entities=1, fallback=fallback, missed=missed)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        lookup("s", "online", 0.00017, entities=1, fallback=fallback, missed=missed)
    return (time.perf_counter_ns() - t0) / n


def case_ingest(make: Callable[[], Any], mod: types.ModuleType, n: int) -> float:
    r = make()
    requests = r.counter("featureline_ingest_requests_total", "x", ["route", "status"])
    records = r.counter("featureline_ingest_records_total", "x", ["schema", "outcome"])
    seconds = r.histogram("featureline_ingest_request_seconds", "x", ["route"],
                          buckets=mod.SECONDS_BUCKETS)
    route = "/v1/schemas/{name}/events"
    t0 = time.perf_counter_ns()
    for _ in range(n):
        requests.labels(route, str(200)).inc()
        seconds.labels(route).observe(0.003)
        records.labels("s", "accepted").inc(980)
        records.labels("s", "rejected").inc(20)
    return (time.perf_counter_ns() - t0) / n


def case_unit(make: Callable[[], Any], mod: types.ModuleType, n: int) -> float:
    m = mod.RunMetrics(make(), "s")
    t0 = time.perf_counter_ns()
    for i in range(n):
        m.unit(read=131_072, stored=128_000, rejected=2_000, already_present=1_072, by_rule=RULES)
        m.write("postgres", 0.8)
        m.write("redis", 1.2)
        m.event_time(1_700_000_000.0 + i)
    return (time.perf_counter_ns() - t0) / n


def case_latency(make: Callable[[], Any], mod: types.ModuleType, n: int) -> float:
    m = mod.RunMetrics(make(), "s", stream=True)
    if isinstance(m._latency, prometheus_client.Histogram):  # the contender without a batch observe
        m._latency = _LoopLatency(m._latency)
    values = np.random.default_rng(1).exponential(0.4, 2_000)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        m.latency(values)
    return (time.perf_counter_ns() - t0) / n


def filled(make: Callable[[], Any], mod: types.ModuleType) -> Any:
    r = make()
    m = mod.RunMetrics(r, "credit_applicant", stream=True)
    for i in range(50):
        m.unit(read=2_000, stored=1_900, rejected=80, already_present=20,
               by_rule={f"field_{j}.rule_{j % 3}": 1 + i % 4 for j in range(20)})
        m.write("postgres", 0.01 * (1 + i % 7))
        m.write("redis", 0.02 * (1 + i % 5))
        m.event_time(1_700_000_000.0 + i)
        m.aggregation(accepted=100, late=1, duplicates=2)
        m.dead_letters(3)
        for p in range(2):
            m.lag("applicants", p, 100 - i)
    if isinstance(m._latency, prometheus_client.Histogram):
        m._latency = _LoopLatency(m._latency)
    m.latency(np.linspace(0.01, 3.0, 2_000))
    sdk = mod.SdkMetrics(r)
    for method in ("online", "online_dicts", "online_async", "historical"):
        for i in range(100):
            sdk.lookup("credit_applicant", method, 0.0002 * (1 + i % 9), entities=1 + i % 10,
                       fallback=i % 2, missed=i % 3)
        sdk.error("credit_applicant", method)
    return r


def case_exposition(make: Callable[[], Any], mod: types.ModuleType, n: int) -> float:
    r = filled(make, mod)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        r.exposition()
    return (time.perf_counter_ns() - t0) / n


CASES: dict[str, tuple[Callable[..., float], int]] = {
    "sdk lookup": (case_sdk, 50_000),
    "sdk lookup + fallback + miss": (lambda make, mod, n: case_sdk(make, mod, n, fallback=1, missed=1),
                                     50_000),
    "ingest request": (case_ingest, 20_000),
    "run unit": (case_unit, 5_000),
    "stream latency (2,000)": (case_latency, 100),
    "exposition": (case_exposition, 100),
}


def fmt(ns: float) -> str:
    return f"{ns / 1000:,.2f} µs" if ns >= 10_000 else f"{ns:,.0f} ns"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--old-rev", default="264a422",
                    help="the commit whose features/metrics.py is the hand-written contender")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every case's operation count")
    args = ap.parse_args(argv)
    old = load_old(args.old_rev)
    who = contenders(old)
    from importlib.metadata import version

    print(f"prometheus_client {version('prometheus_client')}; hand-written = features/metrics.py at "
          f"{args.old_rev}; {args.rounds} rounds; Python "
          f"{sys.version.split()[0]}", flush=True)
    results: dict[tuple[str, str], list[float]] = {}
    names = list(who)
    for r in range(args.rounds):
        for case, (fn, n) in CASES.items():
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                make, mod = who[name]
                ns = fn(make, mod, max(1, int(n * args.scale)))
                results.setdefault((case, name), []).append(ns)
                print(f"round {r + 1}: {case:<30} {name:<18} {fmt(ns):>12} per op", flush=True)
    print(f"\n{'case (per operation)':<30} {'contender':<18} {'median':>12} {'min':>12} {'max':>12}"
          f" {'vs hand-written':>16}")
    for case in CASES:
        base = statistics.median(results[(case, "hand-written")])
        for name in names:
            v = results[(case, name)]
            med = statistics.median(v)
            print(f"{case:<30} {name:<18} {fmt(med):>12} {fmt(min(v)):>12} {fmt(max(v)):>12}"
                  f" {med / base:>15.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
