"""The versions of a schema the stores have held, and reading what earlier versions wrote.

Postgres records every version the stores have held (``featureline_schema_versions``:
fingerprint, version, YAML text, the version it was migrated from; :func:`read_recorded`).
:class:`Upgrader` rewrites a Redis hash that an earlier version wrote into the current
layout: values cast to the new types, renamed fields renamed, new hot columns read from
Postgres where it holds them (the row at the hash's event time), else their default or
null; each hash in one atomic script call that changes it only while it still holds the
event and the fingerprint it was read with. ``features migrate --apply``
(:mod:`features.ops.migrate`) runs it over every hash; the SDK runs it on the hashes a read
meets (``FeatureStore.online``), so reads keep working during and after a migration, and
for hashes an old writer still writes. It lives here, below both, because the SDK reads
through it (the layers of docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import errors

from features.compile import compile_schema
from features.compile.layout import (
    aggregation_names,
    cold_columns,
    declared_type,
    entity_values,
    from_text,
    hot_columns,
    reply_columns,
    rows_to_table,
)
from features.compile.postgres import (
    SCHEMAS_TABLE,
    VERSIONS_TABLE,
    aggregates_table_name,
    aggregation_pg_type,
    cold_table_name,
    pg_type,
    quote_ident,
)
from features.errors import SinkError
from features.lineage import DIGEST
from features.schema.diff import ChangeKind, diff_schemas
from features.schema.parse import parse_schema
from features.sinks.base import WriteUnit
from features.sinks.redis import RedisSink
from features.validation.convert import convert_pylist

if TYPE_CHECKING:
    import numpy.typing as npt

    from features.compile import CompiledSchema

_T = TypeVar("_T")

#: The hash fields read besides a layout's columns, in this order.
_META = ("_event_time", "_schema_fingerprint", "_source", "_schema_version", "_run_id", "_ingested_at",
         "_filled", "_digest")


@dataclass(frozen=True)
class Version:
    """One row of ``featureline_schema_versions``."""

    fingerprint: str
    version: str
    text: str | None
    migrated_from: str | None


@dataclass(frozen=True)
class Recorded:
    """What Postgres records for a schema: the version the stores hold (None: nothing
    loaded yet) and every version they have held, by fingerprint."""

    version: str | None
    fingerprint: str | None
    versions: dict[str, Version] = field(default_factory=dict)

    def ancestors(self, fp: str) -> list[str]:
        """The versions ``fp`` was migrated from, nearest first (a cycle ends the walk)."""
        out: list[str] = []
        seen = {fp}
        at = self.versions.get(fp)
        while at is not None and at.migrated_from is not None and at.migrated_from not in seen:
            out.append(at.migrated_from)
            seen.add(at.migrated_from)
            at = self.versions.get(at.migrated_from)
        return out


def read_recorded(conn: Any, name: str) -> Recorded:
    """The ``featureline_schemas`` row and the ``featureline_schema_versions`` rows of
    schema ``name`` (tables that do not exist yet hold nothing)."""
    have = conn.execute("SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
                        (quote_ident(SCHEMAS_TABLE), quote_ident(VERSIONS_TABLE))).fetchone()
    version = fp = None
    if have[0]:
        row = conn.execute(f"SELECT version, fingerprint FROM {quote_ident(SCHEMAS_TABLE)} "
                           "WHERE schema_name = %s", (name,)).fetchone()
        if row is not None:
            version, fp = row
    versions: dict[str, Version] = {}
    if have[1]:
        for r in conn.execute(f"SELECT fingerprint, version, definition, migrated_from FROM "
                              f"{quote_ident(VERSIONS_TABLE)} WHERE schema_name = %s", (name,)).fetchall():
            versions[r[0]] = Version(*r)
    return Recorded(version, fp, versions)


def compiled_version(v: Version, name: str) -> CompiledSchema:
    """The compiled schema of a recorded version, checked against its fingerprint."""
    if v.text is None:
        raise SinkError(f"featureline_schema_versions holds no YAML text for {name} {v.version} "
                        f"(fingerprint {v.fingerprint[:12]}): run "
                        "`features migrate NEW.yaml --from OLD.yaml` "
                        "with the file that version was loaded with", store="postgres")
    c = compile_schema(parse_schema(v.text, f"<{name} {v.version} from featureline_schema_versions>"))
    if c.fingerprint != v.fingerprint:
        raise SinkError(f"the YAML text recorded for {name} {v.version} compiles to fingerprint "
                        f"{c.fingerprint[:12]}, not {v.fingerprint[:12]} (recorded by another featureline "
                        "version?): run `features migrate NEW.yaml --from OLD.yaml`", store="postgres")
    return c


@dataclass(frozen=True)
class Newer:
    """A compatible newer version the stores hold, as a reader of an earlier version reads
    it (:func:`newer_readable`): ``c`` is the version the stores hold, ``fingerprints`` every
    recorded version migrated (transitively) from the reader's, whose hashes it reads."""

    c: CompiledSchema
    fingerprints: frozenset[str]


