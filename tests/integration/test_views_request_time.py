"""Views with ``windows="request_time"`` (docs/views.md, "Windows at request time")
against the real Redis and Postgres the loader filled: the worked example's view
(``docs/examples/fraud``: ``card_txn``'s 24-hour count and amount sum, stored hot and
cold), its history shuffled and cut into two loads per schema (``test_views``'s
generator), loaded once for the module.

- ``online_view(rows, windows="request_time", at=T)`` equals ``historical_view`` at T
  with ``windows="request_time"`` and a brute-force scan of the generated transactions
  over ``(T - 24h, T]``, at instants after every event (a quiet card's count falls to
  0), exactly on a transaction, 1 µs before one, and inside the histories (Redis holds
  newer rows: re-read as ``historical`` at T); the dicts, async and small-call paths
  give the same rows; a frozen clock without ``at`` is the instant;
- bad ``windows``/``at`` values are ConfigErrors;
- the same through ``online``, ``online_dicts`` and ``online_async`` of the schema;
- request time is the default: without ``windows=`` every read (``online``, ``online_dicts``,
  ``online_async``, ``online_view``, ``historical``, ``historical_view``) evaluates the
  windows at the store's clock (online) or the row's time, a quiet card decays to 0, and
  the default ``online`` at T equals the default ``historical`` at T.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg
import pyarrow as pa
import pytest
import redis
from psycopg import sql
from test_views import (
    DAY_US,
    EXAMPLE,
    FETCHED,
    SOURCES,
    T0,
    VIEW,
    History,
    generate,
    load_history,
    make_store,
    requests,
)

from features.config import Settings
from features.errors import ConfigError

pytestmark = pytest.mark.services
WINDOWED = ["card_txn_count_24h", "card_amount_sum_24h"]


@dataclasses.dataclass
class Loaded:
    h: History
    pg_schema: str
    prefix: str


@pytest.fixture(scope="module")
def loaded(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    """The example's three schemas loaded once (seed 11) into a Postgres schema and a
    Redis key prefix of this module's own, dropped after it."""
    name = f"t_views_rt_{uuid.uuid4().hex[:10]}"
    prefix = f"test:{name}:"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    h = generate(11)
    try:
        load_history(tmp_path_factory.mktemp("views_rt"), h, settings, name, prefix, 11)
        yield Loaded(h, name, prefix)
    finally:
        client = redis.Redis.from_url(settings.redis_url)
        keys = list(client.scan_iter(match=f"{prefix}*", count=10_000))
        if keys:
            client.delete(*keys)
        client.close()
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
        admin.close()


def reference(h: History, cards: list[str], at: dt.datetime) -> tuple[list[int], list[Decimal]]:
    """Each card's transactions in ``(at - 24h, at]``: their count and amount sum (a scan
    of the generated rows, independent of the engine)."""
    t = pd.Timestamp(at)
    window = h.txn[(h.txn.ts > t - pd.Timedelta(microseconds=DAY_US)) & (h.txn.ts <= t)]
    counts = window.groupby("card_id").size()
    sums = window.groupby("card_id")["amount"].apply(lambda a: sum(a, Decimal("0.00")))
    return ([int(counts.get(c, 0)) for c in cards], [sums.get(c, Decimal("0.00")) for c in cards])


def frame_at(rows: list[dict[str, Any]], at: dt.datetime) -> pa.Table:
    return pa.Table.from_pylist([{**r, "timestamp": at} for r in rows],
                                schema=pa.schema([("card_id", pa.string()), ("merchant_id", pa.int64()),
                                                  ("amount", pa.decimal128(12, 2)),
                                                  ("timestamp", pa.timestamp("us", "UTC"))]))


