"""Feature views (docs/views.md) against the real Redis (single and cluster) and Postgres:
the worked example's view over three schemas and two entity kinds
(``docs/examples/fraud``: ``card_txn`` and ``card_profile`` keyed by a string card id,
``merchant`` by an integer merchant id; aggregations, an enum, a derived feature, a
``max_age``, two request-time features).

- online at a frozen instant equals historical at that instant, for random histories
  (seeded, several seeds, shuffled files split into two loads), the instant after every
  event and inside the histories (Redis then holds rows newer than it: never served);
- historical equals an independent reference: pandas ``merge_asof`` per source over the
  generated rows (aggregations counted here from the raw events, as of each event:
  ``windows="event"``; online and historical at an instant use the default, request
  time), for random frames with
  timestamps before any event, equal to an event's, past ``max_age``, missing entities,
  duplicate rows, integer and string keys; the request-time features recomputed here;
- bad request fields give every field-level error (``RequestRejected``);
- lineage names the stored row each value came from;
- one Redis round trip for all sources, on a single server and on a Redis Cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import math
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features import FeatureStore
from features.compile import compile_schema
from features.config import Settings
from features.errors import ConfigError, RequestRejected
from features.load import load
from features.schema import load_schemas

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "fraud"
VIEW = "card_scoring"
#: the instant the generated histories end at; online reads are frozen an hour after it
#: (and, in the frozen-instant test, also days before it: inside the histories)
T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
DAY_US = 86_400 * 10**6
SOURCES = ("card_txn", "card_profile", "merchant")


@dataclasses.dataclass
class History:
    """The rows generated for each schema (all valid), as pandas frames."""

    txn: pd.DataFrame
    profile: pd.DataFrame
    merchant: pd.DataFrame
    cards: int
    merchants: int


def _times(rng: np.random.Generator, n: int, days: int) -> np.ndarray:
    """Distinct microsecond instants in the ``days`` before T0 (UTC)."""
    t0 = int(T0.timestamp() * 10**6)
    us = np.unique(t0 - rng.integers(1, days * DAY_US, n * 2))
    return rng.choice(us, n, replace=False)


def generate(seed: int, cards: int = 120, merchants: int = 30) -> History:
    rng = np.random.default_rng(seed)
    n = 1_500
    card = rng.integers(0, cards - cards // 10, n)  # a tenth of the cards have no transaction
    txn = pd.DataFrame({"txn_id": [f"t{seed}-{i}" for i in range(n)], "card_id": [f"c{c}" for c in card],
                        "ts": pd.to_datetime(_times(rng, n, 20), unit="us", utc=True),
                        "amount": [Decimal(int(x)).scaleb(-2) for x in rng.integers(0, 500_000, n)]})
    # some cards transact in bursts: several events within 24 hours
    m = 300
    prof_card = rng.integers(0, cards, m)
    profile = pd.DataFrame({"card_id": [f"c{c}" for c in prof_card],
                            "updated_at": pd.to_datetime(_times(rng, m, 60), unit="us", utc=True),
                            "credit_limit": [Decimal(int(x)).scaleb(-2) for x in
                                             rng.choice([0, 50_000, 100_000, 250_000, 1_000_000], m)],
                            "segment": pd.Series(rng.choice(["retail", "business", "premium", None], m),
                                                 dtype=object)})
    k = 120
    merchant = pd.DataFrame({"merchant_id": rng.integers(1, merchants + 1, k).astype(np.int64),
                             "scored_at": pd.to_datetime(_times(rng, k, 90), unit="us", utc=True),
                             "risk_score": np.where(rng.random(k) < 0.1, np.nan, rng.random(k).round(4))})
    return History(txn, profile, merchant, cards, merchants)


def _arrow(name: str, df: pd.DataFrame) -> pa.Table:
    c = compile_schema(load_schemas(EXAMPLE / "schemas")[name])
    cols = {}
    for f in c.arrow_schema:
        if f.name in df.columns:
            values = df[f.name]
            if pa.types.is_floating(f.type):
                cols[f.name] = pa.array(values.to_numpy(), f.type, from_pandas=True)
            elif pa.types.is_dictionary(f.type):
                cols[f.name] = pa.array(values.tolist(), pa.string())
            else:
                cols[f.name] = pa.array(values.tolist() if not pa.types.is_timestamp(f.type)
                                        else values.to_numpy(), f.type, from_pandas=True)
    return pa.table(cols)


def load_history(tmp: Path, h: History, settings: Settings, pg_schema: str, prefix: str, seed: int) -> None:
    """Each schema's rows shuffled and cut into two files, loaded in two runs."""
    schemas = load_schemas(EXAMPLE / "schemas")
    rng = np.random.default_rng(seed + 1)
    for name, df in (("card_txn", h.txn), ("card_profile", h.profile), ("merchant", h.merchant)):
        table = _arrow(name, df)
        order = rng.permutation(table.num_rows)
        half = table.num_rows // 2
        c = compile_schema(schemas[name])
        for part, rows in enumerate((order[:half], order[half:])):
            path = tmp / f"{name}-{seed}-{part}.parquet"
            pq.write_table(table.take(pa.array(rows)), path)
            summary = load([path], c, settings, search_path=pg_schema, key_prefix=prefix)
            assert summary.adds_up and summary.rejected == 0, summary


