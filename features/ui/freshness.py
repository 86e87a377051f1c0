"""What the Freshness and lag page shows: per schema, how new its data is, how far its stream
is behind, and how much of its history is hot in Redis (docs/ui.md, "Freshness and lag").

- **Newest event and ingestion time**: ``max(<event time>)`` and ``max(_ingested_at)`` of
  the history table, each read from its own index (``<table>__by_event_time``,
  ``<table>__by_ingested_at``: :func:`features.compile.postgres.history_indexes`), so a
  few index pages whatever the table's size; their age against now, and against the
  schema's ``quality: max_staleness`` when it declares one (the limit of the
  ``FeaturelineStale`` alert, :mod:`features.compile.alerts`): ``stale`` past it.
- **Consumer lag** of each stream the UI is told of (``features ui --stream
  SCHEMA:TOPIC[:GROUP]``; the group defaults to the one ``features stream`` uses):
  the group's committed offsets against the topic's end offsets, per partition and in
  all (:func:`features.stream.kafka.consumer_lag`, with the configured TLS/SASL
  properties and a short timeout). A broker that does not answer, a topic or a group
  that does not exist is a line on the page, never an error page.
- **Redis coverage**: of the distinct entities among the history's newest
  :data:`SAMPLE_ROWS` rows by event time (the whole history when it holds fewer rows:
  then the count is exact), how many have a hot hash (pipelined ``EXISTS``, cluster-aware
  through redis-py's client), and which schema fingerprints those hashes hold
  (:func:`features.ops.health.fingerprint_tally`, the check ``features health`` makes).

Reads only: Postgres in the read-only session of :class:`~features.ui.data.UIData`.
Postgres unreachable raises :class:`~features.errors.SinkUnavailable` (the page says so);
Redis or Kafka unreachable is shown in their own part of the page.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from features.compile import CompiledSchema
from features.compile.layout import KEY_PREFIX, encode_column, hot_columns
from features.compile.postgres import cold_table_name
from features.config import Settings, redact
from features.lineage import INGESTED_AT
from features.ops.health import fingerprint_tally, fingerprint_verdict
from features.sdk.fallback import redis_py_client
from features.sinks.versions import read_recorded
from features.stream.kafka import GroupLag, consumer_lag
from features.ui.data import UIData

#: The newest history rows (by event time) whose distinct entities make the coverage sample.
SAMPLE_ROWS = 5000
#: Seconds a Redis or Kafka request may take before the page says the store does not answer.
TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Stream:
    """A stream the page reports the lag of: ``schema``'s job reading ``topic`` as consumer
    group ``group``."""

    schema: str
    topic: str
    group: str


@dataclass(frozen=True)
class Lag:
    """One stream's lag (``lag``), or why it could not be read (``error``)."""

    stream: Stream
    lag: GroupLag | None
    error: str | None = None


@dataclass(frozen=True)
class Coverage:
    """Of ``entities`` distinct entities (those among the newest ``rows`` history rows;
    ``complete``: that is the whole history), ``hot`` have a hot hash in Redis;
    ``fingerprints``: how many of those hold each schema fingerprint, and the verdict
    (``fingerprints_ok``, ``fingerprint_detail``) ``features health`` gives on them.
    ``error``: Redis did not answer (the counts are then zero)."""

    entities: int
    rows: int
    complete: bool
    hot: int = 0
    fingerprints: dict[str, int] = field(default_factory=dict)
    fingerprints_ok: bool = True
    fingerprint_detail: str = ""
    error: str | None = None

    @property
    def missing(self) -> int:
        return self.entities - self.hot

    @property
    def share(self) -> float | None:
        return self.hot / self.entities if self.entities and self.error is None else None


@dataclass(frozen=True)
class Freshness:
    """One schema's freshness at ``now`` (UTC). ``table``: whether its history table
    exists; ``static``: the schema has no event time (``event_time: none``);
    ``coverage`` None when the schema keeps nothing hot."""

    schema: str
    now: dt.datetime
    table: bool
    static: bool
    newest_event: dt.datetime | None
    newest_ingested: dt.datetime | None
    max_staleness_s: int | None
    coverage: Coverage | None
    lags: list[Lag]

    @property
    def event_age_s(self) -> float | None:
        return None if self.newest_event is None else (self.now - self.newest_event).total_seconds()

    @property
    def ingested_age_s(self) -> float | None:
        return None if self.newest_ingested is None else (self.now - self.newest_ingested).total_seconds()

    @property
    def stale(self) -> bool | None:
        """Past ``max_staleness`` (the newest event older than it, or no event at all);
        None when the schema declares no ``max_staleness``."""
        if self.max_staleness_s is None:
            return None
        age = self.event_age_s if not self.static else self.ingested_age_s
        return age is None or age > self.max_staleness_s


