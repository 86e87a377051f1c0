"""CompiledSchema -> PostgreSQL DDL text (``sql/<schema>.sql``).

The DDL is a translation of the rule program (:mod:`features.compile.rules`): every
rule a column can enforce becomes ``NOT NULL`` or a named ``CHECK`` constraint, and
the constraint name ``<field>__<kind>`` maps a violation back to the rule id
``<field>.<kind>`` (:func:`constraint_rule_ids`). Rules with no column meaning
(``missing``, and ``type`` except the int8 range) have no constraint: the column type
itself enforces them.

Contracts:

- Output is deterministic: the same CompiledSchema gives the same bytes (no
  timestamps, no dict-order or locale dependence).
- Every identifier goes through :func:`quote_ident` and every string literal through
  :func:`quote_literal`; nothing from a schema is pasted into SQL raw.
- Identifiers are unqualified; the caller picks the Postgres schema (search_path).
- NaN and infinity: a float column gets ``CHECK (col <> 'NaN')`` (``<field>__nan``)
  and ``CHECK (col NOT IN ('Infinity', '-Infinity'))`` (``<field>__type``: the
  validator refuses infinities as not a number). PostgreSQL sorts NaN above every
  number, so ``col <= max`` would also fail on NaN; bounds are written
  ``(col <= max OR col IN ('NaN', 'Infinity', '-Infinity'))`` so that a NaN or an
  infinity violates only its own constraint, as in the validator (PostgreSQL reports
  the first violated CHECK in name order). Null passes every CHECK (only NOT NULL
  refuses it).
- Empty strings: with ``empty_as_null`` and a not-null rule, ``''`` is refused by a
  ``<field>__not_null`` CHECK, since the validator counts it as null.

Raises CompileError for what PostgreSQL cannot hold faithfully: an identifier longer
than 63 bytes (Postgres would silently truncate it), a NUL character, a pattern that
cannot be made to agree with RE2 (:mod:`features.compile.patterns`), a bound that is
not a valid value of the field's type.

Why one module of this size: every statement of a schema's DDL and every SQL literal and
CHECK expression it holds is generated here, so the bytes of ``sql/<schema>.sql``
(compared by ``features compile --check``) depend on one module.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from hashlib import sha256
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from features import lineage
from features.compile.patterns import postgres_full_match
from features.compile.rules import ReasonCode, Rule
from features.errors import CompileError
from features.schema.model import (
    FLOAT_KINDS,
    INTEGER_KINDS,
    Aggregation,
    Feature,
    Field,
    FieldType,
    ScalarValue,
    Schema,
    TypeKind,
)
from features.schema.syntax import (
    AGGREGATES_SUFFIX,
    BY_ERROR_SUFFIX,
    BY_RUN_SUFFIX,
    CHECK_SUFFIX,
    PKEY_SUFFIX,
    REJECTS_SUFFIX,
    SOURCE_KEY_SUFFIX,
)

if TYPE_CHECKING:
    from features.compile import CompiledSchema

#: PostgreSQL's NAMEDATALEN - 1: longer identifiers are silently truncated.
PG_MAX_IDENTIFIER_BYTES = 63

#: The table recording which schema version/fingerprint created the tables.
SCHEMAS_TABLE = "featureline_schemas"
#: Every version of a schema the stores have held: its fingerprint, version, YAML text and
#: the fingerprint it was migrated from (docs/evolution.md, "Migrating the stores").
VERSIONS_TABLE = "featureline_schema_versions"
#: PostgreSQL's MaxHeapAttributeNumber: a table has at most 1600 columns.
PG_MAX_COLUMNS = 1600

#: Lineage columns of the cold table (names from :mod:`features.lineage`), in order,
#: with their Postgres types.
LINEAGE_COLUMNS: tuple[tuple[str, str], ...] = (
    (lineage.SOURCE, "text"),
    (lineage.SCHEMA_NAME, "text"),
    (lineage.SCHEMA_VERSION, "text"),
    (lineage.SCHEMA_FINGERPRINT, "text"),
    (lineage.RUN_ID, "text"),
    (lineage.INGESTED_AT, "timestamptz"),
)

#: The history table's content digest column (``lineage.DIGEST``) and its type.
DIGEST = lineage.DIGEST
DIGEST_TYPE = 'text COLLATE "C"'

_INT8_RANGE = (-128, 127)


# --- quoting: the only two ways schema text reaches SQL ---------------------------


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (as psycopg's ``sql.Identifier`` writes it).

    Double quotes inside are doubled. Raises CompileError for an empty name, a control
    character (NUL, newline, ...), or more than 63 UTF-8 bytes (Postgres would truncate it silently,
    and two long names could then collide).
    """
    if not name:
        raise CompileError("empty SQL identifier")
    if not name.isprintable():
        raise CompileError(f"SQL identifier {name!r} contains a control character")
    if len(name.encode("utf-8")) > PG_MAX_IDENTIFIER_BYTES:
        raise CompileError(
            f"SQL identifier {name!r} is longer than {PG_MAX_IDENTIFIER_BYTES} bytes; "
            "PostgreSQL would truncate it"
        )
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """``value`` as a SQL string literal, correct whatever ``standard_conforming_strings``
    says: quotes are doubled, and a value with a backslash is written as an ``E'...'``
    literal with each backslash doubled. Raises CompileError on a NUL character."""
    if "\x00" in value:
        raise CompileError(f"string {value!r} contains a NUL character, which PostgreSQL cannot store")
    body = value.replace("'", "''")
    if "\\" in value:
        return "E'" + body.replace("\\", "\\\\") + "'"
    return "'" + body + "'"