def newer_readable(recorded: Recorded, c: CompiledSchema) -> Newer | None:
    """The version the stores hold when it was migrated (transitively) from ``c``'s and a
    reader of ``c`` can read it in ``c``'s own layout: every column ``c`` stores in Redis
    and in Postgres is stored there under the same name (a compatible change only adds
    columns, widens types and loosens constraints; a rename allowed by a rule is the one
    that moves a column). None otherwise, and when Postgres holds no YAML text for it."""
    held = recorded.fingerprint
    if held is None or held == c.fingerprint or c.fingerprint not in recorded.ancestors(held):
        return None
    try:
        newest = compiled_version(recorded.versions[held], c.name)
    except (KeyError, SinkError):
        return None
    for columns in (hot_columns, cold_columns):
        if not set(columns(c)) <= set(columns(newest)):
            return None
    for store in ("hot", "cold"):
        if not set(aggregation_names(c, store)) <= set(aggregation_names(newest, store)):
            return None
    return Newer(newest, frozenset(fp for fp in recorded.versions
                                   if fp == held or c.fingerprint in recorded.ancestors(fp)))


# --------------------------------------------------------------------------- the Redis rewrite


class ReadPool(Protocol):
    """Pipelined Redis reads (:class:`features.sdk.redis_read.RawPool`)."""

    def hmget_many(self, reads: Sequence[tuple[Sequence[str], Sequence[str] | None]]) -> list[Any]: ...


class Stores(Protocol):
    """What an :class:`Upgrader` reads and writes through (a ``FeatureStore`` or its
    :class:`features.sdk.connections.Connections`): the Redis URL and key prefix its sink
    writes with, a pool of Redis reads, Postgres with driver errors mapped."""

    redis_url: str
    key_prefix: str

    @property
    def redis_pool(self) -> ReadPool: ...

    def run_postgres(self, what: str, fn: Callable[[Any], _T]) -> _T: ...



@dataclass
class _Layout:
    """How one earlier version's hashes become the current one's (entity or aggregates hashes)."""

    old: CompiledSchema
    old_columns: list[str]          # the old layout's hot columns (the fields read)
    sources: dict[str, str]         # new column -> the old column it is read from


