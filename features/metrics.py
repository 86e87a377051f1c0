"""Prometheus metrics: a small registry, the text exposition format 0.0.4, an HTTP endpoint.

No client library: counters, gauges and histograms with labels, rendered as the
text format Prometheus scrapes (``# HELP``/``# TYPE`` lines, ``name{label="value"} 1``),
served by :mod:`http.server` on a daemon thread. Every name and label is listed in
``docs/operations.md``; :class:`RunMetrics` (the batch loader and the stream job) and
:class:`SdkMetrics` (``FeatureStore``) define them in one place.

Conventions (https://prometheus.io/docs/practices/naming/): base units in the name
(``_seconds``, ``_bytes``), counters end in ``_total``, histograms expose
``_bucket{le="..."}`` (cumulative, ending at ``+Inf``), ``_sum`` and ``_count``.

Thread-safe: each metric family has one lock; writers (sink threads, the SDK in a
model server) and the HTTP thread that renders it never see a half-updated histogram.
"""

from __future__ import annotations

import bisect
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Generic, Literal, TypeVar

log = logging.getLogger("features.metrics")

#: The Content-Type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Where the endpoint listens unless told otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"

MetricType = Literal["counter", "gauge", "histogram"]

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

#: Seconds, from a millisecond to a minute: store writes, lookups, produce -> stored.
SECONDS_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Rows per batch (a Parquet batch holds up to 131,072 rows; a stream micro-batch 2,000).
ROWS_BUCKETS: tuple[float, ...] = (1, 10, 100, 500, 1_000, 2_000, 5_000, 10_000, 50_000, 100_000,
                                   131_072, 500_000, 1_000_000)


# --------------------------------------------------------------------------- text format


def escape_label_value(value: str) -> str:
    """A label value as the text format quotes it: ``\\`` -> ``\\\\``, ``"`` -> ``\\"``,
    newline -> ``\\n``."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP text: ``\\`` -> ``\\\\`` and newline -> ``\\n`` (quotes stay)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value as Go's ParseFloat reads it: integers without a fraction, ``+Inf``,
    ``-Inf``, ``NaN``, otherwise Python's shortest round-trip repr (``0.1``, ``1e-05``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _le(bound: float) -> str:
    """A bucket bound for the ``le`` label (``0.005``, ``1.0``, ``+Inf``), as client libraries write it."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _labels_text(pairs: Sequence[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs) + "}"


# --------------------------------------------------------------------------- metric families


class _CounterChild:
    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        """Add ``amount`` (>= 0; a counter never goes down: ValueError)."""
        if amount < 0:
            raise ValueError(f"a counter only goes up, got inc({amount})")
        with self._lock:
            self._value += amount

    def get(self) -> float:
        return self._value


class _GaugeChild:
    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._value = 0.0
        self._function: Callable[[], float] | None = None

    def set(self, value: float) -> None:
        with self._lock:
            self._value = float(value)
            self._function = None

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self._value += amount

    def set_function(self, function: Callable[[], float]) -> None:
        """Compute the value when scraped (e.g. seconds since something); an exception
        in ``function`` shows as NaN."""
        with self._lock:
            self._function = function

    def get(self) -> float:
        if self._function is None:
            return self._value
        try:
            return float(self._function())
        except Exception:  # a broken callback must not break the scrape: NaN says "unknown"
            return math.nan


