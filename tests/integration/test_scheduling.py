"""docs/scheduling.md's nightly pattern as written (issue 47 item 7):
``docs/examples/nightly/load_day.sh`` over two days of folders, run again for the first day
(a re-run stores nothing), for a late file of that day (only its rows), and for a day with no
files yet (exit 0, nothing loaded); every run's JSON summary appended to loads.jsonl and adding
up."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, cli_environment

from features.config import Settings
from features.ops.examples import applicants

pytestmark = pytest.mark.services
SCRIPT = ROOT / "docs" / "examples" / "nightly" / "load_day.sh"
REDIS_DB = 11


@pytest.fixture()
def env(settings: Settings, pg_schema: str) -> Iterator[dict[str, str]]:
    with cli_environment(settings, pg_schema, REDIS_DB) as e:
        yield {**e, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{e['PATH']}"}


def _day(root: Path, day: str, name: str, first_id: int, rows: int = 400) -> None:
    folder = root / "credit_applicant" / f"dt={day}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(applicants(rows, seed=first_id, first_id=first_id), folder / name)


def _run(env: dict[str, str], root: Path, day: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "credit_applicant", str(root), day], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_nightly_script_as_documented(tmp_path: Path, env: dict[str, str]) -> None:
    root = tmp_path / "data"
    _day(root, "2026-12-01", "part-0.parquet", 10**9)
    _day(root, "2026-12-02", "part-0.parquet", 10**9 + 10_000)
    runs = [_run(env, root, "2026-12-01"), _run(env, root, "2026-12-02"), _run(env, root, "2026-12-01")]
    _day(root, "2026-12-01", "part-1-late.parquet", 10**9 + 20_000, rows=100)
    runs += [_run(env, root, "2026-12-01"), _run(env, root, "2026-12-03")]
    assert [r.returncode for r in runs] == [0] * 5, [r.stderr[-2000:] for r in runs]
    assert "no Parquet files in" in runs[4].stderr
    summaries = [json.loads(line) for line in (root / "loads.jsonl").read_text().splitlines()]
    assert len(summaries) == 4  # the empty day appends nothing
    for s in summaries:
        assert s["read"] == s["stored"] + s["rejected"] + s["already_present"], s
    first, second, again, late = summaries
    assert first["read"] == second["read"] == 400 and first["stored"] > 380 and second["stored"] > 380
    assert (again["read"], again["stored"], again["rejected"]) == (400, 0, 0)  # a re-run stores nothing
    assert late["read"] == 500 and late["stored"] + late["rejected"] == 100 and late["stored"] > 90