class Upgrader:
    """Rewrites Redis hashes that earlier versions of schema ``c`` wrote into ``c``'s layout
    (the module docstring says how), for ``features migrate`` and for readers that meet one.

    ``recorded`` must name ``c`` as the version the stores hold; the versions it was
    migrated from (transitively) are the ones rewritten. Uses ``store``'s Redis pool and
    Postgres connection (:class:`Stores`).

    ``before_write``: called with the keys of each group of hashes after they were read
    (and the values they lack read from Postgres) and just before the script call that
    rewrites them; what it writes to those hashes meanwhile is what a concurrent stream or
    load would write there (``tests/integration/test_evolution.py`` interleaves a write of
    a newer event at this point, deterministically). None: nothing is called."""

    def __init__(self, store: Stores, c: CompiledSchema, recorded: Recorded, *,
                 before_write: Callable[[list[str]], None] | None = None) -> None:
        self.store = store
        self.c = c
        self.recorded = recorded
        self.before_write = before_write
        self.chain = recorded.ancestors(c.fingerprint)
        self._layouts: dict[tuple[str, bool], _Layout] = {}
        self._sinks: dict[bool, Any] = {}

    @property
    def old_fingerprints(self) -> set[str]:
        return set(self.chain)

    def close(self) -> None:
        for sink in self._sinks.values():
            sink.close()
        self._sinks.clear()

    def _layout(self, fp: str, aggregates: bool) -> _Layout:
        got = self._layouts.get((fp, aggregates))
        if got is None:
            old = compiled_version(self.recorded.versions[fp], self.c.name)
            # renames along the chain from fp to the current version (new name -> old name)
            steps = [fp, *reversed(self.chain[:self.chain.index(fp)]), self.c.fingerprint]
            names: dict[str, str] = {}
            schemas = [old.schema, *[compiled_version(self.recorded.versions[x], self.c.name).schema
                                     for x in steps[1:-1]], self.c.schema]
            for a, b in pairwise(schemas):
                changes = diff_schemas(a, b, aggregation_type=aggregation_pg_type).changes
                renamed = {ch.field: ch.old_field for ch in changes
                           if ch.kind is ChangeKind.FIELD_RENAMED and ch.old_field is not None}
                names = {new: names.get(was, was) for new, was in renamed.items()} | {
                    k: v for k, v in names.items() if k not in renamed.values()}
            old_columns = aggregation_names(old, "hot") if aggregates else hot_columns(old)
            new_columns = aggregation_names(self.c, "hot") if aggregates else hot_columns(self.c)
            sources = {n: names.get(n, n) for n in new_columns if names.get(n, n) in old_columns}
            got = self._layouts[(fp, aggregates)] = _Layout(old, old_columns, sources)
        return got

    def _sink(self, aggregates: bool, old_fp: str) -> Any:
        sink = self._sinks.get(aggregates)
        if sink is None:
            sink = self._sinks[aggregates] = RedisSink(self.store.redis_url, self.c,
                                                       key_prefix=self.store.key_prefix,
                                                       aggregates=aggregates, restamp=old_fp)
            sink.open()
        sink.restamp = old_fp
        return sink

    def upgrade(self, keys: Sequence[str], aggregates: bool = False) -> int:
        """Rewrite those of ``keys`` (entity hashes, or aggregates hashes) that hold an
        earlier version of the schema; returns how many were rewritten."""
        if not keys or not self.chain:
            return 0

        fps = reply_columns(self.store.redis_pool.hmget_many([(list(keys), ["_schema_fingerprint"])]), 1)[0]
        written = 0
        for fp in self.chain:
            at = np.flatnonzero(np.asarray(pc.fill_null(pc.equal(fps, fp), False)))
            if len(at):
                written += self._upgrade(fp, [keys[i] for i in at.tolist()], aggregates)
        return written

    def refresh(self, keys: Sequence[str], names: Sequence[str]) -> int:
        """Rewrite those of the entity hashes ``keys`` that hold this version with the hot
        columns ``names`` read again from Postgres (the row at each hash's event time):
        ``features recompute`` after it changed them there. Returns the hashes rewritten."""
        if not keys or not names:
            return 0
        return self._upgrade(self.c.fingerprint, list(keys), False, refresh=frozenset(names))

    def _upgrade(self, fp: str, keys: list[str], aggregates: bool,
                 refresh: frozenset[str] = frozenset()) -> int:
        if fp == self.c.fingerprint:  # this version's hashes, ``refresh`` read again from Postgres
            columns = aggregation_names(self.c, "hot") if aggregates else hot_columns(self.c)
            layout = _Layout(self.c, columns, {n: n for n in columns if n not in refresh})
        else:
            layout = self._layout(fp, aggregates)
        old, c = layout.old, self.c
        fields = [*layout.old_columns, *_META]
        replies = self.store.redis_pool.hmget_many([(keys, fields)])
        cols = dict(zip(fields, reply_columns(replies, len(fields)), strict=True))
        # only hashes that still hold that version (the script checks again when it writes)
        keep = pc.fill_null(pc.and_(pc.equal(cols["_schema_fingerprint"], fp),
                                    pc.is_valid(cols["_event_time"])), False)
        if not pc.all(keep).as_py():
            cols = {k: v.filter(keep) for k, v in cols.items()}
            keys = [k for k, ok in zip(keys, keep.to_pylist(), strict=True) if ok]
        n = len(keys)
        if n == 0:
            return 0

        s = c.schema
        # a static schema's hash is ordered by its load (``_ingested_at``), then ``_digest``
        ent, et = str(s.entity), ("_ingested_at" if s.static else str(s.event_time))
        prefix = f"{self.store.key_prefix}features:{c.name}{'__aggregates' if aggregates else ''}:{{"
        entity_text = pa.array([k[len(prefix):-1] for k in keys], pa.string())
        micros = cols["_event_time"].cast(pa.int64())
        data: dict[str, pa.Array] = {ent: entity_text, et: micros.cast(pa.timestamp("us", "UTC"))}
        new_columns = aggregation_names(c, "hot") if aggregates else hot_columns(c)
        cold = set(aggregation_names(c, "cold") if aggregates else cold_columns(c))
        from_pg = [x for x in new_columns if x not in layout.sources and x in cold]
        stored, found = ({}, None) if not from_pg else self._from_postgres(
            entity_text, micros, cols["_digest"], from_pg, aggregates)
        for name in new_columns:
            target = declared_type(c, name)
            if name in layout.sources:
                was = layout.sources[name]
                value = _cast(from_text(old, was, cols[was], declared_type(old, was)), target, c.name, name)
            elif name in stored:
                value = stored[name]
                if found is not None and not found.all():  # no row at that event time: the default
                    value = _where(found, value, _default(c, name, target, n))
            else:
                value = _default(c, name, target, n)
            data[name] = value
        # _digest: the tie-break; a static schema's _ingested_at is already its ``et`` above
        for name in ("_digest", "_source", "_run_id", "_ingested_at", "_filled"):
            data.setdefault(name, cols[name])
        sink = self._sink(aggregates, fp)

        table = pa.table(data)
        if self.before_write is not None:
            self.before_write(keys)
        return int(sink.write(WriteUnit(table, pa.table({}), None, n)).stored)

    def _from_postgres(self, entity_text: pa.Array, micros: pa.Array, digest: pa.Array, names: list[str],
                       aggregates: bool) -> tuple[dict[str, pa.Array], npt.NDArray[np.bool_]]:
        """``names`` of the stored rows at each (entity, event time), in order (null where
        Postgres holds no such row), and whether Postgres holds each row. Of several
        history rows at one time, the one with the hash's ``digest`` (a hash without one:
        the greatest digest, the newest)."""
        c = self.c
        s = c.schema
        ent_field = s.field(str(s.entity))
        et_type = "timestamptz" if s.static else pg_type(s.field(str(s.event_time)).type)
        at = {"date": "(date '1970-01-01' + (k.us / 86400000000)::int)",
              "timestamptz": "(timestamptz '1970-01-01 00:00:00+00' + k.us * interval '1 microsecond')"}.get(
            et_type, "(timestamp '1970-01-01 00:00:00' + k.us * interval '1 microsecond')")
        table = aggregates_table_name(s) if aggregates else cold_table_name(s)
        dg = quote_ident(DIGEST)
        query = (f"SELECT DISTINCT ON (k.i) k.i, {', '.join('h.' + quote_ident(x) for x in names)} FROM "
                 f"unnest(%s::{pg_type(ent_field.type)}[], %s::bigint[], %s::bigint[], %s::text[]) "
                 f"AS k(e, us, i, d) JOIN {quote_ident(table)} h ON h.{quote_ident(str(s.entity))} = k.e "
                 f"AND h.{quote_ident('_ingested_at' if s.static else str(s.event_time))} = {at}"
                 + ("" if aggregates else f" AND (k.d IS NULL OR h.{dg} = k.d) ORDER BY k.i, h.{dg} DESC"))
        ids = entity_values(c, entity_text).to_pylist()
        params = [ids, micros.to_pylist(), list(range(len(ids))), digest.cast(pa.string()).to_pylist()]
        try:
            rows = self.store.run_postgres("the migration's read of stored values",
                                      lambda conn: conn.execute(query, params).fetchall())
        except errors.UndefinedTable:
            rows = []
        got = rows_to_table(c, names, [r[1:] for r in rows])
        where = np.full(len(ids), -1, dtype=np.int64)
        where[np.array([r[0] for r in rows], dtype=np.int64)] = np.arange(len(rows), dtype=np.int64)
        take = pa.array(where, mask=where < 0)
        return {name: got.column(name).combine_chunks().take(take) for name in names}, where >= 0