class _HistogramChild:
    def __init__(self, lock: threading.Lock, bounds: tuple[float, ...]) -> None:
        self._lock = lock
        self._bounds = bounds                      # finite upper bounds, ascending
        self._counts = [0] * (len(bounds) + 1)     # per bucket (not cumulative); last: > every bound
        self._sum = 0.0
        self._count = 0

    def observe(self, value: float) -> None:
        """Count one observation (in the family's unit; NaN is ignored)."""
        if math.isnan(value):
            return
        i = bisect.bisect_left(self._bounds, value)  # first bound >= value: le semantics
        with self._lock:
            self._counts[i] += 1
            self._sum += value
            self._count += 1

    def observe_many(self, values: Iterable[float]) -> None:
        """Count many observations at once (a NumPy array or any iterable; NaN ignored)."""
        import numpy as np

        arr = np.asarray(values if hasattr(values, "__len__") else list(values), dtype=np.float64)
        arr = arr[~np.isnan(arr)]
        if arr.size == 0:
            return
        per = np.bincount(np.searchsorted(np.asarray(self._bounds), arr, side="left"),
                          minlength=len(self._counts))
        total = float(arr.sum())
        with self._lock:
            for i, n in enumerate(per.tolist()):
                self._counts[i] += n
            self._sum += total
            self._count += int(arr.size)

    def snapshot(self) -> tuple[list[int], float, int]:
        return list(self._counts), self._sum, self._count


_C = TypeVar("_C", _CounterChild, _GaugeChild, _HistogramChild)


class _Family(Generic[_C]):
    """A metric family: one name, one help text, one type, fixed label names; a child per
    distinct label values (created on first use)."""

    type: ClassVar[MetricType]
    _reserved: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, name: str, help: str, labelnames: Sequence[str]) -> None:
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL.match(label) or label.startswith("__") or label in self._reserved:
                raise ValueError(f"invalid label name {label!r} for metric {name}")
        if len(set(labelnames)) != len(labelnames):
            raise ValueError(f"metric {name}: duplicate label names {list(labelnames)}")
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], _C] = {}
        if not self.labelnames:
            self._children[()] = self._new_child()

    def _new_child(self) -> _C:
        raise NotImplementedError

    def _key(self, values: Sequence[Any], named: Mapping[str, Any]) -> tuple[str, ...]:
        if values and named:
            raise ValueError(f"metric {self.name}: give label values by position or by name, not both")
        if named:
            if set(named) != set(self.labelnames):
                raise ValueError(f"metric {self.name} has labels {list(self.labelnames)}, "
                                 f"got {sorted(named)}")
            values = [named[k] for k in self.labelnames]
        if len(values) != len(self.labelnames):
            raise ValueError(f"metric {self.name} has labels {list(self.labelnames)}, "
                             f"got {len(values)} values")
        return tuple(str(v) for v in values)

    def labels(self, *values: Any, **named: Any) -> _C:
        """The child for these label values (by position or by name; values become text)."""
        key = self._key(values, named)
        with self._lock:
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._new_child()
            return child

    def samples(self) -> list[tuple[str, list[tuple[str, str]], float]]:
        """``(sample name, label pairs, value)`` for every child, in label order."""
        with self._lock:
            items = sorted(self._children.items())
            out: list[tuple[str, list[tuple[str, str]], float]] = []
            for key, child in items:
                out.extend(self._child_samples(list(zip(self.labelnames, key, strict=True)), child))
            return out

    def _child_samples(self, pairs: list[tuple[str, str]], child: _C
                       ) -> list[tuple[str, list[tuple[str, str]], float]]:
        raise NotImplementedError


class Counter(_Family[_CounterChild]):
    """A monotonic count. The name ends in ``_total`` (checked)."""

    type = "counter"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name!r}: counter names end in _total")
        super().__init__(name, help, labelnames)

    def _new_child(self) -> _CounterChild:
        return _CounterChild(self._lock)

    def inc(self, amount: float = 1.0) -> None:
        """For a family without labels."""
        self.labels().inc(amount)

    def _child_samples(self, pairs: list[tuple[str, str]], child: _CounterChild
                       ) -> list[tuple[str, list[tuple[str, str]], float]]:
        return [(self.name, pairs, child.get())]


class Gauge(_Family[_GaugeChild]):
    """A value that goes up and down (or is computed at scrape time)."""

    type = "gauge"

    def _new_child(self) -> _GaugeChild:
        return _GaugeChild(self._lock)

    def set(self, value: float) -> None:
        """For a family without labels."""
        self.labels().set(value)

    def _child_samples(self, pairs: list[tuple[str, str]], child: _GaugeChild
                       ) -> list[tuple[str, list[tuple[str, str]], float]]:
        return [(self.name, pairs, child.get())]


