"""The freshness page's pure parts: durations as shown, ``--stream`` specs, the history
indexes in the generated DDL, and the lag arithmetic (no services)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from features.compile import compile_schema
from features.compile.postgres import history_index_names, history_indexes
from features.schema import load_schemas
from features.stream.kafka import GroupLag, PartitionLag
from features.ui.freshness import Freshness, streams_of
from features.ui.pages import age

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("seconds", "shown"), [
    (None, "—"), (0, "0 s"), (59.9, "59 s"), (61, "1 min 01 s"), (3600 * 4 + 300, "4 h 05 min"),
    (86400 * 2 + 3600 * 3 + 5, "2 d 03 h"), (-42, "-42 s"), (7200, "2 h 00 min")])
def test_age_shows_the_two_largest_units(seconds: float | None, shown: str) -> None:
    assert age(seconds) == shown


def test_stream_specs_default_the_group_and_refuse_bad_ones() -> None:
    paths = {"credit_applicant": "/p/schemas/credit_applicant.yaml"}

    def group(path: str, topic: str) -> str:
        return f"g({path},{topic})"

    [a, b] = streams_of(["credit_applicant:apps", "credit_applicant:apps:my:group"], paths, group)
    assert (a.schema, a.topic) == ("credit_applicant", "apps")
    assert a.group == "g(/p/schemas/credit_applicant.yaml,apps)"
    assert (b.topic, b.group) == ("apps", "my:group")
    for bad in ("credit_applicant", ":apps", "credit_applicant:", "nope:apps"):
        with pytest.raises(ValueError, match="--stream"):
            streams_of([bad], paths, group)


def test_the_history_indexes_are_in_the_generated_ddl() -> None:
    schemas = load_schemas(ROOT / "schemas")
    c = compile_schema(schemas["credit_applicant"])
    assert history_index_names(c.schema) == ("credit_applicant__by_event_time",
                                             "credit_applicant__by_ingested_at")
    assert all(statement in c.ddl for statement in history_indexes(c.schema).splitlines())
    assert 'ON "credit_applicant" ("submitted_at")' in c.ddl
    assert (ROOT / "sql" / "credit_applicant.sql").read_text() == c.ddl


def test_lag_is_end_minus_committed_and_stale_is_past_max_staleness() -> None:
    lag = GroupLag("g", "t", "EMPTY", 0,
                   (PartitionLag(0, 10, 4), PartitionLag(1, 5, None), PartitionLag(2, 3, 3)))
    assert [p.lag for p in lag.partitions] == [6, None, 0]
    assert lag.total == 6 and lag.committed
    assert not GroupLag("g", "t", "DEAD", 0, (PartitionLag(0, 10, None),)).committed
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def fresh(newest: dt.datetime | None, limit: int | None) -> Freshness:
        return Freshness("s", now, True, False, newest, None, limit, None, [])

    assert fresh(now - dt.timedelta(hours=3), 7200).stale is True
    assert fresh(now - dt.timedelta(hours=1), 7200).stale is False
    assert fresh(None, 7200).stale is True
    assert fresh(now, None).stale is None
    assert fresh(now - dt.timedelta(seconds=90), None).event_age_s == 90
