"""View definitions (features/views, docs/views.md): every refusal of the interface at its
line and key path, all at once; a good view compiles; the fingerprint is stable and
ignores descriptions; request checks give field-level rejects through the loader's
validator; derived features never yield NaN; diffs are classified."""

from __future__ import annotations

import datetime as dt
import json
import math
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from features.compile import compile_schema
from features.errors import RowsRejected, SchemaError, SchemaErrors
from features.schema import load_schemas, parse_schema
from features.views import CompiledView, View, compile_view, load_views, parse_view
from features.views.diff import diff_views

ROOT = Path(__file__).resolve().parents[2]

CARD_TXN = """\
name: card_txn
version: 1.0.0
entity: card_id
event_time: ts
fields:
  - {name: card_id, type: string, store: [hot, cold], constraints: {required: true}}
  - {name: ts, type: "timestamp(us, UTC)", store: cold, constraints: {required: true}}
  - {name: amount, type: "decimal(12,2)", store: cold}
  - {name: note, type: string, store: none}
  - {name: country, type: string, store: hot}
features:
  - {name: amount_log, from: amount, steps: [{fill_null: 0}, log1p], dtype: float64, store: [hot, cold]}
aggregations:
  features:
    - {name: amount_mean_7d, function: mean, of: amount, window: 7d, store: [hot, cold]}
    - {name: txn_24h, function: count, window: 24h, store: cold}
"""
MERCHANT = """\
name: merchant
version: 1.0.0
entity: merchant_id
event_time: updated_at
fields:
  - {name: merchant_id, type: int64, store: [hot, cold], constraints: {required: true}}
  - {name: updated_at, type: "timestamp(us, UTC)", store: cold, constraints: {required: true}}
  - {name: risk_score, type: float64, store: [hot, cold]}
"""
CHECKS = """\
name: checks
version: 1.0.0
fields:
  - {name: x, type: int32}
"""


@pytest.fixture(scope="module")
def schemas() -> dict[str, object]:
    return {s.name: s for s in (parse_schema(CARD_TXN), parse_schema(MERCHANT), parse_schema(CHECKS))}


@pytest.fixture(scope="module")
def compiled(schemas: dict[str, object]) -> dict[str, object]:
    return {name: compile_schema(s) for name, s in schemas.items()}  # type: ignore[arg-type]


GOOD = """\
name: card_scoring
version: 1.0.0
description: free text
request:
  keys:
    card_id: string
    merchant_id: int64
  fields:
    - name: amount
      type: decimal(12,2)
      constraints: {required: true, min: 0}
    - name: request_time
      type: timestamp(us, UTC)
      constraints: {required: true}
sources:
  - schema: card_txn
    features: [amount_mean_7d, txn_24h, amount_log, ts]
    join: {card_id: card_id}
    max_age: 7d
    prefix: card_
  - schema: merchant
    features: [risk_score]
    join: {merchant_id: merchant_id}
features:
  - name: amount_over_mean
    from: amount
    steps: [{ratio: {denominator: card_amount_mean_7d, on_zero: 0}}]
    dtype: float64
  - name: scaled
    from: amount_over_mean
    steps: [{product: {other: risk_score}}]
    dtype: float64
  - name: amount_minus_mean
    from: amount
    steps: [{difference: {other: card_amount_mean_7d, on_null: 0}}]
    dtype: float64
    on_invalid: reject
  - name: hours_since_txn
    from: card_ts
    steps: [{time_since: hours}]
    dtype: float64
  - name: risk_times_mean
    from: risk_score
    steps: [{product: card_amount_mean_7d}]
    dtype: float64
    on_invalid: reject
"""


def _errors(text: str, schemas: dict[str, object]) -> list[str]:
    with pytest.raises(SchemaErrors) as info:
        parse_view(text, "views/x.yaml", schemas)  # type: ignore[arg-type]
    lines = [e.line or 0 for e in info.value.errors]
    assert lines == sorted(lines), "errors sorted by line"
    return [str(e) for e in info.value.errors]


