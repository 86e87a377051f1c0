"""features.schema.diff (the classification), features.compile.migration (its DDL) and
``features schema diff``: every change kind, rules, versions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from features.cli import main
from features.compile import compile_schema
from features.compile.fingerprint import fingerprint
from features.compile.migration import Migration, plan_migration
from features.schema.diff import Change, ChangeKind
from features.schema.model import Schema
from features.schema.parse import parse_schema

KEYS = """\
  - name: application_id
    type: string
    constraints: {required: true}
  - name: submitted_at
    type: timestamp(us, UTC)
    constraints: {required: true}
"""


def schema(fields: str = "", *, version: str = "1.0.0", extra: str = "", head: str = "") -> Schema:
    """A loadable schema ``applicants`` with its key fields plus ``fields`` (YAML)."""
    text = (
        f"name: applicants\nversion: {version}\n"
        + (head or "entity: application_id\nevent_time: submitted_at\n")
        + "fields:\n" + KEYS + fields + extra
    )
    return parse_schema(text, "applicants.yaml")


def field(name: str, type_: str, constraints: str = "", more: str = "") -> str:
    out = f"  - name: {name}\n    type: {type_}\n"
    if more:
        out += "".join(f"    {line}\n" for line in more.splitlines())
    if constraints:
        out += f"    constraints: {{{constraints}}}\n"
    return out


def only(d: Migration) -> Change:
    assert len(d.diff.changes) == 1, d.diff.changes
    return d.diff.changes[0]


def diff(old_fields: str, new_fields: str, *, old_v: str = "1.0.0", new_v: str = "1.1.0",
         old_extra: str = "", new_extra: str = "") -> Migration:
    return plan_migration(
        schema(old_fields, version=old_v, extra=old_extra),
        schema(new_fields, version=new_v, extra=new_extra),
    )


T = '"applicants"'


# ------------------------------------------------------------------ no change


def test_identical_schemas_have_no_changes_and_no_ddl() -> None:
    f = field("income", "decimal(15,2)", "min: 0.01")
    d = diff(f, f, new_v="1.0.0")
    assert d.diff.changes == ()
    assert d.statements == []
    assert d.diff.allowed and d.diff.compatible and d.diff.warnings == ()


def test_description_and_field_order_are_not_changes() -> None:
    a, b = field("a", "int32"), field("b", "int32")
    d = diff(a + b, b + field("a", "int32", more="description: now documented"), new_v="1.0.0")
    assert d.diff.changes == ()


# -------------------------------------------------------------- fields added


def test_field_added_nullable_is_compatible_with_add_column() -> None:
    d = diff("", field("score", "int32", "max: 100"))
    c = only(d)
    assert (c.field, c.kind, c.compatible) == ("score", ChangeKind.FIELD_ADDED, True)
    assert d.statements[:2] == [
        f'ALTER TABLE {T} ADD COLUMN "score" integer',
        f'ALTER TABLE {T} ADD CONSTRAINT "score__max" CHECK ("score" <= 100)',
    ]


def test_field_added_not_nullable_with_default_is_compatible() -> None:
    d = diff("", field("months", "int32", "nullable: false, default: 0"))
    c = only(d)
    assert c.compatible and c.kind is ChangeKind.FIELD_ADDED
    assert d.statements[0] == f'ALTER TABLE {T} ADD COLUMN "months" integer NOT NULL DEFAULT 0'


@pytest.mark.parametrize("constraints", ["required: true", "nullable: false"])
def test_field_added_required_without_default_is_breaking(constraints: str) -> None:
    c = only(diff("", field("months", "int32", constraints), new_v="2.0.0"))
    assert (c.kind, c.compatible) == (ChangeKind.FIELD_ADDED, False)
    assert "without a default" in c.detail


# ------------------------------------------------------ removed and renamed


def test_field_removed_is_breaking() -> None:
    d = diff(field("score", "int32"), "", new_v="2.0.0")
    c = only(d)
    assert (c.field, c.kind, c.compatible) == ("score", ChangeKind.FIELD_REMOVED, False)
    assert d.diff.allowed
    assert d.statements == []


def test_field_renamed_is_detected_as_a_breaking_rename_hint() -> None:
    d = diff(field("score", "int32", "min: 0"), field("points", "int32", "min: 0"), new_v="2.0.0")
    c = only(d)
    assert (c.field, c.old_field, c.kind) == ("points", "score", ChangeKind.FIELD_RENAMED)
    assert not c.compatible
    assert "renamed?" in c.detail


def test_removed_and_added_fields_of_different_types_are_not_a_rename() -> None:
    d = diff(field("score", "int32"), field("label", "string"), new_v="2.0.0")
    assert [(c.field, c.kind) for c in d.diff.changes] == [
        ("label", ChangeKind.FIELD_ADDED), ("score", ChangeKind.FIELD_REMOVED),
    ]


# -------------------------------------------------------------------- types


@pytest.mark.parametrize(
    ("old", "new", "pg"),
    [
        ("int16", "int32", "integer"),
        ("int32", "int64", "bigint"),
        ("int16", "int64", "bigint"),
        ("float32", "float64", "double precision"),
        ("decimal(15,2)", "decimal(18,2)", "numeric(18,2)"),
        ("decimal(10,2)", "decimal(12,3)", "numeric(12,3)"),
    ],
)
def test_type_widening_is_compatible_with_alter_column_type(old: str, new: str, pg: str) -> None:
    d = diff(field("x", old), field("x", new))
    c = only(d)
    assert (c.kind, c.compatible) == (ChangeKind.TYPE, True)
    assert f"widened from {old} to {new}" in c.detail
    assert f'ALTER TABLE {T} ALTER COLUMN "x" TYPE {pg} USING "x"::{pg}' in d.statements


def test_int8_to_int16_drops_the_int8_range_check_without_retyping() -> None:
    d = diff(field("x", "int8"), field("x", "int16"))
    c = only(d)
    assert c.compatible
    assert d.change_ddl[0] == (f'ALTER TABLE {T} DROP CONSTRAINT IF EXISTS "x__type"',)  # both are smallint


def test_retyping_rewrites_checks_and_default_that_keep_the_old_cast() -> None:
    # Postgres keeps `'NaN'::real` inside a CHECK across ALTER TYPE: it is re-added.
    d = diff(field("r", "float32", "default: 0.5"), field("r", "float64", "default: 0.5"))
    only(d)
    assert d.change_ddl[0] == (
        f'ALTER TABLE {T} DROP CONSTRAINT IF EXISTS "r__type"',
        f'ALTER TABLE {T} DROP CONSTRAINT IF EXISTS "r__nan"',
        f'ALTER TABLE {T} ALTER COLUMN "r" TYPE double precision USING "r"::double precision',
        f"ALTER TABLE {T} ALTER COLUMN \"r\" SET DEFAULT '0.5'::double precision",
        f"ALTER TABLE {T} ADD CONSTRAINT \"r__type\" CHECK (\"r\" NOT IN ('Infinity', '-Infinity'))",
        f'ALTER TABLE {T} ADD CONSTRAINT "r__nan" CHECK ("r" <> \'NaN\')',
    )


@pytest.mark.parametrize(
    ("old", "new", "word"),
    [
        ("int64", "int32", "narrowed"),
        ("int16", "int8", "narrowed"),
        ("float64", "float32", "narrowed"),
        ("decimal(18,2)", "decimal(15,2)", "narrowed"),
        ("decimal(10,2)", "decimal(10,3)", "narrowed"),  # integer digits 8 -> 7
        ("decimal(10,2)", "decimal(12,1)", "narrowed"),  # scale lost
        ("int32", "string", "changed"),
        ("int64", "float64", "changed"),
        ("int32", "decimal(18,0)", "changed"),
        ("date", "timestamp(us)", "changed"),
    ],
)
def test_type_narrowing_or_kind_change_is_breaking(old: str, new: str, word: str) -> None:
    d = diff(field("x", old), field("x", new), new_v="2.0.0")
    c = only(d)
    assert (c.kind, c.compatible) == (ChangeKind.TYPE, False)
    assert f"{word} from {old} to {new}" in c.detail
    assert d.statements == []


@pytest.mark.parametrize(
    ("old", "new", "what"),
    [
        ("timestamp(ms)", "timestamp(us)", "unit ms -> us"),
        ("timestamp(us)", "timestamp(us, UTC)", "zone none -> UTC"),
        ("timestamp(us, UTC)", "timestamp(us, Europe/Paris)", "zone UTC -> Europe/Paris"),
    ],
)
def test_timestamp_unit_or_zone_change_is_breaking(old: str, new: str, what: str) -> None:
    c = only(diff(field("seen_at", old), field("seen_at", new), new_v="2.0.0"))
    assert (c.kind, c.compatible) == (ChangeKind.TYPE, False)
    assert what in c.detail


# ------------------------------------------------------- nullable, required


def test_nullable_false_to_true_is_compatible_drop_not_null() -> None:
    d = diff(field("x", "int32", "nullable: false"), field("x", "int32", "nullable: true"))
    c = only(d)
    assert (c.kind, c.compatible) == (ChangeKind.NULLABLE, True)
    assert d.statements[0] == f'ALTER TABLE {T} ALTER COLUMN "x" DROP NOT NULL'


def test_nullable_true_to_false_is_breaking() -> None:
    old, new = field("x", "int32", "nullable: true"), field("x", "int32", "nullable: false")
    c = only(diff(old, new, new_v="2.0.0"))
    assert (c.kind, c.compatible) == (ChangeKind.NULLABLE, False)


def test_required_added_is_breaking() -> None:
    c = only(diff(field("x", "int32"), field("x", "int32", "required: true"), new_v="2.0.0"))
    assert (c.kind, c.compatible) == (ChangeKind.REQUIRED, False)


def test_required_removed_is_compatible_and_drops_not_null() -> None:
    d = diff(field("x", "int32", "required: true"), field("x", "int32"))
    c = only(d)
    assert (c.kind, c.compatible) == (ChangeKind.REQUIRED, True)
    assert f'ALTER TABLE {T} ALTER COLUMN "x" DROP NOT NULL' in d.statements


# -------------------------------------------------------------- constraints


@pytest.mark.parametrize(
    ("type_", "old", "new", "kind", "detail"),
    [
        ("int32", "min: 10", "min: 5", ChangeKind.MIN, "min lowered from 10 to 5"),
        ("int32", "min: 10", "", ChangeKind.MIN, "min removed (was 10)"),
        ("decimal(18,2)", "max: 100.00", "max: 250.50", ChangeKind.MAX, "max raised from 100.00 to 250.50"),
        ("int32", "max: 100", "", ChangeKind.MAX, "max removed (was 100)"),
        ("string", "pattern: '^[a-z]+$'", "", ChangeKind.PATTERN, "pattern removed"),
        ("string", "min_length: 3", "min_length: 1", ChangeKind.MIN_LENGTH, "lowered from 3 to 1"),
        ("string", "max_length: 8", "max_length: 64", ChangeKind.MAX_LENGTH, "raised from 8 to 64"),
        ("date", "min: '2020-01-01'", "min: '2019-06-30'", ChangeKind.MIN, "min lowered"),
    ],
)
def test_constraint_loosened_is_compatible_and_replaces_the_check(
    type_: str, old: str, new: str, kind: ChangeKind, detail: str
) -> None:
    d = diff(field("x", type_, old), field("x", type_, new))
    c = only(d)
    assert (c.kind, c.compatible) == (kind, True)
    assert detail in c.detail
    name = f'"x__{kind.value}"'
    assert d.statements[0] == f"ALTER TABLE {T} DROP CONSTRAINT IF EXISTS {name}"
    re_added = [s for s in d.statements if f"ADD CONSTRAINT {name}" in s]
    assert len(re_added) == (1 if new else 0)


def test_loosened_min_re_adds_the_check_with_the_new_bound() -> None:
    d = diff(field("x", "int32", "min: 10"), field("x", "int32", "min: 5"))
    assert d.statements[:2] == [
        f'ALTER TABLE {T} DROP CONSTRAINT IF EXISTS "x__min"',
        f'ALTER TABLE {T} ADD CONSTRAINT "x__min" CHECK ("x" >= 5)',
    ]


@pytest.mark.parametrize(
    ("type_", "old", "new", "kind", "detail"),
    [
        ("int32", "min: 5", "min: 10", ChangeKind.MIN, "min raised from 5 to 10"),
        ("int32", "", "min: 0", ChangeKind.MIN, "min added: 0"),
        ("int32", "max: 100", "max: 99", ChangeKind.MAX, "max lowered from 100 to 99"),
        ("string", "", "pattern: '^[a-z]+$'", ChangeKind.PATTERN, "pattern added"),
        ("string", "pattern: '^[a-z]+$'", "pattern: '^[a-z0-9]+$'", ChangeKind.PATTERN, "pattern changed"),
        ("string", "max_length: 64", "max_length: 8", ChangeKind.MAX_LENGTH, "max_length lowered"),
        ("string", "", "min_length: 1", ChangeKind.MIN_LENGTH, "min_length added: 1"),
    ],
)
def test_constraint_tightened_is_breaking(
    type_: str, old: str, new: str, kind: ChangeKind, detail: str
) -> None:
    d = diff(field("x", type_, old), field("x", type_, new), new_v="2.0.0")
    c = only(d)
    assert (c.kind, c.compatible) == (kind, False)
    assert detail in c.detail
    assert d.statements == []


def test_enum_value_added_is_compatible_and_replaces_the_check() -> None:
    old = field("status", "enum", more="values: [a, b]")
    d = diff(old, field("status", "enum", more="values: [a, b, c]"))
    c = only(d)
    assert (c.kind, c.compatible) == (ChangeKind.ENUM, True)
    assert "values added: 'c'" in c.detail
    assert d.statements[:2] == [
        f'ALTER TABLE {T} DROP CONSTRAINT IF EXISTS "status__enum"',
        f'ALTER TABLE {T} ADD CONSTRAINT "status__enum" CHECK ("status" IN (\'a\', \'b\', \'c\'))',
    ]


def test_enum_value_removed_is_breaking() -> None:
    c = only(diff(field("status", "enum", more="values: [a, b]"), field("status", "enum", more="values: [a]"),
                  new_v="2.0.0"))
    assert (c.kind, c.compatible) == (ChangeKind.ENUM, False)
    assert "values removed: 'b'" in c.detail


@pytest.mark.parametrize(
    ("old", "new", "sql"),
    [("default: 0", "default: 5", "SET DEFAULT 5"), ("", "default: 7", "SET DEFAULT 7")],
)
def test_default_added_or_changed_is_compatible_set_default(old: str, new: str, sql: str) -> None:
    d = diff(field("x", "int32", old), field("x", "int32", new))
    c = only(d)
    assert (c.kind, c.compatible) == (ChangeKind.DEFAULT, True)
    assert d.statements[0] == f'ALTER TABLE {T} ALTER COLUMN "x" {sql}'


def test_default_removed_from_a_not_nullable_field_is_breaking() -> None:
    old = field("x", "int32", "nullable: false, default: 0")
    c = only(diff(old, field("x", "int32", "nullable: false"), new_v="2.0.0"))
    assert (c.kind, c.compatible) == (ChangeKind.DEFAULT, False)


def test_accept_strings_loosened_is_compatible_tightened_is_breaking() -> None:
    strict, lenient = field("x", "int32"), field("x", "int32", more="accept_strings: true")
    assert only(diff(strict, lenient)).compatible
    tightened = only(diff(lenient, strict, new_v="2.0.0"))
    assert (tightened.kind, tightened.compatible) == (ChangeKind.ACCEPT_STRINGS, False)


@pytest.mark.parametrize(("old", "new", "compatible", "why"), [
    # text the old field could only reject: a type reject before, a null now
    ("float64", "float64, null_values: [nil, NA]", True, "input the old schema rejected is now read as null"),
    ("float64, accept_strings: true", "float64, accept_strings: true, null_values: [nil, '']", True,
     "rejected is now read as null"),
    ("enum, values: [a, b]", "enum, values: [a, b], null_values: [NA]", True, "rejected is now read as null"),
    ("bool, accept_strings: true", "bool, accept_strings: true, null_values: ['?']", True, "rejected"),
    # text that was a value before: its meaning changes
    ("string", "string, null_values: [nil]", False, "input 'nil' was a value, now read as null"),
    ("int32, accept_strings: true", "int32, accept_strings: true, null_values: ['-999']", False,
     "input '-999' was a value"),
    ("bool, accept_strings: true", "bool, accept_strings: true, null_values: ['false']", False,
     "was a value"),
    ("date", "date, null_values: ['1970-01-01']", False, "input '1970-01-01' was a value"),
    ("enum, values: [a, b]", "enum, values: [b], null_values: [a]", False, "was a value"),
    # a marker removed: the text is read again (a value, or a reject)
    ("float64, null_values: [nil, NA]", "float64, null_values: [nil]", False,
     "input 'NA' is no longer read as null"),
    # '' stays null with empty_as_null
    ("string, null_values: ['']", "string, constraints: {empty_as_null: true}", True, "does not change"),
])
def test_null_values_changes_are_classified(old: str, new: str, compatible: bool, why: str) -> None:
    d = plan_migration(schema(f"  - {{name: x, type: {old}}}\n", version="1.0.0"),
                       schema(f"  - {{name: x, type: {new}}}\n", version="2.0.0"))
    found = [c for c in d.diff.changes if c.kind is ChangeKind.NULL_VALUES]
    assert len(found) == 1, d.diff.changes
    assert (found[0].compatible, found[0].field) == (compatible, "x"), found[0].detail
    assert found[0].detail.startswith("null_values markers ") and why in found[0].detail, found[0].detail
    assert d.change_ddl[d.diff.changes.index(found[0])] == ()  # input reading: no DDL


# --------------------------------------------------------- schema level keys


def test_entity_changed_is_breaking() -> None:
    old = schema(field("customer_id", "string", "required: true"))
    new = parse_schema(
        "name: applicants\nversion: 2.0.0\nentity: customer_id\nevent_time: submitted_at\nfields:\n"
        + KEYS + field("customer_id", "string", "required: true"),
        "applicants.yaml",
    )
    c = only(plan_migration(old, new))
    assert (c.kind, c.compatible, c.scope) == (ChangeKind.ENTITY, False, "schema")
    assert "application_id" in c.detail and "customer_id" in c.detail


def test_event_time_changed_is_breaking() -> None:
    fields = field("decided_at", "timestamp(us, UTC)", "required: true")
    old = schema(fields)
    new = schema(fields, version="2.0.0", head="entity: application_id\nevent_time: decided_at\n")
    c = only(plan_migration(old, new))
    assert (c.kind, c.compatible) == (ChangeKind.EVENT_TIME, False)


def test_validation_only_schema_becoming_loadable_is_compatible_without_ddl() -> None:
    fields = field("months", "int32", "nullable: false")
    old = schema(fields, head="\n")
    new = schema(fields, version="1.1.0")
    d = plan_migration(old, new)
    assert not old.loadable and new.loadable
    assert {c.kind for c in d.diff.changes} == {ChangeKind.ENTITY, ChangeKind.EVENT_TIME, ChangeKind.STORE}
    assert d.diff.compatible and d.diff.allowed
    assert d.statements == []  # `features compile` creates the tables


def test_hot_ttl_change_is_compatible_without_ddl() -> None:
    d = diff("", "", old_extra="hot:\n  ttl: 7d\n", new_extra="hot:\n  ttl: 1d\n")
    c = only(d)
    assert (c.kind, c.compatible) == (ChangeKind.HOT_TTL, True)
    assert "from 7d to 1d" in c.detail
    assert len(d.statements) == 1 + len(RECORDS)
    assert d.statements[0].startswith('INSERT INTO "featureline_schemas"')


# --------------------------------------------------------------------- stores


def test_cold_store_added_is_compatible_with_add_column() -> None:
    d = diff(field("x", "int32", more="store: hot"), field("x", "int32", more="store: [hot, cold]"))
    c = only(d)
    assert (c.kind, c.compatible) == (ChangeKind.STORE, True)
    assert d.statements[0] == f'ALTER TABLE {T} ADD COLUMN "x" integer'


def test_hot_store_added_is_compatible_without_ddl() -> None:
    d = diff(field("x", "int32", more="store: cold"), field("x", "int32", more="store: [hot, cold]"))
    c = only(d)
    assert (c.kind, c.compatible, d.change_ddl[0]) == (ChangeKind.STORE, True, ())


@pytest.mark.parametrize(("old", "new"), [("[hot, cold]", "cold"), ("[hot, cold]", "hot")])
def test_store_removed_is_breaking(old: str, new: str) -> None:
    c = only(diff(field("x", "int32", more=f"store: {old}"), field("x", "int32", more=f"store: {new}"),
                  new_v="2.0.0"))
    assert (c.kind, c.compatible) == (ChangeKind.STORE, False)


def test_changes_to_fields_not_stored_cold_touch_no_column() -> None:
    old = field("x", "int32", "min: 5", more="store: hot")
    d = diff(old, field("x", "int32", "min: 1", more="store: hot"))
    assert only(d).compatible
    assert not any('"x' in s for s in d.statements)


# ----------------------------------------------------------- derived features

INCOME = field("income", "float64")


def feature(steps: str = "[log1p]", store: str = "cold") -> str:
    return (
        "features:\n  - name: income_log\n    from: income\n"
        f"    steps: {steps}\n    dtype: float64\n    store: {store}\n"
    )


def test_derived_feature_added_is_compatible_with_add_column_when_cold() -> None:
    d = diff(INCOME, INCOME, new_extra=feature())
    c = only(d)
    assert (c.field, c.kind, c.scope) == ("income_log", ChangeKind.FEATURE_ADDED, "feature")
    assert c.compatible
    assert d.statements[0] == f'ALTER TABLE {T} ADD COLUMN "income_log" double precision'


def test_derived_feature_removed_is_breaking() -> None:
    c = only(diff(INCOME, INCOME, old_extra=feature(), new_v="2.0.0"))
    assert (c.kind, c.compatible) == (ChangeKind.FEATURE_REMOVED, False)


def test_derived_feature_steps_changed_is_breaking() -> None:
    c = only(diff(INCOME, INCOME, old_extra=feature(), new_extra=feature("[log1p, {clip: {lo: 0, hi: 20}}]"),
                  new_v="2.0.0"))
    assert (c.kind, c.compatible) == (ChangeKind.FEATURE_CHANGED, False)
    assert "steps changed" in c.detail


# ---------------------------------------------------------------- aggregations

AGG_FIELDS = (
    field("kind", "enum", more="values: [view, click, buy]") + field("qty", "int32")
    + field("amount", "decimal(12,2)") + field("temp", "float64")
)
A = '"applicants__aggregates"'
CLICKS = "    - {name: clicks_1h, function: count, where: {kind: click}, window: 1h, store: cold}\n"
VIEWS = "    - {name: views_1h, function: count, where: {kind: view}, window: 1h, store: [hot, cold]}\n"
CTR = ("    - {name: ctr_1h, function: ratio, numerator: clicks_1h, denominator: views_1h, on_zero: 0, "
       "store: hot}\n")


def aggs(*items: str, lateness: str = "") -> str:
    head = f"  allowed_lateness: {lateness}\n" if lateness else ""
    return "aggregations:\n" + head + "  features:\n" + "".join(items)


def agg_diff(old: str, new: str, *, new_v: str = "1.1.0", fields: str = AGG_FIELDS,
             new_fields: str | None = None) -> Migration:
    return diff(fields, fields if new_fields is None else new_fields, new_v=new_v, old_extra=old,
                new_extra=new)


def test_identical_aggregations_are_no_change() -> None:
    section = aggs(CLICKS, VIEWS, CTR, lateness="10m")
    assert agg_diff(section, section, new_v="1.0.0").diff.changes == ()


def test_first_aggregations_create_the_aggregates_table_as_compile_does() -> None:
    d = agg_diff("", aggs(CLICKS, VIEWS, CTR))
    assert [(c.field, c.kind, c.scope, c.compatible) for c in d.diff.changes] == [
        ("clicks_1h", ChangeKind.AGGREGATION_ADDED, "aggregation", True),
        ("views_1h", ChangeKind.AGGREGATION_ADDED, "aggregation", True),
        ("ctr_1h", ChangeKind.AGGREGATION_ADDED, "aggregation", True),
    ]
    assert "count over 1h sliding where kind in ('click')" in d.diff.changes[0].detail
    create = d.statements[0]
    assert d.change_ddl[0] == (create,)  # one CREATE TABLE, not one per aggregation
    assert create.startswith(f"CREATE TABLE IF NOT EXISTS {A} (\n")
    assert '"clicks_1h" bigint' in create and '"ctr_1h"' not in create  # ctr_1h is hot only
    # The very text `features compile` writes (without the statement's semicolon).
    assert create + ";\n" in compile_schema(d.diff.new).ddl
    assert len(d.statements) == 2 + len(RECORDS)
    assert d.statements[1].startswith('INSERT INTO "featureline_schemas"')


def test_first_aggregations_of_a_schema_becoming_loadable_need_no_ddl() -> None:
    old = schema(AGG_FIELDS, head="\n")
    new = schema(AGG_FIELDS + aggs(CLICKS), version="1.1.0")
    d = plan_migration(old, new)
    assert d.diff.compatible and d.statements == []  # `features compile` creates every table


@pytest.mark.parametrize(("spec", "pg"), [
    ("function: count", "bigint"),
    ("function: count_distinct, of: kind", "bigint"),
    ("function: sum, of: qty", "bigint"),
    ("function: sum, of: amount", "numeric(38,2)"),
    ("function: mean, of: amount", "double precision"),
    ("function: max, of: qty", "integer"),
    ("function: last, of: amount", "numeric(12,2)"),
    ("function: first, of: qty", "integer"),
    ("function: sum, of: temp", "double precision"),
    ("function: stddev_sample, of: amount", "double precision"),
    ("function: variance, of: temp, scale: 2", "double precision"),
])
def test_aggregation_added_to_a_section_adds_a_typed_column(spec: str, pg: str) -> None:
    added = f"    - {{name: new_one, {spec}, window: 2h, store: [hot, cold]}}\n"
    d = agg_diff(aggs(CLICKS), aggs(CLICKS, added))
    c = only(d)
    assert (c.field, c.kind, c.compatible) == ("new_one", ChangeKind.AGGREGATION_ADDED, True)
    assert d.statements[0] == f'ALTER TABLE {A} ADD COLUMN "new_one" {pg}'
    assert f'"new_one" {pg},' in compile_schema(d.diff.new).ddl  # as a fresh table has it


def test_aggregation_added_hot_only_touches_no_table() -> None:
    d = agg_diff(aggs(CLICKS, VIEWS), aggs(CLICKS, VIEWS, CTR))
    c = only(d)
    assert (c.kind, c.compatible, d.change_ddl[0]) == (ChangeKind.AGGREGATION_ADDED, True, ())
    assert len(d.statements) == 1 + len(RECORDS)  # only the records of the versions


def test_aggregation_removed_is_breaking() -> None:
    d = agg_diff(aggs(CLICKS, VIEWS), aggs(CLICKS), new_v="2.0.0")
    c = only(d)
    assert (c.field, c.kind, c.compatible, c.scope) == ("views_1h", ChangeKind.AGGREGATION_REMOVED, False,
                                                         "aggregation")
    assert d.diff.allowed and d.statements == []


@pytest.mark.parametrize(("old", "new", "what"), [
    (CLICKS, CLICKS.replace("function: count", "function: count_distinct, of: qty"),
     "function count -> count_distinct, of none -> qty"),
    (CLICKS.replace("count", "sum, of: qty"), CLICKS.replace("count", "sum, of: amount"), "of qty -> amount"),
    (CLICKS, CLICKS.replace("window: 1h", "window: 2h"), "window 1h sliding -> 2h sliding"),
    (CLICKS, CLICKS.replace("window: 1h", "window: {size: 1h, type: tumbling}"),
     "window 1h sliding -> 1h tumbling"),
    (CLICKS, CLICKS.replace("{kind: click}", "{kind: [click, buy]}"),
     "where kind in ('click') -> kind in ('click', 'buy')"),
    (CLICKS, CLICKS.replace("where: {kind: click}, ", ""), "where kind in ('click') -> none"),
    (CTR, CTR.replace("on_zero: 0", "on_zero: 1"), "on_zero 0.0 -> 1.0"),
    (CLICKS.replace("count", "sum, of: temp"), CLICKS.replace("count", "sum, of: temp, scale: 2"),
     "scale 6 -> 2"),
    (CTR, CTR.replace("clicks_1h, denominator: views_1h", "views_1h, denominator: clicks_1h"),
     "numerator clicks_1h -> views_1h, denominator views_1h -> clicks_1h"),
], ids=["function", "of", "window_size", "window_type", "where_values", "where_removed", "on_zero",
        "float_scale", "operands"])
def test_aggregation_redefined_is_breaking_and_needs_a_backfill(old: str, new: str, what: str) -> None:
    others = (CLICKS, VIEWS) if "ctr_1h" in old else (VIEWS,)  # a ratio needs its two aggregations
    d = agg_diff(aggs(*others, old), aggs(*others, new), new_v="1.1.0")
    c = only(d)
    assert (c.kind, c.compatible, c.scope) == (ChangeKind.AGGREGATION_CHANGED, False, "aggregation")
    assert c.detail == (f"aggregation {what}: the values already stored were computed differently "
                        "(a backfill is needed)")
    assert not d.diff.allowed and d.diff.refusal is not None and "expected 2.0.0" in d.diff.refusal


def test_a_ratio_changes_with_the_aggregation_it_divides() -> None:
    d = agg_diff(aggs(CLICKS, VIEWS, CTR), aggs(CLICKS, VIEWS.replace("window: 1h", "window: 1d"), CTR),
                 new_v="2.0.0")
    assert [(c.field, c.kind, c.compatible) for c in d.diff.changes] == [
        ("views_1h", ChangeKind.AGGREGATION_CHANGED, False),
        ("ctr_1h", ChangeKind.AGGREGATION_CHANGED, False),
    ]
    assert d.diff.changes[1].detail.startswith("aggregation its denominator views_1h changed: ")


def test_where_values_in_another_order_are_no_change() -> None:
    two = "    - {name: seen, function: count, where: {kind: [view, click]}, window: 1h, store: cold}\n"
    d = agg_diff(aggs(two), aggs(two.replace("[view, click]", "[click, view]")), new_v="1.0.0")
    assert d.diff.changes == ()


def test_allowed_lateness_changed_is_breaking_and_no_rule_overrides_it() -> None:
    rules = rule("clicks_1h", False) + "  - {field: aggregations.allowed_lateness, breaking_change: false}\n"
    d = agg_diff(aggs(CLICKS, lateness="1h"), aggs(CLICKS, lateness="2h") + rules)
    c = only(d)
    assert (c.field, c.kind, c.scope, c.compatible) == (
        "aggregations.allowed_lateness", ChangeKind.ALLOWED_LATENESS, "schema", False)
    assert c.honoured_rule is None
    assert "from 3600s to 7200s" in c.detail and "a backfill is needed" in c.detail


def test_aggregation_cold_store_added_is_compatible_with_add_column() -> None:
    cold_ctr = CTR.replace("store: hot", "store: [hot, cold]")
    d = agg_diff(aggs(CLICKS, VIEWS, CTR), aggs(CLICKS, VIEWS, cold_ctr))
    c = only(d)
    assert (c.field, c.kind, c.scope, c.compatible) == ("ctr_1h", ChangeKind.STORE, "aggregation", True)
    assert d.statements[0] == f'ALTER TABLE {A} ADD COLUMN "ctr_1h" double precision'


def test_aggregation_hot_store_added_is_compatible_without_ddl() -> None:
    d = agg_diff(aggs(CLICKS), aggs(CLICKS.replace("store: cold", "store: [cold, hot]")))
    c = only(d)
    assert (c.kind, c.compatible, d.change_ddl[0]) == (ChangeKind.STORE, True, ())


@pytest.mark.parametrize(("old", "new"), [("[hot, cold]", "hot"), ("[hot, cold]", "cold")])
def test_aggregation_store_removed_is_breaking(old: str, new: str) -> None:
    views = VIEWS.replace("[hot, cold]", old)
    c = only(agg_diff(aggs(views), aggs(views.replace(f"store: {old}", f"store: {new}")), new_v="2.0.0"))
    assert (c.kind, c.compatible, c.scope) == (ChangeKind.STORE, False, "aggregation")
    assert "no longer stored" in c.detail


def test_rule_makes_an_aggregation_change_compatible() -> None:
    new = aggs(CLICKS.replace("window: 1h", "window: 2h")) + rule("clicks_1h", False, "dashboards only")
    d = agg_diff(aggs(CLICKS), new)
    c = only(d)
    assert (c.kind, c.compatible, c.classified_compatible) == (ChangeKind.AGGREGATION_CHANGED, True, False)
    assert "declared compatible by evolution rule for clicks_1h: dashboards only" in c.detail
    assert d.diff.allowed


def test_aggregation_output_type_follows_its_widened_field() -> None:
    top = "    - {name: top_qty, function: max, of: qty, window: 1h, store: cold}\n"
    widened = AGG_FIELDS.replace("type: int32", "type: int64")
    d = agg_diff(aggs(top), aggs(top), new_fields=widened)
    assert [(c.field, c.kind, c.scope, c.compatible) for c in d.diff.changes] == [
        ("qty", ChangeKind.TYPE, "field", True), ("top_qty", ChangeKind.TYPE, "aggregation", True),
    ]
    assert d.diff.changes[1].detail == "output type integer -> bigint, following field qty (int32 -> int64)"
    assert f'ALTER TABLE {A} ALTER COLUMN "top_qty" TYPE bigint USING "top_qty"::bigint' in d.statements


# ---------------------------------------------------------- evolution rules


def rule(name: str, breaking: bool, description: str = "") -> str:
    text = f"evolution_rules:\n  - field: {name}\n    breaking_change: {str(breaking).lower()}\n"
    return text + (f"    description: {description}\n" if description else "")


def test_rule_breaking_change_false_makes_a_narrowing_compatible_with_a_note() -> None:
    d = diff(field("x", "int64"), field("x", "int32"), new_extra=rule("x", False, "values never exceed 2^31"))
    c = only(d)
    assert c.compatible and not c.classified_compatible and c.overridden
    assert c.honoured_rule is not None and c.honoured_rule.field == "x"
    assert "declared compatible by evolution rule for x: values never exceed 2^31" in c.detail
    assert d.diff.allowed
    assert f'ALTER TABLE {T} ALTER COLUMN "x" TYPE integer USING "x"::integer' in d.statements


def test_rule_breaking_change_true_makes_a_new_enum_value_breaking() -> None:
    old = field("status", "enum", more="values: [a, b]")
    new = field("status", "enum", more="values: [a, b, c]")
    d = diff(old, new, new_extra=rule("status", True, "models must be retrained"))
    c = only(d)
    assert (c.compatible, c.classified_compatible) == (False, True)
    assert c.honoured_rule is not None and c.honoured_rule.breaking_change is True
    assert not d.diff.allowed
    assert d.diff.refusal is not None and "status" in d.diff.refusal


def test_rule_that_agrees_is_reported_but_overrides_nothing() -> None:
    d = diff(field("x", "decimal(15,2)"), field("x", "decimal(18,2)"), new_extra=rule("x", False))
    c = only(d)
    assert c.compatible and not c.overridden and c.honoured_rule is not None


def test_rule_for_a_renamed_field_applies_under_the_old_name() -> None:
    extra = rule("score", False, "all readers moved")
    d = diff(field("score", "int32"), field("points", "int32"), new_extra=extra)
    c = only(d)
    assert (c.kind, c.compatible) == (ChangeKind.FIELD_RENAMED, True)
    assert d.statements[0] == f'ALTER TABLE {T} RENAME COLUMN "score" TO "points"'


def test_rules_do_not_override_schema_level_changes() -> None:
    fields = field("decided_at", "timestamp(us, UTC)", "required: true")
    old = schema(fields)
    new = schema(fields + rule("decided_at", False), version="1.1.0",
                 head="entity: application_id\nevent_time: decided_at\n")
    c = only(plan_migration(old, new))
    assert (c.kind, c.compatible, c.honoured_rule) == (ChangeKind.EVENT_TIME, False, None)


def test_design_example_widening_with_rule_is_allowed_as_a_minor_bump() -> None:
    def text(version: str, decimal: str) -> str:
        return f"""\
