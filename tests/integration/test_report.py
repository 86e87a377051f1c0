"""``features report`` end to end: Parquet, the cold table and the rejects table in the
real Postgres; the report's numbers against the compiled validator's on the same data;
exit codes; the HTML page's verdict, counts and escaping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from features.cli import build_parser, main
from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.kernels import compile_transforms
from features.load import load
from features.ops.examples import applicant_schema, applicants
from features.report.stats import DistinctCounter
from features.schema import load_schema
from features.validation import validate

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = str(ROOT / "schemas")
HOSTILE = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
ENUM_ROWS = (10, 11, 4_321)  # hostile employment_status: rejected
REGION_ROWS = (20, 30, 40)  # hostile region: valid (2..32 characters), so stored


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return applicant_schema()


@pytest.fixture(scope="module")
def dirty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """5,000 applicants, ~2% invalid, and a hostile string in a string field (region:
    valid, so it is a min value) and an enum field (employment_status: rejected)."""
    table = applicants(5_000, seed=11)
    for name, rows in (("region", REGION_ROWS), ("employment_status", ENUM_ROWS)):
        values = table.column(name).to_pylist()
        for i in rows:
            values[i] = HOSTILE
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, pa.string()))
    path = tmp_path_factory.mktemp("report") / "applicants.parquet"
    pq.write_table(table, path, row_group_size=2_000)
    return path


def report(out: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    code = main(["report", "--schema", "credit_applicant", "--schemas-dir", SCHEMAS, *args,
                 "--out", str(out), "--no-progress"])
    return (code, json.loads((out / "report.json").read_text(encoding="utf-8")),
            (out / "report.html").read_text(encoding="utf-8"))


def assert_safe_html(html: str) -> None:
    assert HOSTILE not in html
    assert "<script" not in html.lower()
    assert "src=" not in html and "<link" not in html and "@import" not in html  # self-contained


def test_parquet_report_equals_validator(dirty: Path, compiled: CompiledSchema, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, r, html = report(tmp_path, "--parquet", str(dirty), "--batch-rows", "1500")
    table = pq.read_table(dirty)
    expected = validate(table, compiled).counts
    assert expected.rejected_rows > 50
    assert code == 1 and r["verdict"] == "FAIL"
    assert "FAIL" in capsys.readouterr().out

    # One truth: the report's counts are the validator's, on the whole file.
    c = r["counts"]
    assert (c["input_rows"], c["valid_rows"], c["rejected_rows"]) == (
        expected.input_rows, expected.valid_rows, expected.rejected_rows)
    assert {k: v for k, v in c["by_rule"].items() if v} == dict(expected.by_rule)
    assert c["reject_count"] == expected.reject_count
    # GX per expectation, summed over 5 batches (row groups 2000+2000+1000, 1500 rows a batch).
    assert r["gx"]["batches"] == 5
    assert r["disagreements"] == []
    gx_rules = 0
    for e in r["expectations"]:
        n = expected.by_rule.get(e["rule"], 0)
        assert e["validator_rejected_rows"] == n
        if e["gx"] is not None:
            gx_rules += 1
            assert e["gx"]["unexpected_count"] == n, e["rule"]
            assert e["gx"]["success"] == (n == 0) and e["agrees"] is True
            assert len(e["gx"]["examples"]) == min(n, 5)
        else:
            assert e["not_expressible"]
    assert gx_rules == r["gx"]["expectations"] == 20
    assert r["gx"]["failed"] == sum(1 for e in r["expectations"] if e["gx"] and not e["gx"]["success"])

    # Examples point at the right rows of the file.
    uri = dirty.resolve().as_uri()
    groups = {g["rule"]: g for g in r["rejects"]["groups"]}
    assert {k: g["count"] for k, g in groups.items()} == dict(expected.by_rule)
    enum = groups["employment_status.enum"]
    assert any(ex["value"] == HOSTILE for ex in enum["examples"])
    for g in groups.values():
        assert 1 <= len(g["examples"]) <= 5
        for ex in g["examples"]:
            assert ex["source"] == f"{uri}#{ex['row']}"
    for ex in enum["examples"]:
        assert table.column("employment_status")[ex["row"]].as_py() == ex["value"]

    # Field statistics against Arrow on the whole table.
    fields = {f["field"]: f for f in r["fields"]}
    for name in compiled.schema.field_names:
        col = table.column(name)
        f = fields[name]
        assert f["rows"] == 5_000 and f["null_count"] == col.null_count, name
        assert f["distinct_exact"] and f["distinct_count"] == pc.count_distinct(col).as_py(), name
    assert (fields["age"]["min"], fields["age"]["max"]) == (15, 130)
    assert fields["region"]["min"] == HOSTILE  # "<" sorts first
    lo, hi = pc.min_max(table.column("submitted_at")).values()
    assert r["lineage"]["event_time"] == {"field": "submitted_at", "min": lo.as_py().isoformat(),
                                          "max": hi.as_py().isoformat()}
    assert r["lineage"]["files"][0]["uri"] == uri and r["lineage"]["files"][0]["row_groups"] == 3
    assert r["schema"]["fingerprint"] == compiled.fingerprint and r["schema"]["version"] == "3.2.1"

    # The page: verdict, key counts, identity, escaped hostile values.
    assert '<section class="verdict fail" id="verdict"><div class="word">FAIL</div>' in html
    assert f"{expected.rejected_rows:,}" in html and "5,000" in html
    assert compiled.fingerprint in html and uri in html
    assert html.count(ESCAPED) >= 2  # the enum reject examples and the region minimum
    assert_safe_html(html)


def test_clean_parquet_passes(tmp_path: Path) -> None:
    path = tmp_path / "clean.parquet"
    pq.write_table(applicants(2_000, seed=5, invalid_share=0.0), path)
    code, r, html = report(tmp_path / "out", "--parquet", str(path))
    assert code == 0 and r["verdict"] == "PASS" and r["verdict_reasons"] == []
    assert r["counts"]["rejected_rows"] == 0 and r["counts"]["valid_rows"] == 2_000
    assert r["gx"]["success"] and r["gx"]["passed"] == r["gx"]["expectations"]
    assert all(e["gx"] is None or (e["gx"]["success"] and e["agrees"]) for e in r["expectations"])
    assert '<div class="word">PASS</div>' in html
    assert_safe_html(html)


def test_usage_errors_exit_2(tmp_path: Path, dirty: Path, pg_schema: str, settings: Settings,
                             monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    base = ["report", "--schemas-dir", SCHEMAS, "--out", str(out), "--no-progress"]

    def run(*args: str) -> tuple[int, str]:
        try:
            code = main([*base, *args])
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
        return code, capsys.readouterr().err

    code, err = run("--schema", "nope", "--parquet", str(dirty))
    assert code == 2 and "no schema named 'nope'" in err
    code, err = run("--schema", "credit_applicant", "--parquet", str(tmp_path / "missing.parquet"))
    assert code == 2 and "missing.parquet" in err
    assert run("--schema", "credit_applicant")[0] == 2  # no input
    assert run("--schema", "credit_applicant", "--table", "--rejects")[0] == 2
    code, err = run("--schema", "credit_applicant", "--parquet", str(dirty), "--since", "1h")
    assert code == 2 and "--since applies to --rejects only" in err
    assert run("--schema", "credit_applicant", "--rejects", "--since", "yesterday-ish")[0] == 2
    assert run("--schema", "credit_applicant", "--parquet", str(dirty), "--batch-rows", "0")[0] == 2

    monkeypatch.setenv("FEATURES_POSTGRES_DSN", "postgresql://featureline:secret@127.0.0.1:1/featureline")
    for mode in ("--table", "--rejects"):
        code, err = run("--schema", "credit_applicant", mode)
        assert code == 2 and "Postgres unreachable at 127.0.0.1:1/featureline" in err and "secret" not in err
    monkeypatch.setenv("FEATURES_POSTGRES_DSN", _dsn(settings, pg_schema))  # an empty schema
    code, err = run("--schema", "credit_applicant", "--table")
    assert code == 2 and "no table 'credit_applicant'" in err and pg_schema in err
    assert not out.exists()  # nothing written on errors


def _dsn(settings: Settings, pg_schema: str) -> str:
    sep = "&" if "?" in settings.postgres_dsn else "?"
    return f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}"


def test_table_and_rejects_modes(dirty: Path, compiled: CompiledSchema, tmp_path: Path, settings: Settings,
                                 pg_schema: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    summary = load([dirty], compiled, settings, batch_rows=2_000, search_path=pg_schema,
                   key_prefix=redis_prefix)
    expected = validate(pq.read_table(dirty), compiled).counts
    assert summary.rejected == expected.rejected_rows and summary.stored == expected.valid_rows
    monkeypatch.setenv("FEATURES_POSTGRES_DSN", _dsn(settings, pg_schema))

    # The cold table holds only valid rows: the suite passes on it.
    capsys.readouterr()
    code, r, html = report(tmp_path / "table", "--table", "--batch-rows", "3000")
    assert code == 0 and r["verdict"] == "PASS", r["verdict_reasons"]
    assert r["counts"]["input_rows"] == r["counts"]["valid_rows"] == summary.stored
    assert r["gx"]["success"] and r["gx"]["batches"] == 2 and r["disagreements"] == []
    lin = r["lineage"]
    assert lin["table"] == f"{pg_schema}.credit_applicant"
    assert lin["run_ids"]["values"] == {summary.run_id: summary.stored}
    assert lin["origins"]["values"] == {dirty.resolve().as_uri(): summary.stored}
    valid = validate(pq.read_table(dirty), compiled).valid
    lo, hi = pc.min_max(valid.column("submitted_at")).values()
    assert lin["event_time"] == {"field": "submitted_at", "min": lo.as_py().isoformat(),
                                 "max": hi.as_py().isoformat()}
    fields = {f["field"]: f for f in r["fields"]}
    assert fields["application_id"]["distinct_count"] == summary.stored
    assert fields["region"]["min"] == HOSTILE  # stored rows with a hostile region
    assert html.count(ESCAPED) == 1
    assert_safe_html(html)
    # Not a bare PASS: the rows the load refused are counted in the rejects table and said.
    rejects_table = f"{pg_schema}.credit_applicant__rejects"
    assert r["rejects_kept"] == {"table": rejects_table, "rows": summary.rejected,
                                 "command": "features report --schema credit_applicant --rejects --out DIR"}
    assert r["verdict_notes"] == [f"{summary.rejected:,} rows rejected at load are kept in {rejects_table} "
                                  "(not in this table): `features report --schema credit_applicant --rejects "
                                  "--out DIR` reports them"]
    assert 'class="verdict pass noted"' in html and rejects_table in html
    assert f"{summary.rejected:,} rejected rows kept in {rejects_table}" in capsys.readouterr().out
    # The stored derived features' statistics: those of the transform over the stored rows.
    features = {f["name"]: f for f in r["features"]}
    assert set(features) == {"debt_to_income", "score_bucket", "customer_tenure_days"}  # the cold ones
    program_out = compile_transforms(compiled.schema, device="cpu").run(valid).features
    assert program_out.num_rows == summary.stored  # the rows the load stored, in the same order
    for name, stats in features.items():
        column = program_out.column(name)
        values = column.drop_null().to_numpy(zero_copy_only=False).astype(np.float64)
        assert stats["rows"] == summary.stored and stats["null_count"] == column.null_count, name
        assert stats["mean"] == pytest.approx(float(np.mean(values)), rel=1e-9), name
        assert stats["quantiles"]["p50"] == pytest.approx(float(np.quantile(values, 0.5)), rel=1e-9), name
        assert sum(stats["histogram"]["shares"]) == pytest.approx(1.0)
    assert r["aggregations"] is None  # the schema declares none

    # The rejects table, grouped by field and rule: the validator's counts on the file.
    code, r, html = report(tmp_path / "rejects", "--rejects")
    assert code == 1 and r["verdict"] == "FAIL"
    assert r["counts"]["reject_rows"] == expected.rejected_rows
    assert r["counts"]["errors"] == expected.reject_count
    assert r["counts"]["by_rule"] == dict(expected.by_rule)
    groups = {g["rule"]: g for g in r["rejects"]["groups"]}
    assert groups["employment_status.enum"]["field"] == "employment_status"
    assert any(ex["value"] == HOSTILE for ex in groups["employment_status.enum"]["examples"])
    assert all(ex["source"].startswith(dirty.resolve().as_uri() + "#")
               for g in groups.values() for ex in g["examples"])
    assert r["lineage"]["run_ids"]["values"] == {summary.run_id: expected.rejected_rows}
    assert f"{expected.rejected_rows:,}" in html and ESCAPED in html
    assert_safe_html(html)

    # --since filters on _ingested_at.
    code, r, _ = report(tmp_path / "recent", "--rejects", "--since", "1h")
    assert code == 1 and r["counts"]["reject_rows"] == expected.rejected_rows
    code, r, html = report(tmp_path / "future", "--rejects", "--since", "2999-01-01")
    assert code == 0 and r["verdict"] == "PASS" and r["counts"]["reject_rows"] == 0
    assert r["lineage"]["since"] == "2999-01-01T00:00:00+00:00" and '<div class="word">PASS</div>' in html


PROBE = """\
name: probe
version: 1.0.0
fields:
  - {name: code, type: string, constraints: {required: true, pattern: "^[A-Z][0-9]$"}}
  - {name: score, type: float64, constraints: {min: 0.5, max: 10}}
  - {name: n, type: int32, accept_strings: true, constraints: {min: 0}}