def _comment(text: str) -> str:
    """A ``--`` comment line; control characters (a newline would end the comment
    and turn the rest into SQL) are replaced with their escapes."""
    safe = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
    return f"-- {safe}".rstrip()


# --- names ------------------------------------------------------------------------


def _bounded(base: str, suffix: str) -> str:
    """``base + suffix``, shortened with a hash of ``base`` when over 63 bytes, so
    distinct bases keep distinct names. Deterministic."""
    name = base + suffix
    if len(name.encode("utf-8")) <= PG_MAX_IDENTIFIER_BYTES:
        return name
    digest = sha256(base.encode("utf-8")).hexdigest()[:8]
    room = PG_MAX_IDENTIFIER_BYTES - len(suffix.encode("utf-8")) - len(digest) - 1
    short = base.encode("utf-8")[:room].decode("utf-8", errors="ignore")
    return f"{short}_{digest}{suffix}"


def primary_key_name(table: str) -> str:
    """The name of ``table``'s primary key constraint (as the generated DDL names it)."""
    return _bounded(table, PKEY_SUFFIX)


def constraint_name(field: str, kind: ReasonCode | str) -> str:
    """The constraint enforcing rule ``field.kind``: ``<field>__<kind>`` (hashed when
    it would exceed 63 bytes; :func:`constraint_rule_ids` maps either form back)."""
    return _bounded(field, f"__{kind}")


def cold_table_name(schema: Schema) -> str:
    """The cold feature table: named after the schema."""
    return schema.name


def rejects_table_name(schema: Schema) -> str:
    """The rejects table: ``<schema>__rejects``."""
    return schema.name + REJECTS_SUFFIX


def aggregates_table_name(schema: Schema) -> str:
    """The cold aggregation table: ``<schema>__aggregates`` (hashed when over 63 bytes)."""
    return _bounded(schema.name, AGGREGATES_SUFFIX)


def check_table_name(schema: Schema) -> str:
    """The all-fields check table of a validation-only schema: ``<schema>__check``."""
    return schema.name + CHECK_SUFFIX


# --- types and literals -----------------------------------------------------------


def pg_type(ft: FieldType) -> str:
    """The Postgres column type of a declared type (see the type mapping); a list is an
    array of its element's type (``real[]``, ``bigint[]``)."""
    if ft.items is not None:
        return pg_type(ft.items.element) + "[]"
    k = ft.kind
    if k in (TypeKind.STRING, TypeKind.ENUM):
        return "text"
    if k is TypeKind.BOOL:
        return "boolean"
    if k in (TypeKind.INT8, TypeKind.INT16):
        return "smallint"
    if k is TypeKind.INT32:
        return "integer"
    if k is TypeKind.INT64:
        return "bigint"
    if k is TypeKind.FLOAT32:
        return "real"
    if k is TypeKind.FLOAT64:
        return "double precision"
    if k is TypeKind.DECIMAL:
        return f"numeric({ft.precision},{ft.scale})"
    if k is TypeKind.DATE:
        return "date"
    if k is TypeKind.TIMESTAMP:
        if ft.unit == "ns":
            raise CompileError("timestamp(ns) cannot be stored: PostgreSQL keeps microseconds")
        return "timestamptz" if ft.tz else "timestamp"
    raise CompileError(f"type {ft} has no PostgreSQL mapping")