def make_store(settings: Settings, pg_schema: str, prefix: str, at: dt.datetime | None = None,
               **kw: Any) -> FeatureStore:
    frozen = (at or T0 + dt.timedelta(hours=1)).timestamp()
    return FeatureStore(redis_url=kw.pop("redis_url", settings.redis_url), postgres_dsn=settings.postgres_dsn,
                        schemas=EXAMPLE / "schemas", views=EXAMPLE / "views", search_path=pg_schema,
                        key_prefix=prefix, fill=False, clock=lambda: frozen, **kw)


def requests(h: History, seed: int, n: int = 80) -> list[dict[str, Any]]:
    """Request rows: known and unknown cards and merchants, a repeated row."""
    rng = np.random.default_rng(seed + 2)
    rows = [{"card_id": f"c{int(c)}", "merchant_id": int(m),
             "amount": Decimal(int(a)).scaleb(-2)}
            for c, m, a in zip(rng.integers(0, h.cards + 5, n), rng.integers(1, h.merchants + 3, n),
                               rng.integers(0, 300_000, n), strict=True)]
    return [*rows, rows[0]]


FETCHED = ["card_amount", "card_txn_count_24h", "card_amount_sum_24h", "credit_limit", "segment", "limit_log",
           "risk_score"]
DERIVED = ["amount_over_limit", "amount_over_last"]
PER_SOURCE = [f"{s}.{w}" for s in SOURCES for w in ("_found", "_event_time")]


@pytest.fixture(scope="module")
def example_view_files() -> None:
    assert (EXAMPLE / "views" / f"{VIEW}.yaml").exists()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_online_at_a_frozen_instant_equals_historical_at_it(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str, seed: int) -> None:
    h = generate(seed)
    load_history(tmp_path, h, settings, pg_schema, redis_prefix, seed)
    rng = np.random.default_rng(seed)
    # the instants: after every event (some merchants' newest score past max_age), and
    # inside the histories, where Redis holds rows newer than the clock (never served)
    after = T0 + dt.timedelta(days=int(rng.integers(1, 15)))
    inside = T0 - dt.timedelta(days=int(rng.integers(3, 8)), seconds=int(rng.integers(0, 86_400)))
    rows = requests(h, seed)
    for at in (after, inside):
        _online_equals_historical(h, rows, at, settings, pg_schema, redis_prefix)


