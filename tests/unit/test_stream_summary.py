"""The run's summary that ``features stream`` prints: the subtasks' files added up."""
from __future__ import annotations

import json
from pathlib import Path

from features.flink.stream import merged_summary
from features.stream.summary import render


def _part(folder: Path, name: str, **values: object) -> None:
    base = {"read": 0, "stored": 0, "rejected": 0, "already_present": 0, "batches": 0, "dead_letters": 0}
    (folder / f"{name}.json").write_text(json.dumps({**base, **values}))


def test_lag_is_each_subtasks_last_measure_and_none_when_never_measured(tmp_path: Path) -> None:
    _part(tmp_path, "run-a", read=10, stored=9, rejected=1, batches=2, lag={"t/0": 3, "t/1": 0})
    _part(tmp_path, "run-b", read=5, stored=5, batches=1, lag={"t/2": 4})
    _part(tmp_path, "run-c", read=0)  # a subtask with no partition: never measured
    _part(tmp_path, "other-a", read=7, stored=7, lag={"t/0": 100})  # another run's file
    s = merged_summary(tmp_path, "run")
    assert (s["subtasks"], s["read"], s["adds_up"]) == (3, 15, True)
    assert s["lag"] == {"t/0": 3, "t/1": 0, "t/2": 4} and s["lag_total"] == 7
    assert "consumer lag 7 record(s) behind" in render(s, "clicks")

    (tmp_path / "none").mkdir()
    _part(tmp_path / "none", "run-a", read=1, stored=1)
    unmeasured = merged_summary(tmp_path / "none", "run")
    assert unmeasured["lag"] == {} and unmeasured["lag_total"] is None
    assert "consumer lag not measured" in render(unmeasured, "clicks")


def test_no_subtask_file_does_not_add_up(tmp_path: Path) -> None:
    s = merged_summary(tmp_path, "run")
    assert s["subtasks"] == 0 and not s["adds_up"] and s["lag_total"] is None