def _decimal(value: ScalarValue, what: str) -> Decimal:
    if isinstance(value, bool) or value is None:
        raise CompileError(f"{what}: {value!r} is not a number")
    try:
        d = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    except (InvalidOperation, TypeError, ValueError) as exc:
        raise CompileError(f"{what}: {value!r} is not a number") from exc
    if not d.is_finite():
        raise CompileError(f"{what}: {value!r} is not a finite number")
    return d


def _number_text(d: Decimal) -> str:
    text = format(d, "f")
    return f"({text})" if text.startswith("-") else text


def _parse_datetime(value: ScalarValue, ft: FieldType, what: str) -> dt.datetime:
    if isinstance(value, dt.datetime):
        moment = value
    else:
        try:
            moment = dt.datetime.fromisoformat(str(value))
        except ValueError as exc:
            raise CompileError(f"{what}: {value!r} is not an ISO timestamp") from exc
    if ft.tz is None:
        if moment.tzinfo is not None:
            raise CompileError(f"{what}: {value!r} has a zone but the field is a naive timestamp")
        return moment
    try:
        zone = ZoneInfo(ft.tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise CompileError(f"{what}: unknown time zone {ft.tz!r}") from exc
    if moment.tzinfo is None:
        # A naive bound on a zoned field is wall time in the field's zone.
        moment = moment.replace(tzinfo=zone)
    return moment.astimezone(dt.UTC)


def sql_value(value: ScalarValue, ft: FieldType, what: str) -> str:
    """``value`` as a SQL expression of type ``ft`` (a default or a bound).

    Floats are written as ``'<decimal>'::double precision`` so a float32 column is
    compared in double precision (exactly), as the validator compares. Zoned
    timestamps are converted to UTC and written with ``+00``, naive ones as they are,
    so the result never depends on the session's TimeZone.
    """
    k = ft.kind
    if k is TypeKind.BOOL:
        if not isinstance(value, bool):
            raise CompileError(f"{what}: {value!r} is not a boolean")
        return "TRUE" if value else "FALSE"
    if k in INTEGER_KINDS:
        d = _decimal(value, what)
        if d != d.to_integral_value():
            raise CompileError(f"{what}: {value!r} is not an integer")
        return _number_text(d.quantize(Decimal(1)))
    if k is TypeKind.DECIMAL:
        return _number_text(_decimal(value, what))
    if k in FLOAT_KINDS:
        return f"{quote_literal(format(_decimal(value, what), 'f'))}::double precision"
    if k in (TypeKind.STRING, TypeKind.ENUM):
        if not isinstance(value, str):
            raise CompileError(f"{what}: {value!r} is not a string")
        return quote_literal(value)
    if k is TypeKind.DATE:
        try:
            day = value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value))
        except ValueError as exc:
            raise CompileError(f"{what}: {value!r} is not an ISO date") from exc
        return f"{quote_literal(day.isoformat())}::date"
    if k is TypeKind.TIMESTAMP:
        moment = _parse_datetime(value, ft, what)
        if ft.tz is None:
            return f"{quote_literal(moment.isoformat(sep=' '))}::timestamp"
        text = moment.replace(tzinfo=None).isoformat(sep=" ") + "+00"
        return f"{quote_literal(text)}::timestamptz"
    raise CompileError(f"{what}: no SQL literal for type {ft}")


# --- constraints ------------------------------------------------------------------