def test_a_good_view_parses_and_compiles(schemas: dict[str, object], compiled: dict[str, object]) -> None:
    view = parse_view(GOOD, "views/card_scoring.yaml", schemas)  # type: ignore[arg-type]
    assert isinstance(view, View) and view.version == (1, 0, 0)
    card = view.sources[0]
    assert (card.schema, card.alias, card.entity, card.key, card.max_age_seconds, card.prefix) == (
        "card_txn", "card_txn", "card_id", "card_id", 7 * 86400, "card_")
    assert card.column("txn_24h") == "card_txn_24h"
    assert view.sources[1].prefix == "" and view.sources[1].max_age_seconds is None
    cv = compile_view(view, compiled, device="cpu")  # type: ignore[arg-type]
    assert isinstance(cv, CompiledView)
    assert cv.keys == ("card_id", "merchant_id") and cv.request_fields == ("amount", "request_time")
    assert cv.request_schema.names == ["card_id", "merchant_id", "amount", "request_time"]
    assert cv.request_schema.field("amount").type == pa.decimal128(12, 2)
    assert [(f.name, f.type) for f in cv.fetched] == [
        ("card_amount_mean_7d", pa.float64()), ("card_txn_24h", pa.int64()),
        ("card_amount_log", pa.float64()),
        ("card_ts", pa.timestamp("us", tz="UTC")), ("risk_score", pa.float64())]
    assert all(f.nullable for f in cv.fetched)
    assert cv.derived.names == ["amount_over_mean", "scaled", "amount_minus_mean", "hours_since_txn",
                                "risk_times_mean"]
    assert cv.output_schema.names == [*cv.request_schema.names, *cv.fetched.names, *cv.derived.names]
    assert len(cv.levels) == 2, "scaled reads amount_over_mean: a second level"


def test_the_shipped_view_compiles_over_the_shipped_schemas() -> None:
    schemas = load_schemas(ROOT / "schemas")
    views = load_views(ROOT / "views", schemas)
    assert "application_scoring" in views
    cv = compile_view(views["application_scoring"], {n: compile_schema(s) for n, s in schemas.items()},
                      device="cpu")
    assert {s.schema for s in cv.sources} == {"credit_applicant", "clicks"}
    assert set(cv.keys) == {"application_id", "user_id"}
    artefact = json.loads((ROOT / "views" / "compiled" / "application_scoring.json").read_text())
    assert artefact == json.loads(json.dumps(cv.artefact())), "views/compiled is up to date"
    assert load_views(ROOT / "no-such-folder", schemas) == {}


def test_every_refusal_at_its_line_and_key_path_all_at_once(schemas: dict[str, object]) -> None:
    text = """\
name: bad
version: 1.0.0
request:
  keys:
    card_id: int64
    merchant_id: int64
  fields:
    - {name: amount, type: float64}
    - {name: risk_score, type: float64}
    - {name: note, type: string, store: cold, constraints: {min: 1}}
sources:
  - schema: card_tx
    features: [x]
    join: {card_id: card_id}
  - schema: merchant
    features: [risk_scores, risk_score, merchant_id]
    join: {merchant_id: merchant}
  - schema: card_txn
    features: [country, note, amount_log]
    join: {card_id: card_id}
  - schema: checks
    features: [x]
    join: {x: card_id}
  - schema: merchant
    features: [updated_at]
    join: {merchant_id: merchant_id}
features:
  - {name: a, from: b, steps: [log1p], dtype: float64}
  - {name: b, from: a, steps: [log1p], dtype: float64}
  - {name: amount, from: amount, steps: [log1p], dtype: float64}
  - {name: t, from: amount, steps: [{product: nope}], dtype: float64}
"""
    errors = _errors(text, schemas)
    expected = [
        "views/x.yaml:10: request.fields[2].constraints.min: min does not apply to string fields",
        "views/x.yaml:10: request.fields[2].store: a request field is not stored",
        "views/x.yaml:12: sources[0].schema: unknown schema 'card_tx' (did you mean 'card_txn'?)",
        "views/x.yaml:16: sources[1].features[0]: schema 'merchant' has no feature 'risk_scores' "
        "(did you mean 'risk_score'?)",
        "views/x.yaml:16: sources[1].features[1]: output column 'risk_score' (feature 'risk_score' of source "
        "'merchant') is also a request field",
        "views/x.yaml:16: sources[1].features[2]: output column 'merchant_id' (feature 'merchant_id' of "
        "source 'merchant') is also a request key",
        "views/x.yaml:17: sources[1].join.merchant_id: join names request key 'merchant', which is not one "
        "of request.keys (did you mean 'merchant_id'?)",
        "views/x.yaml:19: sources[2].features[0]: feature 'country' of schema 'card_txn' is stored in the "
        "hot store only",
        "views/x.yaml:19: sources[2].features[1]: schema 'card_txn' has no stored feature 'note' (the field "
        "is validated, not stored)",
        "views/x.yaml:20: sources[2].join.card_id: request key 'card_id' is int64 but the entity 'card_id' "
        "of schema 'card_txn' is string",
        "views/x.yaml:21: sources[3].schema: schema 'checks' is validation-only",
        "views/x.yaml:24: sources[4].schema: duplicate source alias 'merchant'",
        "views/x.yaml:28: features[0].from: request-time features form a cycle: a -> b -> a",
        "views/x.yaml:30: features[2].name: output column 'amount' (a request-time feature) is also a "
        "request field",
        "views/x.yaml:31: features[3].steps[0].product.other: product other 'nope' is not a field of this "
        "view",
    ]
    for want in expected:
        assert any(e.startswith(want) for e in errors), f"{want!r} not in:\n" + "\n".join(errors)
    assert len(errors) == len(expected), "\n".join(errors)