class Histogram(_Family[_HistogramChild]):
    """Observations counted in buckets (``le``: less than or equal), with their sum and count."""

    type = "histogram"
    _reserved = frozenset({"le"})

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = (),
                 buckets: Sequence[float] = SECONDS_BUCKETS) -> None:
        bounds = tuple(sorted(float(b) for b in buckets if not math.isinf(b)))
        if not bounds or len(set(bounds)) != len(bounds) or any(math.isnan(b) for b in bounds):
            raise ValueError(f"histogram {name}: buckets must be distinct numbers, got {list(buckets)}")
        self.buckets = bounds
        super().__init__(name, help, labelnames)

    def _new_child(self) -> _HistogramChild:
        return _HistogramChild(self._lock, self.buckets)

    def observe(self, value: float) -> None:
        """For a family without labels."""
        self.labels().observe(value)

    def _child_samples(self, pairs: list[tuple[str, str]], child: _HistogramChild
                       ) -> list[tuple[str, list[tuple[str, str]], float]]:
        counts, total, count = child.snapshot()
        out: list[tuple[str, list[tuple[str, str]], float]] = []
        cumulative = 0
        for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
            cumulative += n
            out.append((self.name + "_bucket", [*pairs, ("le", _le(bound))], float(cumulative)))
        out.append((self.name + "_sum", pairs, total))
        out.append((self.name + "_count", pairs, float(count)))
        return out