def check_expr(f: Field, rule: Rule) -> str | None:
    """The CHECK expression enforcing ``rule`` on column ``f``, or None when the rule
    is enforced by the column itself (type, NOT NULL) or has no column meaning."""
    col = quote_ident(f.name)
    kind = rule.kind
    what = f"field {f.name} constraint {kind.value}"
    is_float = f.type.kind in FLOAT_KINDS
    if f.type.items is not None:
        return _list_check(f, kind)
    if kind is ReasonCode.TYPE:
        if f.type.kind is TypeKind.INT8:
            lo, hi = _INT8_RANGE
            return f"{col} BETWEEN {_number_text(Decimal(lo))} AND {hi}"
        if is_float:  # the validator refuses infinities as "not a number"
            return f"{col} NOT IN ('Infinity', '-Infinity')"
        return None
    if kind is ReasonCode.NOT_NULL:
        if f.constraints.empty_as_null and f.type.kind in (TypeKind.STRING, TypeKind.ENUM):
            return f"{col} <> ''"
        return None
    if kind is ReasonCode.NAN:
        return f"{col} <> 'NaN'"
    if kind in (ReasonCode.MIN, ReasonCode.MAX, ReasonCode.MIN_LENGTH, ReasonCode.MAX_LENGTH):
        if isinstance(rule.value, tuple):
            raise CompileError(f"{what}: expected one value, got {rule.value!r}", field=f.name)
        param: ScalarValue = rule.value
    if kind in (ReasonCode.MIN, ReasonCode.MAX):
        if f.type.kind in (TypeKind.STRING, TypeKind.ENUM, TypeKind.BOOL):
            raise CompileError(
                f"field {f.name}: {kind.value} is not defined for type {f.type}", field=f.name
            )
        op = ">=" if kind is ReasonCode.MIN else "<="
        expr = f"{col} {op} {sql_value(param, f.type, what)}"
        return f"({expr} OR {col} IN ('NaN', 'Infinity', '-Infinity'))" if is_float else expr
    if kind in (ReasonCode.MIN_LENGTH, ReasonCode.MAX_LENGTH):
        op = ">=" if kind is ReasonCode.MIN_LENGTH else "<="
        n = _decimal(param, what)
        return f"char_length({col}) {op} {_number_text(n)}"
    if kind is ReasonCode.PATTERN:
        if not isinstance(rule.value, str):
            raise CompileError(f"{what}: pattern must be a string", field=f.name)
        try:
            regex = postgres_full_match(rule.value)
        except CompileError as exc:
            raise CompileError(f"field {f.name}: {exc}", field=f.name) from exc
        return f"{col} ~ {quote_literal(regex)}"
    if kind is ReasonCode.ENUM:
        values = rule.value if isinstance(rule.value, tuple) else ()
        if not values:
            raise CompileError(f"field {f.name}: enum without values", field=f.name)
        return f"{col} IN ({', '.join(quote_literal(v) for v in values)})"
    return None  # missing: a property of the input, not of a stored value


def _list_check(f: Field, kind: ReasonCode) -> str | None:
    """A list column's CHECKs: ``type`` holds what the array type alone does not (one
    dimension from 1, the length, no null element unless ``nullable=true``, no infinity,
    int8's range); ``nan``: no NaN element."""
    items = f.type.items
    assert items is not None
    col = quote_ident(f.name)
    element = items.element.kind
    if kind is ReasonCode.NAN:
        return f"NOT ('NaN' = ANY({col}))"
    if kind is not ReasonCode.TYPE:
        return None
    parts = [f"coalesce(array_ndims({col}), 1) = 1", f"coalesce(array_lower({col}, 1), 1) = 1"]
    if items.length is not None:
        parts.append(f"cardinality({col}) = {items.length}")
    else:
        parts.append(f"cardinality({col}) <= {items.max_length}")
    if not items.nullable:
        parts.append(f"array_position({col}, NULL) IS NULL")
    if element in FLOAT_KINDS:
        parts.append(f"NOT ('Infinity' = ANY({col}) OR '-Infinity' = ANY({col}))")
    if element is TypeKind.INT8:
        lo, hi = _INT8_RANGE
        parts.append(f"{_number_text(Decimal(lo))} <= ALL({col}) AND {hi} >= ALL({col})")
    return " AND ".join(parts)


def _not_null(f: Field, rules: Iterable[Rule]) -> bool:
    return any(r.field == f.name and r.kind is ReasonCode.NOT_NULL for r in rules)


def _field_column(f: Field, rules: tuple[Rule, ...], *, force_not_null: bool = False) -> str:
    parts = [quote_ident(f.name), pg_type(f.type)]
    if force_not_null or _not_null(f, rules):
        parts.append("NOT NULL")
    if f.constraints.has_default and f.constraints.default is not None:
        parts.append("DEFAULT " + sql_value(f.constraints.default, f.type, f"field {f.name} default"))
    return " ".join(parts)