version: {version}
fields:
  - name: application_id
    type: string
    constraints:
      pattern: ^APP-[0-9]{{12}}$
      required: true
  - name: income_monthly
    type: {decimal}
    constraints:
      min: 0.01
      max: 99999999.99
      nullable: false
evolution_rules:
  - field: income_monthly
    breaking_change: false
    description: widening from decimal(15,2) to decimal(18,2) is allowed
  - field: employment_status
    breaking_change: true
"""
    d = plan_migration(parse_schema(text("3.1.0", "decimal(15,2)"), "credit.yaml"),
                     parse_schema(text("3.2.1", "decimal(18,2)"), "credit.yaml"))
    c = only(d)
    assert (c.field, c.kind, c.compatible, c.overridden) == ("income_monthly", ChangeKind.TYPE, True, False)
    assert d.diff.allowed and d.diff.warnings == ()
    assert d.statements == []  # validation-only: no cold table to migrate


# --------------------------------------------------------------- versioning


def test_breaking_change_without_major_bump_is_refused_naming_each_change() -> None:
    d = diff(field("a", "int32") + field("b", "int64"), field("b", "int32"), new_v="1.5.0")
    assert not d.diff.allowed
    assert {c.field for c in d.diff.breaking} == {"a", "b"}
    assert d.diff.refusal is not None
    assert "2 breaking change(s)" in d.diff.refusal and "expected 2.0.0" in d.diff.refusal
    assert "  - b: type narrowed from int64 to int32" in d.diff.refusal
    assert "  - a: field a (int32) removed" in d.diff.refusal


def test_breaking_change_with_major_bump_is_allowed_without_fingerprint_update() -> None:
    old = field("a", "int32") + field("b", "int32", "max: 9")
    d = diff(old, field("b", "int32", "max: 99"), new_v="2.0.0")
    assert d.diff.allowed and not d.diff.compatible and not d.complete
    assert not any("featureline_schemas" in s for s in d.statements)
    assert f'ALTER TABLE {T} ADD CONSTRAINT "b__max" CHECK ("b" <= 99)' in d.statements


def test_compatible_change_without_bump_is_allowed_with_a_warning() -> None:
    d = diff(field("a", "int32", "max: 9"), field("a", "int32", "max: 99"), new_v="1.0.0")
    assert d.diff.allowed
    assert len(d.diff.warnings) == 1 and "version not bumped" in d.diff.warnings[0]


@pytest.mark.parametrize("new_v", ["1.0.1", "1.1.0", "2.0.0"])
def test_compatible_change_with_a_bump_ends_with_the_fingerprint_update(new_v: str) -> None:
    old = schema(field("a", "int32", "max: 9"))
    new = schema(field("a", "int32", "max: 99"), version=new_v)
    d = plan_migration(old, new)
    assert d.diff.allowed and d.diff.warnings == ()
    # then both versions in featureline_schema_versions: the old one, the new one migrated from it
    assert d.statements[-3].startswith('CREATE TABLE IF NOT EXISTS "featureline_schema_versions"')
    assert d.statements[-2].startswith('INSERT INTO "featureline_schema_versions"')
    assert f"'{fingerprint(old)}', '1.0.0'" in d.statements[-2] and "NULL) ON CONFLICT" in d.statements[-2]
    assert f"'{fingerprint(new)}', '{new_v}'" in d.statements[-1]
    assert d.statements[-1].endswith(
        f"'{fingerprint(old)}') ON CONFLICT (\"schema_name\", \"fingerprint\") DO UPDATE SET "
        '"definition" = coalesce("featureline_schema_versions"."definition", EXCLUDED."definition"), '
        '"migrated_from" = '
        'coalesce("featureline_schema_versions"."migrated_from", EXCLUDED."migrated_from")')
    assert d.statements[-4] == (
        'INSERT INTO "featureline_schemas" ("schema_name", "version", "fingerprint") '
        f"VALUES ('applicants', '{new_v}', '{fingerprint(new)}') "
        'ON CONFLICT ("schema_name") DO UPDATE SET "version" = EXCLUDED."version", '
        '"fingerprint" = EXCLUDED."fingerprint", "applied_at" = now()'
    )


#: the statements recording both versions after the featureline_schemas upsert
RECORDS = ("CREATE TABLE featureline_schema_versions", "INSERT old", "INSERT new")


def test_version_going_backwards_warns() -> None:
    d = diff(field("a", "int32", "max: 9"), field("a", "int32", "max: 99"), old_v="1.2.0", new_v="1.1.0")
    assert any("backwards" in w for w in d.diff.warnings)


# -------------------------------------------------------------------- quoting


def test_every_identifier_in_the_migration_is_quoted() -> None:
    d = diff(field("a", "int32", "required: true"),
             field("a", "int64") + field("b", "string", "max_length: 4", more="store: cold"))
    assert d.statements
    ddl = d.statements[:-(1 + len(RECORDS))]  # then the records of both versions (literals only)
    for statement in ddl:
        assert statement.startswith(f"ALTER TABLE {T} ")
    # no bare (unquoted) column names: every reference to a or b is quoted
    body = " ".join(ddl)
    assert not re.search(r'(?<!["\w])(a|b)(?!["\w])', body.replace("'", " "))


# ------------------------------------------------------------------------ CLI


def write(tmp_path: Path, name: str, s_fields: str, version: str) -> str:
    path = tmp_path / name
    path.write_text(
        f"name: applicants\nversion: {version}\nentity: application_id\nevent_time: submitted_at\n"
        "fields:\n" + KEYS + s_fields
    )
    return str(path)


def test_cli_exit_0_for_a_compatible_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write(tmp_path, "old.yaml", field("x", "int32", "max: 9"), "1.0.0")
    new = write(tmp_path, "new.yaml", field("x", "int32", "max: 99"), "1.1.0")
    assert main(["schema", "diff", old, new]) == 0
    out = capsys.readouterr().out
    assert "compatible" in out and "max raised from 9 to 99" in out
    assert 'ALTER TABLE "applicants" ADD CONSTRAINT "x__max" CHECK ("x" <= 99);' in out
    assert "BEGIN;" in out and "COMMIT;" in out


def test_cli_exit_1_for_a_breaking_change_without_major(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write(tmp_path, "old.yaml", field("x", "int64"), "1.0.0")
    new = write(tmp_path, "new.yaml", field("x", "int32"), "1.1.0")
    assert main(["schema", "diff", old, new]) == 1
    captured = capsys.readouterr()
    assert "BREAKING" in captured.out and "narrowed" in captured.out
    assert "refused" in captured.err and "x: type narrowed" in captured.err


def test_cli_exit_0_for_a_breaking_change_with_major(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write(tmp_path, "old.yaml", field("x", "int64"), "1.0.0")
    new = write(tmp_path, "new.yaml", field("x", "int32"), "2.0.0")
    assert main(["schema", "diff", old, new]) == 0
    assert "BREAKING" in capsys.readouterr().out


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write(tmp_path, "old.yaml", field("x", "int64"), "1.0.0")
    new = write(tmp_path, "new.yaml", field("x", "int32"), "1.0.1")
    assert main(["schema", "diff", old, new, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["allowed"] is False
    assert doc["changes"] == [{
        "field": "x", "old_field": None, "kind": "type", "scope": "field", "compatible": False,
        "classified_compatible": False, "detail": "type narrowed from int64 to int32", "rule": None,
        "ddl": [],
    }]


def test_cli_exit_2_for_a_bad_schema_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write(tmp_path, "old.yaml", field("x", "int32"), "1.0.0")
    bad = write(tmp_path, "bad.yaml", field("x", "int128"), "1.0.1")
    assert main(["schema", "diff", old, bad]) == 2
    assert "int128" in capsys.readouterr().err


def test_cli_exit_2_for_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write(tmp_path, "old.yaml", field("x", "int32"), "1.0.0")
    assert main(["schema", "diff", old, str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_cli_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["schema", "diff", "only-one.yaml"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["schema"])
    assert exc.value.code == 2


def test_cli_prints_rule_overrides_and_agreements(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = rule("x", False, "no value exceeds 2^31") + "  - field: y\n    breaking_change: false\n"
    old = write(tmp_path, "old.yaml", field("x", "int64") + field("y", "int32"), "1.0.0")
    new = write(tmp_path, "new.yaml", field("x", "int32") + field("y", "int64") + rules, "1.1.0")
    assert main(["schema", "diff", old, new]) == 0
    lines = capsys.readouterr().out.splitlines()
    x_line = next(line for line in lines if " x " in line)
    y_line = next(line for line in lines if " y " in line)
    assert "declared compatible by evolution rule for x: no value exceeds 2^31" in x_line
    assert "rule honoured: y breaking_change=false" in y_line


def test_cli_prints_the_aggregates_table_of_new_aggregations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write(tmp_path, "old.yaml", AGG_FIELDS, "1.0.0")
    new = write(tmp_path, "new.yaml", AGG_FIELDS + aggs(CLICKS), "1.1.0")
    assert main(["schema", "diff", old, new]) == 0
    out = capsys.readouterr().out
    assert "compatible  clicks_1h  aggregation_added: aggregation added (count over 1h sliding" in out
    body = out[out.index("BEGIN;"):out.index("COMMIT;")]
    assert 'CREATE TABLE IF NOT EXISTS "applicants__aggregates" (\n' in body
    pkey = '"applicants__aggregates__pkey" PRIMARY KEY ("application_id", "submitted_at")\n);'
    assert f"    CONSTRAINT {pkey}" in body


def test_a_fingerprint_mismatch_names_the_fix_by_which_side_is_newer() -> None:
    from features.compile.migration import mismatch_hint

    s = schema(field("a", "int32"), version="1.1.0")
    assert "features migrate" in mismatch_hint(s, "1.0.0")      # the file is newer: migrate the stores
    assert "newer version" in mismatch_hint(s, "1.2.0")         # the stores are newer: take that file
    assert "features migrate" not in mismatch_hint(s, "2.0.0")


def test_durations_print_as_the_schema_writes_them() -> None:
    """issue 47: a 90-day window printed as 7776000s; durations print as the YAML writes them."""
    from features.schema.syntax import duration_seconds, duration_text

    assert duration_text(7_776_000) == "90d" and duration_text(5_400) == "1h30m" and duration_text(0) == "0s"
    for s in (1, 59, 60, 61, 3_600, 86_399, 86_400, 90_061, 7_776_000, 10**9):
        assert duration_seconds(duration_text(s)) == s
    c = only(agg_diff(aggs(CLICKS), aggs(CLICKS.replace("window: 1h", "window: 90d")), new_v="2.0.0"))
    assert "window 1h sliding -> 90d sliding" in c.detail, c.detail


QUALITY_RULE = field("income", "int64", "min: 0")


def quality_schema(quality: str, *, version: str = "1.0.0") -> Schema:
    return schema(QUALITY_RULE, version=version, extra=quality)


def test_quality_changes_are_listed_apart_and_need_no_version_bump(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    old = "quality:\n  owner: risk-team\n  max_reject_rate: 0.05\n  min_rows: 10\n"
    new = ("quality:\n  owner: fraud-team\n  max_reject_rate: 0.1\n  max_staleness: 2h\n"
           "  max_rule_rate:\n    income.min: {limit: 0.01, on_breach: warn}\n")
    d = plan_migration(quality_schema(old), quality_schema(new))
    assert d.diff.changes == () and d.diff.warnings == () and d.diff.allowed and not d.statements
    assert d.diff.quality == (
        "gate max_reject_rate changed: 0.05 (fail) -> 0.1 (fail)",
        "gate max_rule_rate[income.min] added: 0.01 (warn)",
        "gate min_rows removed (was 10 (fail))",
        "owner: risk-team -> fraud-team",
        "max_staleness: none -> 2h",
    )
    # the line a gate is declared on is not a change; a section added or removed is
    moved = "quality:\n  min_rows: 10\n  owner: risk-team\n  max_reject_rate: 0.05\n"
    assert plan_migration(quality_schema(old), quality_schema(moved)).diff.quality == ()
    assert plan_migration(quality_schema(""), quality_schema("quality:\n  min_rows: 1\n")).diff.quality == (
        "quality section added", "gate min_rows added: 1 (fail)")

    paths = []
    for name, text in (("old", old), ("new", new)):
        path = tmp_path / f"{name}.yaml"
        path.write_text("name: applicants\nversion: 1.0.0\nentity: application_id\nevent_time: submitted_at\n"
                        "fields:\n" + KEYS + QUALITY_RULE + text)
        paths.append(str(path))
    assert main(["schema", "diff", *paths]) == 0
    out = capsys.readouterr().out
    assert "  gate        quality  gate max_reject_rate changed: 0.05 (fail) -> 0.1 (fail)\n" in out
    assert "no changes" not in out and "warning" not in out
    assert main(["schema", "diff", *paths, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["quality_changes"] == list(d.diff.quality) and doc["changes"] == []
