"""Prometheus metrics: featureline's metrics on ``prometheus_client``.

``prometheus_client`` provides the metric types (counters, gauges and histograms with
labels), the text exposition format 0.0.4 (``generate_latest``), its parser and the HTTP
endpoint (``start_http_server``). This module adds what featureline needs around them:

- :class:`Registry`: a ``CollectorRegistry`` per run, store or worker, never the
  process-global default one (tests and several stores in one process never collide).
  Its ``counter``/``gauge``/``histogram`` return the family already registered under a
  name when the definition is the same (two ``FeatureStore`` objects sharing one
  registry, two schemas' :class:`RunMetrics`), and it leaves out prometheus_client's
  ``<name>_created`` series (creation times, which no featureline metric defines);
- :class:`BatchHistogram`, written here: the one histogram observed in bulk, the
  stream's produce -> stored latency of every record of a micro-batch.
  prometheus_client observes one value per call: 3-5 ms for a 2,000-record micro-batch
  against ~0.04 ms in one NumPy ``searchsorted`` (``bench/metrics.py``; bench/RESULTS.md,
  "Metrics overhead (issue 21)");
- :class:`MetricsServer`: prometheus_client's server with ``.port`` (port 0 picks a
  free one), ``.url``, an idempotent ``close()``, and a text source besides a registry
  (the stream job serves its subtasks' saved final values);
- :func:`parse_exposition` and :func:`sample_value`, on ``prometheus_client.parser``,
  for tests and tools.

Every name and label is listed in ``docs/operations.md``; :class:`RunMetrics` (the batch
loader and the stream job) and :class:`SdkMetrics` (``FeatureStore``) define them in one
place. Conventions (https://prometheus.io/docs/practices/naming/): base units in the name
(``_seconds``), counters end in ``_total``, histograms expose ``_bucket{le="..."}``
(cumulative, ending at ``+Inf``), ``_count`` and ``_sum``.

Thread-safe: every value has a lock (prometheus_client's; :class:`BatchHistogram` one per
family). A scrape can land between a histogram's ``_sum`` and its bucket being updated.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

log = logging.getLogger("features.metrics")

#: The Content-Type of what :meth:`Registry.exposition` returns: the text format 0.0.4,
#: which ``generate_latest`` writes and every Prometheus reads (prometheus_client's own
#: ``CONTENT_TYPE_LATEST`` is 0.0.4 up to 0.21, version 1.0.0 in 0.26).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Where the endpoint listens unless told otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"

MetricType = Literal["counter", "gauge", "histogram"]

# The classic names, checked here: prometheus_client 0.26 accepts any UTF-8 name, which
# the 0.0.4 text format would then write with its characters replaced by underscores.
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

#: Seconds, from a millisecond to a minute: store writes, lookups, produce -> stored.
SECONDS_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Rows per batch (a Parquet batch holds up to 131,072 rows; a stream micro-batch 2,000).
ROWS_BUCKETS: tuple[float, ...] = (1, 10, 100, 500, 1_000, 2_000, 5_000, 10_000, 50_000, 100_000,
                                   131_072, 500_000, 1_000_000)

_F = TypeVar("_F")
#: A bound as prometheus_client writes ``le`` (Go's formatting: ``0.005``, ``1.0``, ``1e+06``);
#: typed here, untyped there.
_go_float: Callable[[float], str] = floatToGoString


def _bounds(name: str, buckets: Sequence[float]) -> tuple[float, ...]:
    """Finite, distinct, ascending bucket bounds (+Inf is implied); ValueError otherwise."""
    bounds = tuple(sorted(float(b) for b in buckets if not math.isinf(b)))
    if not bounds or len(set(bounds)) != len(bounds) or any(math.isnan(b) for b in bounds):
        raise ValueError(f"histogram {name}: buckets must be distinct numbers, got {list(buckets)}")
    return bounds


# --------------------------------------------------------------------------- the hand-written histogram


class BatchChild:
    """One series of a :class:`BatchHistogram`."""

    def __init__(self, lock: threading.Lock, bounds: tuple[float, ...]) -> None:
        self._lock = lock
        self._bounds = np.asarray(bounds, dtype=np.float64)
        self._counts = [0] * (len(bounds) + 1)     # per bucket (not cumulative); last: > every bound
        self._sum = 0.0

    def observe_many(self, values: Iterable[float]) -> None:
        """Count many observations at once (a NumPy array or any iterable of numbers, in
        the family's unit); NaN values are left out (prometheus_client's observe would
        turn ``_sum`` into NaN for good)."""
        arr = np.asarray(values if hasattr(values, "__len__") else list(values), dtype=np.float64)
        arr = arr[~np.isnan(arr)]
        if arr.size == 0:
            return
        # side="left": the first bound >= the value, the le ("less than or equal") bucket
        per = np.bincount(np.searchsorted(self._bounds, arr, side="left"), minlength=len(self._counts))
        total = float(arr.sum())
        with self._lock:
            for i, n in enumerate(per.tolist()):
                self._counts[i] += n
            self._sum += total

    def observe(self, value: float) -> None:
        """One observation (NaN is left out)."""
        self.observe_many((value,))

    def snapshot(self) -> tuple[list[int], float]:
        """The per-bucket counts and the sum; the caller holds the family's lock."""
        return list(self._counts), self._sum