def _field_checks(f: Field, rules: tuple[Rule, ...]) -> list[str]:
    checks = []
    for rule in rules:
        if rule.field != f.name:
            continue
        expr = check_expr(f, rule)
        if expr is not None:
            checks.append(f"CONSTRAINT {quote_ident(constraint_name(f.name, rule.kind))} CHECK ({expr})")
    return checks


def constraint_rule_ids(compiled: CompiledSchema) -> dict[str, str]:
    """Constraint name -> rule id (``field.kind``) for every CHECK the DDL can hold.

    A NOT NULL violation carries no constraint name; map it with the column name
    to ``<column>.not_null``.
    """
    out: dict[str, str] = {}
    fields = {f.name: f for f in compiled.schema.fields}
    for rule in compiled.rules:
        f = fields.get(rule.field)
        if f is not None and check_expr(f, rule) is not None:
            out[constraint_name(rule.field, rule.kind)] = rule.id
    return out


# --- tables -----------------------------------------------------------------------


def _rules_by_field(rules: Iterable[Rule]) -> dict[str, tuple[Rule, ...]]:
    """Each field's rules (one pass: a per-field scan of every rule is quadratic)."""
    out: dict[str, list[Rule]] = {}
    for rule in rules:
        out.setdefault(rule.field, []).append(rule)
    return {name: tuple(found) for name, found in out.items()}


def _check_width(table: str, columns: int) -> None:
    if columns > PG_MAX_COLUMNS:
        raise CompileError(f"table {table} would have {columns} columns; PostgreSQL allows at most "
                           f"{PG_MAX_COLUMNS}")


def _create_table(name: str, lines: list[str]) -> str:
    body = ",\n".join(f"    {line}" for line in lines)
    return f"CREATE TABLE IF NOT EXISTS {quote_ident(name)} (\n{body}\n);\n"


def render_check_table(compiled: CompiledSchema, table_name: str) -> str:
    """``CREATE TABLE IF NOT EXISTS <table_name>`` with every field of the schema as a
    column, with its NOT NULL, DEFAULT and CHECK constraints; no primary key, no
    lineage. A row is accepted by this table exactly when the validator accepts the
    same (already typed, already defaulted) values."""
    schema = compiled.schema
    _check_width(table_name, len(schema.fields))
    by_field = _rules_by_field(compiled.rules)
    lines = [_field_column(f, by_field.get(f.name, ())) for f in schema.fields]
    for f in schema.fields:
        lines.extend(_field_checks(f, by_field.get(f.name, ())))
    return _create_table(table_name, lines)


def _feature_type(feature: Feature) -> str:
    if feature.dtype.kind not in INTEGER_KINDS | FLOAT_KINDS | {TypeKind.BOOL}:
        raise CompileError(
            f"feature {feature.name}: dtype {feature.dtype} is not int*, float* or bool",
            field=feature.name,
        )
    return pg_type(feature.dtype)


def cold_keys(schema: Schema) -> tuple[str, ...]:
    """The cold table's primary key of a loadable schema: (entity, event time), or the
    entity alone for a static schema (``event_time: none``: one row per entity)."""
    assert schema.entity is not None and (schema.event_time is not None or schema.static)  # loadable
    return (schema.entity,) if schema.event_time is None else (schema.entity, schema.event_time)


def _cold_table(compiled: CompiledSchema) -> str:
    schema = compiled.schema
    keys = cold_keys(schema)
    try:
        key_fields = [schema.field(k) for k in keys]
    except KeyError as exc:
        raise CompileError(
            f"schema {schema.name}: entity/event_time names no field: {exc}", schema_name=schema.name
        ) from exc
    stored = [f for f in schema.fields if f.name not in keys and "cold" in f.store]
    columns = [*key_fields, *stored]
    by_field = _rules_by_field(compiled.rules)
    lines = [_field_column(f, by_field.get(f.name, ()), force_not_null=f.name in keys) for f in columns]
    for feature in schema.features:
        if "cold" in feature.store:
            typ = _feature_type(feature)
            lines.extend(f"{quote_ident(col)} {typ}" for col in schema.feature_columns(feature))
    # the content digest (features.kernels.digest): every distinct event of one (entity,
    # event time) is kept, an exact copy is one event; a static schema's row (one per
    # entity) is the newest load's, of one load's rows the greatest digest's. COLLATE "C":
    # its hex digits compare byte by byte (numeric order) whatever the database's collation
    lines.append(f"{quote_ident(DIGEST)} {DIGEST_TYPE} NOT NULL")
    lines.extend(f"{quote_ident(name)} {typ} NOT NULL" for name, typ in LINEAGE_COLUMNS)
    table = cold_table_name(schema)
    _check_width(table, len(lines))
    for f in columns:
        lines.extend(_field_checks(f, by_field.get(f.name, ())))
    pkey = quote_ident(_bounded(table, PKEY_SUFFIX))
    pkey_columns = keys if schema.static else (*keys, DIGEST)  # static: one row per entity
    lines.append(f"CONSTRAINT {pkey} PRIMARY KEY ({', '.join(quote_ident(k) for k in pkey_columns)})")
    return _create_table(table, lines)


