"""Schema evolution -> migration DDL: the statements that take the cold table from one
version of a schema to the next.

``plan_migration(old, new)`` classifies every change (:mod:`features.schema.diff`,
with aggregations typed as their Postgres columns) and renders the DDL of each
compatible one; ``render_migration(diff)`` renders an existing classification.

The migration touches only the cold table (named after the schema, identifiers
always quoted, unqualified) and the aggregates table (``<schema>__aggregates``), and
only columns stored cold there; constraint names are ``<column>__<kind>`` as in the
generated DDL. It is generated for compatible changes (including ones made
compatible by a rule) when both schemas are loadable under the same name: all
constraint drops first, then column changes, then constraint adds. When the schema
gains its first aggregations, the CREATE TABLE of the aggregates table (the text
``features compile`` writes) is among the column changes. When the diff is allowed
and has no breaking change it ends by recording the new version and fingerprint in
``featureline_schemas`` and both versions (with their YAML text) in
``featureline_schema_versions``. A breaking change has no generated migration: a major
version means a manual migration or a new table.

DDL per change kind (see :mod:`features.schema.diff` for the classification):

=================  ==========================================================
field_added        ADD COLUMN (NOT NULL, DEFAULT) and its CHECKs, when cold
field_removed      DROP NOT NULL (the column stays for history), when a rule
                   allows the removal
field_renamed      RENAME COLUMN and RENAME CONSTRAINT of its CHECKs, when a
                   rule allows the rename
type               ALTER COLUMN TYPE ... USING when the Postgres type changes,
                   and the CHECKs and DEFAULT written again (Postgres keeps the
                   old casts inside them); CHECKs that change with the type
                   (the int8 range) are dropped and re-added
nullable,          SET / DROP NOT NULL, and the CHECK of the not_null rule
required,          (empty_as_null) replaced, on the first of them
empty_as_null
min, max, ...,     the CHECK ``<column>__<kind>`` dropped and re-added
pattern, enum
default            SET DEFAULT / DROP DEFAULT
store              ``cold`` added: ADD COLUMN (in the aggregates table for an
                   aggregation); ``cold`` removed from a field: DROP NOT NULL,
                   when a rule allows it
feature_added      ADD COLUMN when stored cold
aggregation_added  ADD COLUMN in the aggregates table when stored cold; the
                   CREATE TABLE of the aggregates table when the old schema had
                   no aggregations
type (of an        ALTER COLUMN TYPE in the aggregates table
aggregation)
=================  ==========================================================

Columns, CHECKs and defaults come from :mod:`features.compile.postgres`, the same
code that writes the cold table, so a migrated table equals a freshly created one.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from features.compile.fingerprint import fingerprint
from features.compile.postgres import (
    SCHEMAS_TABLE,
    VERSIONS_TABLE,
    aggregates_table_name,
    aggregation_pg_type,
    check_expr,
    cold_table_name,
    constraint_name,
    pg_type,
    quote_ident,
    quote_literal,
    record_version,
    render_aggregates_table,
    sql_value,
    versions_table,
)
from features.compile.rules import ReasonCode, field_rules
from features.schema.diff import Change, ChangeKind, SchemaDiff, diff_schemas, store_changes
from features.schema.model import Aggregation, Feature, Field, Schema


@dataclass(frozen=True)
class Migration:
    """The classified changes from ``diff.old`` to ``diff.new`` and the DDL that applies them.

    - ``change_ddl``: per change of ``diff.changes`` (same order), the statements that
      apply it to the cold table (or the aggregates table), in order; empty when
      nothing in Postgres changes or the change is breaking.
    - ``statements``: the statements migrating the tables for the compatible
      changes (see the module docstring), without trailing semicolons, meant to run
      in one transaction.
    """

    diff: SchemaDiff
    change_ddl: tuple[tuple[str, ...], ...]
    statements: list[str]

    @property
    def complete(self) -> bool:
        """False when breaking changes exist: they have no generated migration, and the
        fingerprint is not recorded."""
        return self.diff.compatible


def plan_migration(old: Schema, new: Schema) -> Migration:
    """Classify every change from ``old`` to ``new`` (an aggregation's stored type is
    its Postgres column type) and render the migration of the compatible ones.

    Never raises for a refused change (``migration.diff.allowed`` is False). Raises
    CompileError where the generated DDL would (a pattern Postgres cannot match like
    RE2, a type or value with no Postgres form), and whatever
    :func:`~features.compile.fingerprint.fingerprint` raises when the migration
    records the new fingerprint.
    """
    return render_migration(diff_schemas(old, new, aggregation_type=aggregation_pg_type))


def render_migration(diff: SchemaDiff) -> Migration:
    """The DDL of each change of ``diff`` (as :func:`~features.schema.diff.diff_schemas`
    returned it: the renderer finds each change by its item and kind) and the whole
    migration. Raises as :func:`plan_migration` does."""
    renderer = _Renderer(diff.old, diff.new, diff.changes)
    renderer.fields()
    renderer.features()
    renderer.aggregations()
    pairs = list(zip(diff.changes, renderer.ddls, strict=True))
    statements = _phases(d for c, d in pairs if c.compatible)
    if diff.changes and diff.refusal is None and diff.compatible and renderer.table is not None:
        old_fp, new_fp = fingerprint(diff.old), fingerprint(diff.new)
        statements += [_record_fingerprint(diff.new, new_fp),
                       # both versions' YAML text, so readers of Redis hashes the old version
                       # wrote can rebuild its layout (features migrate, docs/evolution.md)
                       versions_table().rstrip().removesuffix(";"),
                       record_version(diff.old, old_fp), record_version(diff.new, new_fp, old_fp)]
    return Migration(
        diff=diff, change_ddl=tuple(d.all() if c.compatible else () for c, d in pairs), statements=statements,
    )


# --------------------------------------------------------------------------- tables


def _checks(f: Field) -> dict[str, str]:
    """The CHECK constraints of ``f``'s cold column: constraint name -> expression.

    Raises CompileError where the generated DDL would (a pattern Postgres cannot
    match like RE2, a bound that is not a value of the type)."""
    out: dict[str, str] = {}
    for rule in field_rules(f):
        expr = check_expr(f, rule)
        if expr is not None:
            out[constraint_name(f.name, rule.kind)] = expr
    return out


def _default_sql(f: Field) -> str | None:
    """The column DEFAULT expression, or None (as in the generated DDL)."""
    c = f.constraints
    if not c.has_default or c.default is None:
        return None
    return sql_value(c.default, f.type, f"field {f.name} default")


@dataclass
class _Ddl:
    """Statements of one change, by phase (drops, column changes, adds)."""

    drops: list[str] = field(default_factory=list)
    alters: list[str] = field(default_factory=list)
    adds: list[str] = field(default_factory=list)

    def all(self) -> tuple[str, ...]:
        return (*self.drops, *self.alters, *self.adds)


class _Table:
    """The cold table a migration runs against (and the aggregates table beside it):
    builds their ALTER TABLE statements. ``schema`` is the NEW schema."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.name = quote_ident(cold_table_name(schema))
        self.aggregates = quote_ident(aggregates_table_name(schema))
        self.keys = frozenset({schema.entity or "", schema.event_time or ""})

    def alter(self, action: str) -> str:
        return f"ALTER TABLE {self.name} {action}"

    def alter_aggregates(self, action: str) -> str:
        return f"ALTER TABLE {self.aggregates} {action}"

    def add_aggregation_column(self, agg: Aggregation, ddl: _Ddl) -> None:
        ddl.alters.append(self.alter_aggregates(
            f"ADD COLUMN {quote_ident(agg.name)} {aggregation_pg_type(self.schema, agg)}"))

    def add_column(self, f: Field, ddl: _Ddl) -> None:
        parts = [f"ADD COLUMN {quote_ident(f.name)} {pg_type(f.type)}"]
        if f.constraints.not_null:
            parts.append("NOT NULL")
        if (default := _default_sql(f)) is not None:
            parts.append(f"DEFAULT {default}")
        ddl.alters.append(self.alter(" ".join(parts)))
        self.add_checks(_checks(f), {}, ddl)

    def add_feature_column(self, feat: Feature, ddl: _Ddl) -> None:
        ddl.alters.append(self.alter(f"ADD COLUMN {quote_ident(feat.name)} {pg_type(feat.dtype)}"))

    def drop_checks(self, old: dict[str, str], new: dict[str, str], ddl: _Ddl) -> set[str]:
        """Drop each constraint of ``old`` that ``new`` lacks or words differently;
        returns the names dropped."""
        names = {name for name, expr in old.items() if new.get(name) != expr}
        ddl.drops.extend(
            self.alter(f"DROP CONSTRAINT IF EXISTS {quote_ident(name)}") for name in old if name in names
        )
        return names

    def add_checks(self, new: dict[str, str], old: dict[str, str], ddl: _Ddl) -> set[str]:
        """Add each constraint of ``new`` that ``old`` lacks or words differently;
        returns the names added."""
        names = {name for name, expr in new.items() if old.get(name) != expr}
        ddl.adds.extend(
            self.alter(f"ADD CONSTRAINT {quote_ident(name)} CHECK ({expr})")
            for name, expr in new.items() if name in names
        )
        return names


