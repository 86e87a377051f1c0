"""``features report`` drift against a reference (``--reference-parquet`` / ``--reference-table``):
KS and PSI of numeric fields, PSI and total variation distance of categorical fields, checked
against brute-force implementations on real Parquet files; thresholds, verdict and exit code;
the page's inline SVG charts."""

from __future__ import annotations

import json
import math
from bisect import bisect_left, bisect_right
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.cli import main
from features.ops.examples import applicant_schema, applicants

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = str(ROOT / "schemas")
NUMERIC = ("income_monthly", "employment_duration_months", "age", "existing_debt", "credit_score",
           "requested_amount")
CATEGORICAL = ("employment_status", "region")


def _set(table: pa.Table, name: str, values: list[Any]) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, pa.array(values, table.schema.field(name).type))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = applicants(3_000, seed=21, invalid_share=0.0)
    d = tmp_path_factory.mktemp("drift")
    out = {"ref": d / "ref.parquet", "same": d / "same.parquet", "income3": d / "income3.parquet",
           "mix": d / "mix.parquet"}
    pq.write_table(base, out["ref"], row_group_size=1_000)
    pq.write_table(base, out["same"], row_group_size=700)  # same rows, other batches
    income = [None if v is None else v * 3 for v in base.column("income_monthly").to_pylist()]
    pq.write_table(_set(base, "income_monthly", income), out["income3"])
    rng = np.random.default_rng(5)  # 80% employed instead of ~20%
    status = base.column("employment_status").to_pylist()
    mixed = ["employed" if v is not None and rng.random() < 0.8 else v for v in status]
    pq.write_table(_set(base, "employment_status", mixed), out["mix"])
    return out


