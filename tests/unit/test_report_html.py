"""``report.html`` from a hand-built report dict, no services: every value reaches the
page escaped (a hostile string in each place the page shows text), the sections and
charts are drawn, and the template ships as package data."""

from __future__ import annotations

import fnmatch
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import pytest

from features.report.html import category_chart, histogram_chart, num, render_html

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "<script>alert('x')</script>&\"q\""
ESCAPED = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&#34;q&#34;"


def _report(h: str = HOSTILE) -> dict[str, Any]:
    """A data report with drift; ``h`` in every string the page shows (52 places, the
    ``data-rule`` attribute of an expectation's row among them)."""
    example = {"value": f"v{h}", "source": f"file://{h}#3", "row": 3, "message": f"m{h}"}
    return {
        "generated_at": f"2026{h}", "generated_by": f"featureline {h}", "mode": "parquet",
        "schema": {"name": f"s{h}", "version": f"1{h}", "fingerprint": f"f{h}", "unchecked_fields": [h]},
        "lineage": {"files": [{"uri": f"file:///{h}", "rows": 9, "row_groups": 1, "footer_digest": h}],
                    "table": h, "postgres": h, "since": h, "event_time": {"field": h, "min": h, "max": h},
                    "ingested_at": {"min": h, "max": h}, "run_ids": {"values": {h: 1}},
                    "origins": {"values": {h: 2}}, "schema_fingerprints": {"values": {h: 3}},
                    "fields_not_in_table": [h]},
        "verdict": "FAIL", "verdict_reasons": [h], "verdict_notes": [h],
        "counts": {"input_rows": 1_234_567, "valid_rows": 1_234_000, "rejected_rows": 567},
        "gx": {"passed": 1, "expectations": 2},
        "expectations": [
            {"rule": h, "expectation": h, "agrees": False, "validator_rejected_rows": 567, "status": "fail",
             "gx": {"success": False, "unexpected_count": 567, "unexpected_percent": 0.05,
                    "examples": [example]}},
            {"rule": "r.pattern", "gx": None, "not_expressible": h, "validator_rejected_rows": 0,
             "status": "pass"},
        ],
        "disagreements": [h],
        "fields": [{"field": h, "type": h, "rows": 9, "null_count": 0, "nan_count": None,
                    "type_failures": 0, "min": h, "max": h, "distinct_count": 2, "distinct_exact": False,
                    "mean": None, "quantiles": None, "histogram": None},
                   {"field": "n", "type": "int32", "rows": 9, "null_count": 0, "nan_count": None,
                    "type_failures": 0, "min": 1, "max": 3, "distinct_count": 3, "distinct_exact": True,
                    "mean": 2.0, "quantiles": {"p5": 1.1, "p50": 2.0, "p95": 2.9},
                    "histogram": {"edges": [1, 2, 3], "shares": [0.5, 0.5]}}],
        "features": [{"name": h, "type": h, "rows": 9, "null_count": 1, "nan_count": 0, "min": 0.5,
                      "max": 4.5, "mean": 1.25, "quantiles": {"p5": 0.5, "p50": 1.0, "p95": 4.0},
                      "histogram": {"edges": [0.5, 2.5, 4.5], "shares": [0.75, 0.25]}}],
        "aggregations": None,
        "rejects": {"groups": [{"field": h, "rule": h, "reason": h, "count": 567, "examples": [example]}]},
        "drift": {
            "thresholds": {"psi_fail": 0.25, "ks_fail": 0.2, "psi_warn": 0.1}, "epsilon": 1e-4,
            "reference": {"files": [{"uri": h}]}, "reference_rows": 9, "data_rows": 9,
            "sample_size": 100_000, "failed": [h], "warned": [],
            "fields": [
                {"field": h, "kind": "numeric", "status": "fail", "ks": 0.5, "psi": 2.0, "tvd": None,
                 "reference_null_share": 0.0, "data_null_share": 0.5,
                 "histogram": {"reference": [0.5, 0.5], "data": [1.0, 0.0], "edges": [0, 1, 2]}},
                {"field": "status", "kind": "categorical", "status": "ok", "ks": None, "psi": 0.0,
                 "tvd": 0.0, "categories": [{"value": h, "reference_share": 1.0, "data_share": 1.0}]},
                {"field": "skipped", "kind": "numeric", "status": "skipped", "reason": h},
            ]},
    }


