"""The registry's history, diffs, views and GX suites (read-only).

- A schema's *history*: the rows of ``featureline_schema_versions`` (every version the
  stores have held: fingerprint, version, whether its YAML text is recorded, the version
  it was migrated from, when it was recorded), read by the table's primary key
  (``schema_name, fingerprint``): the newest :data:`HISTORY_ROWS` of them, shown oldest
  first (a version recorded in the same transaction as the one it was migrated from comes
  after it). The version ``featureline_schemas`` records is the one the stores hold.
- A *diff* between two recorded versions, or between the newest recorded one and the
  YAML in the schemas folder (``file``): the same classification and the same lines as
  ``features schema diff OLD NEW`` (:func:`features.compile.migration.diff_text`) over
  the two YAML texts, each checked against its recorded fingerprint
  (:func:`features.sinks.versions.compiled_version`).
- A *view*: its keys, request fields, the columns it reads from each schema (each a
  field, a derived feature or an aggregation of that schema), its request-time derived
  features, its version and fingerprint (:func:`features.views.compile.view_fingerprint`).
- A schema's *GX suite*: the text ``features compile`` writes to
  ``expectations/<name>.json`` (and ``<name>__aggregates.json``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from features.compile import CompiledSchema
from features.compile.migration import diff_text, plan_migration
from features.compile.postgres import SCHEMAS_TABLE, VERSIONS_TABLE
from features.compile.suite import suite_json
from features.errors import SchemaError, SinkError
from features.ops.catalog import Catalog, describe, list_all
from features.schema.model import Schema
from features.sinks.versions import Version, compiled_version
from features.ui.data import UIData
from features.views.compile import view_fingerprint

#: versions listed on a schema's page, at most: the newest ones
HISTORY_ROWS = 100
#: the ``to`` of a diff that means the YAML in the schemas folder
FILE = "file"

_COLUMNS = sql.SQL("fingerprint, version, definition IS NOT NULL, migrated_from, recorded_at")


@dataclass(frozen=True)
class VersionRow:
    """One row of ``featureline_schema_versions`` (without its YAML text)."""

    fingerprint: str
    version: str
    has_text: bool
    migrated_from: str | None
    recorded_at: dt.datetime
    held: bool  # the version featureline_schemas records: the one the stores hold
    ref: str  # how a diff link names it: its version when no other row has it, else its fingerprint
    base: str | None  # the ref of the row its diff link starts from: the version it was migrated
    #                   from, else the row before it; None for the first


@dataclass(frozen=True)
class History:
    """A schema's newest recorded versions (at most :data:`HISTORY_ROWS`), oldest first;
    ``table`` False when the versions table does not exist; ``total`` every row of it."""

    table: bool
    rows: list[VersionRow]
    held: tuple[str, str] | None  # (version, fingerprint) of featureline_schemas
    total: int = 0

    def newest(self) -> VersionRow | None:
        """The version the stores hold (else the last recorded one)."""
        held = [r for r in self.rows if r.held]
        return held[0] if held else (self.rows[-1] if self.rows else None)

    def version_of(self, fp: str | None) -> str | None:
        return next((r.version for r in self.rows if r.fingerprint == fp), None)


@dataclass(frozen=True)
class Side:
    """One side of a diff: its label, version and fingerprint."""

    label: str
    version: str
    fingerprint: str


@dataclass(frozen=True)
class DiffPage:
    """``features schema diff`` between two versions: its lines, verdict and quality changes."""

    schema: str
    old: Side
    new: Side
    lines: list[str]
    compatible: bool
    allowed: bool
    refusal: str | None
    quality: tuple[str, ...]
    warnings: tuple[str, ...]
    changes: int


class NotFound(LookupError):
    """A version, or the YAML text of one, that the diff cannot find (the page: 404)."""


def _depths(rows: list[tuple[Any, ...]]) -> dict[str, int]:
    """Per fingerprint, how many of ``rows`` it descends from (``migrated_from`` links)."""
    origin = {r[0]: r[3] for r in rows}
    depth: dict[str, int] = {}
    for fp in origin:
        chain = []
        at: str | None = fp
        while at is not None and at in origin and at not in depth and at not in chain:
            chain.append(at)
            at = origin[at]
        known = depth.get(at, -1) if at is not None else -1
        for i, f in enumerate(reversed(chain)):
            depth[f] = known + 1 + i
    return depth


def history(data: UIData, name: str, limit: int = HISTORY_ROWS) -> History:
    """``name``'s newest ``limit`` rows of ``featureline_schema_versions``, oldest first,
    and the version ``featureline_schemas`` records. Every query is a range of a primary
    key (``schema_name, ...``): bounded by the schema's own versions."""
    table = sql.Identifier(VERSIONS_TABLE)
    with data.session("reading featureline_schema_versions") as conn:
        held_row = conn.execute("SELECT version, fingerprint FROM featureline_schemas WHERE schema_name = %s",
                                [name]).fetchone() if data.exists(conn, SCHEMAS_TABLE) else None
        held = None if held_row is None else (str(held_row[0]), str(held_row[1]))
        if not data.exists(conn, VERSIONS_TABLE):
            return History(False, [], held)
        rows = conn.execute(sql.SQL("SELECT {} FROM {} WHERE schema_name = %s ORDER BY recorded_at DESC, "
                                    "fingerprint DESC LIMIT %s").format(_COLUMNS, table), [name, limit]
                            ).fetchall()
        total_row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE schema_name = %s").format(table),
                                 [name]).fetchone()
        repeated = {r[0] for r in conn.execute(sql.SQL(
            "SELECT version FROM {} WHERE schema_name = %s GROUP BY version HAVING count(*) > 1"
        ).format(table), [name])}
    depth = _depths(rows)  # rows recorded in one transaction share recorded_at: an ancestor first
    rows.sort(key=lambda r: (r[4], depth[r[0]], r[0]))
    refs = {r[0]: r[0] if r[1] in repeated or r[1] == FILE else r[1] for r in rows}
    out: list[VersionRow] = []
    for i, (fp, version, text, origin, at) in enumerate(rows):
        base = refs.get(origin or "", origin) or (refs[rows[i - 1][0]] if i else None)
        is_held = held is not None and fp == held[1]
        out.append(VersionRow(fp, version, bool(text), origin, at, is_held, refs[fp], base))
    return History(True, out, held, int(total_row[0]) if total_row else len(out))