def report(out: Path, data: Path, ref: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    code = main(["report", "--schema", "credit_applicant", "--schemas-dir", SCHEMAS, "--parquet", str(data),
                 "--reference-parquet", str(ref), *args, "--out", str(out), "--no-progress"])
    return (code, json.loads((out / "report.json").read_text(encoding="utf-8")),
            (out / "report.html").read_text(encoding="utf-8"))


def by_field(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["field"]: f for f in r["drift"]["fields"]}


def assert_self_contained(html: str) -> None:
    low = html.lower()
    assert "<script" not in low and "src=" not in low and "<link" not in low and "@import" not in low
    assert "http://" not in low and "https://" not in low and "url(" not in low


# --------------------------------------------------------------------------- brute force


def ks_brute(a: list[Any], b: list[Any]) -> float:
    """max |F_a(x) - F_b(x)| over every sample value x, by sort + bisect (no numpy/scipy)."""
    a, b = sorted(a), sorted(b)
    return max(abs(bisect_right(a, x) / len(a) - bisect_right(b, x) / len(b)) for x in a + b)


def psi_brute(p: list[float], q: list[float], eps: float) -> float:
    pairs = [(max(x, eps), max(y, eps)) for x, y in zip(p, q, strict=True)]
    return sum((y - x) * math.log(y / x) for x, y in pairs)


def present(table: pa.Table, name: str) -> list[Any]:
    return [v for v in table.column(name).to_pylist() if v is not None]


# --------------------------------------------------------------------------- tests


def test_identical_data_has_no_drift(files: dict[str, Path], tmp_path: Path) -> None:
    code, r, html = report(tmp_path / "a", files["same"], files["ref"])
    assert code == 0 and r["verdict"] == "PASS" and r["verdict_reasons"] == []
    d = r["drift"]
    assert d["failed"] == [] and d["warned"] == []
    assert d["thresholds"] == {"psi_warn": 0.1, "psi_fail": 0.25, "ks_fail": 0.2}
    assert d["reference_rows"] == d["data_rows"] == 3_000
    fields = by_field(r)
    for name in NUMERIC:
        f = fields[name]
        assert f["status"] == "ok" and f["ks"] == 0.0 and abs(f["psi"]) < 1e-12 and not f["sampled"], name
        assert f["histogram"]["reference"] == f["histogram"]["data"]
    for name in CATEGORICAL:
        f = fields[name]
        assert f["status"] == "ok" and f["tvd"] == 0.0 and abs(f["psi"]) < 1e-12, name
    assert fields["application_id"]["status"] == "skipped"  # the entity key
    assert fields["submitted_at"]["status"] == "skipped"  # times are not compared

    # Sampled (bottom-k, same seeds on both sides): identical inputs keep identical samples.
    code, r, _ = report(tmp_path / "b", files["same"], files["ref"], "--drift-sample", "500")
    assert code == 0
    for name in NUMERIC:
        f = by_field(r)[name]
        assert f["sampled"] and f["reference_sample"] == f["data_sample"] == 500 and f["ks"] == 0.0, name
    assert_self_contained(html)


def test_shifted_numeric_field_fails(files: dict[str, Path], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, r, html = report(tmp_path, files["income3"], files["ref"])
    assert code == 1 and r["verdict"] == "FAIL"
    assert r["counts"]["rejected_rows"] == 0 and r["gx"]["success"]  # only drift fails
    d = r["drift"]
    assert d["failed"] == ["income_monthly"]
    f = by_field(r)["income_monthly"]
    assert f["status"] == "fail" and f["psi"] > 0.25 and f["ks"] > 0.2
    assert f["data_mean"] == pytest.approx(3 * f["reference_mean"])
    assert any("income_monthly" in reason and "PSI" in reason and "KS" in reason
               for reason in r["verdict_reasons"])
    assert "income_monthly" in capsys.readouterr().out
    for name in NUMERIC[1:]:
        assert by_field(r)[name]["ks"] == 0.0
    # The page: one histogram per compared numeric field, paired bars per categorical field.
    assert html.count('aria-label="histogram: reference vs data"') == len(NUMERIC)
    assert html.count('aria-label="category shares: reference vs data"') == len(CATEGORICAL)
    assert "Drift against the reference" in html and "income_monthly (PSI" in html
    assert_self_contained(html)


def test_changed_category_mix_is_detected(files: dict[str, Path], tmp_path: Path) -> None:
    code, r, html = report(tmp_path, files["mix"], files["ref"])
    assert code == 1 and r["drift"]["failed"] == ["employment_status"]
    f = by_field(r)["employment_status"]
    ref, data = pq.read_table(files["ref"]), pq.read_table(files["mix"])
    rc, dc = Counter(present(ref, "employment_status")), Counter(present(data, "employment_status"))
    cats = sorted(set(rc) | set(dc))
    p = [rc[c] / sum(rc.values()) for c in cats]
    q = [dc[c] / sum(dc.values()) for c in cats]
    assert f["tvd"] == pytest.approx(0.5 * sum(abs(x - y) for x, y in zip(p, q, strict=True)))
    assert f["psi"] == pytest.approx(psi_brute(p, q, r["drift"]["epsilon"]))
    assert f["tvd"] > 0.4 and f["psi"] > 0.25 and f["status"] == "fail"
    assert f["categories_count"] == len(cats)
    listed = {c["value"]: c for c in f["categories"]}
    assert listed["employed"]["reference_count"] == rc["employed"]
    assert listed["employed"]["data_count"] == dc["employed"]
    assert listed["employed"]["data_share"] > 0.75 > 0.3 > listed["employed"]["reference_share"]
    assert by_field(r)["region"]["tvd"] == 0.0
    assert_self_contained(html)


def test_ks_and_psi_equal_brute_force(tmp_path: Path) -> None:
    """Different small data sets, no sampling: KS exactly the brute force; PSI's bins as reported."""
    ref_t = applicants(900, seed=1, invalid_share=0.0)
    data_t = applicants(650, seed=2, invalid_share=0.0)
    ages = [int(v * 1.1) if v is not None else None for v in data_t.column("age").to_pylist()]
    data_t = _set(data_t, "age", ages)
    pq.write_table(ref_t, tmp_path / "ref.parquet", row_group_size=200)
    pq.write_table(data_t, tmp_path / "data.parquet", row_group_size=300)
    code, r, _ = report(tmp_path / "out", tmp_path / "data.parquet", tmp_path / "ref.parquet",
                        "--batch-rows", "128")
    fields = by_field(r)
    for name in NUMERIC:
        f = fields[name]
        a, b = present(ref_t, name), present(data_t, name)
        assert not f["sampled"] and f["reference_values"] == len(a) and f["data_values"] == len(b)
        assert f["ks"] == ks_brute(a, b), name  # exact: same counts, same divisions
        # PSI over the reported (right-closed) decile edges, recounted here.
        edges = [Decimal(repr(e)) if isinstance(a[0], Decimal) else e for e in f["psi_bins"]["edges"]]
        assert len(edges) <= 9 and edges == sorted(edges)
        p = np.bincount([bisect_left(edges, x) for x in a], minlength=len(edges) + 1) / len(a)
        q = np.bincount([bisect_left(edges, x) for x in b], minlength=len(edges) + 1) / len(b)
        assert f["psi_bins"]["reference"] == pytest.approx(list(p)), name
        assert f["psi_bins"]["data"] == pytest.approx(list(q)), name
        assert f["psi"] == pytest.approx(psi_brute(list(p), list(q), 1e-4)), name
        assert f["reference_null_share"] == pytest.approx(1 - len(a) / 900)
    assert fields["age"]["ks"] > 0.05
    expected_fail = [n for n in NUMERIC if fields[n]["psi"] > 0.25 or fields[n]["ks"] > 0.2]
    assert r["drift"]["failed"] == expected_fail and (code == 1) == bool(expected_fail)


def test_sampled_ks_is_close(tmp_path: Path) -> None:
    from features.report.drift import Side, ks_statistic

    compiled = applicant_schema()
    ref_t = applicants(20_000, seed=3, invalid_share=0.0)
    data_t = applicants(20_000, seed=4, invalid_share=0.0)
    sides = []
    for t in (ref_t, data_t):
        side = Side(compiled, sample_size=5_000)
        field = next(f for f in compiled.schema.fields if f.name == "credit_score")
        for batch in t.select(["credit_score"]).to_batches(max_chunksize=3_000):
            side.add_values(field, batch.column(0), batch.num_rows)
        sides.append(side)
    a, b = (np.array(present(t, "credit_score"), dtype=np.float64) for t in (ref_t, data_t))
    exact = ks_statistic(a, b)
    sampled = ks_statistic(sides[0].samples["credit_score"].values, sides[1].samples["credit_score"].values)
    assert sides[0].samples["credit_score"].sampled and len(sides[0].samples["credit_score"].values) == 5_000
    assert abs(sampled - exact) < 1.36 * math.sqrt(2 / 5_000) * 1.5  # within the documented error


def test_threshold_flags(files: dict[str, Path], tmp_path: Path) -> None:
    code, r, _ = report(tmp_path / "a", files["income3"], files["ref"], "--psi-threshold", "100",
                        "--ks-threshold", "1")
    f = by_field(r)["income_monthly"]
    assert code == 0 and r["verdict"] == "PASS" and f["status"] == "warn"
    assert r["drift"]["thresholds"] == {"psi_warn": 0.1, "psi_fail": 100.0, "ks_fail": 1.0}
    assert r["drift"]["warned"] == ["income_monthly"] and r["drift"]["failed"] == []
    code, r, _ = report(tmp_path / "b", files["income3"], files["ref"], "--psi-threshold", "100",
                        "--psi-warn", "100", "--ks-threshold", "1")
    assert code == 0 and by_field(r)["income_monthly"]["status"] == "ok"
    # KS alone fails a field (PSI threshold out of reach).
    code, r, _ = report(tmp_path / "c", files["income3"], files["ref"], "--psi-threshold", "100")
    assert code == 1 and by_field(r)["income_monthly"]["reasons"][0].startswith("KS ")
    # A stricter PSI threshold catches a small category shift the default lets pass.
    small = tmp_path / "small.parquet"
    base = pq.read_table(files["ref"])
    status = base.column("employment_status").to_pylist()
    pq.write_table(_set(base, "employment_status",
                        ["employed" if v == "student" and i % 4 == 0 else v
                         for i, v in enumerate(status)]), small)
    code, r, _ = report(tmp_path / "d", small, files["ref"])
    psi = by_field(r)["employment_status"]["psi"]
    assert code == 0 and 0 < psi < 0.1
    code, r, _ = report(tmp_path / "e", small, files["ref"], "--psi-threshold", f"{psi / 2}",
                        "--psi-warn", "0")
    assert code == 1 and r["drift"]["failed"] == ["employment_status"]


def test_drift_usage_errors(files: dict[str, Path], tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"

    def run(*args: str) -> tuple[int, str]:
        try:
            code = main(["report", "--schema", "credit_applicant", "--schemas-dir", SCHEMAS,
                         "--out", str(out), "--no-progress", *args])
        except SystemExit as exc:
            code = int(exc.code or 0)
        return code, capsys.readouterr().err

    ref = str(files["ref"])
    assert run("--rejects", "--reference-parquet", ref)[0] == 2
    code, err = run("--parquet", ref, "--reference-parquet", str(tmp_path / "missing.parquet"))
    assert code == 2 and "missing.parquet" in err
    assert run("--parquet", ref, "--reference-parquet", ref, "--reference-table")[0] == 2
    assert run("--parquet", ref, "--reference-parquet", ref, "--psi-threshold", "-1")[0] == 2
    assert run("--parquet", ref, "--reference-parquet", ref, "--psi-warn", "0.5",
               "--psi-threshold", "0.2")[0] == 2
    assert run("--parquet", ref, "--reference-parquet", ref, "--drift-sample", "1")[0] == 2
    assert not out.exists()


@pytest.mark.services
def test_reference_table(files: dict[str, Path], tmp_path: Path, settings: Any, pg_schema: str,
                         redis_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from features.load import load

    compiled = applicant_schema()
    summary = load([files["ref"]], compiled, settings, batch_rows=2_000, search_path=pg_schema,
                   key_prefix=redis_prefix)
    assert summary.stored == 3_000
    sep = "&" if "?" in settings.postgres_dsn else "?"
    monkeypatch.setenv("FEATURES_POSTGRES_DSN",
                       f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}")
    code = main(["report", "--schema", "credit_applicant", "--schemas-dir", SCHEMAS, "--parquet",
                 str(files["income3"]), "--reference-table", "--out", str(tmp_path), "--no-progress"])
    r = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert code == 1 and r["drift"]["failed"] == ["income_monthly"]
    assert r["drift"]["reference"]["table"] == f"{pg_schema}.credit_applicant"
    fields = by_field(r)
    assert fields["employment_status"]["status"] == "ok" and fields["employment_status"]["tvd"] == 0.0
    # The table holds the reference file's rows: every other field is unchanged, except that the
    # loader stored employment_duration_months' nulls as its default 0 (a real, small difference).
    for name in NUMERIC[2:]:
        assert fields[name]["status"] == "ok" and fields[name]["ks"] == 0.0, name
        assert fields[name]["reference_values"] == fields[name]["data_values"], name
    duration = fields["employment_duration_months"]
    assert duration["reference_null_share"] == 0.0 < duration["data_null_share"]
    assert 0 < duration["ks"] < 0.2 and duration["status"] != "fail"
