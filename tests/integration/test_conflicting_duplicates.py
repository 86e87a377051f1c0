"""Two different events with one (entity, event time), in separate loads, against the
real Redis and Postgres: both stores keep the first given (Postgres's rule), also when
the Redis hash is one the SDK filled from Postgres (``_filled``) or has expired."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import redis

from features import FeatureStore
from features.compile.layout import entity_key
from features.config import Settings
from features.load import load
from features.ops.examples import applicant_schema, applicants
from features.sinks.redis import FILLED

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[2]
NAME, ENTITY = "credit_applicant", "application_id"


def _two_versions(tmp_path: Path) -> tuple[Path, Path]:
    """Event A of every applicant, and event B: the same ids and event times with
    another income."""
    a = applicants(300, seed=21, invalid_share=0.0)
    income = a.column("income_monthly")
    b = a.set_column(a.schema.get_field_index("income_monthly"), a.schema.field("income_monthly"),
                     pc.add(income, pa.scalar(Decimal("1.00"), income.type)).cast(income.type))
    pq.write_table(a, tmp_path / "a.parquet")
    pq.write_table(b, tmp_path / "b.parquet")
    return tmp_path / "a.parquet", tmp_path / "b.parquet"


def _cold_income(settings: Settings, pg_schema: str) -> dict[str, str]:
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        return dict(conn.execute(f"SELECT {ENTITY}, income_monthly::text FROM {NAME}").fetchall())


def _hot_income(hot: redis.Redis, prefix: str, ids: list[str]) -> dict[str, str]:
    out = {}
    for i in ids:
        value = hot.hget(prefix + entity_key(NAME, i), "income_monthly")
        assert value is not None, i
        out[i] = value.decode()
    return out


def _load(path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    s = load([path], applicant_schema(), settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert s.adds_up and s.rejected == 0


def _fill(settings: Settings, pg_schema: str, redis_prefix: str, hot: redis.Redis, ids: list[str]) -> None:
    """Delete the ids' hashes, read them through the SDK (Postgres fallback and fill) and
    wait until every one is back in Redis, marked ``_filled``."""
    hot.delete(*[redis_prefix + entity_key(NAME, i) for i in ids])
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=ROOT / "schemas", search_path=pg_schema, key_prefix=redis_prefix,
                      fill=True) as fs:
        assert fs.online(NAME, ids).column("_from").to_pylist() == ["postgres"] * len(ids)
        deadline = time.monotonic() + 30
        while (not all(hot.hexists(redis_prefix + entity_key(NAME, i), FILLED) for i in ids)
               and time.monotonic() < deadline):
            time.sleep(0.05)
    assert all(hot.hexists(redis_prefix + entity_key(NAME, i), FILLED) for i in ids)


def test_a_filled_hash_keeps_the_first_event_like_postgres(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    a, b = _two_versions(tmp_path)
    _load(a, settings, pg_schema, redis_prefix)
    hot = redis.Redis.from_url(settings.redis_url)
    ids = sorted(_cold_income(settings, pg_schema))
    first = _hot_income(hot, redis_prefix, ids)
    filled = ids[:20]
    _fill(settings, pg_schema, redis_prefix, hot, filled)
    assert _hot_income(hot, redis_prefix, filled) == {i: first[i] for i in filled}
    _load(b, settings, pg_schema, redis_prefix)  # B: already present in Postgres
    cold = _cold_income(settings, pg_schema)
    assert {i: Decimal(v) for i, v in _hot_income(hot, redis_prefix, ids).items()} == \
        {i: Decimal(v) for i, v in cold.items()}
    assert _hot_income(hot, redis_prefix, ids) == first


def test_the_first_event_is_unchanged_after_a_replay_of_itself_through_a_fill(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    """The pipeline's own write of the event a fill holds still replaces the filled hash
    (the ``_filled`` mark goes, the values and lineage stay those of the event)."""
    a, _ = _two_versions(tmp_path)
    _load(a, settings, pg_schema, redis_prefix)
    hot = redis.Redis.from_url(settings.redis_url)
    ids = sorted(_cold_income(settings, pg_schema))[:10]
    before = {i: hot.hgetall(redis_prefix + entity_key(NAME, i)) for i in ids}
    _fill(settings, pg_schema, redis_prefix, hot, ids)
    # a new run of the same file: new ledger units (another run id), same events
    s = load([a], applicant_schema(), settings, search_path=pg_schema, key_prefix=redis_prefix,
             batch_rows=77)
    assert s.stored == 0
    for i in ids:
        after = hot.hgetall(redis_prefix + entity_key(NAME, i))
        assert FILLED.encode() not in after
        assert after[b"income_monthly"] == before[i][b"income_monthly"]
        assert after[b"_source"] == before[i][b"_source"]


def test_an_expired_hash_is_not_replaced_by_another_event_of_its_time(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    """Redis cannot tell an expired hash from a new entity, so B re-creates it; the cold
    store's refusal (another ``_source`` at that key) makes Redis drop it again, and the
    next read falls back to Postgres: online and historical agree on A."""
    a, b = _two_versions(tmp_path)
    _load(a, settings, pg_schema, redis_prefix)
    hot = redis.Redis.from_url(settings.redis_url)
    ids = sorted(_cold_income(settings, pg_schema))
    first = _hot_income(hot, redis_prefix, ids)
    expired, kept = ids[:20], ids[20:]
    for i in expired:
        hot.pexpire(redis_prefix + entity_key(NAME, i), 1)
    time.sleep(0.05)
    assert not any(hot.exists(redis_prefix + entity_key(NAME, i)) for i in expired)
    _load(b, settings, pg_schema, redis_prefix)
    cold = _cold_income(settings, pg_schema)
    assert {i: Decimal(v) for i, v in first.items()} == {i: Decimal(v) for i, v in cold.items()}
    # no hash holds B: the expired ones are gone again, the others still hold A
    assert not any(hot.exists(redis_prefix + entity_key(NAME, i)) for i in expired)
    assert _hot_income(hot, redis_prefix, kept) == {i: first[i] for i in kept}
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=ROOT / "schemas", search_path=pg_schema, key_prefix=redis_prefix) as fs:
        online = fs.online(NAME, ids)
    got = dict(zip(online.column(ENTITY).to_pylist(), online.column("income_monthly").to_pylist(),
                   strict=True))
    assert got == {i: Decimal(v) for i, v in cold.items()}
    assert online.column("_from").to_pylist() == ["postgres" if i in expired else "redis" for i in ids]