def _where(mask: npt.NDArray[np.bool_], values: pa.Array, other: pa.Array) -> pa.Array:
    """``values`` where ``mask``, else ``other`` (of the same type; a dictionary array
    through its values)."""
    if pa.types.is_dictionary(values.type):
        plain = values.type.value_type
        return pc.if_else(pa.array(mask), values.cast(plain), other.cast(plain)).dictionary_encode()
    return pc.if_else(pa.array(mask), values, other)


def _cast(values: pa.Array, target: pa.DataType, schema: str, name: str) -> pa.Array:
    if values.type == target:
        return values
    try:
        if pa.types.is_dictionary(target):
            return values.cast(target.value_type).dictionary_encode()
        if pa.types.is_dictionary(values.type):
            values = values.cast(values.type.value_type)
        return values.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SinkError(f"a {schema}.{name} value in Redis does not fit its new type {target}: {exc}",
                        store="redis") from exc


def _default(c: CompiledSchema, name: str, target: pa.DataType, n: int) -> pa.Array:
    """A new column's value in a rewritten hash: its field's default, else null."""
    try:
        f = c.schema.field(name)
    except KeyError:
        return pa.nulls(n, target)
    if not f.constraints.has_default or f.constraints.default is None:
        return pa.nulls(n, target)

    one = convert_pylist([f.constraints.default], f, target, accept_strings=True).values
    return pa.repeat(one[0], n) if not pa.types.is_dictionary(target) else pa.repeat(
        one.cast(target.value_type)[0], n).dictionary_encode()


__all__ = ["Newer", "ReadPool", "Recorded", "Stores", "Upgrader", "Version", "compiled_version",
           "newer_readable", "read_recorded"]