class Registry:
    """The metric families one endpoint serves, in registration order.

    Registering a name again with the same type, labels (and buckets) returns the
    family already there, so several users (two ``FeatureStore`` objects, two schemas'
    :class:`RunMetrics`) can share a registry; a different definition raises ValueError.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family[Any]] = {}

    def _register(self, family: _Family[Any]) -> Any:
        with self._lock:
            have = self._families.get(family.name)
            if have is None:
                self._families[family.name] = family
                return family
            same = (type(have) is type(family) and have.labelnames == family.labelnames
                    and getattr(have, "buckets", None) == getattr(family, "buckets", None))
            if not same:
                raise ValueError(f"metric {family.name} is already registered with another definition")
            return have

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        c: Counter = self._register(Counter(name, help, labelnames))
        return c

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        g: Gauge = self._register(Gauge(name, help, labelnames))
        return g

    def histogram(self, name: str, help: str, labelnames: Sequence[str] = (),
                  buckets: Sequence[float] = SECONDS_BUCKETS) -> Histogram:
        h: Histogram = self._register(Histogram(name, help, labelnames, buckets))
        return h

    def families(self) -> list[_Family[Any]]:
        with self._lock:
            return list(self._families.values())

    def exposition(self) -> str:
        """Every family in the text exposition format 0.0.4 (ends with a newline)."""
        lines: list[str] = []
        for fam in self.families():
            lines.append(f"# HELP {fam.name} {escape_help(fam.help)}")
            lines.append(f"# TYPE {fam.name} {fam.type}")
            for name, pairs, value in fam.samples():
                lines.append(f"{name}{_labels_text(pairs)} {format_value(value)}")
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- reading it back


@dataclass(frozen=True)
class Sample:
    """One sample line: ``name{labels} value``."""

    name: str
    labels: dict[str, str]
    value: float


_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$')
_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')
_UNESCAPE = re.compile(r"\\(.)")


def _unescape(m: re.Match[str]) -> str:
    return "\n" if m.group(1) == "n" else m.group(1)


def parse_exposition(text: str) -> list[Sample]:
    """The samples of a text exposition (this module's, or any 0.0.4 text without
    timestamps); ``# HELP``/``# TYPE`` and other comment lines are skipped. Raises
    ValueError naming the first line that is not the format."""
    out: list[Sample] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ValueError(f"line {number} is not a sample: {line!r}")
        labels: dict[str, str] = {}
        rest = m.group("labels") or ""
        pos = 0
        while pos < len(rest):
            p = _PAIR.match(rest, pos)
            if p is None:
                raise ValueError(f"line {number}: bad labels at {rest[pos:]!r}")
            labels[p.group(1)] = _UNESCAPE.sub(_unescape, p.group(2))
            pos = p.end()
        out.append(Sample(m.group("name"), labels, float(m.group("value"))))
    return out


def sample_value(samples: Iterable[Sample], name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` whose labels include ``labels`` (the sum when
    several match), or None when none does."""
    hits = [s.value for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(hits) if hits else None


# --------------------------------------------------------------------------- the endpoint


class MetricsServer:
    """``GET /metrics`` (and ``/``) on ``host:port``, served from a daemon thread until
    :meth:`close`: a registry's exposition, or the text ``source()`` returns. Port 0
    picks a free port (see :attr:`port`). OSError when the port is taken."""

    def __init__(self, source: Registry | Callable[[], str], port: int, host: str = DEFAULT_HOST) -> None:
        render = source.exposition if isinstance(source, Registry) else source

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the name http.server calls
                if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics here")
                    return
                body = render().encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                # http.server writes every request to stderr; keep stderr for our log lines
                log.debug("metrics %s - " + format, self.address_string(), *args)

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.host = host
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=f"metrics-{self.port}",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(5)
        self._httpd.server_close()


def serve(source: Registry | Callable[[], str], port: int, host: str = DEFAULT_HOST) -> MetricsServer:
    """Serve ``source`` (a registry, or a function returning exposition text) on
    ``host:port`` (OSError when the port is taken)."""
    return MetricsServer(source, port, host)


def serve_first_free(registry: Registry, ports: range, host: str = DEFAULT_HOST) -> MetricsServer | None:
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
        self._lag: Gauge | None = None
        self._latency: _HistogramChild | None = None
        self._dead: _CounterChild | None = None
        if stream:
            self._lag = r.gauge("featureline_consumer_lag", "Records behind the partition's end offset "
                                "(stream job; refreshed every few seconds).",
                                ["schema", "topic", "partition"])
            self._latency = r.histogram("featureline_produce_to_stored_seconds",
                                        "Seconds from a record's Kafka timestamp to its micro-batch being "
                                        "stored (stream job).", ["schema"], SECONDS_BUCKETS).labels(schema)
            self._dead = r.counter("featureline_dead_letters_total",
                                   "Rejects published to the dead-letter topic (stream job).",
                                   ["schema"]).labels(schema)
        self._newest_s: float | None = None
        self._lock = threading.Lock()

    def unit(self, *, read: int, stored: int, rejected: int, already_present: int,
             by_rule: Mapping[str, int]) -> None:
        """One batch accounted (``features.runner.account``); ``by_rule``: rule id -> count."""
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

    def lag(self, topic: str, partition: int | str, records: int) -> None:
        if self._lag is not None:
            self._lag.labels(self.schema, topic, str(partition)).set(records)

    def latency(self, seconds: Iterable[float]) -> None:
        if self._latency is not None:
            self._latency.observe_many(seconds)

    def dead_letters(self, n: int) -> None:
        if self._dead is not None:
            self._dead.inc(n)


#: How the SDK was called: ``FeatureStore.online``, ``.online_dicts``, ``.online_async``, ``.historical``.
SdkMethod = Literal["online", "online_dicts", "online_async", "historical"]


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
        #: (schema, method) -> its children: a lookup then costs no label resolution
        self._bound: dict[tuple[str, str], tuple[_HistogramChild, _CounterChild, _CounterChild,
                                                 _CounterChild]] = {}

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


__all__ = ["CONTENT_TYPE", "DEFAULT_HOST", "ROWS_BUCKETS", "SECONDS_BUCKETS", "AggregationMetrics", "Counter",
           "Gauge", "Histogram", "MetricsServer", "Registry", "RunMetrics", "Sample", "SdkMethod",
           "SdkMetrics", "escape_help", "escape_label_value", "format_value", "linger", "parse_exposition",
           "sample_value", "serve", "serve_first_free", "sleep_interruptibly"]