def test_a_join_on_another_column_than_the_entity_is_refused(schemas: dict[str, object]) -> None:
    text = GOOD.replace("join: {card_id: card_id}", "join: {country: card_id}")
    errors = _errors(text, schemas)
    assert errors == ["views/x.yaml:18: sources[0].join.country: join column 'country' is not the entity of "
                      "schema 'card_txn' (its entity is 'card_id')"]


def test_time_since_needs_the_request_time_field(schemas: dict[str, object]) -> None:
    text = GOOD.replace("    - name: request_time\n      type: timestamp(us, UTC)\n"
                        "      constraints: {required: true}\n", "")
    errors = _errors(text, schemas)
    assert len(errors) == 1
    assert "time_since in a view measures up to the request field 'request_time'" in errors[0]
    assert errors[0].startswith("views/x.yaml:37: features[3].steps:")
    nullable = GOOD.replace("      constraints: {required: true}\nsources", "sources")
    errors = _errors(nullable, schemas)
    assert any("request field 'request_time' is the time time_since measures up to" in e for e in errors)


def test_a_yaml_error_and_an_empty_file_are_one_schema_error(schemas: dict[str, object]) -> None:
    with pytest.raises(SchemaError, match="invalid YAML"):
        parse_view("name: [", "v.yaml", schemas)  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match="the file is empty"):
        parse_view("", "v.yaml", schemas)  # type: ignore[arg-type]


def test_load_views_reports_every_file_and_duplicate_names(
        schemas: dict[str, object], tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yaml").write_text(GOOD)
    (tmp_path / "c.yaml").write_text(GOOD.replace("card_scoring", "other").replace("schema: merchant",
                                                                                   "schema: merchnt"))
    with pytest.raises(SchemaErrors) as info:
        load_views(tmp_path, schemas)  # type: ignore[arg-type]
    text = str(info.value)
    assert "b.yaml:1: name: duplicate view name 'card_scoring'" in text
    assert "c.yaml:21: sources[1].schema: unknown schema 'merchnt'" in text


def test_the_fingerprint_is_stable_and_ignores_descriptions(
        schemas: dict[str, object], compiled: dict[str, object]) -> None:
    def fp(text: str) -> str:
        view = parse_view(text, None, schemas)  # type: ignore[arg-type]
        return compile_view(view, compiled, device="cpu").fingerprint  # type: ignore[arg-type]

    first = fp(GOOD)
    assert len(first) == 64 and first == fp(GOOD)
    assert fp(GOOD.replace("description: free text", "description: other words")) == first
    assert fp(GOOD.replace("description: free text\n", "")) == first
    assert fp(GOOD.replace("max_age: 7d", "max_age: 6d")) != first
    assert fp(GOOD.replace("version: 1.0.0", "version: 1.0.1")) != first


@pytest.fixture(scope="module")
def card(schemas: dict[str, object], compiled: dict[str, object]) -> CompiledView:
    view = parse_view(GOOD, None, schemas)  # type: ignore[arg-type]
    return compile_view(view, compiled, device="cpu")  # type: ignore[arg-type]


def test_check_request_gives_field_level_rejects_from_the_validator(card: CompiledView) -> None:
    now = "2024-05-01T12:00:00+00:00"
    table, result = card.check_request([
        {"card_id": "c1", "merchant_id": 7, "amount": Decimal("10.00"), "request_time": now, "extra": 1},
        {"card_id": "c2", "merchant_id": 8, "amount": Decimal("-1.00"), "request_time": now},
        {"card_id": None, "merchant_id": 9, "amount": Decimal("1.00"), "request_time": now},
    ])
    assert table.schema == card.request_schema and table.column("card_id").to_pylist() == ["c1"]
    messages = result.rejects.column("message").to_pylist()
    assert messages[0] == "field amount violates constraint min: got -1.00, expected >= 0.00"
    assert result.rejects.column("field").to_pylist() == ["amount", "card_id"]
    assert result.rejects.column("row").to_pylist() == [1, 2]


def _table(card: CompiledView, amounts: list[Decimal | None], means: list[float | None],
           risks: list[float | None]) -> pa.Table:
    n = len(amounts)
    now = dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)
    cols = {
        "card_id": pa.array([f"c{i}" for i in range(n)]), "merchant_id": pa.array(range(n), pa.int64()),
        "amount": pa.array(amounts, pa.decimal128(12, 2)),
        "request_time": pa.array([now] * n, card.request_schema.field("request_time").type),
        "card_amount_mean_7d": pa.array(means, pa.float64()), "card_txn_24h": pa.array([1] * n, pa.int64()),
        "card_amount_log": pa.array([None] * n, pa.float64()),
        "card_ts": pa.array([now - dt.timedelta(hours=3)] * n, pa.timestamp("us", tz="UTC")),
        "risk_score": pa.array(risks, pa.float64()),
    }
    assert list(cols) == card.request_schema.names + card.fetched.names
    return pa.table(cols)


