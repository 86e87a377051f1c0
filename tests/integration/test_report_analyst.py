"""What an analyst reads in ``features report`` (issue 47, item 4), on retail orders
(``report_pages``): failing expectations first, statistics of the fields and the derived
features, drift that leaves identifiers and excluded fields out and does not flag a
small sample's noise; and the page itself in Debian's Chromium (Selenium), screenshots
kept in the test's tmp_path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from report_pages import LONG_ID, PARTS, orders, screenshot, write_inputs, write_schema

from features.cli import main
from features.compile import compile_schema
from features.kernels import compile_transforms
from features.report.drift import chi2_99, ks_noise
from features.schema import load_schema
from features.validation import validate


def run_report(out: Path, schemas: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["report", "--schema", "shop_orders", "--schemas-dir", str(schemas), *args,
                 "--out", str(out), "--no-progress"])
    return code, json.loads((out / "report.json").read_text(encoding="utf-8"))


def test_failing_first_and_statistics(tmp_path: Path) -> None:
    schemas, data, _ = write_inputs(tmp_path)
    code, r = run_report(tmp_path / "out", schemas, "--parquet", str(data))
    table = pq.read_table(data)
    compiled = compile_schema(load_schema(schemas / "shop_orders.yaml"))
    result = validate(table, compiled)
    assert code == 1 and r["counts"]["rejected_rows"] == result.counts.rejected_rows == 7

    # Failing first, most rows rejected first; then the passing ones in schema order.
    statuses = [e["status"] for e in r["expectations"]]
    failing = [e["rule"] for e in r["expectations"] if e["status"] == "fail"]
    assert statuses == sorted(statuses)
    assert failing == ["quantity.min", "discount_share_of_list_price_before_tax.max", "sales.min"]
    assert [e["validator_rejected_rows"] for e in r["expectations"][:3]] == [3, 2, 2]
    passing = [e["rule"] for e in r["expectations"] if e["status"] == "pass"]
    schema_order = [rule.id for rule in compiled.rules]
    assert passing == [rule for rule in schema_order if rule in passing]

    # Field statistics over every converted value (rejected rows included, as min/max are).
    fields = {f["field"]: f for f in r["fields"]}
    sales = table.column("sales").to_numpy()
    assert fields["sales"]["mean"] == pytest.approx(float(np.mean(sales)), rel=1e-12)
    assert fields["sales"]["quantiles"]["p95"] == pytest.approx(float(np.quantile(sales, 0.95)), rel=1e-12)
    assert fields["sales"]["sampled"] is False
    hist = fields["quantity"]["histogram"]
    assert hist["edges"][0] == 0 and hist["edges"][-1] == 11 and len(hist["shares"]) == 20
    assert sum(hist["shares"]) == pytest.approx(1.0)
    assert fields["city"]["mean"] is None and fields["city"]["quantiles"] is None  # text: no mean

    # The derived feature: computed by the transform over the rows the validator kept.
    program = compile_transforms(compiled.schema, device="cpu")
    expected = program.run(result.valid).features.column("sales_log")
    values = expected.to_numpy()
    (feature,) = r["features"]
    assert feature["name"] == "sales_log" and feature["origin"] == "feature"
    assert feature["rows"] == result.counts.valid_rows == 483
    assert feature["mean"] == pytest.approx(float(np.mean(values)), rel=1e-12)
    assert feature["quantiles"]["p50"] == pytest.approx(float(np.quantile(values, 0.5)), rel=1e-12)
    assert feature["min"] == pytest.approx(float(values.min()))
    assert feature["max"] == pytest.approx(float(values.max()))


def test_drift_skips_identifiers_and_small_sample_noise(tmp_path: Path) -> None:
    schemas, data, reference = write_inputs(tmp_path)
    code, r = run_report(tmp_path / "out", schemas, "--parquet", str(data),
                         "--reference-parquet", str(reference))
    drift = {f["field"]: f for f in r["drift"]["fields"]}
    # city and postal_code: nearly one value per row, identifiers rather than categories.
    data_cities = len(set(pq.read_table(data).column("city").to_pylist()))
    assert drift["city"]["status"] == "skipped"
    assert drift["city"]["reason"] == f"high cardinality: {data_cities} distinct of 490 values (data)"
    assert drift["postal_code"]["status"] == "skipped"
    assert drift["postal_code"]["reason"].startswith("high cardinality: ")
    # An enum keeps its declared categories, however few the rows.
    assert drift["segment"]["kind"] == "categorical" and drift["segment"]["status"] == "ok"
    # sales: the same distribution on both sides; 60 reference values make a PSI above the
    # threshold by chance alone, within the noise, so it is reported and not flagged.
    sales = drift["sales"]
    assert sales["psi"] > r["drift"]["thresholds"]["psi_fail"]
    assert sales["psi_noise"] == pytest.approx((1 / 60 + 1 / 490) * chi2_99(9))
    assert sales["ks_noise"] == pytest.approx(ks_noise(60, 490))
    assert sales["status"] == "ok" and "within the sampling noise of 60 vs 490 values" in sales["note"]
    assert r["drift"]["failed"] == []
    assert r["verdict_reasons"] == ["7 of 490 rows rejected by the validator",
                                    "3 of 15 GX expectations failed"]
    assert code == 1  # the rejected rows, not drift

    # A real shift is still flagged on the same small reference: sales ten times larger.
    shifted = orders(490, 1)
    shifted = shifted.set_column(shifted.schema.get_field_index("sales"), "sales",
                                 pa.array(shifted.column("sales").to_numpy() * 10))
    pq.write_table(shifted, tmp_path / "shifted.parquet")
    code, r = run_report(tmp_path / "shifted", schemas, "--parquet", str(tmp_path / "shifted.parquet"),
                         "--reference-parquet", str(reference))
    assert r["drift"]["failed"] == ["sales"] and code == 1
    # ... unless excluded.
    code, r = run_report(tmp_path / "excluded", schemas, "--parquet", str(tmp_path / "shifted.parquet"),
                         "--reference-parquet", str(reference), "--drift-exclude", "sales")
    assert r["drift"]["failed"] == [] and r["drift"]["excluded"] == ["sales"] and code == 0
    entry = next(f for f in r["drift"]["fields"] if f["field"] == "sales")
    assert entry == {"field": "sales", "type": "float64", "kind": "not compared", "status": "skipped",
                     "reason": "excluded (--drift-exclude)"}


def test_drift_exclude_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schemas, data, reference = write_inputs(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        run_report(tmp_path / "out", schemas, "--parquet", str(data), "--reference-parquet", str(reference),
                   "--drift-exclude", "zip")
    assert exit_info.value.code == 2
    assert "schema 'shop_orders' has no field 'zip'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        run_report(tmp_path / "out", schemas, "--parquet", str(data), "--drift-exclude", "sales")
    assert exit_info.value.code == 2
    assert "--drift-exclude needs --reference-parquet or --reference-table" in capsys.readouterr().err


def test_page_in_chromium(tmp_path: Path) -> None:
    """The page in a real browser: failing expectations above the passing ones (collapsed),
    rule names unbroken inside their words, the long order id whole and inside its cell, the
    derived feature's histogram drawn. Screenshots: ``tmp_path/report*.png``."""
    from report_pages import chromium_driver
    from selenium.webdriver.common.by import By

    schemas, data, reference = write_inputs(tmp_path)
    out = tmp_path / "report"
    run_report(out, schemas, "--parquet", str(data), "--reference-parquet", str(reference))
    page = out / "report.html"
    shots = screenshot(page, tmp_path / "report.png", PARTS)
    assert (tmp_path / "report.png").stat().st_size > 50_000
    assert set(shots) == set(PARTS), "a part of the page is missing"

    drv = chromium_driver()
    try:
        drv.get(page.resolve().as_uri())
        failing = drv.find_element(By.ID, "expectations-failing")
        passing = drv.find_element(By.ID, "passing-expectations")
        assert failing.location["y"] < passing.location["y"]
        rows = failing.find_elements(By.CSS_SELECTOR, "tr[data-rule]")
        failing_rules = [tr.get_attribute("data-rule") for tr in rows]
        assert failing_rules == ["quantity.min", "discount_share_of_list_price_before_tax.max", "sales.min"]
        # passing rows exist but are collapsed: not displayed until the analyst opens them
        assert not passing.find_element(By.CSS_SELECTOR, "tr[data-rule]").is_displayed()

        # Every rule name is laid out in lines that each end at a word boundary (after _ or .).
        for tr in failing.find_elements(By.CSS_SELECTOR, "tr[data-rule]"):
            code = tr.find_element(By.CSS_SELECTOR, "td code")
            lines = drv.execute_script(LINES_JS, code)
            assert "".join(lines) == tr.get_attribute("data-rule")
            assert all(line[-1] in "_." for line in lines[:-1]), lines

        # The long id: its whole text is on the page, and no line of it sticks out of its cell.
        cell = drv.find_elements(By.CSS_SELECTOR, 'tr[data-field="order_id"] td.val')[1]  # max
        assert LONG_ID in cell.text.replace("\n", "")
        inner = cell.find_element(By.CSS_SELECTOR, "span")
        assert drv.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth + 1", cell)
        assert inner.rect["x"] + inner.rect["width"] <= cell.rect["x"] + cell.rect["width"] + 1

        # The derived feature's own histogram: bars drawn.
        bars = drv.find_elements(By.CSS_SELECTOR, 'tr[data-column="sales_log"] svg.spark rect')
        assert len(bars) >= 5
    finally:
        drv.quit()
    print("screenshots:", tmp_path / "report.png", *shots.values())


#: The text of each rendered line of an element (by the y of each character's box).
LINES_JS = """
const walker = document.createTreeWalker(arguments[0], NodeFilter.SHOW_TEXT);
const lines = []; let top = null;
for (let t = walker.nextNode(); t; t = walker.nextNode()) {
  for (let i = 0; i < t.length; i++) {
    const r = document.createRange(); r.setStart(t, i); r.setEnd(t, i + 1);
    const y = Math.round(r.getBoundingClientRect().top);
    if (top === null || Math.abs(y - top) > 2) { lines.push(""); top = y; }
    lines[lines.length - 1] += t.data[i];
  }
}
return lines;
"""


def test_schema_helper_writes_a_loadable_schema(tmp_path: Path) -> None:
    compiled = compile_schema(load_schema(write_schema(tmp_path) / "shop_orders.yaml"))
    assert compiled.schema.entity == "order_id"
    assert [f.name for f in compiled.schema.features] == ["sales_log"]