# ------------------------------------------------------------------------ renderer

#: Constraint change kinds and the rule whose CHECK each one replaces.
_CHECK_RULES = (
    (ChangeKind.MIN, ReasonCode.MIN), (ChangeKind.MAX, ReasonCode.MAX),
    (ChangeKind.MIN_LENGTH, ReasonCode.MIN_LENGTH), (ChangeKind.MAX_LENGTH, ReasonCode.MAX_LENGTH),
    (ChangeKind.PATTERN, ReasonCode.PATTERN), (ChangeKind.ENUM, ReasonCode.ENUM),
)
#: Null change kinds: the first one present carries NOT NULL and the not_null CHECK.
_NULL_KINDS = (ChangeKind.REQUIRED, ChangeKind.NULLABLE, ChangeKind.EMPTY_AS_NULL)


class _Renderer:
    """Renders the DDL of each change of one diff into ``ddls`` (same order as the
    changes). Walks the two schemas as the classification does and finds each change
    by its item (scope and name) and kind."""

    def __init__(self, old: Schema, new: Schema, changes: Sequence[Change]) -> None:
        self.old, self.new = old, new
        self.changes = changes
        self.ddls = [_Ddl() for _ in changes]
        same_table = old.loadable and new.loadable and old.name == new.name
        self.table = _Table(new) if same_table else None
        #: (scope, name) -> change kind -> indexes of its changes, in order
        self.at: dict[tuple[str, str], dict[ChangeKind, list[int]]] = defaultdict(lambda: defaultdict(list))
        for i, c in enumerate(changes):
            self.at[(c.scope, c.field)][c.kind].append(i)

    def ddl(self, scope: str, name: str, kind: ChangeKind) -> _Ddl | None:
        """The DDL of the (one) change of ``kind`` to the item, None when there is none."""
        found = self.at.get((scope, name), {}).get(kind)
        return self.ddls[found[0]] if found else None

    def in_cold(self, f: Field | Feature, schema: Schema) -> bool:
        if self.table is None:
            return False
        return "cold" in f.store or f.name in (schema.entity, schema.event_time)

    # -- fields -----------------------------------------------------------------

    def fields(self) -> None:
        old_by = {f.name: f for f in self.old.fields}
        renames = {c.field: c.old_field for c in self.changes
                   if c.kind is ChangeKind.FIELD_RENAMED and c.old_field is not None}
        for f in self.new.fields:
            if f.name in renames:
                self.renamed(old_by[renames[f.name]], f)
            elif f.name in old_by:
                self.modified(old_by[f.name], f)
            elif self.in_cold(f, self.new):
                ddl = self.ddl("field", f.name, ChangeKind.FIELD_ADDED)
                assert self.table is not None and ddl is not None
                self.table.add_column(f, ddl)
        for f in self.old.fields:
            if (ddl := self.ddl("field", f.name, ChangeKind.FIELD_REMOVED)) is not None:
                self.keep_history(f, ddl)

    def keep_history(self, f: Field, ddl: _Ddl) -> None:
        """DDL for a column no longer written: kept for history, nulls allowed."""
        if self.in_cold(f, self.old) and self.table is not None and f.name not in self.table.keys:
            if f.constraints.not_null:
                ddl.alters.append(self.table.alter(f"ALTER COLUMN {quote_ident(f.name)} DROP NOT NULL"))

    def renamed(self, old: Field, new: Field) -> None:
        ddl = self.ddl("field", new.name, ChangeKind.FIELD_RENAMED)
        assert ddl is not None
        if self.table is not None and self.in_cold(old, self.old) and self.in_cold(new, self.new):
            ddl.alters.append(self.table.alter(
                f"RENAME COLUMN {quote_ident(old.name)} TO {quote_ident(new.name)}"))
            for rule in field_rules(old):
                if check_expr(old, rule) is not None:
                    ddl.alters.append(self.table.alter(
                        f"RENAME CONSTRAINT {quote_ident(constraint_name(old.name, rule.kind))} "
                        f"TO {quote_ident(constraint_name(new.name, rule.kind))}"))
        # Whatever else differs was compared under the new name.
        self.modified(dataclasses.replace(old, name=new.name), new)

    def modified(self, old: Field, new: Field) -> None:
        """The DDL of the changes to a field present in both schemas (under ``new``'s name)."""
        name = new.name
        table = self.table if self.in_cold(old, self.old) and self.in_cold(new, self.new) else None
        old_checks, new_checks = (_checks(old), _checks(new)) if table is not None else ({}, {})
        dropped: set[str] = set()  # CHECKs some change drops (and maybe re-adds)
        added: set[str] = set()

        def check_ddl(kind: ReasonCode, ddl: _Ddl) -> None:
            """Drop and re-add the CHECK of ``kind`` when its expression changed."""
            if table is not None:
                key = constraint_name(name, kind)
                before = {k: v for k, v in old_checks.items() if k == key}
                after = {k: v for k, v in new_checks.items() if k == key}
                dropped.update(table.drop_checks(before, after, ddl))
                added.update(table.add_checks(after, before, ddl))

        for kind, code in _CHECK_RULES:
            if (ddl := self.ddl("field", name, kind)) is not None:
                check_ddl(code, ddl)

        # NOT NULL (and the empty-string CHECK of empty_as_null) follow the not_null
        # rule; they go with the first null change.
        null_ddl = next((d for k in _NULL_KINDS if (d := self.ddl("field", name, k)) is not None), _Ddl())
        a, b = old.constraints, new.constraints
        if table is not None and name not in table.keys and a.not_null != b.not_null:
            action = "SET NOT NULL" if b.not_null else "DROP NOT NULL"
            null_ddl.alters.append(table.alter(f"ALTER COLUMN {quote_ident(name)} {action}"))
        check_ddl(ReasonCode.NOT_NULL, null_ddl)

        # The type; it also owns every CHECK no other change handles (the int8 range,
        # NaN, bounds whose SQL changes with the type). When the column type changes,
        # Postgres keeps the old casts inside CHECKs and DEFAULT (``'NaN'::real``):
        # they are written again so the table equals a freshly created one.
        old_default, new_default = _default_sql(old), _default_sql(new)
        retyped = pg_type(new.type) != pg_type(old.type)
        default_ddl = self.ddl("field", name, ChangeKind.DEFAULT)
        if (ddl := self.ddl("field", name, ChangeKind.TYPE)) is not None and table is not None:
            rest_old = {k: v for k, v in old_checks.items() if k not in dropped}
            rest_new = {k: v for k, v in new_checks.items() if k not in added}
            table.drop_checks(rest_old, {} if retyped else rest_new, ddl)
            if retyped:
                col = quote_ident(name)
                pg = pg_type(new.type)
                ddl.alters.append(table.alter(f"ALTER COLUMN {col} TYPE {pg} USING {col}::{pg}"))
                if new_default is not None and default_ddl is None:
                    ddl.alters.append(table.alter(f"ALTER COLUMN {col} SET DEFAULT {new_default}"))
            table.add_checks(rest_new, {} if retyped else rest_old, ddl)

        if default_ddl is not None and table is not None and (old_default != new_default or retyped):
            action = "DROP DEFAULT" if new_default is None else f"SET DEFAULT {new_default}"
            default_ddl.alters.append(table.alter(f"ALTER COLUMN {quote_ident(name)} {action}"))

        self.stores("field", old, new)

    def stores(self, scope: str, old: Field | Feature | Aggregation,
               new: Field | Feature | Aggregation) -> None:
        """The DDL of the ``store`` changes of one item (in the order of ``store_changes``)."""
        found = self.at.get((scope, new.name), {}).get(ChangeKind.STORE, [])
        for (target, gained), i in zip(store_changes(old, new), found, strict=True):
            ddl = self.ddls[i]
            if target != "cold":
                continue
            if gained and self.table is not None and old.name not in self.table.keys:
                if isinstance(new, Field):
                    self.table.add_column(new, ddl)
                elif isinstance(new, Aggregation):
                    self.table.add_aggregation_column(new, ddl)
                else:
                    self.table.add_feature_column(new, ddl)
            elif not gained and isinstance(old, Field):
                self.keep_history(old, ddl)

    # -- derived features -------------------------------------------------------

    def features(self) -> None:
        old_by = {f.name: f for f in self.old.features}
        for feat in self.new.features:
            before = old_by.get(feat.name)
            if before is not None:
                self.stores("feature", before, feat)
            elif self.table is not None and "cold" in feat.store:
                ddl = self.ddl("feature", feat.name, ChangeKind.FEATURE_ADDED)
                assert ddl is not None
                self.table.add_feature_column(feat, ddl)

    # -- aggregations -----------------------------------------------------------

    def aggregations(self) -> None:
        old_section, new_section = self.old.aggregations, self.new.aggregations
        old_by = {a.name: a for a in (old_section.features if old_section is not None else ())}
        for agg in new_section.features if new_section is not None else ():
            before = old_by.get(agg.name)
            if before is None:
                # Without aggregations before there is no aggregates table to alter: it is
                # created below with every cold aggregation in it.
                if self.table is not None and old_section is not None and "cold" in agg.store:
                    ddl = self.ddl("aggregation", agg.name, ChangeKind.AGGREGATION_ADDED)
                    assert ddl is not None
                    self.table.add_aggregation_column(agg, ddl)
                continue
            ddl = self.ddl("aggregation", agg.name, ChangeKind.TYPE)
            if ddl is not None and self.table is not None and "cold" in before.store and "cold" in agg.store:
                col, after = quote_ident(agg.name), aggregation_pg_type(self.new, agg)
                ddl.alters.append(self.table.alter_aggregates(
                    f"ALTER COLUMN {col} TYPE {after} USING {col}::{after}"))
            self.stores("aggregation", before, agg)
        if old_section is None and new_section is not None and self.table is not None:
            create = render_aggregates_table(self.new).rstrip().removesuffix(";")
            for c, ddl in zip(self.changes, self.ddls, strict=True):
                if c.kind is ChangeKind.AGGREGATION_ADDED and c.compatible:
                    ddl.alters.insert(0, create)
                    break