def _online_equals_historical(h: History, rows: list[dict[str, Any]], at: dt.datetime, settings: Settings,
                              pg_schema: str, redis_prefix: str) -> None:
    with make_store(settings, pg_schema, redis_prefix, at=at) as fs:
        online = fs.online_view(VIEW, rows)
        frame = pa.Table.from_pylist([{**r, "timestamp": at, "label": i} for i, r in enumerate(rows)],
                                     schema=pa.schema([("card_id", pa.string()), ("merchant_id", pa.int64()),
                                                       ("amount", pa.decimal128(12, 2)),
                                                       ("timestamp", pa.timestamp("us", "UTC")),
                                                       ("label", pa.int64())]))
        past = fs.historical_view(VIEW, frame)
        dicts = fs.online_view_dicts(VIEW, rows)
        small = [fs.online_view_dicts(VIEW, rows[i:i + 8]) for i in range(0, 32, 8)]  # the small-call path
        traced = fs.online_view(VIEW, rows, lineage=True)

    async def read_async() -> pa.Table:
        store = make_store(settings, pg_schema, redis_prefix, at=at)
        try:
            return await store.online_view_async(VIEW, rows)
        finally:
            await store.aclose()

    via_async = asyncio.run(read_async())
    assert online.column_names == ["card_id", "merchant_id", "amount", *FETCHED, *DERIVED,
                                   *[f"{s}.{w}" for s in SOURCES for w in ("_found", "_event_time", "_from")]]
    assert past.column_names == ["card_id", "merchant_id", "amount", "timestamp", "label", *FETCHED, *DERIVED,
                                 *PER_SOURCE]
    assert past.column("label").to_pylist() == list(range(len(rows)))
    for name in [*FETCHED, *DERIVED, *PER_SOURCE]:
        a, b = online.column(name), past.column(name)
        assert a.type == b.type, (at, name)
        assert a.to_pylist() == b.to_pylist(), (at, name)
        assert traced.column(name).to_pylist() == a.to_pylist(), (at, name)
    assert dicts == online.to_pylist()
    assert [r for part in small for r in part] == online.to_pylist()[:32]
    assert via_async.to_pylist() == online.to_pylist()
    for s in SOURCES:  # no row newer than the clock
        assert all(t is None or t <= at for t in online.column(f"{s}._event_time").to_pylist()), (at, s)
    found = {s: sum(online.column(f"{s}._found").to_pylist()) for s in SOURCES}
    # the random data reach every case: found and not, max_age cutting some merchants off
    assert all(0 < v < len(rows) for v in found.values()), found
    # merchants whose newest score at or before the instant is past max_age (30 days): not found
    newest = h.merchant[h.merchant.scored_at <= pd.Timestamp(at)].groupby("merchant_id")["scored_at"].max()
    stale = {int(m) for m, t in newest.items() if t < pd.Timestamp(at) - pd.Timedelta(days=30)}
    hits = [r["merchant_id"] in stale for r in rows]
    assert any(hits)
    assert not any(f for f, s in zip(online.column("merchant._found").to_pylist(), hits, strict=True) if s)
    if at < T0:  # inside the histories: cards whose newest transaction (in Redis) is after the instant
        latest = h.txn.groupby("card_id")["ts"].max()
        ahead = [r["card_id"] in latest.index and latest[r["card_id"]] > pd.Timestamp(at) for r in rows]
        assert sum(ahead) > 10, sum(ahead)
        assert {f for f, a in zip(online.column("card_txn._from").to_pylist(), ahead, strict=True) if a} \
            <= {"postgres", None}
    # request-time features: never NaN
    for name in DERIVED:
        assert not any(isinstance(v, float) and math.isnan(v) for v in online.column(name).to_pylist())


# --------------------------------------------------------------------------- the reference


def _windows(txn: pd.DataFrame) -> pd.DataFrame:
    """Per transaction, its card's count and amount sum over (ts - 24h, ts]: computed here."""
    out = []
    for _, g in txn.sort_values("ts").groupby("card_id"):
        us = g["ts"].astype("int64").to_numpy() // 1000 if g["ts"].dtype.unit == "ns" else \
            g["ts"].astype("int64").to_numpy()
        amounts = list(g["amount"])
        lo = np.searchsorted(us, us - DAY_US, side="right")
        counts = np.arange(1, len(us) + 1) - lo
        sums = [sum(amounts[lo[i]:i + 1], Decimal("0.00")) for i in range(len(us))]
        out.append(g.assign(txn_count_24h=counts, amount_sum_24h=sums))
    return pd.concat(out)