"""


def test_floats_nan_inf_and_type_failures(tmp_path: Path) -> None:
    """NaN, +-inf, nulls and text that does not convert: GX and the validator agree."""
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "probe.yaml").write_text(PROBE, encoding="utf-8")
    nan, inf = float("nan"), float("inf")
    table = pa.table({"code": ["A1", "B2", "xx", None, "C3", "D4", "E5"],
                      "score": [1.0, nan, inf, None, 0.1, nan, -inf],
                      "n": ["1", "-2", "x", None, "12.5", "3", "7"]})
    pq.write_table(table, tmp_path / "probe.parquet")
    code = main(["report", "--schema", "probe", "--schemas-dir", str(schemas), "--parquet",
                 str(tmp_path / "probe.parquet"), "--out", str(tmp_path / "out"), "--no-progress"])
    r = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    expected = validate(table, compile_schema(load_schema(schemas / "probe.yaml"))).counts
    assert code == 1
    assert {k: v for k, v in r["counts"]["by_rule"].items() if v} == dict(expected.by_rule)
    assert expected.by_rule["score.type"] == 2 and expected.by_rule["score.nan"] == 2
    assert r["disagreements"] == []
    by_rule = {e["rule"]: e for e in r["expectations"]}
    assert [ex["value"] for ex in by_rule["score.nan"]["gx"]["examples"]] == ["NaN", "NaN"]
    assert [ex["value"] for ex in by_rule["score.type"]["gx"]["examples"]] == ["inf", "-inf"]
    score, n = (next(f for f in r["fields"] if f["field"] == name) for name in ("score", "n"))
    assert (score["null_count"], score["nan_count"], score["type_failures"]) == (1, 2, 2)
    assert (score["min"], score["max"], score["distinct_count"]) == (0.1, 1.0, 2)
    assert (n["null_count"], n["type_failures"], n["min"], n["max"]) == (1, 2, -2, 7)


def test_distinct_counter_switches_to_a_sketch() -> None:
    exact = DistinctCounter()
    exact.add(pa.array(["a", "b", None, "a", ""]))
    assert (exact.count, exact.exact) == (3, True)
    sketch = DistinctCounter(exact_limit=1_000)
    values = pa.array(np.arange(60_000, dtype=np.int64))
    for start in range(0, 60_000, 7_000):  # overlapping batches: repeats must not count
        sketch.add(values.slice(start, 9_000))
    assert not sketch.exact
    assert abs(sketch.count / 60_000 - 1) < 0.04  # HLL p=14: ~0.8% standard error


def test_report_is_a_registered_command() -> None:
    assert "report" in build_parser().format_help()