def test_every_value_is_escaped() -> None:
    page = render_html(_report())
    assert HOSTILE not in page and "<script" not in page
    # Identifiers carry <wbr> break opportunities (after "/" here), added after escaping.
    assert "&lt;/<wbr>script&gt;" in page
    assert page.replace("<wbr>", "").count(ESCAPED) == 52


def test_sections_and_charts() -> None:
    page = render_html(_report("x"))
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</main></body></html>\n")
    assert '<section class="verdict fail noted" id="verdict"><div class="word">FAIL</div>' in page
    for text in ("1,234,567", "567 (0.05%)", "≈ 2", "0.0% / 50.0%", "see note 1",
                 "Not expressible in GX: x", "Drift against the reference", "Rejects by field and rule"):
        assert text in page, text
    assert page.count('aria-label="histogram: reference vs data"') == 1
    assert page.count('aria-label="category shares: reference vs data"') == 1
    assert page.count('<i class="bar"') == 2  # one category's pair
    # the drift histogram's non-empty bars, and two bars of each column's own histogram
    assert page.count("<rect ") == 3 + 2 + 2
    assert "1.10 / 2.00 / 2.90" in page and "0.50 / 1.00 / 4.00" in page and "Derived features" in page
    failing, passing = page.index('id="expectations-failing"'), page.index('id="expectations-passing"')
    assert failing < page.index('data-rule="x"') < passing < page.index('data-rule="r.pattern"')


def test_rejects_mode_and_empty_tables() -> None:
    r = _report("x") | {"mode": "rejects", "verdict": "PASS", "verdict_reasons": [], "drift": None,
                        "counts": {"reject_rows": 0, "errors": 0}, "rejects": {"groups": []}}
    page = render_html(r)
    assert '<div class="word">PASS</div>' in page and "<li>every check passed</li>" in page
    assert "Rejects by field and rule (rejects table)" in page and "<h2>Expectations</h2>" not in page
    assert '<td colspan="5" class="muted">none</td>' in page


def test_a_missing_key_is_an_error_not_a_blank() -> None:
    r = _report()
    del r["fields"][0]["null_count"]
    with pytest.raises(jinja2.UndefinedError, match="null_count"):
        render_html(r)


def test_numbers_and_chart_geometry() -> None:
    assert [num(v) for v in (None, True, 1234, 0.005, 1234.5, "a")] == ["—", "yes", "1,234", "0.005",
                                                                         "1,234.50", "a"]
    assert histogram_chart({"reference": [1.0], "data": [1.0], "edges": [0]}) is None
    chart = histogram_chart({"reference": [0.25, 0.75], "data": [0.75, 0.0], "edges": [0, 1, 2]})
    assert chart is not None
    assert [(b["series"], b["x"], b["height"]) for b in chart["bars"]] == [
        ("reference", "0.0", "22.0"), ("reference", "130.0", "66.0"), ("data", "0.0", "66.0")]
    assert category_chart([]) is None
    long_id = "ORD-" + "x" * 120
    cats = category_chart([{"value": long_id, "reference_share": 0.5, "data_share": 0.25}])
    assert cats is not None and cats[0]["label"] == long_id  # whole: the page wraps it, never cuts it
    assert [b["percent"] for b in cats[0]["bars"]] == ["100.0", "50.0"]


def test_templates_ship_as_package_data() -> None:
    """Every file under templates/ matches the package-data globs, so a wheel carries it."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    folder = resources.files("features.report") / "templates"
    names = sorted(f"templates/{p.name}" for p in folder.iterdir() if p.is_file())
    assert "templates/report.html.j2" in names
    for name in names:
        assert any(fnmatch.fnmatch(name, g) for g in globs["features.report"]), name