def _as_of(frame: pd.DataFrame, src: pd.DataFrame, key: str, entity: str, time: str, cols: list[str],
           max_age: dt.timedelta | None) -> pd.DataFrame:
    """pandas merge_asof: each frame row's newest source row at or before its timestamp."""
    right = src.rename(columns={entity: key})[[key, time, *cols]].sort_values(time)
    right = right.assign(**{"_t": right[time]})
    left = frame.assign(_i=np.arange(len(frame))).sort_values("timestamp")
    got = pd.merge_asof(left, right, left_on="timestamp", right_on=time, by=key, direction="backward",
                        allow_exact_matches=True, tolerance=pd.Timedelta(max_age) if max_age else None)
    return got.sort_values("_i").reset_index(drop=True)


def _ratio(a: Any, b: Any) -> Any:
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return None
    return 0.0 if b == 0 else float(a) / float(b)


@pytest.mark.parametrize("seed", [4, 5])
def test_historical_equals_merge_asof_per_source(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str, seed: int) -> None:
    h = generate(seed)
    load_history(tmp_path, h, settings, pg_schema, redis_prefix, seed)
    rng = np.random.default_rng(seed + 9)
    n = 600
    cards = rng.integers(0, h.cards + 5, n)
    merchants = rng.integers(1, h.merchants + 3, n)
    ts = T0.timestamp() * 10**6 - rng.integers(0, 100 * DAY_US, n)  # some before any event
    frame = pd.DataFrame({"card_id": [f"c{c}" for c in cards], "merchant_id": merchants.astype(np.int64),
                          "amount": [Decimal(int(a)).scaleb(-2) for a in rng.integers(0, 300_000, n)],
                          "timestamp": pd.to_datetime(ts.astype(np.int64), unit="us", utc=True),
                          "label": rng.integers(0, 2, n)})
    # timestamps equal to events: a transaction's, a profile update's, a score's
    picks = rng.integers(0, len(h.txn), 40)
    frame.loc[:39, "card_id"] = h.txn["card_id"].iloc[picks].to_numpy()
    frame.loc[:39, "timestamp"] = h.txn["ts"].iloc[picks].to_numpy()
    picks = rng.integers(0, len(h.merchant), 20)
    frame.loc[40:59, "merchant_id"] = h.merchant["merchant_id"].iloc[picks].to_numpy()
    frame.loc[40:59, "timestamp"] = h.merchant["scored_at"].iloc[picks].to_numpy()
    frame = pd.concat([frame, frame.iloc[:15]], ignore_index=True)  # duplicate rows
    with make_store(settings, pg_schema, redis_prefix) as fs:
        got = fs.historical_view(VIEW, frame, windows="event")  # the reference: per-event windows, as of T
    assert got.num_rows == len(frame)
    assert got.column("label").to_pylist() == frame["label"].tolist()

    txn = _as_of(frame, _windows(h.txn), "card_id", "card_id", "ts",
                 ["amount", "txn_count_24h", "amount_sum_24h"], None)
    logs = [math.log1p(float(x)) for x in h.profile["credit_limit"]]
    prof = _as_of(frame, h.profile.assign(limit_log=logs),
                  "card_id", "card_id", "updated_at", ["credit_limit", "segment", "limit_log"], None)
    merch = _as_of(frame, h.merchant, "merchant_id", "merchant_id", "scored_at", ["risk_score"],
                   dt.timedelta(days=30))

    def col(df: pd.DataFrame, name: str) -> list[Any]:
        return [None if (v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NaT) else v
                for v in df[name].tolist()]

    want = {"card_amount": col(txn, "amount_y"), "card_txn_count_24h": col(txn, "txn_count_24h"),
            "card_amount_sum_24h": col(txn, "amount_sum_24h"), "credit_limit": col(prof, "credit_limit"),
            "segment": col(prof, "segment"), "limit_log": col(prof, "limit_log"),
            "risk_score": col(merch, "risk_score")}
    for name, values in want.items():
        have = got.column(name).to_pylist()
        if name == "card_txn_count_24h":
            values = [None if v is None else int(v) for v in values]
        if name == "limit_log":
            assert [v is None for v in have] == [v is None for v in values], name
            assert all(a is None or a == pytest.approx(b, rel=1e-12)
                       for a, b in zip(have, values, strict=True))
            continue
        assert have == values, name
    found = {s: got.column(f"{s}._found").to_pylist() for s in SOURCES}
    assert found["card_txn"] == [t is not pd.NaT and not pd.isna(t) for t in txn["_t"]]
    assert found["merchant"] == [not pd.isna(t) for t in merch["_t"]]
    assert 0 < sum(found["merchant"]) < len(frame) and 0 < sum(found["card_txn"]) < len(frame)
    # request-time features, recomputed here from the request and the fetched values
    amounts = frame["amount"].tolist()
    ratio = [_ratio(a, b) for a, b in zip(amounts, want["credit_limit"], strict=True)]
    have = got.column("amount_over_limit").to_pylist()
    assert [v is None for v in have] == [v is None for v in ratio]
    assert all(a is None or a == pytest.approx(b, rel=1e-12, abs=0)
               for a, b in zip(have, ratio, strict=True))
    diff = [0.0 if b is None else float(a) - float(b)  # on_null: 0
            for a, b in zip(amounts, want["card_amount"], strict=True)]
    assert got.column("amount_over_last").to_pylist() == pytest.approx(diff, rel=1e-12)