class BatchHistogram:
    """A histogram whose series are observed a batch of values at a time
    (:meth:`BatchChild.observe_many`), exposed through a :class:`Registry` as
    prometheus_client's histograms are: same ``le`` labels, ``_bucket``, ``_count``,
    ``_sum``. Made by :meth:`Registry.batch_histogram`."""

    def __init__(self, name: str, help: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self.buckets = _bounds(name, buckets)
        self._le = [_go_float(b) for b in self.buckets] + ["+Inf"]
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], BatchChild] = {}
        if not self.labelnames:
            self._children[()] = BatchChild(self._lock, self.buckets)

    def labels(self, *values: object) -> BatchChild:
        """The series for these label values (by position; values become text)."""
        if len(values) != len(self.labelnames):
            raise ValueError(f"metric {self.name} has label names {list(self.labelnames)}, "
                             f"got {len(values)} values")
        key = tuple(str(v) for v in values)
        with self._lock:
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = BatchChild(self._lock, self.buckets)
            return child

    def describe(self) -> list[Metric]:
        """The family without samples: what the registry checks names against."""
        return [HistogramMetricFamily(self.name, self.help, labels=self.labelnames)]

    def collect(self) -> list[Metric]:
        """The family with a series per label values (what a scrape renders)."""
        with self._lock:
            series = [(key, *c.snapshot()) for key, c in self._children.items()]
        family = HistogramMetricFamily(self.name, self.help, labels=self.labelnames)
        for key, counts, total in series:
            family.add_metric(list(key), list(zip(self._le, map(float, itertools.accumulate(counts)),
                                                  strict=True)), total)
        return [family]


# --------------------------------------------------------------------------- the registry