def event_time_index_name(schema: Schema) -> str:
    """The cold table's index on its event time: ``<table>__by_event_time``."""
    return _bounded(cold_table_name(schema), "__by_event_time")


def event_time_index(schema: Schema) -> str | None:
    """``CREATE INDEX IF NOT EXISTS`` on the cold table's event time (a btree: a time
    window's rows, the newest event), or None for a schema without an event time (static)."""
    if schema.event_time is None:
        return None
    return (f"CREATE INDEX IF NOT EXISTS {quote_ident(event_time_index_name(schema))} ON "
            f"{quote_ident(cold_table_name(schema))} ({quote_ident(schema.event_time)});\n")


def ingested_at_index_name(schema: Schema) -> str:
    """The cold table's index on ``_ingested_at``: ``<table>__by_ingested_at``."""
    return _bounded(cold_table_name(schema), "__by_ingested_at")


def ingested_at_index(schema: Schema) -> str:
    """``CREATE INDEX IF NOT EXISTS`` on the cold table's ``_ingested_at`` (a btree: the newest
    ingestion, ``max()`` from a few index pages: the UI's freshness page, docs/ui.md)."""
    return (f"CREATE INDEX IF NOT EXISTS {quote_ident(ingested_at_index_name(schema))} ON "
            f"{quote_ident(cold_table_name(schema))} ({quote_ident(lineage.INGESTED_AT)});\n")


def history_index_names(schema: Schema) -> tuple[str, ...]:
    """The history table's indexes: by event time (none for a static schema), by ingestion time."""
    by_time = () if schema.event_time is None else (event_time_index_name(schema),)
    return (*by_time, ingested_at_index_name(schema))


def history_indexes(schema: Schema) -> str:
    """Every ``CREATE INDEX IF NOT EXISTS`` of the history table (:func:`history_index_names`)."""
    return (event_time_index(schema) or "") + ingested_at_index(schema)


def aggregation_pg_type(schema: Schema | CompiledSchema, agg: Aggregation) -> str:
    """The Postgres type of a stored aggregation of ``schema`` (see ``AggSpec.output_type``)."""
    if not isinstance(schema, Schema):
        schema = schema.schema
    f = agg.function
    if f in ("count", "count_distinct", "approx_count_distinct"):
        return "bigint"
    if f == "approx_percentile":  # one quantile, or the listed ones in their order
        return "double precision[]" if isinstance(agg.q, tuple) else "double precision"
    if f in ("mean", "ratio", "variance", "stddev", "variance_sample", "stddev_sample"):
        return "double precision"
    assert agg.of is not None
    ft = schema.field(agg.of).type
    if f == "sum" and agg.scale is not None:
        return "double precision"  # a float field's fixed-point sum
    if f == "sum":
        return "bigint" if ft.kind in INTEGER_KINDS else f"numeric(38,{ft.scale})"
    if f == "last_k":
        return pg_type(ft) + "[]"  # the k newest values, newest first
    return pg_type(ft)


def render_aggregates_table(schema: Schema) -> str:
    """``CREATE TABLE IF NOT EXISTS <schema>__aggregates (...);`` for a loadable schema
    with aggregations: the entity and event time (the key), a column per aggregation
    stored cold, and lineage. The same text ``render_ddl`` writes; the migration
    (``features.compile.migration``) uses it when a schema gains its first aggregations."""
    assert schema.entity is not None and schema.event_time is not None and schema.aggregations is not None
    keys = (schema.entity, schema.event_time)
    lines = [f"{quote_ident(k)} {pg_type(schema.field(k).type)} NOT NULL" for k in keys]
    lines += [f"{quote_ident(a.name)} {aggregation_pg_type(schema, a)}"
              for a in schema.aggregations.features if "cold" in a.store]
    lines.extend(f"{quote_ident(name)} {typ} NOT NULL" for name, typ in LINEAGE_COLUMNS)
    table = aggregates_table_name(schema)
    _check_width(table, len(lines))
    pkey = quote_ident(_bounded(table, PKEY_SUFFIX))
    lines.append(f"CONSTRAINT {pkey} PRIMARY KEY ({', '.join(quote_ident(k) for k in keys)})")
    return _create_table(table, lines)


