"""``report.html`` opened in a real headless Chromium (Debian's package, installed by
``features dev up``): the rendered page shows the verdict and the key counts, and a
screenshot is kept as a test artifact in ``test-artifacts/``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from features.cli import main
from features.examples import applicants

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


def _chromium() -> str:
    binary = shutil.which("chromium")
    if binary is None:
        pytest.fail("chromium is not installed: run `features dev up` (it installs Debian's chromium)")
    return binary


def _browser(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("invalid_share", [0.02, 0.0], ids=["fail", "pass"])
def test_report_renders_verdict_and_counts_in_chromium(tmp_path: Path, invalid_share: float) -> None:
    data = tmp_path / "applicants.parquet"
    pq.write_table(applicants(3_000, seed=5, invalid_share=invalid_share), data)
    out = tmp_path / "report"
    code = main(["report", "--schema", "credit_applicant", "--schemas-dir", str(ROOT / "schemas"),
                 "--parquet", str(data), "--out", str(out), "--no-progress"])
    numbers = json.loads((out / "report.json").read_text())
    assert code == (1 if numbers["verdict"] == "FAIL" else 0)
    assert numbers["verdict"] == ("FAIL" if invalid_share else "PASS")

    page = (out / "report.html").resolve().as_uri()
    dom = _browser("--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = dom.stdout.split("<body", 1)[1]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body.split("<style", 1)[0]
                                      if "<style" in body else body))
    assert numbers["verdict"] in text
    counts = numbers["counts"]
    for n in (counts["input_rows"], counts["valid_rows"], counts["rejected_rows"]):
        assert f"{n:,}" in text, f"{n:,} not on the rendered page"
    for rule, count in counts["by_rule"].items():
        if count:
            assert rule in text and f"{count:,}" in text

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"report-{numbers['verdict'].lower()}.png"
    shot.unlink(missing_ok=True)
    taken = _browser(f"--screenshot={shot}", "--window-size=1280,2000", page)
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.stat().st_size > 10_000  # a rendered page, not an empty image
