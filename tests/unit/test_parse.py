"""Schema parsing: every bad file is refused with its line, key path and reason; the
shipped schemas parse; numbers stay exact; fingerprints are stable."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from features.compile.fingerprint import canonical_json, fingerprint
from features.errors import SchemaError, SchemaErrors
from features.schema import Schema, load_schema, load_schemas, parse_schema
from features.schema.model import FieldType, Step, TypeKind
from features.schema.syntax import regex_problem

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
BAD = Path(__file__).parent / "bad_schemas"

# (file stem, line, key path, a fragment of the reason). One problem per file.
BAD_CASES: list[tuple[str, int | None, str, str]] = [
    # the document itself
    ("not_a_mapping", 1, "", "expected a schema (a mapping), got a list"),
    ("duplicate_key", 8, "fields[0].constraints.min", "duplicate key 'min' (first at line 6)"),
    ("unknown_top_key", 2, "descripton",
     "unknown key 'descripton' in a schema (did you mean 'description'?)"),
    ("unknown_constraint_key", 6, "fields[0].constraints.nulable", "(did you mean 'nullable'?)"),
    ("missing_version", 1, "version", "missing required key 'version'"),
    ("missing_field_type", 3, "fields[0].type", "missing required key 'type' in a field"),
    ("bad_version", 1, "version", "version '1.2' is not semver MAJOR.MINOR.PATCH"),
    ("loadable_without_name", 1, "name", "a loadable schema (entity, event_time) needs an explicit name"),
    ("payload_format", 3, "payload.format", "payload format 'avro' is not supported (only json)"),
    ("hot_ttl_invalid", 5, "hot.ttl", "ttl string 'forever' is not a duration"),
    # types
    ("unknown_type", 4, "fields[0].type", "unknown type 'int128'"),
    ("decimal_precision", 4, "fields[0].type", "decimal precision 39 is out of range 1..38"),
    ("decimal_scale", 4, "fields[0].type", "decimal scale 6 must be between 0 and the precision 5"),
    ("timestamp_ns", 4, "fields[0].type",
     "timestamp unit ns is not supported (PostgreSQL keeps microseconds)"),
    ("timestamp_unit", 4, "fields[0].type", "unknown timestamp unit 'hours'"),
    ("unknown_time_zone", 4, "fields[0].type", "unknown time zone 'Mars/Olympus_Mons'"),
    # bounds
    ("min_greater_than_max", 6, "fields[0].constraints.min", "min 10 is greater than max 5"),
    ("min_on_bool", 6, "fields[0].constraints.min", "min does not apply to bool fields: they have no order"),
    ("max_on_enum", 7, "fields[0].constraints.max", "max does not apply to enum fields"),
    ("int32_overflow", 6, "fields[0].constraints.max",
     "max 10000000000 is not representable in int32 (range -2147483648..2147483647)"),
    ("decimal_places", 6, "fields[0].constraints.min",
     "min 0.001 has 3 decimal places, decimal(18,2) allows 2"),
    ("decimal_digits", 6, "fields[0].constraints.max",
     "max 100 is not representable in decimal(4,2) (at most 2 integer digits)"),
    ("bool_bound_for_int", 6, "fields[0].constraints.min", "min must be a number, got bool true"),
    ("naive_bound_for_zoned_timestamp", 6, "fields[0].constraints.min",
     "min '2020-01-01T00:00:00' needs a UTC offset for timestamp(us, UTC)"),
    # patterns and lengths
    ("pattern_on_int", 6, "fields[0].constraints.pattern",
     "pattern applies to string fields, this one is int32"),
    ("invalid_regex", 6, "fields[0].constraints.pattern", "invalid regex: unterminated character set"),
    ("lookahead_regex", 6, "fields[0].constraints.pattern",
     "lookahead (?=...) / (?!...) is not supported by RE2"),
    ("backreference_regex", 6, "fields[0].constraints.pattern",
     "backreferences (\\1) are not supported by RE2"),
    ("word_boundary_regex", 6, "fields[0].constraints.pattern",
     "\\b is a word boundary in Python and RE2 but a backspace in PostgreSQL"),
    ("min_length_over_max", 6, "fields[0].constraints.min_length",
     "min_length 5 is greater than max_length 2"),
    ("negative_min_length", 6, "fields[0].constraints.min_length", "min_length must be >= 0, got -1"),
    # defaults and nullability
    ("default_wrong_type", 6, "fields[0].constraints.default", "default must be a number, got string 'abc'"),
    ("default_below_min", 7, "fields[0].constraints.default", "default -1 violates min: expected >= 0"),
    ("default_breaks_pattern", 7, "fields[0].constraints.default",
     "default 'ABC' violates pattern: expected a full match of ^[a-z]+$"),
    ("default_not_in_enum", 7, "fields[0].constraints.default",
     "default 'z' violates enum: expected one of x, y"),
    ("default_nan", 6, "fields[0].constraints.default", "default must be a finite number, got .nan"),
    ("default_null_not_nullable", 7, "fields[0].constraints.default",
     "default: null contradicts nullable: false"),
    ("required_and_nullable", 7, "fields[0].constraints.nullable",
     "nullable: true contradicts required: true"),
    # names
    ("duplicate_field", 5, "fields[1].name", "duplicate field name 'a' (first at line 3)"),
    ("reserved_schema_name", 1, "name", "invalid schema name 'select': it is a reserved SQL word"),
    ("underscore_field_name", 3, "fields[0].name",
     "names starting with '_' are reserved for lineage columns"),
    ("long_field_name", 3, "fields[0].name", "it is too long (64 characters, at most 63)"),
    ("uppercase_field_name", 3, "fields[0].name",
     "invalid field name 'IncomeMonthly': it is not a safe identifier"),
    # enums
    ("empty_enum", 5, "fields[0].values", "enum values must not be empty"),
    ("duplicate_enum_value", 5, "fields[0].values[2]", "duplicate enum value 'x'"),
    ("enum_value_not_string", 5, "fields[0].values[0]", "got bool yes (quote it: 'yes')"),
    ("values_on_non_enum", 5, "fields[0].values", "values applies only to enum fields, this one is string"),
    # entity, event time, stores
    ("entity_not_a_field", 3, "entity",
     "entity 'customer_id' is not a field of this schema (did you mean 'user_id'?)"),
    ("event_time_not_temporal", 4, "event_time",
     "event_time field 'region' has type string; it must be a timestamp"),
    ("entity_float", 3, "entity", "entity field 'income' has type float64"),
    ("entity_nullable", 3, "entity", "entity field 'region' is nullable; mark it required: true"),
    ("entity_without_event_time", 2, "entity", "entity needs event_time too"),
    ("stored_without_entity", 5, "fields[0].store",
     "field 'a' is stored (hot) but the schema is validation-only"),
    ("feature_without_entity", 6, "features", "features need a loadable schema"),
    ("store_unknown", 21, "fields[5].store", "unknown store 'warm'"),
    # features
    ("unknown_op", 25, "features[0].steps[0]", "unknown op 'log' (did you mean 'log1p'?)"),
    ("missing_op_arg", 25, "features[0].steps[0].zscore", "zscore is missing argument 'std'"),
    ("extra_op_arg", 25, "features[0].steps[0].clip.mid", "unknown key 'mid' in the arguments of clip"),
    ("op_arg_wrong_type", 25, "features[0].steps[0].hash_bucket.n",
     "expected hash_bucket n, got string 'many'"),
    ("op_takes_no_args", 25, "features[0].steps[0].log1p", "log1p takes no arguments"),
    ("from_not_a_field", 23, "features[0].from",
     "from 'incme' is not a field of this schema (did you mean 'income'?)"),
    ("log1p_on_string", 25, "features[0].steps[0]", "log1p needs numeric input, got string (field 'region')"),
    ("hash_bucket_on_int", 25, "features[0].steps[0]", "hash_bucket needs string or enum input, got numeric"),
    ("one_hot_on_string", 25, "features[0].steps[0]", "one_hot needs enum input, got string"),
    ("one_hot_too_many_values", 25, "features[0].steps[0]", "at most 32 values; 'status' has 33"),
    ("one_hot_not_last", 26, "features[0].steps[1]", "one_hot must be the last step"),
    ("time_since_on_number", 25, "features[0].steps[0]",
     "time_since needs timestamp/date input, got numeric"),
    ("time_since_on_event_time", 25, "features[0].steps[0]",
     "time_since on the event_time field 'ts' itself"),
    ("time_since_unit", 25, "features[0].steps[0].time_since.unit", "unknown time_since unit 'fortnights'"),
    ("ratio_without_denominator", 25, "features[0].steps[0].ratio",
     "ratio is missing argument 'denominator'"),
    ("ratio_denominator_not_a_field", 25, "features[0].steps[0].ratio.denominator",
     "ratio denominator 'incme' is not a field of this schema"),
    ("ratio_denominator_string", 25, "features[0].steps[0].ratio.denominator",
     "ratio denominator 'region' is a string field, expected a number"),
    ("bucketize_not_increasing", 25, "features[0].steps[0].bucketize.boundaries[2]",
     "bucketize boundaries must be strictly increasing: 2 follows 3"),
    ("hash_bucket_zero", 25, "features[0].steps[0].hash_bucket.n", "hash_bucket n must be >= 1, got 0"),
    ("clip_lo_over_hi", 25, "features[0].steps[0].clip", "clip lo 5 is greater than hi 1"),
    ("zscore_std_zero", 25, "features[0].steps[0].zscore.std", "zscore std must be > 0, got 0"),
    ("minmax_lo_equals_hi", 25, "features[0].steps[0].minmax", "minmax lo 1 must be less than hi 1"),
    ("string_feature_output", 25, "features[0].steps", "the steps end with a string value"),
    ("dtype_unknown", 26, "features[0].dtype", "unknown type 'flaot64' (did you mean 'float64'?)"),
    ("dtype_not_numeric", 26, "features[0].dtype",
     "dtype must be an integer, float or bool type, got string"),
    ("feature_missing_dtype", 22, "features[0].dtype", "missing required key 'dtype' in a feature"),
    ("feature_missing_store", 22, "features[0].store", "missing required key 'store' in a feature"),
    ("feature_store_none", 27, "features[0].store", "a feature must be stored: hot, cold or [hot, cold]"),
    ("feature_name_clash", 22, "features[0].name", "feature name 'income' clashes with the field 'income'"),
    ("on_invalid_unknown", 28, "features[0].on_invalid", "on_invalid must be null or reject, got 'drop'"),
]


def test_every_bad_file_has_a_case() -> None:
    on_disk = {p.stem for p in BAD.glob("*.yaml")}
    in_table = {case[0] for case in BAD_CASES} | {"yaml_syntax"}
    assert on_disk == in_table
    assert len(BAD_CASES) >= 30


@pytest.mark.parametrize(("stem", "line", "key_path", "reason"), BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_schema_is_refused_with_its_place(stem: str, line: int, key_path: str, reason: str) -> None:
    path = BAD / f"{stem}.yaml"
    with pytest.raises(SchemaErrors) as info:
        load_schema(path)
    errors = info.value.errors
    assert len(errors) == 1, [str(e) for e in errors]
    error = errors[0]
    assert reason in error.reason
    assert error.line == line
    assert error.key_path == key_path
    assert error.path == str(path)
    # The message names the place as file:line: key.path: reason.
    prefix = f"{path}:{line}: {key_path}: " if key_path else f"{path}:{line}: "
    assert str(info.value) == prefix + error.reason


def test_yaml_syntax_error_is_one_schema_error_at_pyyaml_line() -> None:
    path = BAD / "yaml_syntax.yaml"
    with pytest.raises(SchemaError) as info:
        load_schema(path)
    assert not isinstance(info.value, SchemaErrors)
    assert info.value.line == 4
    assert info.value.reason.startswith("invalid YAML: ")
    assert info.value.path == str(path)


def test_empty_text_is_refused() -> None:
    with pytest.raises(SchemaError, match="the file is empty"):
        parse_schema("# nothing here\n", "x.yaml")


def test_a_file_with_three_problems_reports_all_three() -> None:
    text = (
        "version: 1.0.0\n"
        "fields:\n"
        "  - name: a\n"
        "    type: int128\n"                  # 4: unknown type
        "  - name: b\n"
        "    type: string\n"
        "    constraints:\n"
        "      min_length: 9\n"               # 8: min_length > max_length
        "      max_length: 3\n"
        "  - name: Order\n"                   # 10: not a safe identifier
        "    type: bool\n"
    )
    with pytest.raises(SchemaErrors) as info:
        parse_schema(text, "three.yaml")
    found = [(e.line, e.key_path) for e in info.value.errors]
    assert found == [(4, "fields[0].type"), (8, "fields[1].constraints.min_length"), (10, "fields[2].name")]
    message = str(info.value).splitlines()
    assert len(message) == 3
    assert message[0] == "three.yaml:4: fields[0].type: unknown type 'int128' (did you mean 'int8'?)"


# --------------------------------------------------------------------------- good schemas


def test_shipped_schemas_parse() -> None:
    schemas = load_schemas(SCHEMAS)
    assert {"credit_applicant", "clicks", "design_example"} <= set(schemas)
    for schema in schemas.values():
        assert isinstance(schema, Schema)


def test_design_example_is_validation_only_and_exact() -> None:
    schema = load_schema(SCHEMAS / "design_example.yaml")
    assert schema.name == "design_example"
    assert schema.version == (3, 2, 1)
    assert schema.field_names == ("application_id", "income_monthly", "employment_duration_months")
    assert not schema.loadable
    assert all(f.store == frozenset() for f in schema.fields)
    app = schema.field("application_id")
    assert app.constraints.required and not app.constraints.nullable
    assert app.constraints.pattern == "^APP-[0-9]{12}$"
    income = schema.field("income_monthly")
    assert income.type == FieldType(TypeKind.DECIMAL, precision=18, scale=2)
    assert income.constraints.min == Decimal("0.01")
    assert str(income.constraints.min) == "0.01"
    assert str(income.constraints.max) == "99999999.99"
    assert income.constraints.nullable is False
    months = schema.field("employment_duration_months")
    assert months.constraints.default == 0 and months.constraints.has_default
    assert type(months.constraints.min) is int
    # An evolution rule may name a field the schema does not have (yet).
    assert [r.field for r in schema.evolution_rules] == ["income_monthly", "employment_status"]
    assert schema.evolution_rules[1].breaking_change is True


def test_credit_applicant_is_loadable() -> None:
    schema = load_schema(SCHEMAS / "credit_applicant.yaml")
    assert schema.loadable
    assert (schema.entity, schema.event_time) == ("application_id", "submitted_at")
    assert schema.hot.ttl_seconds == 7 * 86400
    assert schema.field("submitted_at").type == FieldType(TypeKind.TIMESTAMP, unit="us", tz="UTC")
    assert schema.field("employment_status").values == (
        "employed", "self_employed", "unemployed", "retired", "student",
    )
    # no explicit store in a loadable schema: cold
    assert schema.field("age").store == frozenset({"cold"})
    assert schema.field("application_id").store == frozenset({"hot", "cold"})
    assert schema.field("existing_debt").constraints.min == Decimal("0.00")
    assert schema.field("credit_score").constraints.nullable
    debt = next(f for f in schema.features if f.name == "debt_to_income")
    assert debt.on_invalid == "reject"
    assert debt.store == frozenset({"hot", "cold"})
    assert [s.op for s in debt.steps] == ["fill_null", "ratio", "clip"]
    assert debt.steps[1].arg("denominator") == "income_monthly"
    assert debt.steps[2].args == (("lo", 0), ("hi", 100))
    bucket = next(f for f in schema.features if f.name == "score_bucket")
    assert bucket.steps == (Step("bucketize", (("boundaries", (580, 670, 740, 800)),)),)
    assert bucket.dtype == FieldType(TypeKind.INT32)
    assert next(f for f in schema.features if f.name == "income_log").on_invalid == "null"


def test_clicks_is_loadable() -> None:
    schema = load_schema(SCHEMAS / "clicks.yaml")
    assert (schema.entity, schema.event_time) == ("user_id", "event_time")
    assert schema.field("event_time").type == FieldType(TypeKind.TIMESTAMP, unit="ms", tz="UTC")
    assert schema.field("price").type == FieldType(TypeKind.DECIMAL, precision=12, scale=2)
    assert schema.field("session_id").constraints.empty_as_null
    assert schema.field("dwell_ms").constraints.max == 3_600_000
    assert {f.name for f in schema.features} == {"dwell_log", "item_hash", "event_type_onehot"}


# --------------------------------------------------------------------------- exact values


def _one_field(field_yaml: str, extra: str = "") -> Schema:
    text = "version: 1.0.0\n" + extra + "fields:\n  - name: x\n" + "".join(
        f"    {line}\n" for line in field_yaml.strip("\n").split("\n")
    )
    return parse_schema(text, "exact.yaml")


def test_decimal_bounds_come_from_the_text_not_a_float() -> None:
    big = "1234567890123456789012345678.0123456789"
    c = _one_field(f"type: decimal(38,10)\nconstraints:\n  min: 0.01\n  max: {big}").field("x").constraints
    assert c.min == Decimal("0.01") and isinstance(c.min, Decimal)
    assert str(c.min) == "0.0100000000"  # quantized to the field's scale, still exact
    assert c.max == Decimal(big)
    assert float(Decimal("0.01")) != Decimal("0.01")  # what going through float would have broken


def test_numbers_convert_to_the_field_type() -> None:
    c = _one_field("type: float32\nconstraints: {min: -1e3, max: 0.5, default: 0.25}").field("x").constraints
    assert (c.min, c.max, c.default) == (-1000.0, 0.5, 0.25)
    assert all(type(v) is float for v in (c.min, c.max, c.default))
    c = _one_field("type: int64\nconstraints: {min: -9223372036854775808, max: 1e3}").field("x").constraints
    assert (c.min, c.max) == (-(2**63), 1000)
    assert type(c.max) is int
    with pytest.raises(SchemaErrors, match="is not an integer, int8 needs one"):
        _one_field("type: int8\nconstraints:\n  max: 1.5")
    with pytest.raises(SchemaErrors, match="not representable in float32"):
        _one_field("type: float32\nconstraints:\n  max: 1e39")
    with pytest.raises(SchemaErrors, match=r"min 010 is not written in decimal \(YAML 1.1 would read it as"):
        _one_field("type: int32\nconstraints:\n  min: 010")


def test_temporal_bounds_are_iso_strings() -> None:
    c = _one_field("type: date\nconstraints: {min: 2000-01-01, default: 2020-02-29}").field("x").constraints
    assert (c.min, c.default) == ("2000-01-01", "2020-02-29")
    c = _one_field("type: timestamp(ms, Europe/Paris)\nconstraints:\n  min: 2024-01-01T01:00:00+01:00").field(
        "x").constraints
    assert c.min == "2024-01-01T00:00:00+00:00"
    with pytest.raises(SchemaErrors, match=r"not representable in timestamp\(s\) \(finer than s\)"):
        _one_field("type: timestamp(s)\nconstraints:\n  min: 2024-01-01T00:00:00.5")
    with pytest.raises(SchemaErrors, match="must not carry a UTC offset for naive"):
        _one_field("type: timestamp(us)\nconstraints:\n  max: 2024-01-01T00:00:00Z")
    with pytest.raises(SchemaErrors, match="min 2024-01-02 is greater than max 2024-01-01"):
        _one_field("type: date\nconstraints:\n  min: 2024-01-02\n  max: 2024-01-01")


def test_nullability_defaults() -> None:
    assert _one_field("type: string").field("x").constraints.nullable is True
    req = _one_field("type: string\nconstraints: {required: true}").field("x").constraints
    assert (req.required, req.nullable) == (True, False)
    c = _one_field("type: string\nconstraints: {default: null}").field("x").constraints
    assert (c.has_default, c.default) == (True, None)


def test_hot_ttl_forms() -> None:
    base = "name: t\nversion: 1.0.0\nentity: k\nevent_time: t\nhot:\n  ttl: {ttl}\nfields:\n" \
           "  - {{name: k, type: int64, constraints: {{required: true}}}}\n" \
           "  - {{name: t, type: date, constraints: {{required: true}}}}\n"
    assert parse_schema(base.format(ttl="1d12h")).hot.ttl_seconds == 36 * 3600
    assert parse_schema(base.format(ttl="3600")).hot.ttl_seconds == 3600
    assert parse_schema(base.format(ttl="45s")).hot.ttl_seconds == 45
    with pytest.raises(SchemaErrors, match="ttl must be > 0 seconds"):
        parse_schema(base.format(ttl="0"))


def test_hot_refresh_after_is_shorter_than_the_ttl_and_not_in_the_fingerprint() -> None:
    from features.compile import compile_schema

    base = "name: t\nversion: 1.0.0\nentity: k\nevent_time: t\nhot:\n{hot}fields:\n" \
           "  - {{name: k, type: int64, constraints: {{required: true}}}}\n" \
           "  - {{name: t, type: date, constraints: {{required: true}}}}\n"
    plain = parse_schema(base.format(hot="  ttl: 7d\n"))
    soft = parse_schema(base.format(hot="  ttl: 7d\n  refresh_after: 1h\n"))
    assert (soft.hot.ttl_seconds, soft.hot.refresh_after_seconds) == (7 * 86400, 3600)
    assert plain.hot.refresh_after_seconds is None
    assert compile_schema(soft).fingerprint == compile_schema(plain).fingerprint
    for hot, message in [("  ttl: 1h\n  refresh_after: 1h\n", "must be shorter than hot.ttl"),
                         ("  refresh_after: 1h\n", "must be shorter than hot.ttl \\(none\\)"),
                         ("  ttl: 1d\n  refresh_after: soon\n", "refresh_after string 'soon' is not"),
                         ("  ttl: 1d\n  refresh_after: 0\n", "refresh_after must be > 0 seconds"),
                         ("  ttl: 1d\n  refresh: 1h\n", "refresh")]:
        with pytest.raises(SchemaErrors, match=message):
            parse_schema(base.format(hot=hot))


def test_step_shorthands_equal_the_long_form() -> None:
    def features(steps: str) -> tuple[Step, ...]:
        text = (
            "name: t\nversion: 1.0.0\nentity: k\nevent_time: t\nfields:\n"
            "  - {name: k, type: string, constraints: {required: true}}\n"
            "  - {name: t, type: date, constraints: {required: true}}\n"
            "  - {name: c, type: string}\n"
            "features:\n"
            f"  - {{name: f, from: c, steps: {steps}, dtype: int32, store: hot, on_invalid: null}}\n"
        )
        return parse_schema(text).features[0].steps

    assert features("[{hash_bucket: 64}]") == features("[{hash_bucket: {n: 64}}]")
    cast = features("[{fill_null: z}, {hash_bucket: 8}, {cast: int64}]")[2]
    assert cast == Step("cast", (("dtype", "int64"),))


def test_name_comes_from_the_stem_only_for_validation_only_schemas() -> None:
    text = "version: 1.0.0\nfields:\n  - {name: a, type: string}\n"
    assert parse_schema(text, "schemas/my_checks.yaml").name == "my_checks"
    with pytest.raises(SchemaErrors, match=r"the file name 'my-checks'.*add name:"):
        parse_schema(text, "schemas/my-checks.yaml")
    with pytest.raises(SchemaErrors, match="missing required key 'name'"):
        parse_schema(text)


@pytest.mark.parametrize(("name", "reserved"), [
    ("featureline_ledger", "featureline_"), ("featureline_schemas", "featureline_"),
    ("featureline_x", "featureline_"),
    ("x__aggregates", "__aggregates"), ("y__check", "__check"), ("z__rejects", "__rejects"),
    ("w__pkey", "__pkey"), ("v__source_key", "__source_key"),
])
def test_names_featureline_derives_its_own_tables_and_keys_from_are_refused(name: str, reserved: str) -> None:
    """A schema named like one of featureline's own tables, or like a table or Redis key
    derived from another schema's name (``x__aggregates`` is schema ``x``'s aggregates
    table and hashes), would share it: refused, naming the reserved part."""
    text = f"name: {name}\nversion: 1.0.0\nfields:\n  - {{name: a, type: string}}\n"
    with pytest.raises(SchemaErrors) as info:
        parse_schema(text, "schemas/s.yaml")
    (error,) = info.value.errors
    assert error.key_path == "name" and error.line == 1
    assert f"invalid schema name '{name}'" in error.reason and f"'{reserved}'" in error.reason
    assert "reserved" in error.reason


def test_every_suffix_of_a_derived_name_is_reserved() -> None:
    """The one list the schema check uses is the one the derived names are built from:
    tables, their key indexes (relations in the same namespace) and Redis hashes."""
    from features.compile import compile_schema, postgres
    from features.compile.layout import aggregates_key
    from features.schema.syntax import RESERVED_PREFIXES, RESERVED_SUFFIXES

    schema = parse_schema("name: s\nversion: 1.0.0\nentity: e\nevent_time: t\nfields:\n"
                          "  - {name: e, type: string, constraints: {required: true}}\n"
                          "  - {name: t, type: date, constraints: {required: true}}\n")
    derived = [postgres.rejects_table_name(schema), postgres.aggregates_table_name(schema),
               postgres.check_table_name(schema), aggregates_key("s", "E").split(":")[1], "s__pkey"]
    for name in derived:
        assert name.removeprefix("s") in RESERVED_SUFFIXES, name
    ddl = compile_schema(schema).ddl
    assert '"s__pkey"' in ddl and '"s__rejects__source_key"' in ddl and "__source_key" in RESERVED_SUFFIXES
    for index in postgres.rejects_index_names(schema):  # relations too: a schema may not be named so
        assert index in ddl and index.removeprefix("s__rejects") in RESERVED_SUFFIXES
    assert RESERVED_PREFIXES == ("featureline_",)


# --------------------------------------------------------------------------- regexes


@pytest.mark.parametrize(
    "pattern",
    [
        "^APP-[0-9]{12}$", "[A-Za-z_]+", "a|b|(?:cd)*?", r"\.\-\+x{2,255}", "[]a]", "[^]a]", r"\t\n",
        r"^\d+$", r"[\w.-]+@\S+", "[[:alpha:]_]+", r"\x41\x{1F600}", "a[b&&c]",
    ],
)
def test_portable_patterns_pass(pattern: str) -> None:
    assert regex_problem(pattern) is None


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        ("(?<=a)b", "lookbehind"),
        ("(?P<n>a)", "named groups"),
        ("(?P=n)", "backreferences"),
        ("(?>a)", "atomic groups"),
        ("(?i)abc", "inline flags"),
        ("a++", "possessive quantifiers"),
        ("a{2}+", "possessive quantifiers"),
        (r"abc\Z", r"\Z is not portable"),
        (r"\Aabc", r"\A is not portable"),
        (r"\bword", "backspace in PostgreSQL"),
        ("a{,3}", "write {0,3}"),
        ("a{1,300}", "above PostgreSQL's limit of 255"),
        (r"\u0041", r"the escape \u differs"),
        (r"\_", r"the escape \_ differs"),
        (r"[\D]", r"\D inside a bracket expression"),
        ("[[:foo:]]", "POSIX class [:foo:] is not supported"),
        ("[[.a.]]", "collating elements"),
        (r"\x{0}", "malformed \\x escape"),
        ("a\x00", "a NUL character"),
        ("a{", "a literal '{' must be escaped"),
        ("(a", "invalid regex: missing ), unterminated subpattern"),
    ],
)
def test_non_portable_or_invalid_patterns_are_refused(pattern: str, fragment: str) -> None:
    problem = regex_problem(pattern)
    assert problem is not None and fragment in problem


# --------------------------------------------------------------------------- load_schemas


def _write(path: Path, name: str) -> Path:
    text = f"name: {name}\nversion: 1.0.0\nfields:\n  - {{name: a, type: string}}\n"
    path.write_text(text, encoding="utf-8")
    return path


def test_load_schemas_refuses_duplicate_names_across_files(tmp_path: Path) -> None:
    _write(tmp_path / "a.yaml", "same")
    second = _write(tmp_path / "b.yml", "same")
    _write(tmp_path / "c.yaml", "other")
    with pytest.raises(SchemaErrors) as info:
        load_schemas(tmp_path)
    [error] = info.value.errors
    assert error.path == str(second)
    assert (error.line, error.key_path) == (1, "name")
    assert f"duplicate schema name 'same' (also declared in {tmp_path / 'a.yaml'})" == error.reason


def test_load_schemas_collects_errors_of_every_file(tmp_path: Path) -> None:
    _write(tmp_path / "good.yaml", "good")
    (tmp_path / "bad1.yaml").write_text("version: 1\nfields: []\n", encoding="utf-8")
    (tmp_path / "bad2.yaml").write_text("version: [\n", encoding="utf-8")
    (tmp_path / "notes.txt").write_text("not a schema", encoding="utf-8")
    with pytest.raises(SchemaErrors) as info:
        load_schemas([tmp_path])
    paths = sorted({Path(e.path or "").name for e in info.value.errors})
    assert paths == ["bad1.yaml", "bad2.yaml"]
    assert len(info.value.errors) == 3  # bad version, empty fields, YAML syntax


def test_load_schema_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="cannot read the schema file") as info:
        load_schema(tmp_path / "nope.yaml")
    assert info.value.path == str(tmp_path / "nope.yaml")


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_is_stable_and_semantic() -> None:
    text = (SCHEMAS / "credit_applicant.yaml").read_text(encoding="utf-8")
    base = fingerprint(parse_schema(text, "a.yaml"))
    assert len(base) == 64 and int(base, 16) >= 0
    assert fingerprint(parse_schema(text, "elsewhere/b.yaml")) == base  # the path does not count
    changed = text.replace("max: 850", "max: 851")
    assert changed != text
    assert fingerprint(parse_schema(changed)) != base
    described = text.replace(
        "description: bureau score; null for applicants without a credit history",
        "description: a different comment",
    )
    assert described != text
    assert fingerprint(parse_schema(described)) == base
    moved = text.replace("version: 3.2.1\n", "\n\nversion: 3.2.1\n")  # lines shift, nothing else
    assert fingerprint(parse_schema(moved)) == base


def test_fingerprint_ignores_equal_spellings_of_the_same_value() -> None:
    a = _one_field("type: decimal(18,2)\nconstraints:\n  min: 0\n  max: 1e2")
    b = _one_field("type: decimal(18,2)\nconstraints:\n  min: 0.00\n  max: 100")
    assert fingerprint(a) == fingerprint(b)
    assert '"min":"0.00"' in canonical_json(a)


def test_fingerprint_is_the_same_in_another_process() -> None:
    path = SCHEMAS / "clicks.yaml"
    code = (
        "import sys; from features.schema import load_schema; "
        "from features.compile.fingerprint import fingerprint; "
        "print(fingerprint(load_schema(sys.argv[1])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], check=True, capture_output=True, text=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    )
    assert out.stdout.strip() == fingerprint(load_schema(path))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=list("ab[]^$(){}?*+|\\:.=-,09xdDsbAZ&_é\n"), max_size=16))
def test_regex_problem_always_answers(pattern: str) -> None:
    problem = regex_problem(pattern)
    assert problem is None or problem.startswith(("invalid regex: ", "not portable across"))