def _rejects_table(compiled: CompiledSchema) -> str:
    schema = compiled.schema
    table = rejects_table_name(schema)
    event_type = "timestamptz" if schema.event_time is None else pg_type(schema.field(schema.event_time).type)
    lines = [
        f"{quote_ident('id')} bigserial PRIMARY KEY",
        f"{quote_ident(lineage.SOURCE)} text NOT NULL",
        f"{quote_ident('row_index')} bigint",
        f"{quote_ident('raw')} jsonb",
        f"{quote_ident('errors')} jsonb NOT NULL",
        f"{quote_ident('event_time')} {event_type}",
        *(f"{quote_ident(n)} {t} NOT NULL" for n, t in LINEAGE_COLUMNS if n != lineage.SOURCE),
        f"CONSTRAINT {quote_ident(_bounded(table, '__errors'))} "
        f"CHECK (jsonb_typeof({quote_ident('errors')}) = 'array')",
        # One reject row per input record and schema: replaying a file or a Kafka
        # range inserts nothing new (ON CONFLICT DO NOTHING on this key).
        f"CONSTRAINT {quote_ident(_bounded(table, SOURCE_KEY_SUFFIX))} "
        f"UNIQUE ({quote_ident(lineage.SOURCE)}, {quote_ident(lineage.SCHEMA_FINGERPRINT)})",
    ]
    return _create_table(table, lines)


def rejects_index_names(schema: Schema) -> tuple[str, str]:
    """The rejects table's two indexes (as :func:`rejects_indexes` names them): by run
    (``<table>__by_run``) and by error (``<table>__by_error``)."""
    table = rejects_table_name(schema)
    return _bounded(table, BY_RUN_SUFFIX), _bounded(table, BY_ERROR_SUFFIX)


def rejects_indexes(schema: Schema) -> str:
    """``CREATE INDEX IF NOT EXISTS`` statements for the rejects table: a btree on
    ``(_run_id, id)`` (a run's rejects in keyset order, the runs a table holds) and a GIN
    ``jsonb_path_ops`` on ``errors`` (the ``errors @> '[{"rule": ...}]'`` filters)."""
    table = quote_ident(rejects_table_name(schema))
    by_run, by_error = (quote_ident(n) for n in rejects_index_names(schema))
    run, errors = quote_ident(lineage.RUN_ID), quote_ident("errors")
    return (f"CREATE INDEX IF NOT EXISTS {by_run} ON {table} ({run}, {quote_ident('id')});\n"
            f"CREATE INDEX IF NOT EXISTS {by_error} ON {table} USING gin ({errors} jsonb_path_ops);\n")


def _schemas_table() -> str:
    lines = [
        f"{quote_ident('schema_name')} text PRIMARY KEY",
        f"{quote_ident('version')} text NOT NULL",
        f"{quote_ident('fingerprint')} text NOT NULL",
        f"{quote_ident('applied_at')} timestamptz NOT NULL DEFAULT now()",
    ]
    return _create_table(SCHEMAS_TABLE, lines)


def versions_table() -> str:
    """The ``featureline_schema_versions`` table (``CREATE TABLE IF NOT EXISTS``): one row per
    (schema, fingerprint) the stores have held, with the version, the YAML text it was
    parsed from (null when unknown) and the fingerprint it was migrated from (null for the
    first one). Readers rebuild an older version's Redis layout from its text."""
    lines = [
        f"{quote_ident('schema_name')} text NOT NULL",
        f"{quote_ident('fingerprint')} text NOT NULL",
        f"{quote_ident('version')} text NOT NULL",
        f"{quote_ident('definition')} text",
        f"{quote_ident('migrated_from')} text",
        f"{quote_ident('recorded_at')} timestamptz NOT NULL DEFAULT now()",
        f"PRIMARY KEY ({quote_ident('schema_name')}, {quote_ident('fingerprint')})",
    ]
    return _create_table(VERSIONS_TABLE, lines)


