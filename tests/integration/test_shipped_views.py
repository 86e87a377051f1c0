"""Every shipped view (``views/``) read as a user reads it after ``make demo``'s data: the
demo's applicants loaded by the batch loader (``features demo``'s own files), plus a click
history, then ``application_scoring`` online (``online_view_dicts``, ``online_view``), in a
training set (``historical_view``) and over HTTP (a real ``features serve --no-ingest``).
The view's ``credit_applicant`` source has a feature stored in Postgres only
(``credit_score``): each path must read it, and online at a frozen clock must equal
historical at that clock. (``docs/examples/fraud``'s view: ``test_views*.py``.)"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import ROOT
from test_serve import TOKENS, serve
from test_views_http import _db_url, _env

from features import FeatureStore
from features.compile import compile_schema
from features.config import Settings
from features.load import load
from features.ops.demo import generate_files
from features.ops.examples import click_history
from features.schema import load_schemas
from features.serve.app import _json_value

pytestmark = [pytest.mark.services, pytest.mark.scratch_redis_db(5)]
VIEW = "application_scoring"
#: the Redis database these tests own (the server reads without a key prefix)
DB = 5
#: the frozen clock: after the last click and the demo's applications of late 2023
AT = dt.datetime(2023, 12, 31, 12, tzinfo=dt.UTC)
AUTH = {"Authorization": f"Bearer {TOKENS[0]}", "Content-Type": "application/json"}


@pytest.fixture()
def demo_stores(tmp_path: Path, settings: Settings, pg_schema: str) -> Iterator[tuple[Settings, pa.Table]]:
    """The demo's 3,000 applicants (two files, ~2% invalid) and 3,000 clicks loaded into the
    test's Postgres schema and Redis database DB; yields the settings and the applicants."""
    import redis

    on_db = dataclasses.replace(settings, redis_url=_db_url(settings.redis_url, DB))
    client = redis.Redis.from_url(on_db.redis_url)
    client.flushdb()
    schemas = load_schemas(ROOT / "schemas")
    paths = generate_files(tmp_path / "demo", 3000, 2)
    summary = load(paths, compile_schema(schemas["credit_applicant"]), on_db, search_path=pg_schema)
    assert summary.adds_up and summary.stored > 2800, summary
    clicks = tmp_path / "clicks.parquet"
    history = click_history(3000, users=200)  # 2026-01-01 .. 01-10: moved to end before AT
    shift = pa.scalar(dt.datetime(2026, 1, 1, tzinfo=dt.UTC) - (AT - dt.timedelta(days=10)))
    moved = pc.subtract(history["event_time"], shift)
    at_column = history.schema.get_field_index("event_time")
    pq.write_table(history.set_column(at_column, "event_time", moved), clicks)
    assert load([clicks], compile_schema(schemas["clicks"]), on_db, search_path=pg_schema).adds_up
    yield on_db, pa.concat_tables([pq.read_table(p) for p in paths])
    client.flushdb()
    client.close()


def _requests(applicants: pa.Table, at: dt.datetime, n: int = 40) -> list[dict[str, Any]]:
    """Request rows for applications submitted in the 30 days before ``at`` (the view's
    max_age), with a credit score, for users who clicked (and some who did not)."""
    us = pa.timestamp("us", "UTC")
    submitted = applicants["submitted_at"]
    recent = applicants.filter(pc.and_(pc.greater(submitted, pa.scalar(at - dt.timedelta(days=29), us)),
                                       pc.less_equal(submitted, pa.scalar(at, us))))
    recent = recent.filter(pc.is_valid(recent["credit_score"]))
    ids = [i for i in recent["application_id"].to_pylist() if i and i.startswith("APP-")][:n]
    assert len(ids) >= 10, len(ids)
    return [{"application_id": a, "user_id": f"u{i % 250}", "offered_amount": Decimal(1000 + i).scaleb(-1),
             "request_time": at} for i, a in enumerate(ids)]


def _store(settings: Settings, pg_schema: str, **kw: Any) -> FeatureStore:
    return FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                        schemas=ROOT / "schemas", views=ROOT / "views", search_path=pg_schema, fill=False,
                        **kw)


def test_the_shipped_view_online_historical_and_http_after_the_demo(
        tmp_path: Path, demo_stores: tuple[Settings, pa.Table], pg_schema: str) -> None:
    settings, applicants = demo_stores
    at = AT
    rows = _requests(applicants, at)
    with _store(settings, pg_schema, clock=lambda: at.timestamp()) as fs:
        online = fs.online_view_dicts(VIEW, rows)
        table = fs.online_view(VIEW, rows)
        frame = pa.Table.from_pylist([{**r, "timestamp": at} for r in rows])
        hist = fs.historical_view(VIEW, frame).to_pylist()
    assert table.to_pylist() == online
    # the cold-only feature is read, and is the loaded row's value
    score_of = dict(zip(applicants["application_id"].to_pylist(), applicants["credit_score"].to_pylist(),
                        strict=True))
    assert [r["credit_score"] for r in online] == [score_of[r["application_id"]] for r in rows]
    assert all(r["credit_applicant._found"] for r in online)
    # online at the frozen clock equals historical at it, column for column
    for o, h in zip(online, hist, strict=True):
        for column, value in o.items():
            if column.endswith("._from"):
                continue  # where online found it (redis / postgres): not a historical column
            assert h[column] == value, (column, o, h)
    # over HTTP: the SDK's rows as JSON (the server's clock is the real one: max_age drops the
    # 2023 applications, so compare with an SDK store on the real clock)
    with serve(tmp_path, _env(settings, pg_schema), "--schemas", str(ROOT / "schemas"), "--views",
               str(ROOT / "views"), "--no-ingest") as server:
        # decimals as JSON numbers (docs/views.md), times in ISO 8601
        sent = [{**r, "offered_amount": float(r["offered_amount"]),
                 "request_time": r["request_time"].isoformat()} for r in rows]
        body = json.dumps({"rows": sent}).encode()
        status, _, answer = server.request("POST", f"/v1/views/{VIEW}/online", body, AUTH)
    assert status == 200, answer
    with _store(settings, pg_schema) as fs:
        now = fs.online_view_dicts(VIEW, rows)
    want = json.loads(json.dumps(now, default=_json_value))
    for got, expect in zip(answer["rows"], want, strict=True):
        got.pop("hours_since_submitted"), expect.pop("hours_since_submitted")  # request_time given: equal
        assert got == expect