def _recorded(conn: Any, name: str, ref: str) -> tuple[Version, dt.datetime]:
    """The row a diff's ``from``/``to`` names (a fingerprint, or a version one row has), with
    its YAML text: a range of the primary key."""
    rows = conn.execute(sql.SQL(
        "SELECT fingerprint, version, definition, migrated_from, recorded_at FROM {} WHERE schema_name = %s "
        "AND (fingerprint = %s OR version = %s) ORDER BY fingerprint = %s DESC LIMIT 5"
    ).format(sql.Identifier(VERSIONS_TABLE)), [name, ref, ref, ref]).fetchall()
    if (rows and rows[0][0] == ref) or len(rows) == 1:
        return Version(*rows[0][:4]), rows[0][4]
    if rows:
        raise NotFound(f"{name} has {len(rows)} or more recorded versions {ref}: name one by its fingerprint "
                       f"({', '.join(r[0][:12] for r in rows)}...)")
    raise NotFound(f"featureline_schema_versions records no version or fingerprint {ref!r} of {name} "
                   "(the schema's page lists them)")


def diff(data: UIData, catalog: Catalog, name: str, old_ref: str, new_ref: str) -> DiffPage:
    """``features schema diff`` from ``old_ref`` to ``new_ref`` (a recorded version or
    fingerprint, or :data:`FILE`: the YAML in the schemas folder), each recorded one parsed
    from its YAML text and checked against its fingerprint. NotFound names what is missing."""
    found: dict[str, tuple[Version, dt.datetime]] = {}
    wanted = [ref for ref in (old_ref, new_ref) if ref != FILE]
    if wanted:
        with data.session("reading featureline_schema_versions") as conn:
            if not data.exists(conn, VERSIONS_TABLE):
                raise NotFound(f"{VERSIONS_TABLE} does not exist: no version of {name} is recorded")
            found = {ref: _recorded(conn, name, ref) for ref in wanted}
    sides: list[tuple[Side, Schema]] = []
    for ref in (old_ref, new_ref):
        if ref == FILE:
            schema = catalog.schemas[name]
            fp = data.schemas[name].fingerprint
            sides.append((Side("the schemas folder's YAML", schema.version_str, fp), schema))
            continue
        v, at = found[ref]
        try:
            recorded = compiled_version(v, name).schema
        except (SinkError, SchemaError) as exc:
            raise NotFound(str(exc)) from exc
        sides.append((Side(f"recorded {at:%Y-%m-%d %H:%M:%S UTC}", v.version, v.fingerprint), recorded))
    (old, old_schema), (new, new_schema) = sides
    migration = plan_migration(old_schema, new_schema)
    d = migration.diff
    return DiffPage(name, old, new, diff_text(migration), d.compatible, d.allowed, d.refusal, d.quality,
                    d.warnings, len(d.changes))


def suites(c: CompiledSchema) -> list[tuple[str, str]]:
    """(file name, text) of each GX suite ``features compile`` writes for ``c``."""
    out = [(f"{c.name}.json", suite_json(c.expectations))]
    if c.aggregates_expectations is not None:
        out.append((f"{c.aggregates_expectations['name']}.json", suite_json(c.aggregates_expectations)))
    return out


def _kind(schema: Schema, column: str) -> str:
    """What ``column`` of ``schema`` is: field, derived feature (one of its columns), aggregation."""
    if any(f.name == column for f in schema.fields):
        return "field"
    if any(column in schema.feature_columns(f) for f in schema.features):
        return "derived"
    return "aggregation"


def view_page(catalog: Catalog, name: str) -> dict[str, Any]:
    """``features describe VIEW``'s document, each source column with what it is in its
    schema, and the view's fingerprint."""
    v = catalog.views[name]
    d = describe(catalog, name)
    for source, s in zip(d["sources"], v.sources, strict=True):
        schema = catalog.schemas[s.schema]
        source["columns"] = [{"feature": f, "column": s.column(f), "kind": _kind(schema, f)}
                             for f in s.features]
    return {**d, "fingerprint": view_fingerprint(v)}


def view_rows(catalog: Catalog) -> list[dict[str, Any]]:
    """``features list``'s row of each view, with its fingerprint (12 digits)."""
    return [{**row, "fingerprint": view_fingerprint(catalog.views[row["name"]])[:12]}
            for row in list_all(catalog)["views"]]


__all__ = ["FILE", "HISTORY_ROWS", "DiffPage", "History", "NotFound", "Side", "VersionRow", "diff", "history",
           "suites", "view_page", "view_rows"]