def without_age(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows less ``_age_seconds`` (measured against the wall clock at each call)."""
    return [{k: v for k, v in r.items() if k != "_age_seconds"} for r in rows]


def instants(h: History) -> list[dt.datetime]:
    """After every event (some windows full, most empty), exactly on a transaction and
    1 µs before it, inside the histories (Redis holds newer rows)."""
    busiest = h.txn.groupby("card_id").size().idxmax()
    on = h.txn[h.txn.card_id == busiest].ts.sort_values().iloc[-2].to_pydatetime()
    last = h.txn.ts.max().to_pydatetime()
    return [last + dt.timedelta(hours=3), T0 + dt.timedelta(days=2), on, on - dt.timedelta(microseconds=1),
            T0 - dt.timedelta(days=5, hours=7)]


def test_online_view_at_request_time_equals_historical_view_and_the_reference(
        loaded: Loaded, settings: Settings) -> None:
    h = loaded.h
    rows = requests(h, 11)
    busiest = h.txn.groupby("card_id").size().idxmax()
    rows = [*rows, {"card_id": busiest, "merchant_id": 1, "amount": Decimal("1.00")}]
    cards = [r["card_id"] for r in rows]
    seen_counts: set[int] = set()
    for at in instants(h):
        with make_store(settings, loaded.pg_schema, loaded.prefix, at=at + dt.timedelta(days=30)) as fs:
            online = fs.online_view(VIEW, rows, windows="request_time", at=at)
            past = fs.historical_view(VIEW, frame_at(rows, at), windows="request_time")
            dicts = fs.online_view_dicts(VIEW, rows, windows="request_time", at=at)
            small = fs.online_view_dicts(VIEW, rows[:5], windows="request_time", at=at)
            stale = fs.online_view(VIEW, rows, windows="event")  # as of the newest event
        counts, sums = reference(h, cards, at)
        assert online.column("card_txn_count_24h").to_pylist() == counts, at
        assert online.column("card_amount_sum_24h").to_pylist() == sums, at
        for name in [*FETCHED, "amount_over_limit", "amount_over_last",
                     *[f"{s}.{w}" for s in SOURCES for w in ("_found", "_event_time")]]:
            assert online.column(name).to_pylist() == past.column(name).to_pylist(), (at, name)
        assert dicts == online.to_pylist()
        assert small == online.to_pylist()[:5]
        for s in SOURCES:  # no row newer than the instant
            assert all(t is None or t <= at for t in online.column(f"{s}._event_time").to_pylist()), (at, s)
        seen_counts.update(counts)
        if at > T0:  # the clock is 30 days later still: the stored values froze at the newest event
            assert stale.column("card_txn_count_24h").to_pylist() != counts
    assert 0 in seen_counts and max(seen_counts) >= 2, seen_counts

    async def read_async(at: dt.datetime) -> pa.Table:
        store = make_store(settings, loaded.pg_schema, loaded.prefix)
        try:
            return await store.online_view_async(VIEW, rows, windows="request_time", at=at)
        finally:
            await store.aclose()

    at = instants(h)[2]
    with make_store(settings, loaded.pg_schema, loaded.prefix) as fs:
        assert asyncio.run(read_async(at)).to_pylist() == fs.online_view(VIEW, rows, windows="request_time",
                                                                         at=at).to_pylist()


def test_a_frozen_clock_is_the_request_time(loaded: Loaded, settings: Settings) -> None:
    h = loaded.h
    rows = requests(h, 12)
    at = h.txn.ts.max().to_pydatetime() - dt.timedelta(hours=5)
    with make_store(settings, loaded.pg_schema, loaded.prefix, at=at) as fs:
        clocked = fs.online_view(VIEW, rows, windows="request_time")
        given = fs.online_view(VIEW, rows, windows="request_time", at=at)
        assert clocked.to_pylist() == given.to_pylist()
        counts, _ = reference(h, [r["card_id"] for r in rows], at)
        assert clocked.column("card_txn_count_24h").to_pylist() == counts
        with pytest.raises(ConfigError, match="is naive, but schema 'card_txn'"):
            fs.online_view(VIEW, rows, windows="request_time", at=at.replace(tzinfo=None))
        with pytest.raises(ConfigError, match="windows must be one of"):
            fs.online_view(VIEW, rows, windows="request-time")
        with pytest.raises(ConfigError, match="at= is the request time"):
            fs.online_view(VIEW, rows, windows="event", at=at)
        with pytest.raises(ConfigError, match="at must be a datetime"):
            fs.online_view(VIEW, rows, windows="request_time", at="2026-10-01")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="windows must be one of"):
            fs.historical_view(VIEW, frame_at(rows, at), windows="now")


def test_every_online_call_of_the_schema(loaded: Loaded, settings: Settings) -> None:
    h = loaded.h
    newest = h.txn.groupby("card_id").ts.max().sort_values(ascending=False)
    cards = [*newest.index, "nobody"]
    names = ["amount", "txn_count_24h", "amount_sum_24h"]
    at = h.txn.ts.max().to_pydatetime() + dt.timedelta(hours=1)
    counts, sums = reference(h, cards, at)
    assert counts[-1] == 0 and max(counts) >= 2 and 0 in counts[:-1], counts
    with make_store(settings, loaded.pg_schema, loaded.prefix) as fs:
        table = fs.online("card_txn", cards, names, windows="request_time", at=at)
        assert table.column("txn_count_24h").to_pylist() == counts
        assert table.column("amount_sum_24h").to_pylist() == sums
        dicts = fs.online_dicts("card_txn", cards, names, windows="request_time", at=at)
        assert without_age(dicts) == without_age(table.to_pylist())
        with pytest.raises(ConfigError, match="windows must be one of"):
            fs.online_dicts("card_txn", cards, names, windows="request")

    async def read() -> pa.Table:
        store = make_store(settings, loaded.pg_schema, loaded.prefix)
        try:
            with pytest.raises(ConfigError, match="at= is the request time"):
                await store.online_async("card_txn", cards, names, windows="event", at=at)
            return await store.online_async("card_txn", cards, names, windows="request_time", at=at)
        finally:
            await store.aclose()

    assert without_age(asyncio.run(read()).to_pylist()) == without_age(table.to_pylist())


def test_features_historical_view_windows_request_time(loaded: Loaded, settings: Settings,
                                                       tmp_path: Path) -> None:
    """``features historical --view`` (``--windows request-time``, the default): the
    training set's windows are evaluated at each row's timestamp (the reference's counts
    and sums), the file equal to ``historical_view`` (default, and
    ``windows="request_time"``); with ``--windows event`` they are not."""
    import json
    import subprocess
    import sys

    import pyarrow.parquet as pq
    from conftest import cli_environment

    h = loaded.h
    rows = requests(h, 11)[:6]
    frame = pa.concat_tables([frame_at(rows, at) for at in instants(h)])
    out = tmp_path
    pq.write_table(frame, out / "frame.parquet")
    with make_store(settings, loaded.pg_schema, loaded.prefix) as fs:
        want = fs.historical_view(VIEW, frame, windows="request_time")
        assert fs.historical_view(VIEW, frame).to_pylist() == want.to_pylist()  # the default
    folders = ["--views-dir", str(EXAMPLE / "views"), "--schemas-dir", str(EXAMPLE / "schemas"),
               "--entities", str(out / "frame.parquet"), "--json"]
    cli = [sys.executable, "-m", "features.cli", "historical", "--view", VIEW, *folders]
    with cli_environment(settings, loaded.pg_schema, 6) as env:  # Redis db 6: unused by historical
        done = subprocess.run([*cli, "--out", str(out / "rt.parquet")],  # the default: request-time
                              env=env, capture_output=True, text=True, timeout=300)
        event = subprocess.run([*cli, "--out", str(out / "ev.parquet"), "--windows", "event"], env=env,
                               capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert event.returncode == 0, event.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["rows"] == frame.num_rows
    got = pq.read_table(out / "rt.parquet")
    assert got.to_pylist() == want.to_pylist()
    counts: list[int] = []
    sums: list[Decimal] = []
    for at in instants(h):
        c, s = reference(h, [r["card_id"] for r in rows], at)
        counts += c
        sums += s
    assert got.column("card_txn_count_24h").to_pylist() == counts
    assert got.column("card_amount_sum_24h").to_pylist() == sums
    assert 0 in counts and max(counts) >= 1, counts
    assert pq.read_table(out / "ev.parquet").column("card_txn_count_24h").to_pylist() != counts


def test_request_time_is_the_default_of_every_read(loaded: Loaded, settings: Settings) -> None:
    """No ``windows=``: the windows at the store's clock (online, views) or each row's
    timestamp (historical), equal to the reference scan; quiet cards read 0 where the
    per-event values (``windows="event"``) keep the count before their newest event; the
    default ``online`` at T equals the default ``historical`` at T."""
    h = loaded.h
    newest = h.txn.groupby("card_id").ts.max().sort_values(ascending=False)
    cards = [*newest.index, "nobody"]
    names = ["txn_count_24h", "amount_sum_24h"]
    at = h.txn.ts.max().to_pydatetime() + dt.timedelta(hours=20)  # most cards quiet for a day
    counts, sums = reference(h, cards, at)
    assert counts[-1] == 0 and 0 in counts[:-1] and max(counts) >= 1, counts
    frame = pa.table({"card_id": pa.array(cards), "timestamp": pa.array([at] * len(cards),
                                                                        pa.timestamp("us", "UTC"))})
    with make_store(settings, loaded.pg_schema, loaded.prefix, at=at) as fs:  # the clock: at
        online = fs.online("card_txn", cards, names)
        assert online.column("txn_count_24h").to_pylist() == counts
        assert online.column("amount_sum_24h").to_pylist() == sums
        past = fs.historical("card_txn", frame, names)
        assert past.select(names).to_pylist() == online.select(names).to_pylist()
        assert without_age(fs.online_dicts("card_txn", cards, names)) == without_age(online.to_pylist())
        event = fs.online("card_txn", cards, names, windows="event")
        # as of each card's newest event: never 0 for a card with history, so quiet ones differ
        assert 0 not in event.column("txn_count_24h").to_pylist()[:-1]
        assert event.column("txn_count_24h").to_pylist() != counts
        assert fs.historical("card_txn", frame, names, windows="event").column(
            "txn_count_24h").to_pylist()[:-1] == event.column("txn_count_24h").to_pylist()[:-1]

        rows = requests(h, 13)
        view_counts, _ = reference(h, [r["card_id"] for r in rows], at)
        assert 0 in view_counts and max(view_counts) >= 1, view_counts
        view = fs.online_view(VIEW, rows)
        assert view.column("card_txn_count_24h").to_pylist() == view_counts
        assert view.to_pylist() == fs.online_view(VIEW, rows, windows="request_time", at=at).to_pylist()
        assert fs.online_view_dicts(VIEW, rows) == view.to_pylist()
        view_past = fs.historical_view(VIEW, frame_at(rows, at))
        for name in WINDOWED:
            assert view_past.column(name).to_pylist() == view.column(name).to_pylist(), name
        assert fs.online_view(VIEW, rows, windows="event").column("card_txn_count_24h").to_pylist() != \
            view_counts

    async def read() -> tuple[pa.Table, pa.Table]:
        store = make_store(settings, loaded.pg_schema, loaded.prefix, at=at)
        try:
            table = await store.online_async("card_txn", cards, names)
            return table, await store.online_view_async(VIEW, rows)
        finally:
            await store.aclose()

    got, got_view = asyncio.run(read())
    assert without_age(got.to_pylist()) == without_age(online.to_pylist())
    assert got_view.to_pylist() == view.to_pylist()
