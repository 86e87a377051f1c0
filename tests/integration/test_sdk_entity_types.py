"""Every entity type a schema may declare (docs/schema.md: a string or an integer field)
through every SDK read against the real Redis and Postgres: ``online``,
``online_dicts`` and ``online_async`` (from Redis and from the Postgres fallback, with
the read-through fill), ``historical`` and ``prewarm``."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from features import FeatureStore
from features.compile import compile_schema
from features.config import Settings
from features.load import load
from features.schema import parse_schema
from features.schema.model import INTEGER_KINDS, TypeKind

pytestmark = pytest.mark.services

#: every type docs/schema.md allows for an entity (the parser's own list)
ENTITY_TYPES = [TypeKind.STRING.value, *sorted(k.value for k in INTEGER_KINDS)]
NAME = "typed_entity"
T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)


def schema_yaml(entity_type: str) -> str:
    return f"""\
name: {NAME}
version: 1.0.0
entity: eid
event_time: ts
hot:
  ttl: 1d
fields:
  - name: eid
    type: {entity_type}
    store: [hot, cold]
    constraints:
      required: true
  - name: ts
    type: timestamp(us, UTC)
    store: [hot, cold]
    constraints:
      required: true
  - name: score
    type: int32
    store: [hot, cold]
    constraints:
      nullable: true