# --------------------------------------------------------------------- statements


def _phases(ddls: Iterable[_Ddl]) -> list[str]:
    items = list(ddls)
    return [s for d in items for s in d.drops] + [s for d in items for s in d.alters] + [
        s for d in items for s in d.adds
    ]


def mismatch_hint(schema: Schema, stored_version: str) -> str:
    """What to do when the stores hold ``stored_version`` of a schema and a reader or
    writer has ``schema``: migrate the stores to a newer file, or take the newer file."""
    try:
        newer = tuple(int(p) for p in stored_version.split(".")) > schema.version
    except ValueError:
        newer = False
    if newer:
        return "the stores hold a newer version: use the schema file of that version"
    where = schema.path or f"{schema.name}.yaml"
    return (f"run `features migrate {where}` (a dry run, then --apply) to bring the stores to this version "
            "when it is a compatible change, or use the schema file the data was written with "
            "(docs/evolution.md)")


def brief(statement: str) -> str:
    """``statement`` as the text views print it: a record of a version in
    ``featureline_schema_versions`` without the YAML text it carries (``--sql`` and
    ``--json`` print it whole)."""
    head = f"INSERT INTO {quote_ident(VERSIONS_TABLE)} "
    if not statement.startswith(head):
        return statement
    values = statement[statement.index("VALUES (") + 8:]
    name, fp, version = (v.strip().strip("'") for v in values.split(",")[:3])
    return f"-- {head.strip()}: {name} {version} ({fp[:12]}) with its YAML text"