class FreshnessReader:
    """Reads :class:`Freshness` of the schemas of ``data`` from the stores of ``settings``
    (``redis_url``, ``kafka_bootstrap``, ``kafka_properties``). ``key_prefix``: put before
    every Redis key (as ``features load --key-prefix`` wrote them); ``streams``: the
    streams whose lag is shown."""

    def __init__(self, data: UIData, settings: Settings, *, key_prefix: str = "",
                 streams: Sequence[Stream] = (), sample_rows: int = SAMPLE_ROWS,
                 timeout_s: float = TIMEOUT_S) -> None:
        self.data = data
        self.settings = settings
        self.key_prefix = key_prefix
        self.streams = list(streams)
        self.sample_rows = sample_rows
        self.timeout_s = timeout_s

    def read(self, schemas: Sequence[str] | None = None) -> list[Freshness]:
        """The freshness of ``schemas`` (default every loadable schema), in name order.
        KeyError for a schema the UI does not know."""
        names = [n for n, c in self.data.schemas.items() if c.schema.loadable] if schemas is None else schemas
        compiled = [self.data.schemas[n] for n in names]
        now = dt.datetime.now(dt.UTC)
        wanted = [s for s in self.streams if s.schema in names]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(len(wanted), 1)) as pool:
            lags = [pool.submit(self._lag, s) for s in wanted]  # beside the Postgres and Redis reads
            with self.data.session("reading the newest event times") as conn:
                found = [self._history(conn, c) for c in compiled]
            coverage = self._coverage(compiled, [f[3] for f in found])
            by_schema: dict[str, list[Lag]] = {}
            for done in lags:
                lag = done.result()
                by_schema.setdefault(lag.stream.schema, []).append(lag)
        out = []
        for c, (table, newest, ingested, _), cov in zip(compiled, found, coverage, strict=True):
            quality = c.schema.quality
            out.append(Freshness(c.name, now, table, c.schema.event_time is None, newest, ingested,
                                 None if quality is None else quality.max_staleness_s, cov,
                                 by_schema.get(c.name, [])))
        return out

    def _history(self, conn: Any, c: CompiledSchema
                 ) -> tuple[bool, dt.datetime | None, dt.datetime | None, tuple[pa.Array, int, Any] | None]:
        """(table exists, newest event time, newest ingestion time, the coverage sample:
        its distinct entities, the rows read, the recorded versions)."""
        table = cold_table_name(c.schema)
        if not self.data.exists(conn, table):
            return False, None, None, None
        t = sql.Identifier(table)
        order = sql.Identifier(c.schema.event_time or INGESTED_AT)
        newest = None
        if c.schema.event_time is not None:
            newest = conn.execute(sql.SQL("SELECT max({}) FROM {}").format(order, t)).fetchone()[0]
        ingested = conn.execute(sql.SQL("SELECT max({}) FROM {}").format(sql.Identifier(INGESTED_AT), t)
                                ).fetchone()[0]
        sample = None
        if hot_columns(c):
            entity = sql.Identifier(str(c.schema.entity))
            rows = conn.execute(sql.SQL(
                "SELECT e, count(*) FROM (SELECT {} AS e, {} AS t FROM {} ORDER BY {} DESC LIMIT %s) s "
                "GROUP BY e").format(entity, order, t, order),
                [self.sample_rows]).fetchall()
            ids = pa.array([r[0] for r in rows], c.arrow_schema.field(str(c.schema.entity)).type)
            sample = (ids, sum(int(r[1]) for r in rows), read_recorded(conn, c.name))
        return True, newest, ingested, sample

    def _coverage(self, compiled: Sequence[CompiledSchema],
                  samples: Sequence[tuple[pa.Array, int, Any] | None]) -> list[Coverage | None]:
        """Each schema's :class:`Coverage` from its sample (None: no sample, nothing hot)."""
        out: list[Coverage | None] = []
        client = None
        try:
            for c, sample in zip(compiled, samples, strict=True):
                if sample is None:
                    out.append(None)
                    continue
                ids, rows, recorded = sample
                cov = Coverage(len(ids), rows, rows < self.sample_rows)
                if len(ids) == 0:
                    out.append(cov)
                    continue
                try:
                    if client is None:
                        client = redis_py_client(self.settings.redis_url, self.timeout_s)
                    keys = pc.binary_join_element_wise(f"{self.key_prefix}{KEY_PREFIX}:{c.name}:{{",
                                                       pc.cast(encode_column(ids), pa.string()), "}", ""
                                                       ).to_pylist()
                    pipe = client.pipeline(transaction=False)
                    for k in keys:
                        pipe.exists(k)
                    present = [k for k, n in zip(keys, pipe.execute(), strict=True) if n]
                    tally = fingerprint_tally(client, present)
                    ok, detail = fingerprint_verdict(c, recorded, tally, len(present))
                    out.append(Coverage(cov.entities, rows, cov.complete, len(present), tally, ok, detail))
                except Exception as exc:  # Redis down: said on the page, the other figures stand
                    client = None
                    out.append(Coverage(cov.entities, rows, cov.complete,
                                        error=f"Redis did not answer: {type(exc).__name__}: "
                                        f"{redact(str(exc)).strip().splitlines()[0] if str(exc) else ''}"))
        finally:
            if client is not None:
                client.close()
        return out

    def _lag(self, stream: Stream) -> Lag:
        s = self.settings
        try:
            return Lag(stream, consumer_lag(s.kafka_bootstrap, stream.group, stream.topic,
                                            timeout_s=self.timeout_s, properties=s.kafka_properties))
        except Exception as exc:  # broker down, no such topic, refused: a line on the page
            return Lag(stream, None, redact(str(exc)))


def streams_of(specs: Sequence[str], schema_paths: Mapping[str, str | None],
               default_group: Any) -> list[Stream]:
    """``SCHEMA:TOPIC[:GROUP]`` specs as :class:`Stream` s; the group defaults to
    ``default_group(schema file, topic)`` (the one ``features stream`` uses). ValueError
    naming the spec for a malformed one or an unknown schema."""
    out = []
    for spec in specs:
        schema, _, rest = spec.partition(":")
        topic, _, group = rest.partition(":")
        if not schema or not topic:
            raise ValueError(f"--stream {spec!r}: expected SCHEMA:TOPIC or SCHEMA:TOPIC:GROUP")
        if schema not in schema_paths:
            raise ValueError(f"--stream {spec!r}: no schema {schema!r}; the schemas: "
                             f"{', '.join(sorted(schema_paths)) or 'none'}")
        path = schema_paths[schema]
        out.append(Stream(schema, topic, group or default_group(path or f"{schema}.yaml", topic)))
    return out