def test_derive_computes_chained_and_cross_column_features_and_never_nan(card: CompiledView) -> None:
    table = _table(card, [Decimal("10.00"), Decimal("10.00"), Decimal("5.00"), Decimal("1.00")],
                   [4.0, 0.0, None, 1e-300], [0.5, 2.0, 1.0, 1e308])
    out = card.derive(table)
    assert out.schema.names == card.output_schema.names
    assert out.column("amount_over_mean").to_pylist() == [2.5, 0.0, None, 1.0 / 1e-300]
    # product of the chained feature with the fetched risk: 1e300 * 1e308 overflows -> null
    assert out.column("scaled").to_pylist() == [1.25, 0.0, None, None]
    assert out.column("amount_minus_mean").to_pylist() == [6.0, 10.0, 0.0, 1.0 - 1e-300]
    assert out.column("hours_since_txn").to_pylist() == [3.0] * 4
    for name in card.derived.names:
        values = out.column(name).drop_null().to_pylist()
        assert all(math.isfinite(v) for v in values), name


def test_derive_checked_reports_rows_an_on_invalid_reject_feature_refuses(card: CompiledView) -> None:
    table = _table(card, [Decimal("1.00"), Decimal("2.00"), Decimal("3.00")], [1e10, 1.0, 1e10],
                   [1e308, 2.0, None])
    out, rejects = card.derive_checked(table)
    assert out.column("card_id").to_pylist() == ["c1", "c2"], "the refused row is left out"
    assert out.column("risk_times_mean").to_pylist() == [2.0, None]  # a null operand: null
    assert rejects.column("row").to_pylist() == [0]
    assert rejects.column("field").to_pylist() == ["risk_times_mean"]
    assert rejects.column("message").to_pylist() == [
        "feature risk_times_mean violates transform product: got 1e+308 * 10000000000.0, expected a finite "
        "result"]
    with pytest.raises(RowsRejected, match="1 of 3 rows rejected") as info:
        card.derive(table)
    assert info.value.rejected == 1