def change_label(compatible: bool) -> str:
    """``compatible`` or ``BREAKING``: a change's label in the diff's text."""
    return "compatible" if compatible else "BREAKING"


def title_lines(kind: str, old: tuple[str, str], new: tuple[str, str], names: Sequence[str]) -> list[str]:
    """The diff's title line (``schema NAME: 1.0.0 -> 1.1.0``; ``no changes`` under it when
    ``names`` is empty): ``old`` and ``new`` are (name, version)."""
    title = old[0] if old[0] == new[0] else f"{old[0]} -> {new[0]}"
    return [f"{kind} {title}: {old[1]} -> {new[1]}", *(["  no changes"] if not names else [])]


def diff_text(migration: Migration) -> list[str]:
    """The lines ``features schema diff OLD NEW`` prints for ``migration`` (its stdout): each
    change with its label, the ``quality:`` changes (``gate``), the warnings, then the
    migration DDL (a version record without its YAML text: :func:`brief`). The refusal,
    when there is one, is not among them (the command writes it to stderr)."""
    result = migration.diff
    old, new = result.old, result.new
    names = [c.field for c in result.changes] + ["quality"] * bool(result.quality)
    out = title_lines("schema", (old.name, old.version_str), (new.name, new.version_str), names)
    width = max((len(n) for n in names), default=0)
    for c in result.changes:
        line = f"  {change_label(c.compatible):<10}  {c.field:<{width}}  {c.kind.value}: {c.detail}"
        if c.honoured_rule is not None and not c.overridden:  # an override says so in the detail
            rule = c.honoured_rule
            line += f"  (rule honoured: {rule.field} breaking_change={str(rule.breaking_change).lower()})"
        out.append(line)
    out += [f"  {'gate':<10}  {'quality':<{width}}  {text}" for text in result.quality]  # never a data change
    out += [f"warning: {warning}" for warning in result.warnings]
    if migration.statements:
        out.append("")
        out.append("-- migration DDL" if result.compatible else
                   "-- partial migration DDL: only the compatible changes; breaking changes need a manual "
                   "migration")
        out.append("BEGIN;")
        for statement in migration.statements:
            short = brief(statement)
            out.append(short if short != statement else f"{statement};")
        out.append("COMMIT;")
        if any(brief(s) != s for s in migration.statements):
            out.append("-- (--sql prints the whole migration, to pipe to psql)")
    elif result.changes and result.compatible:
        out += ["", "-- no migration DDL: the cold table does not change"]
    elif result.breaking and result.allowed:
        out += ["", "-- no migration DDL: breaking changes need a manual migration (or a new table)"]
    return out


def _record_fingerprint(new: Schema, fp: str) -> str:
    """Upsert the new version and fingerprint into ``featureline_schemas`` (the table
    ``features compile``'s DDL creates, keyed by schema name)."""
    columns = ("schema_name", "version", "fingerprint", "applied_at")
    name, version, fp_col, applied = (quote_ident(c) for c in columns)
    values = ", ".join(quote_literal(v) for v in (new.name, new.version_str, fp))
    return (
        f"INSERT INTO {quote_ident(SCHEMAS_TABLE)} ({name}, {version}, {fp_col}) VALUES ({values}) "
        f"ON CONFLICT ({name}) DO UPDATE SET {version} = EXCLUDED.{version}, "
        f"{fp_col} = EXCLUDED.{fp_col}, {applied} = now()"
    )


__all__ = ["Migration", "brief", "change_label", "diff_text", "mismatch_hint", "plan_migration",
           "render_migration", "title_lines"]