class Registry(CollectorRegistry):
    """The metric families one endpoint serves: a prometheus_client ``CollectorRegistry``
    (so ``generate_latest``, ``push_to_gateway`` and the like take it as it is).

    ``counter``, ``gauge``, ``histogram`` and ``batch_histogram`` create a family, or
    return the one already there under that name with the same type, labels (and
    buckets), so several users can share a registry; another definition raises
    ValueError, as do an invalid metric or label name, a label reserved to Prometheus
    (``__*``, a histogram's ``le``), a counter whose name does not end in ``_total`` and
    histogram buckets that are not distinct numbers.
    """

    def __init__(self) -> None:
        super().__init__()
        self._define_lock = threading.Lock()
        self._defined: dict[str, tuple[tuple[object, ...], Any]] = {}

    def _family(self, kind: MetricType | Literal["batch_histogram"], name: str, labelnames: Sequence[str],
                buckets: tuple[float, ...] | None, make: Callable[[], _F]) -> _F:
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        labels = tuple(labelnames)
        for label in labels:
            if not _LABEL.match(label) or label.startswith("__") or (buckets is not None and label == "le"):
                raise ValueError(f"invalid label name {label!r} for metric {name}")
        if len(set(labels)) != len(labels):
            raise ValueError(f"metric {name}: duplicate label names {list(labels)}")
        definition = (kind, labels, buckets)
        with self._define_lock:
            have = self._defined.get(name)
            if have is not None:
                if have[0] != definition:
                    raise ValueError(f"metric {name} is already registered with another definition")
                return cast(_F, have[1])
            family = make()  # registers itself (or is registered below): DuplicateTimeseries is a ValueError
            self._defined[name] = (definition, family)
            return family

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name!r}: counter names end in _total")
        return self._family("counter", name, labelnames, None,
                            lambda: Counter(name, help, labelnames, registry=self))

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        """A gauge. ``set_function`` callbacks run at scrape time; one that raises fails
        the scrape, so it should return NaN for "unknown" instead."""
        return self._family("gauge", name, labelnames, None,
                            lambda: Gauge(name, help, labelnames, registry=self))

    def histogram(self, name: str, help: str, labelnames: Sequence[str] = (),
                  buckets: Sequence[float] = SECONDS_BUCKETS) -> Histogram:
        """A histogram (``buckets``: finite bounds, any order; +Inf is added). Its
        ``observe`` takes one value; never give it NaN (its ``_sum`` would stay NaN)."""
        bounds = _bounds(name, buckets)
        return self._family("histogram", name, labelnames, bounds,
                            lambda: Histogram(name, help, labelnames, registry=self, buckets=bounds))

    def batch_histogram(self, name: str, help: str, labelnames: Sequence[str] = (),
                        buckets: Sequence[float] = SECONDS_BUCKETS) -> BatchHistogram:
        """A :class:`BatchHistogram`: for values that come thousands at a time."""
        bounds = _bounds(name, buckets)

        def make() -> BatchHistogram:
            family = BatchHistogram(name, help, labelnames, bounds)
            self.register(family)
            return family

        return self._family("batch_histogram", name, labelnames, bounds, make)

    def families(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Every family defined so far: its name -> (its type: ``counter``, ``gauge``,
        ``histogram``, ``batch_histogram``; its label names). The generated alerting rules
        are checked against it (``tests/unit/test_alerts.py``)."""
        with self._define_lock:
            return {name: (str(d[0]), tuple(cast(tuple[str, ...], d[1])))
                    for name, (d, _) in sorted(self._defined.items())}

    def collect(self) -> Iterable[Metric]:
        """Every family, less the ``<name>_created`` samples of counters and histograms."""
        for metric in super().collect():
            if metric.type in ("counter", "histogram"):
                created = metric.name + "_created"
                metric.samples = [s for s in metric.samples if s.name != created]
            yield metric

    def exposition(self) -> str:
        """Every family in the text exposition format 0.0.4 (``generate_latest``; ends
        with a newline; labels in name order)."""
        return generate_latest(self).decode("utf-8")


# --------------------------------------------------------------------------- reading it back


@dataclass(frozen=True)
class Sample:
    """One sample line: ``name{labels} value``."""

    name: str
    labels: dict[str, str]
    value: float


def parse_exposition(text: str) -> list[Sample]:
    """The samples of a text exposition (0.0.4, timestamps ignored), in their order;
    ``# HELP``/``# TYPE`` and other comment lines are skipped. prometheus_client's
    parser: it raises ValueError on most lines that are not the format, but it is laxer
    than Prometheus' own."""
    return [Sample(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def sample_value(samples: Iterable[Sample], name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` whose labels include ``labels`` (the sum when
    several match), or None when none does."""
    hits = [s.value for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(hits) if hits else None


# --------------------------------------------------------------------------- the endpoint


class _TextCollector:
    """A collector whose families are the text exposition ``render()`` returns at scrape
    time (parsed back, then written again by prometheus_client)."""

    def __init__(self, render: Callable[[], str]) -> None:
        self._render = render

    def collect(self) -> Iterable[Metric]:
        return text_string_to_metric_families(self._render())


class MetricsServer:
    """prometheus_client's HTTP endpoint (``start_http_server``) on ``host:port``, served
    from a daemon thread until :meth:`close`: a registry, or the exposition text
    ``source()`` returns (re-read at every scrape). Every path answers the metrics, in the
    text format 0.0.4 (or OpenMetrics when the scraper asks for it, as Prometheus does).

    What the wrapper adds: :attr:`port` (port 0 picks a free port), :attr:`url`, an
    idempotent :meth:`close` that frees the port, and the text source, which
    prometheus_client's server does not take. OSError when the port is taken."""

    def __init__(self, source: CollectorRegistry | Callable[[], str], port: int,
                 host: str = DEFAULT_HOST) -> None:
        if isinstance(source, CollectorRegistry):
            registry = source
        else:
            registry = CollectorRegistry()
            registry.register(_TextCollector(source))
        self._httpd, self._thread = start_http_server(port, host, registry)
        self.host = host
        self.port: int = self._httpd.server_port
        self._lock = threading.Lock()
        self._closed = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._httpd.shutdown()
        self._thread.join(5)
        self._httpd.server_close()


def serve(source: CollectorRegistry | Callable[[], str], port: int,
          host: str = DEFAULT_HOST) -> MetricsServer:
    """Serve ``source`` (a registry, or a function returning exposition text) on
    ``host:port`` (OSError when the port is taken)."""
    return MetricsServer(source, port, host)


def serve_first_free(registry: CollectorRegistry, ports: range,
                     host: str = DEFAULT_HOST) -> MetricsServer | None:
    """Serve ``registry`` on the first port of ``ports`` that is free; None when none is
    (a warning is logged: metrics are never a reason to fail a job)."""
    for port in ports:
        try:
            return MetricsServer(registry, port, host)
        except OSError:
            continue
    log.warning("metrics: no free port in %s-%s on %s; this process serves no metrics",
                ports.start, ports.stop - 1, host)
    return None


def sleep_interruptibly(seconds: float, step: float = 0.25) -> None:
    """``time.sleep(seconds)`` in short steps, so that Ctrl-C ends it at once.

    A process-directed SIGINT may be delivered to any thread (the metrics server's, a
    driver's); CPython then only sets a flag for the main thread, which sees it when its
    sleep returns: one long ``time.sleep`` would keep an interrupted process alive to its end."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, step))


def linger(server: MetricsServer | None, seconds: float) -> None:
    """Keep ``server`` up ``seconds`` more (so a scraper sees the final values), then close it."""
    if server is None:
        return
    try:
        sleep_interruptibly(seconds)
    finally:
        server.close()


# --------------------------------------------------------------------------- featureline's metrics


class AggregationMetrics:
    """The windowed aggregations' event outcomes (the loader's backfill, the stream's
    aggregation writer): ``accepted + late + duplicate`` = events."""

    def __init__(self, registry: Registry, schema: str) -> None:
        self.registry = registry
        self.schema = schema
        self._events = registry.counter("featureline_aggregation_events_total",
                                        "Events the windowed aggregations saw, by outcome (accepted, late, "
                                        "duplicate).", ["schema", "outcome"])

    def add(self, *, accepted: int, late: int, duplicates: int) -> None:
        for outcome, n in (("accepted", accepted), ("late", late), ("duplicate", duplicates)):
            self._events.labels(self.schema, outcome).inc(n)


class RunMetrics:
    """The loader's and the stream job's metrics for one schema (every series has a
    ``schema`` label). The counters add up like the run summary:
    ``rows_read == rows_stored + rows_rejected + rows_already_present``. ``stream``
    adds the stream job's own (consumer lag, produce -> stored latency, dead letters)."""

    def __init__(self, registry: Registry, schema: str, *, stream: bool = False) -> None:
        self.registry = registry
        self.schema = schema
        r = registry
        self._read = r.counter("featureline_rows_read_total",
                               "Input rows read (Parquet rows, Kafka records).", ["schema"]).labels(schema)
        self._stored = r.counter("featureline_rows_stored_total",
                                 "Rows newly stored in the cold store (Postgres).", ["schema"]).labels(schema)
        self._rejected = r.counter("featureline_rows_rejected_total",
                                   "Input rows rejected (each counted once, whatever the number of rules "
                                   "it failed).", ["schema"]).labels(schema)
        self._present = r.counter("featureline_rows_already_present_total",
                                  "Valid rows the cold store already held, or rows of batches committed by "
                                  "an earlier run.", ["schema"]).labels(schema)
        self._rejects = r.counter("featureline_rejects_total",
                                  "Rule violations: one per rejected row and failed rule (rule is the rule "
                                  "id, <field>.<kind>).", ["schema", "field", "rule"])
        self._write = r.histogram("featureline_write_seconds",
                                  "Seconds to write one batch to one store (retries included).",
                                  ["schema", "store"], SECONDS_BUCKETS)
        self._batch = r.histogram("featureline_batch_rows",
                                  "Input rows per batch (micro-batch in the stream).", ["schema"],
                                  ROWS_BUCKETS).labels(schema)
        self._newest = r.gauge("featureline_newest_event_time_seconds",
                               "Newest event time written, as Unix time in seconds; absent until a row is "
                               "written.", ["schema"])
        self._fresh = r.gauge("featureline_freshness_seconds",
                              "Seconds between now (at scrape) and the newest event time written; absent "
                              "until a row is written.", ["schema"])
        self._aggs = AggregationMetrics(registry, schema)
        self._gate_breaches = r.counter("featureline_gate_breaches_total",
                                        "Quality gates breached (docs/operations.md, \"Quality gates\"), by "
                                        "gate and what the breach did (fail: the load stored nothing; warn: "
                                        "it stored everything).", ["schema", "gate", "on_breach"])
        self._gate_measured = r.gauge("featureline_gate_measured",
                                      "The value a load's quality gate was judged on: the rate for a rate "
                                      "gate (rows / rows read), the rows read for min_rows.",
                                      ["schema", "gate"])
        self._lag: Gauge | None = None
        self._latency: BatchChild | None = None
        self._dead: Counter | None = None
        if stream:
            self._lag = r.gauge("featureline_consumer_lag", "Records behind the partition's end offset "
                                "(stream job; refreshed every few seconds).",
                                ["schema", "topic", "partition"])
            # every record of a micro-batch at once: BatchHistogram (prometheus_client observes one)
            self._latency = r.batch_histogram("featureline_produce_to_stored_seconds",
                                              "Seconds from a record's Kafka timestamp to its micro-batch "
                                              "being stored (stream job).", ["schema"],
                                              SECONDS_BUCKETS).labels(schema)
            self._dead = r.counter("featureline_dead_letters_total",
                                   "Rejects published to the dead-letter topic (stream job).",
                                   ["schema"]).labels(schema)
        self._newest_s: float | None = None
        self._lock = threading.Lock()

    def unit(self, *, read: int, stored: int, rejected: int, already_present: int,
             by_rule: Mapping[str, int]) -> None:
        """One batch accounted (``features.pipeline.write.account``); ``by_rule``: rule id -> count."""
        self._read.inc(read)
        self._stored.inc(stored)
        self._rejected.inc(rejected)
        self._present.inc(already_present)
        self._batch.observe(read)
        for rule, count in by_rule.items():
            field = rule.rsplit(".", 1)[0] if "." in rule else ""
            self._rejects.labels(self.schema, field, rule).inc(count)

    def write(self, store: str, seconds: float) -> None:
        self._write.labels(self.schema, store).observe(seconds)

    def event_time(self, newest_unix_s: float) -> None:
        """The newest event time of a batch just written (Unix seconds)."""
        with self._lock:
            if self._newest_s is not None and newest_unix_s <= self._newest_s:
                return
            first = self._newest_s is None
            self._newest_s = newest_unix_s
        self._newest.labels(self.schema).set(newest_unix_s)
        if first:
            self._fresh.labels(self.schema).set_function(self._freshness)

    def _freshness(self) -> float:
        newest = self._newest_s
        return math.nan if newest is None else time.time() - newest

    def aggregation(self, *, accepted: int, late: int, duplicates: int) -> None:
        self._aggs.add(accepted=accepted, late=late, duplicates=duplicates)

    def gate(self, gate: str, on_breach: str, measured: float, *, breached: bool) -> None:
        """One quality gate judged: its measured value, and a breach counted."""
        self._gate_measured.labels(self.schema, gate).set(measured)
        if breached:
            self._gate_breaches.labels(self.schema, gate, on_breach).inc()

    def lag(self, topic: str, partition: int | str, records: int) -> None:
        if self._lag is not None:
            self._lag.labels(self.schema, topic, str(partition)).set(records)

    def latency(self, seconds: Iterable[float]) -> None:
        if self._latency is not None:
            self._latency.observe_many(seconds)

    def dead_letters(self, n: int) -> None:
        if self._dead is not None:
            self._dead.inc(n)


#: How the SDK was called: ``FeatureStore.online``, ``.online_dicts``, ``.online_async``, ``.historical``,
#: and for views ``.online_view``, ``.online_view_dicts``, ``.online_view_async``, ``.historical_view``.
SdkMethod = Literal["online", "online_dicts", "online_async", "historical", "online_view",
                    "online_view_dicts", "online_view_async", "historical_view"]


class SdkMetrics:
    """``FeatureStore``'s metrics (labels ``schema`` and ``method``)."""

    def __init__(self, registry: Registry) -> None:
        r = registry
        labels = ["schema", "method"]
        self._seconds = r.histogram("featureline_sdk_lookup_seconds",
                                    "Seconds per SDK call (Redis, the Postgres fallback and decoding).",
                                    labels, SECONDS_BUCKETS)
        self._lookups = r.counter("featureline_sdk_lookups_total",
                                  "Entities looked up (ids for online, entity_df rows for historical).",
                                  labels)
        self._fallback = r.counter("featureline_sdk_fallback_total",
                                   "Entities missing from Redis and served from Postgres.", labels)
        self._miss = r.counter("featureline_sdk_miss_total",
                               "Entities found nowhere (returned as nulls with _found false; historical: no "
                               "row at or before the timestamp).", labels)
        self._errors = r.counter("featureline_sdk_errors_total", "SDK calls that raised.", labels)
        self._history = r.counter("featureline_sdk_windows_from_history_total",
                                  "Entities whose request-time windows were computed from the Postgres "
                                  "history because their tiles hash was absent from Redis.", ["schema"])
        #: (schema, method) -> its children: a lookup then costs no label resolution. On
        #: prometheus_client a lookup's metrics cost ~1 µs more than on the hand-written
        #: registry they replaced (<1% of a ~170 µs call; bench/RESULTS.md, issue 21)
        self._bound: dict[tuple[str, str], tuple[Histogram, Counter, Counter, Counter]] = {}

    def lookup(self, schema: str, method: SdkMethod, seconds: float, *, entities: int, fallback: int,
               missed: int) -> None:
        children = self._bound.get((schema, method))
        if children is None:
            children = self._bound[(schema, method)] = (
                self._seconds.labels(schema, method), self._lookups.labels(schema, method),
                self._fallback.labels(schema, method), self._miss.labels(schema, method))
        seconds_h, lookups, from_pg, misses = children
        seconds_h.observe(seconds)
        lookups.inc(entities)
        if fallback:
            from_pg.inc(fallback)
        if missed:
            misses.inc(missed)

    def error(self, schema: str, method: SdkMethod) -> None:
        self._errors.labels(schema, method).inc()

    def windows_from_history(self, schema: str, entities: int) -> None:
        """``entities`` read their request-time windows from the history (no tiles hash)."""
        self._history.labels(schema).inc(entities)


__all__ = ["CONTENT_TYPE", "DEFAULT_HOST", "ROWS_BUCKETS", "SECONDS_BUCKETS", "AggregationMetrics",
           "BatchChild", "BatchHistogram", "Counter", "Gauge", "Histogram", "MetricsServer", "Registry",
           "RunMetrics", "Sample", "SdkMethod", "SdkMetrics", "linger", "parse_exposition", "sample_value",
           "serve", "serve_first_free", "sleep_interruptibly"]
