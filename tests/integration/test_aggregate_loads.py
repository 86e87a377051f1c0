"""Batch backfills of windowed aggregations do not depend on how the history was cut
into loads or in which order they ran, nor on the order of files and rows.

A random history is split into consecutive time ranges (or into random parts), each
part's rows shuffled and written as Parquet, and the parts loaded with ``features
load`` (``features.load.load``) one after the other in a random order (February
before January included) into real Postgres and Redis. Afterwards:

- ``<schema>__aggregates`` holds exactly the brute-force reference's values
  (``tests/aggregate_reference.py``, independent of the engines) for every event of the
  history, each row with the lineage ``_source`` of its own history row;
- Redis holds, per entity, the reference's hot values of its newest event;
- with ties (several different events of one entity at one instant, and exact copies
  spread over the loads): the history holds every distinct event once.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

import psycopg
import pyarrow.parquet as pq
import pytest
import redis
from aggregate_reference import (
    BASE_US,
    EVENT,
    MINUTE_US,
    SCHEMA,
    T,
    check_hot,
    event_digests,
    history_table,
    one_content_per_key,
    reference,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

import features.aggregate.backfill as backfill_module
from features.compile import compile_schema
from features.config import Settings
from features.load import load
from features.schema import parse_schema

pytestmark = pytest.mark.services

COMPILED = compile_schema(parse_schema(SCHEMA))
AGGS = [a.name for a in COMPILED.schema.aggregations.features]  # type: ignore[union-attr]


@st.composite
def cases(draw: st.DrawFn, ties: bool = False
          ) -> tuple[list[dict[str, Any]], list[list[list[dict[str, Any]]]]]:
    """A history and the loads it is cut into, in the order they run, each load's rows
    shuffled and cut into files given in any order. Without ``ties`` every event of one
    key is an exact copy of the first; with them, events of one key differ (both are
    kept) and some events come again as exact copies."""
    events = draw(st.lists(EVENT, min_size=1, max_size=40))
    if ties:
        events += draw(st.lists(st.sampled_from(events), max_size=10))  # exact copies
    else:
        events = one_content_per_key(events)
    k = draw(st.integers(1, 3))
    if draw(st.booleans()):  # consecutive time ranges: the daily/monthly backfill
        cuts = sorted(draw(st.lists(st.integers(0, 540), min_size=k - 1, max_size=k - 1)))
        bounds = [BASE_US + c * MINUTE_US for c in cuts]
        parts: list[list[dict[str, Any]]] = [[] for _ in range(k)]
        for e in events:
            parts[sum(e[T] >= b for b in bounds)].append(e)
    else:  # any split
        which = draw(st.lists(st.integers(0, k - 1), min_size=len(events), max_size=len(events)))
        parts = [[e for e, w in zip(events, which, strict=True) if w == i] for i in range(k)]
    parts = [draw(st.permutations(p)) for p in parts if p]
    # each load's rows cut into 1-3 files, given to the loader in any order
    loads = []
    for p in draw(st.permutations(parts)):
        cuts = sorted(draw(st.lists(st.integers(1, max(len(p) - 1, 1)), max_size=2)))
        files = [p[a:b] for a, b in itertools.pairwise([0, *cuts, len(p)]) if b > a]
        loads.append(draw(st.permutations(files)))
    return events, loads


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(case=cases())
def test_loads_in_any_order_and_split_give_the_values_of_the_whole_history(
        case: tuple[list[dict[str, Any]], list[list[list[dict[str, Any]]]]], settings: Settings,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    _check_loads(case, settings, tmp_path_factory)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(case=cases(ties=True))
def test_events_at_one_instant_in_any_order_and_split_give_the_values_of_the_whole_history(
        case: tuple[list[dict[str, Any]], list[list[list[dict[str, Any]]]]], settings: Settings,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    _check_loads(case, settings, tmp_path_factory)


def _check_loads(case: tuple[list[dict[str, Any]], list[list[list[dict[str, Any]]]]], settings: Settings,
                 tmp_path_factory: pytest.TempPathFactory) -> None:
    events, loads = case
    tmp = tmp_path_factory.mktemp("loads")
    ns = f"t_loads_{uuid.uuid4().hex[:12]}"
    prefix = f"test:{ns}:"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    r = redis.Redis.from_url(settings.redis_url)
    try:
        for i, files in enumerate(loads):
            paths = []
            for j, rows in enumerate(files):
                paths.append(Path(tmp) / f"load{i}_file{j}.parquet")
                pq.write_table(history_table(rows), paths[-1])
            # small groups of entities: several computed and written one after the other,
            # by two writers
            with mock.patch.object(backfill_module, "WRITE_CHUNK", 1 + sum(map(len, files)) // 3):
                summary = load(paths, COMPILED, settings, search_path=ns, key_prefix=prefix)
            assert summary.adds_up and summary.rejected == 0
            assert summary.aggregations is not None and summary.aggregations["adds_up"]
        want = reference(COMPILED.schema, events)
        cols = sql.SQL(", ").join(sql.Identifier(a) for a in AGGS)
        got_rows = admin.execute(sql.SQL("SELECT uid, ts, {} FROM {}.agg_props__aggregates").format(
            cols, sql.Identifier(ns))).fetchall()
        got = {(u, int(ts.timestamp()) * 1_000_000 + ts.microsecond): tuple(v)
               for u, ts, *v in got_rows}
        assert len(got) == len(got_rows)
        assert got == want
        # lineage: each aggregates row names the history row it belongs to
        stray = admin.execute(sql.SQL(
            "SELECT count(*) FROM {ns}.agg_props__aggregates a LEFT JOIN {ns}.agg_props h "
            "ON h.uid = a.uid AND h.ts = a.ts AND h._source = a._source WHERE h.uid IS NULL").format(
            ns=sql.Identifier(ns))).fetchone()
        assert stray is not None and stray[0] == 0
        # the history: every distinct event once
        history = admin.execute(sql.SQL("SELECT uid, ts, _digest FROM {}.agg_props").format(
            sql.Identifier(ns))).fetchall()
        assert sorted((u, int(ts.timestamp()) * 1_000_000 + ts.microsecond, d) for u, ts, d in history) == \
            sorted({(e["uid"], e[T], d) for e, d in zip(events, event_digests(COMPILED.schema, events),
                                                        strict=True)})
        check_hot(r, prefix, COMPILED.schema, want)  # Redis: each entity's newest event's hot values
    finally:
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        admin.close()
        keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()