"""


def ids_of(entity_type: str) -> list[Any]:
    """Three entities, the integers at the edges of their type (negative, zero, the maximum)."""
    if entity_type == "string":
        return ["a-1", "b 2", "c{3}"]
    bits = int(entity_type.removeprefix("int"))
    return [-(2 ** (bits - 1)), 0, 2 ** (bits - 1) - 1]


def arrow_type(entity_type: str) -> pa.DataType:
    return pa.string() if entity_type == "string" else getattr(pa, entity_type)()


@dataclass
class Loaded:
    entity_type: str
    ids: list[Any]
    texts: list[str]
    fs: FeatureStore
    drop_hot: Callable[[], None]


@pytest.fixture(params=ENTITY_TYPES)
def loaded(request: pytest.FixtureRequest, tmp_path: Path, settings: Settings, pg_schema: str,
           redis_prefix: str) -> Iterator[Loaded]:
    """The schema with an entity of the parameter's type, two events per entity loaded by
    the batch loader (the newer one, score ``10 * k + 1``, is the online value), and a
    store on it (no negative cache: every miss asks Postgres)."""
    entity_type = str(request.param)
    yaml = schema_yaml(entity_type)
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / f"{NAME}.yaml").write_text(yaml)
    compiled = compile_schema(parse_schema(yaml, f"{NAME}.yaml"))
    ids = ids_of(entity_type)
    rows = pa.table({"eid": pa.array(ids * 2, arrow_type(entity_type)),
                     "ts": pa.array([T0] * 3 + [T0 + dt.timedelta(hours=1)] * 3, pa.timestamp("us", "UTC")),
                     "score": pa.array([0, 10, 20, 1, 11, 21], pa.int32())})
    path = tmp_path / "rows.parquet"
    pq.write_table(rows, path)
    summary = load([path], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert summary.stored == 6 and summary.adds_up
    hot = redis.Redis.from_url(settings.redis_url)

    def drop_hot() -> None:
        keys = list(hot.scan_iter(match=f"{redis_prefix}*", count=1000))
        if keys:
            hot.delete(*keys)

    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp_path / "schemas", search_path=pg_schema, key_prefix=redis_prefix,
                      negative_ttl=dt.timedelta(0)) as fs:
        yield Loaded(entity_type, ids, [str(i) for i in ids], fs, drop_hot)
    hot.close()


def test_online_and_online_dicts_from_redis(loaded: Loaded) -> None:
    fs, ids, texts = loaded.fs, loaded.ids, loaded.texts
    for ask in (ids, texts):  # the ids as given (ints for an integer entity) and as text
        got = fs.online(NAME, [*ask, ask[0]])
        assert got.column("score").to_pylist() == [1, 11, 21, 1]
        assert got.column("_from").to_pylist() == ["redis"] * 4
        assert got.column("eid").to_pylist() == [*texts, texts[0]]
        assert [r["score"] for r in fs.online_dicts(NAME, ask)] == [1, 11, 21]


@pytest.mark.parametrize("method", ["online", "online_dicts", "online_async"])
def test_the_postgres_fallback_serves_and_fills(loaded: Loaded, method: str) -> None:
    fs, ids, texts = loaded.fs, loaded.ids, loaded.texts
    loaded.drop_hot()  # Redis lost: every id takes the fallback, and its fill writes it back
    if method == "online":
        got = fs.online(NAME, ids)
    elif method == "online_dicts":
        got = pa.Table.from_pylist(fs.online_dicts(NAME, ids))
    else:
        async def read() -> pa.Table:
            table = await fs.online_async(NAME, ids)
            await fs.aclose()  # its asyncio client belongs to this loop (the store reopens the rest)
            return table

        got = asyncio.run(read())
    assert got.column("score").to_pylist() == [1, 11, 21]
    assert got.column("_from").to_pylist() == ["postgres"] * 3
    assert got.column("eid").to_pylist() == texts
    assert fs.online(NAME, ids).column("_from").to_pylist() == ["redis"] * 3  # filled


def test_an_id_that_is_no_value_of_the_entity_type_is_found_nowhere(loaded: Loaded) -> None:
    fs, ids = loaded.fs, loaded.ids
    loaded.drop_hot()
    odd: list[Any] = ["x", "\x01"]
    if loaded.entity_type != "string":  # not the text of a value of the type (Redis keys are that text)
        bits = int(loaded.entity_type.removeprefix("int"))
        odd += ["1.0", "007", "+1", " 1", str(2 ** 70), str(2 ** (bits - 1)), str(-(2 ** (bits - 1)) - 1)]
    got = fs.online(NAME, [*odd, ids[1]])
    assert got.column("_found").to_pylist() == [False] * len(odd) + [True]
    assert got.column("score").to_pylist() == [None] * len(odd) + [11]
    df = pa.table({"eid": pa.array([*odd, str(ids[1])]),
                   "timestamp": pa.array([T0 + dt.timedelta(hours=2)] * (len(odd) + 1),
                                         pa.timestamp("us", "UTC"))})
    assert fs.historical(NAME, df, ["score"]).column("score").to_pylist() == [None] * len(odd) + [11]


def test_historical(loaded: Loaded) -> None:
    when = pa.array([T0 - dt.timedelta(seconds=1), T0, T0 + dt.timedelta(hours=2)], pa.timestamp("us", "UTC"))
    # the entity column in the entity's own type, in int64 (pandas' integer), and as text
    columns = [pa.array(loaded.ids, arrow_type(loaded.entity_type)), pa.array(loaded.texts, pa.string())]
    if loaded.entity_type != "string":
        columns.append(pa.array(loaded.ids, pa.int64()))
    for column in columns:
        df = pa.table({"eid": column, "timestamp": when})
        train = loaded.fs.historical(NAME, df, ["score"])
        assert train.column("eid").to_pylist() == column.to_pylist()  # carried through untouched
        assert train.column("score").to_pylist() == [None, 10, 21]


def test_prewarm_of_all_and_of_given_ids(loaded: Loaded) -> None:
    fs, ids, texts = loaded.fs, loaded.ids, loaded.texts
    loaded.drop_hot()
    assert fs.prewarm(NAME, ids=texts[:2]) == {"rows": 2, "written": 2}  # ids as text, as the CLI gives them
    assert fs.online(NAME, ids, fallback=False).column("_found").to_pylist() == [True, True, False]
    assert fs.prewarm(NAME) == {"rows": 3, "written": 1}
    assert fs.online(NAME, ids, fallback=False).column("score").to_pylist() == [1, 11, 21]