def test_diff_classifies_view_changes(schemas: dict[str, object], compiled: dict[str, object]) -> None:
    def cv(text: str) -> CompiledView:
        return compile_view(parse_view(text, None, schemas), compiled, device="cpu")  # type: ignore[arg-type]

    old = cv(GOOD)
    added = cv(GOOD.replace("features: [risk_score]", "features: [risk_score, updated_at]"))
    d = diff_views(old, added)
    assert [(c.column, c.kind, c.compatible) for c in d.changes] == [("updated_at", "column_added", True)]
    assert d.allowed
    removed = cv(GOOD.replace("features: [amount_mean_7d, txn_24h, amount_log, ts]",
                              "features: [amount_mean_7d, amount_log, ts]"))
    d = diff_views(old, removed)
    assert [(c.column, c.kind, c.compatible) for c in d.changes] == [
        ("card_txn_24h", "column_removed", False)]
    assert not d.allowed and d.refusal is not None and "2.0.0" in d.refusal
    bumped = cv(GOOD.replace("features: [amount_mean_7d, txn_24h, amount_log, ts]",
                             "features: [amount_mean_7d, amount_log, ts]")
                .replace("version: 1.0.0", "version: 2.0.0"))
    assert diff_views(old, bumped).allowed
    retyped = cv(GOOD.replace("    dtype: float64\n  - name: scaled", "    dtype: float32\n  - name: scaled"))
    d = diff_views(old, retyped)
    assert [(c.column, c.kind, c.compatible) for c in d.changes] == [
        ("amount_over_mean", "column_retyped", False)]
    rekeyed = cv(GOOD.replace("    merchant_id: int64\n", "    merchant_id: int64\n    extra_key: string\n"))
    d = diff_views(old, rekeyed)
    assert [(c.column, c.kind, c.compatible) for c in d.changes] == [("extra_key", "key_changed", False)]
    # request fields: a required one added is breaking, an optional one compatible, an
    # optional one made required breaking (callers that leave it out are refused)
    field = "    - name: channel\n      type: string\n      constraints: {required: %s}\nsources:\n"
    optional = cv(GOOD.replace("sources:\n", field % "false", 1))
    required = cv(GOOD.replace("sources:\n", field % "true", 1))
    d = diff_views(old, required)
    assert [(c.column, c.kind, c.compatible) for c in d.changes] == [
        ("channel", "request_field_added", False)]
    assert not d.allowed
    assert [(c.column, c.kind, c.compatible) for c in diff_views(old, optional).changes] == [
        ("channel", "column_added", True)]
    d = diff_views(optional, required)
    assert [(c.column, c.kind, c.compatible) for c in d.changes] == [
        ("channel", "request_field_required", False)]
    assert not d.allowed and d.refusal is not None and "channel" in d.refusal
    assert [(c.column, c.kind, c.compatible) for c in diff_views(required, optional).changes] == [], \
        "a required field made optional: every caller still sends what it may"
    # values change, types do not: compatible, reported
    d = diff_views(old, cv(GOOD.replace("steps: [{ratio: {denominator: card_amount_mean_7d, on_zero: 0}}]",
                                        "steps: [{ratio: {denominator: card_amount_mean_7d, on_zero: 1}}]")))
    assert [(c.column, c.kind, c.compatible) for c in d.changes] == [
        ("amount_over_mean", "definition_changed", True)]
    assert d.allowed
    d = diff_views(old, cv(GOOD.replace("    max_age: 7d\n", "    max_age: 1d\n")))
    assert [(c.column, c.kind, c.compatible, c.detail) for c in d.changes] == [
        ("card_txn", "max_age_changed", True, "max_age 7d -> 1d")]
    assert d.allowed


def test_schema_diff_cli_takes_two_view_files(tmp_path: Path) -> None:
    new = (ROOT / "views" / "application_scoring.yaml").read_text().replace(
        "features: [clicks_24h, click_ratio_24h, spend_today]", "features: [clicks_24h, spend_today]")
    (tmp_path / "new.yaml").write_text(new)
    out = subprocess.run([sys.executable, "-m", "features.cli", "schema", "diff",
                          str(ROOT / "views" / "application_scoring.yaml"), str(tmp_path / "new.yaml"),
                          "--schemas-dir", str(ROOT / "schemas"), "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kind"] == "view" and not doc["allowed"]
    assert [(c["column"], c["kind"]) for c in doc["changes"]] == [("user_click_ratio_24h", "column_removed")]


def test_features_compile_writes_and_checks_one_artefact_per_view(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from features.cli import main

    views = tmp_path / "views"
    views.mkdir()
    source = (ROOT / "views" / "application_scoring.yaml").read_text()
    (views / "application_scoring.yaml").write_text(source)

    def run(*extra: str) -> int:
        return main(["compile", "--schemas-dir", str(ROOT / "schemas"), "--sql-dir", str(tmp_path / "sql"),
                     "--expectations-dir", str(tmp_path / "exp"), "--views-dir", str(views), *extra])

    assert run("--check") == 1 and "missing: " in capsys.readouterr().err
    assert run() == 0
    out = capsys.readouterr().out
    artefact = views / "compiled" / "application_scoring.json"
    doc = json.loads(artefact.read_text())
    assert f"view application_scoring 1.0.0 {doc['fingerprint'][:12]}" in out
    assert artefact.read_bytes() == (ROOT / "views" / "compiled" / "application_scoring.json").read_bytes()
    assert run("--check") == 0
    (views / "application_scoring.yaml").write_text(source.replace("max_age: 1d", "max_age: 2d"))
    assert run("--check") == 1 and "stale: " in capsys.readouterr().err
    (views / "application_scoring.yaml").write_text(source.replace("spend_today]", "spend_todays]"))
    assert run("--check") == 1
    err = capsys.readouterr().err
    assert ("application_scoring.yaml:26: sources[1].features[2]: schema 'clicks' has no feature "
            "'spend_todays'") in err
    (views / "application_scoring.yaml").unlink()
    assert run("--check") == 1 and "extra: " in capsys.readouterr().err
    assert run() == 0 and not artefact.exists()