# --------------------------------------------------------------------------- requests, lineage


@pytest.fixture()
def loaded(tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> Iterator[History]:
    h = generate(7)
    load_history(tmp_path, h, settings, pg_schema, redis_prefix, 7)
    yield h


def test_bad_request_fields_give_every_field_error(
        loaded: History, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    bad = [{"card_id": "c1", "merchant_id": 3, "amount": Decimal("12.50")},
           {"card_id": "c2", "merchant_id": 4, "amount": Decimal("-1.00")},
           {"card_id": "c3", "merchant_id": "not-an-int", "amount": None},
           {"card_id": None, "merchant_id": 5}]
    with make_store(settings, pg_schema, redis_prefix) as fs:
        with pytest.raises(RequestRejected) as err:
            fs.online_view(VIEW, bad)
        with pytest.raises(RequestRejected) as err_hist:
            fs.historical_view(VIEW, pd.DataFrame(
                [{**r, "timestamp": T0} for r in bad[:2]]).astype({"merchant_id": "int64"}))
        with pytest.raises(ConfigError, match=r"no view named 'card_scorin'.*did you mean"):
            fs.online_view("card_scorin", bad[:1])
        ok = fs.online_view(VIEW, bad[:1])
    exc = err.value
    assert exc.rejected == 3
    by_row: dict[int, set[str]] = {}
    for e in exc.errors:
        by_row.setdefault(int(e["row"]), set()).add(str(e["field"]))
        assert e["message"].startswith(f"field {e['field']} ")
    assert by_row == {1: {"amount"}, 2: {"merchant_id", "amount"}, 3: {"card_id", "amount"}}, exc.errors
    assert any("violates constraint min" in str(e["message"]) for e in exc.errors)
    assert err_hist.value.rejected == 1
    assert ok.num_rows == 1


def test_lineage_names_the_stored_row(loaded: History, settings: Settings, pg_schema: str,
                                      redis_prefix: str) -> None:
    rows = [{"card_id": c, "merchant_id": 1, "amount": Decimal("1.00")} for c in ("c1", "c2", "c3", "c999")]
    with make_store(settings, pg_schema, redis_prefix) as fs:
        plain = fs.online_view(VIEW, rows)
        got = fs.online_view(VIEW, rows, lineage=True)
    assert "card_txn._source" not in plain.column_names
    sources = got.column("card_txn._source").to_pylist()
    found = got.column("card_txn._found").to_pylist()
    assert [s is not None for s in sources] == found and found[-1] is False
    assert sum(found) == 3
    assert all(r is None or len(r) > 0 for r in got.column("card_txn._run_id").to_pylist())
    # the row each _source names (file and row number) holds the values served: the
    # card's newest transaction, and the card's newest profile
    newest_txn = loaded.txn.sort_values("ts").groupby("card_id").tail(1).set_index("card_id")
    newest_profile = loaded.profile.sort_values("updated_at").groupby("card_id").tail(1).set_index("card_id")
    profile_cols = {"credit_limit": "credit_limit", "segment": "segment"}
    for alias, served, newest, time in (("card_txn", {"amount": "card_amount"}, newest_txn, "ts"),
                                        ("card_profile", profile_cols, newest_profile, "updated_at")):
        for i, src in enumerate(got.column(f"{alias}._source").to_pylist()):
            card = rows[i]["card_id"]
            if src is None:
                assert card not in newest.index
                continue
            path, _, at = src.removeprefix("file://").rpartition("#")
            assert Path(path).name.startswith(f"{alias}-7-"), src
            stored = pq.read_table(path).slice(int(at), 1).to_pylist()[0]
            assert stored["card_id"] == card, (alias, src)
            served_time = got.column(f"{alias}._event_time")[i].as_py()
            assert stored[time] == served_time == newest.loc[card, time], src
            for field, column in served.items():
                assert stored[field] == got.column(column)[i].as_py(), (alias, field, src)
    for name in [*FETCHED, *DERIVED]:
        assert got.column(name).to_pylist() == plain.column(name).to_pylist()


def test_one_round_trip_and_the_fallback_per_schema(
        loaded: History, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    """Every source's HMGETs go out as one pipeline (the pool is asked once); with Redis
    emptied of the view's keys, each schema's misses take the Postgres fallback and the
    values are the same."""
    import redis as redis_py

    rows = requests(loaded, 7, 30)
    with make_store(settings, pg_schema, redis_prefix) as fs:
        calls: list[int] = []
        real = fs.redis_pool.hmget_many

        def counting(reads: Any) -> Any:
            calls.append(len(reads))
            return real(reads)

        fs.redis_pool.hmget_many = counting  # type: ignore[method-assign]
        before = fs.online_view(VIEW, rows)
        assert len(calls) == 1 and calls[0] >= 3
        client = redis_py.Redis.from_url(settings.redis_url)
        keys = list(client.scan_iter(match=redis_prefix + "*", count=10_000))
        client.delete(*keys)
        client.close()
        after = fs.online_view(VIEW, rows)
    froms = {s: set(after.column(f"{s}._from").to_pylist()) - {None} for s in SOURCES}
    assert all(v == {"postgres"} for v in froms.values()), froms
    for name in [*FETCHED, *DERIVED, *PER_SOURCE]:
        assert after.column(name).to_pylist() == before.column(name).to_pylist(), name


def test_the_view_on_a_redis_cluster(tmp_path: Path, settings: Settings, pg_schema: str,
                                     redis_cluster: Any, redis_cluster_prefix: str) -> None:
    on_cluster = dataclasses.replace(settings, redis_url=redis_cluster.url)
    h = generate(8)
    load_history(tmp_path, h, on_cluster, pg_schema, redis_cluster_prefix, 8)
    rows = requests(h, 8, 40)
    with make_store(settings, pg_schema, redis_cluster_prefix, redis_url=redis_cluster.url) as fs:
        online = fs.online_view(VIEW, rows)
        frame = pa.Table.from_pylist([{**r, "timestamp": T0 + dt.timedelta(hours=1)} for r in rows])
        past = fs.historical_view(VIEW, frame.set_column(
            frame.schema.get_field_index("timestamp"), "timestamp",
            frame.column("timestamp").cast(pa.timestamp("us", "UTC"))))
    assert set(online.column("card_txn._from").to_pylist()) - {None} == {"redis"}
    for name in [*FETCHED, *DERIVED, *PER_SOURCE]:
        assert online.column(name).to_pylist() == past.column(name).to_pylist(), name


def test_small_calls_give_the_arrow_paths_rows(loaded: History, settings: Settings, pg_schema: str,
                                               redis_prefix: str, small_view_calls: list[int]) -> None:
    """At most SMALL_CALL request rows whose every source is in Redis decode in Python
    (``features.sdk.online.small_rows``); the rows are those of a larger call (Arrow),
    ``max_age`` included (the clock frozen where some merchants' scores are too old). The
    per-event read (``windows="event"``): a request-time read of a view with aggregations
    takes the Arrow path."""
    from features.sdk.online import SMALL_CALL

    taken = small_view_calls
    known_cards = sorted(set(loaded.txn["card_id"]) & set(loaded.profile["card_id"]))
    merchants = sorted(int(m) for m in set(loaded.merchant["merchant_id"]))
    rows = [{"card_id": c, "merchant_id": merchants[i % len(merchants)], "amount": Decimal(f"{i}.25")}
            for i, c in enumerate(known_cards[:40])]
    at = T0 + dt.timedelta(days=12)
    with make_store(settings, pg_schema, redis_prefix, at=at) as fs:
        big = fs.online_view(VIEW, rows, windows="event")
        assert big.num_rows > SMALL_CALL
        for part in (rows[:1], rows[:5], rows[5:5 + SMALL_CALL]):
            small = fs.online_view(VIEW, part, windows="event")
            want = big.slice(rows.index(part[0]), len(part))
            assert small.schema == want.schema
            assert small.to_pylist() == want.to_pylist()
            assert fs.online_view_dicts(VIEW, part, windows="event") == want.to_pylist()
    assert taken == [1, 1, 5, 5, SMALL_CALL, SMALL_CALL]  # the small path, never for the big call
    stale = sum(not f for f in big.column("merchant._found").to_pylist())
    assert 0 < stale < big.num_rows


def test_time_since_measures_up_to_the_request_time(loaded: History, settings: Settings, pg_schema: str,
                                                    redis_prefix: str, tmp_path: Path) -> None:
    """A view declaring ``request_time`` gets it from the store's clock online and from each
    row's timestamp in historical (unless the request gives it): ``time_since`` over a
    fetched timestamp is then the same both ways, and the seconds since the card's last
    transaction at that instant."""
    views = tmp_path / "views"
    views.mkdir()
    (views / "since.yaml").write_text("""\
name: since
version: 1.0.0
request:
  keys: {card_id: string}
  fields:
    - name: request_time
      type: timestamp(us, UTC)
      constraints: {required: true}
sources:
  - schema: card_txn
    features: [ts, amount]
    join: {card_id: card_id}
features:
  - name: seconds_since_txn
    from: ts
    steps: [{time_since: s}]
    dtype: float64
""")
    at = T0 + dt.timedelta(hours=5)
    cards = ["c1", "c2", "c3", "c998"]
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=EXAMPLE / "schemas", views=views, search_path=pg_schema,
                      key_prefix=redis_prefix,
                      fill=False, clock=lambda: at.timestamp()) as fs:
        online = fs.online_view("since", [{"card_id": c} for c in cards])
        past = fs.historical_view("since", pa.table({
            "card_id": cards, "timestamp": pa.array([at] * len(cards), pa.timestamp("us", "UTC"))}))
        given = fs.online_view("since", [{"card_id": c, "request_time": at + dt.timedelta(seconds=10)}
                                         for c in cards])
    assert online.column("request_time").to_pylist() == [at] * len(cards)
    assert online.column("seconds_since_txn").to_pylist() == past.column("seconds_since_txn").to_pylist()
    last = loaded.txn.groupby("card_id")["ts"].max()
    want = [None if c not in last else (at - last[c].to_pydatetime()).total_seconds() for c in cards]
    got = online.column("seconds_since_txn").to_pylist()
    assert [g is None for g in got] == [w is None for w in want] and want[-1] is None
    assert all(g is None or g == pytest.approx(w, abs=1e-6) for g, w in zip(got, want, strict=True))
    assert [g and g + 10 for g in got] == pytest.approx(
        [g or None for g in given.column("seconds_since_txn").to_pylist()])


def test_features_historical_view_writes_the_training_set(loaded: History, settings: Settings, pg_schema: str,
                                                          redis_prefix: str, tmp_path: Path) -> None:
    """``features historical --view``: the frame file in chunks, each a ``historical_view``,
    the Parquet file equal to one ``historical_view`` of the whole frame."""
    import json
    import subprocess
    import sys

    from conftest import cli_environment

    rows = requests(loaded, 7, 50)
    frame = pa.Table.from_pylist([{**r, "timestamp": T0 - dt.timedelta(days=i % 9), "label": i}
                                  for i, r in enumerate(rows)])
    frame = frame.set_column(3, "timestamp", frame.column("timestamp").cast(pa.timestamp("us", "UTC")))
    pq.write_table(frame, tmp_path / "frame.parquet")
    with make_store(settings, pg_schema, redis_prefix) as fs:
        want = fs.historical_view(VIEW, frame)
    folders = ["--views-dir", str(EXAMPLE / "views"), "--schemas-dir", str(EXAMPLE / "schemas"),
               "--entities", str(tmp_path / "frame.parquet")]
    cli = [sys.executable, "-m", "features.cli", "historical"]
    with cli_environment(settings, pg_schema, 6) as env:  # Redis db 6: unused by historical
        done = subprocess.run([*cli, "--view", VIEW, *folders, "--out", str(tmp_path / "t.parquet"),
                               "--chunk-rows", "16", "--json"], env=env, capture_output=True, text=True,
                              timeout=300)
        bad = subprocess.run([*cli, "--view", "nope", *folders, "--out", str(tmp_path / "x.parquet")],
                             env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["view"] == VIEW and summary["rows"] == frame.num_rows
    got = pq.read_table(tmp_path / "t.parquet")
    assert pq.ParquetFile(tmp_path / "t.parquet").num_row_groups == 4
    assert got.to_pylist() == want.to_pylist()
    assert bad.returncode == 2 and "no view named 'nope'" in bad.stderr
    assert not (tmp_path / "x.parquet").exists()


def test_one_schema_twice_under_two_aliases(loaded: History, settings: Settings, pg_schema: str,
                                            redis_prefix: str, tmp_path: Path) -> None:
    """A view reading one schema for two request keys (a payment's two merchants, as
    sender and receiver accounts): each alias gets its own columns and per-source columns,
    online and in historical, equal to the one-alias view's values for that key."""
    views = tmp_path / "views"
    views.mkdir()
    (views / "pair.yaml").write_text("""\
name: pair
version: 1.0.0
request:
  keys: {payer: int64, payee: int64}
sources:
  - schema: merchant
    alias: payer
    features: [risk_score]
    join: {merchant_id: payer}
  - schema: merchant
    alias: payee
    features: [risk_score]
    join: {merchant_id: payee}
""")
    ids = sorted(int(m) for m in set(loaded.merchant["merchant_id"]))
    rows = [{"payer": ids[i], "payee": ids[-1 - i]} for i in range(6)]
    rows.append({"payer": 999_999, "payee": ids[0]})
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=EXAMPLE / "schemas", views=views, search_path=pg_schema,
                      key_prefix=redis_prefix, fill=False) as fs:
        got = fs.online_view("pair", rows)
        single = fs.online("merchant", [r["payer"] for r in rows] + [r["payee"] for r in rows],
                           ["risk_score"])
        past = fs.historical_view("pair", pa.table({
            "payer": pa.array([r["payer"] for r in rows], pa.int64()),
            "payee": pa.array([r["payee"] for r in rows], pa.int64()),
            "timestamp": pa.array([T0 + dt.timedelta(hours=1)] * len(rows), pa.timestamp("us", "UTC"))}))
    assert [n for n in got.column_names if "risk" in n] == ["payer__risk_score", "payee__risk_score"]
    n = len(rows)
    assert got.column("payer__risk_score").to_pylist() == single.column("risk_score").to_pylist()[:n]
    assert got.column("payee__risk_score").to_pylist() == single.column("risk_score").to_pylist()[n:]
    assert got.column("payer._found").to_pylist() == [True] * 6 + [False]
    for name in ["payer__risk_score", "payee__risk_score", "payer._found", "payee._found"]:
        assert past.column(name).to_pylist() == got.column(name).to_pylist(), name
