"""``features validate`` and the report count exact copies apart from distinct events at one instant
(issue 48): ``valid = events + exact copies``, across files, as a load would store them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tie_files import tie_files as _files

from features.cli import main as cli_main
from features.ops.examples import applicants

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_validate_counts_exact_copies_and_tied_events_across_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = _files(tmp_path)
    # a.parquet: 125 rows; b.parquet: 80 + 6 + 5 + 1 + 3 = 95; other.slice(0, 1) is in both
    code = cli_main(["validate", "--json", "--schema", "credit_applicant", "--schemas-dir", str(SCHEMAS),
                     str(first), str(second)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert (doc["input_rows"], doc["valid_rows"], doc["rejected_rows"]) == (220, 217, 3)
    # copies: 10 of base rows, 1 of other[0] (both files), 1 of other[3]
    assert doc["exact_copies"] == 12
    assert doc["events"] == 205 == doc["valid_rows"] - doc["exact_copies"]
    assert (doc["tied_events"], doc["tied_instants"]) == (10, 5)


def test_validate_prints_the_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = _files(tmp_path)
    cli_main(["validate", "--schema", "credit_applicant", "--schemas-dir", str(SCHEMAS),
              str(first), str(second)])
    out = capsys.readouterr().out
    assert "2 files, 220 rows: 217 valid, 3 rejected" in out
    assert ("valid rows as stored: 205 events + 12 exact copies (same entity, event time and content: "
            "stored once); 10 distinct events share an entity and event time with another (5 instants: "
            "all stored, the greatest digest the newest)") in out


def test_no_ties_no_copies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "clean.parquet"
    pq.write_table(applicants(50, seed=4, invalid_share=0.0), path)
    assert cli_main(["validate", "--json", "--schema", "credit_applicant", "--schemas-dir", str(SCHEMAS),
                     str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["events"], doc["exact_copies"], doc["tied_events"], doc["tied_instants"]) == (50, 0, 0, 0)


def test_the_report_counts_them_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = _files(tmp_path)
    out = tmp_path / "out"
    cli_main(["report", "--schema", "credit_applicant", "--schemas-dir", str(SCHEMAS),
              "--parquet", str(first), str(second), "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    counts = json.loads((out / "report.json").read_text(encoding="utf-8"))["counts"]
    assert (counts["input_rows"], counts["valid_rows"], counts["rejected_rows"]) == (220, 217, 3)
    assert (counts["events"], counts["exact_copies"], counts["tied_events"], counts["tied_instants"]) == (
        205, 12, 10, 5)
    assert "12 exact copies, 10 distinct events at 5 shared instants" in printed
    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="card-exact-copies"' in html and 'id="card-tied-events"' in html