def record_version(schema: Schema, fp: str, migrated_from: str | None = None) -> str:
    """The statement (no trailing semicolon) recording ``schema`` at fingerprint ``fp`` in
    ``featureline_schema_versions``: its version, its YAML text, and ``migrated_from``;
    a row already there keeps what it holds, except a missing definition or origin."""
    cols = ("schema_name", "fingerprint", "version", "definition", "migrated_from")
    values = [quote_literal(schema.name), quote_literal(fp), quote_literal(schema.version_str),
              "NULL" if schema.text is None else quote_literal(schema.text),
              "NULL" if migrated_from is None else quote_literal(migrated_from)]
    d, m = quote_ident("definition"), quote_ident("migrated_from")
    return (f"INSERT INTO {quote_ident(VERSIONS_TABLE)} ({', '.join(quote_ident(c) for c in cols)}) "
            f"VALUES ({', '.join(values)}) ON CONFLICT ({quote_ident('schema_name')}, "
            f"{quote_ident('fingerprint')}) DO UPDATE SET {d} = coalesce({quote_ident(VERSIONS_TABLE)}.{d}, "
            f"EXCLUDED.{d}), {m} = coalesce({quote_ident(VERSIONS_TABLE)}.{m}, EXCLUDED.{m})")


def _record_fingerprint(compiled: CompiledSchema) -> str:
    schema = compiled.schema
    cols = ", ".join(quote_ident(c) for c in ("schema_name", "version", "fingerprint"))
    values = ", ".join(quote_literal(v) for v in (schema.name, schema.version_str, compiled.fingerprint))
    return f"INSERT INTO {quote_ident(SCHEMAS_TABLE)} ({cols})\nVALUES ({values})\nON CONFLICT DO NOTHING;\n"


def _header(compiled: CompiledSchema) -> str:
    schema = compiled.schema
    lines = [
        "-- Generated by featureline (`features compile`); do not edit.",
        _comment(f"schema: {schema.name}"),
        _comment(f"version: {schema.version_str}"),
        _comment(f"fingerprint: {compiled.fingerprint}"),
        "-- Identifiers are unqualified: set search_path to choose the Postgres schema.",
    ]
    return "\n".join(lines) + "\n"


def render_ddl(compiled: CompiledSchema) -> str:
    """The whole ``sql/<schema>.sql`` text. Deterministic; safe to apply twice.

    Loadable schema: the ``featureline_schemas`` table, the cold feature table (and its
    event-time index, :func:`event_time_index`), the rejects table, and an INSERT
    recording the fingerprint. Validation-only schema:
    only the ``<schema>__check`` table (every field and its constraints), which
    agreement tests and ad-hoc checks can use.
    """
    schema = compiled.schema
    parts = [_header(compiled)]
    if schema.loadable:
        parts += [
            _schemas_table(),
            ("-- Cold store of a static schema (event_time: none): one row per entity, the newest\n"
             "-- load's (_ingested_at, then _digest, the content's), with lineage.\n" if schema.static else
             "-- Cold store: full history keyed by (entity, event time, content digest), with lineage.\n")
            + _cold_table(compiled),
        ]
        if (by_time := event_time_index(schema)) is not None:
            parts.append("-- The history by event time (a time window's rows, the newest event).\n" + by_time)
        parts.append("-- The history by ingestion time (the newest ingestion: features ui).\n"
                     + ingested_at_index(schema))
        parts += [
            "-- Rejected rows: raw payload, every error, and lineage.\n" + _rejects_table(compiled),
            "-- The rejects by run (keyset order) and by error (errors @> '[{\"rule\": ...}]').\n"
            + rejects_indexes(schema),
        ]
        if schema.aggregations is not None:
            parts.append(
                "-- Windowed aggregations: each value as of its event's time, keyed like the history.\n"
                + render_aggregates_table(schema)
            )
        parts.append(_record_fingerprint(compiled))
        parts.append("-- Every version the stores have held, with its YAML text (features migrate).\n"
                     + versions_table())
        parts.append(record_version(compiled.schema, compiled.fingerprint) + ";\n")
    else:
        parts += [
            "-- validation-only schema: no tables for features or rejects (no entity/event_time).\n"
            "-- The check table below holds every field with its constraints.\n"
            + render_check_table(compiled, check_table_name(schema)),
        ]
    return "\n".join(parts)
