"""Two different events with one (entity, event time), against the real Redis and
Postgres (issue 48): the history keeps both (keyed by entity, event time and content
digest), an exact copy is one event (already present), and Redis holds the one with the
greater digest, whatever order the loads (``features load``, ``FeatureStore.write``,
the stream's micro-batches) give them in, also when the hash is one the SDK filled from
Postgres (``_filled``)."""

from __future__ import annotations

import json
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
from features.kernels.digest import digests
from features.lineage import new_run_id
from features.load import load
from features.ops.examples import applicant_schema, applicants
from features.sinks.redis import FILLED
from features.stream.core import StreamProcessor

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[2]
NAME, ENTITY = "credit_applicant", "application_id"
#: a hash's fields that name the run that wrote it (not the event)
RUN_FIELDS = {b"_run_id", b"_ingested_at"}


def _two_versions(rows: int = 300) -> tuple[pa.Table, pa.Table]:
    """Event A of every applicant, and event B: the same ids and event times with
    another income."""
    a = applicants(rows, seed=21, invalid_share=0.0)
    income = a.column("income_monthly")
    b = a.set_column(a.schema.get_field_index("income_monthly"), a.schema.field("income_monthly"),
                     pc.add(income, pa.scalar(Decimal("1.00"), income.type)).cast(income.type))
    return a, b


def _write_files(tmp_path: Path) -> tuple[Path, Path]:
    a, b = _two_versions()
    pq.write_table(a, tmp_path / "a.parquet")
    pq.write_table(b, tmp_path / "b.parquet")
    return tmp_path / "a.parquet", tmp_path / "b.parquet"


def _expected_newest(a: pa.Table, b: pa.Table) -> dict[str, Decimal]:
    """Per applicant, the income of the event with the greater digest (computed here, in
    Python, from the two tables: not read from a store)."""
    schema = applicant_schema().schema
    da, db = digests(a, schema).to_pylist(), digests(b, schema).to_pylist()
    assert all(x != y for x, y in zip(da, db, strict=True))
    ids = a.column(ENTITY).to_pylist()
    ia, ib = a.column("income_monthly").to_pylist(), b.column("income_monthly").to_pylist()
    return {i: (x if dx > dy else y) for i, x, y, dx, dy in zip(ids, ia, ib, da, db, strict=True)}


def _history(settings: Settings, pg_schema: str) -> list[tuple[str, str, str]]:
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        return sorted(conn.execute(
            f"SELECT {ENTITY}, income_monthly::text, _digest FROM {NAME}").fetchall())


def _newest_in_postgres(settings: Settings, pg_schema: str) -> dict[str, Decimal]:
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        rows = conn.execute(f"SELECT DISTINCT ON ({ENTITY}) {ENTITY}, income_monthly FROM {NAME} "
                            f"ORDER BY {ENTITY}, submitted_at DESC, _digest DESC").fetchall()
    return dict(rows)


def _hashes(hot: redis.Redis, prefix: str, ids: list[str]) -> dict[str, dict[bytes, bytes]]:
    out = {}
    for i in ids:
        h: dict[bytes, bytes] = hot.hgetall(prefix + entity_key(NAME, i))  # type: ignore[assignment]
        assert h, i
        out[i] = {k: v for k, v in h.items() if k not in RUN_FIELDS}
    return out


def _hot_income(hot: redis.Redis, prefix: str, ids: list[str]) -> dict[str, Decimal]:
    return {i: Decimal(h[b"income_monthly"].decode()) for i, h in _hashes(hot, prefix, ids).items()}


def _load(path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    s = load([path], applicant_schema(), settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert s.adds_up and s.rejected == 0
    assert (s.stored, s.already_present) == (s.read, 0)  # a distinct event is never "already present"


def test_both_events_are_kept_and_redis_holds_the_greater_digest_in_either_order(
        tmp_path: Path, settings: Settings, pg_schema: str, second_pg_schema: str, redis_prefix: str) -> None:
    a, b = _write_files(tmp_path)
    expected = _expected_newest(*_two_versions())
    hot = redis.Redis.from_url(settings.redis_url)
    histories, hashes = [], []
    for order, schema, ns in (((a, b), pg_schema, "ab"), ((b, a), second_pg_schema, "ba")):
        prefix = f"{redis_prefix}{ns}:"
        for path in order:
            _load(path, settings, schema, prefix)
        history = _history(settings, schema)
        assert len(history) == 600 and len({(e, d) for e, _, d in history}) == 600
        assert _newest_in_postgres(settings, schema) == expected
        ids = sorted(expected)
        assert _hot_income(hot, prefix, ids) == expected
        histories.append(history)
        hashes.append(_hashes(hot, prefix, ids))
    assert histories[0] == histories[1]
    assert hashes[0] == hashes[1]


def test_an_exact_copy_is_one_event_already_present(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    a, b = _write_files(tmp_path)
    _load(a, settings, pg_schema, redis_prefix)
    # the same events in another file (another unit, another _source): exact copies
    copy = tmp_path / "copy.parquet"
    table = pq.read_table(a)
    pq.write_table(pa.concat_tables([table.slice(150), table.slice(0, 150), table.slice(0, 10)]), copy)
    s = load([copy], applicant_schema(), settings, search_path=pg_schema, key_prefix=redis_prefix,
             batch_rows=77)
    assert (s.read, s.stored, s.rejected, s.already_present) == (310, 0, 0, 310)
    assert len(_history(settings, pg_schema)) == 300
    # one file holding both events of every applicant and copies of some: both kept, once
    both = tmp_path / "both.parquet"
    tb = pq.read_table(b)
    pq.write_table(pa.concat_tables([tb.slice(0, 100), table, tb.slice(100), tb.slice(0, 5)]), both)
    s = load([both], applicant_schema(), settings, search_path=pg_schema, key_prefix=redis_prefix,
             batch_rows=64)
    assert (s.read, s.stored, s.rejected, s.already_present) == (605, 300, 0, 305)
    assert len(_history(settings, pg_schema)) == 600


def test_feature_store_write_follows_the_same_rule(
        settings: Settings, pg_schema: str, second_pg_schema: str, redis_prefix: str) -> None:
    a, b = _two_versions(120)
    expected = _expected_newest(a, b)
    hot = redis.Redis.from_url(settings.redis_url)
    got = []
    for order, schema, ns in (((a, b), pg_schema, "ab"), ((b, a), second_pg_schema, "ba")):
        prefix = f"{redis_prefix}{ns}:"
        with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                          schemas=ROOT / "schemas", search_path=schema, key_prefix=prefix) as fs:
            for table in order:
                w = fs.write(NAME, table)
                assert (w.stored, w.already_present) == (120, 0)
            w = fs.write(NAME, order[0], run_id="again")  # exact copies
            assert (w.stored, w.already_present) == (0, 120)
            ids = sorted(expected)
            online = fs.online(NAME, ids)
        assert dict(zip(online.column(ENTITY).to_pylist(), online.column("income_monthly").to_pylist(),
                        strict=True)) == expected
        assert len(_history(settings, schema)) == 240
        got.append((_history(settings, schema), _hashes(hot, prefix, ids)))
    assert got[0][0] == got[1][0]
    assert {i: {k: v for k, v in h.items() if k != b"_source"} for i, h in got[0][1].items()} == \
        {i: {k: v for k, v in h.items() if k != b"_source"} for i, h in got[1][1].items()}


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


def test_a_filled_hash_holds_the_greater_digest_and_a_reload_changes_nothing(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    a, b = _write_files(tmp_path)
    expected = _expected_newest(*_two_versions())
    _load(a, settings, pg_schema, redis_prefix)
    _load(b, settings, pg_schema, redis_prefix)
    hot = redis.Redis.from_url(settings.redis_url)
    ids = sorted(expected)
    before = _hashes(hot, redis_prefix, ids)
    filled = ids[:20]
    _fill(settings, pg_schema, redis_prefix, hot, filled)
    assert _hot_income(hot, redis_prefix, filled) == {i: expected[i] for i in filled}
    assert {i: h[b"_digest"] for i, h in _hashes(hot, redis_prefix, filled).items()} == \
        {i: before[i][b"_digest"] for i in filled}
    # a new run of both files (other units): every event already present; the pipeline's
    # write of the event a fill holds replaces the filled hash (the mark goes)
    for path in (b, a):
        s = load([path], applicant_schema(), settings, search_path=pg_schema, key_prefix=redis_prefix,
                 batch_rows=77)
        assert (s.stored, s.already_present) == (0, 300)
    after = _hashes(hot, redis_prefix, ids)
    assert not any(FILLED.encode() in h for h in after.values())
    assert after == before


def _records(table: pa.Table) -> list[bytes]:
    """``table``'s rows as the stream's JSON records (decimals as text, instants ISO 8601)."""
    out = []
    for row in table.to_pylist():
        obj = {k: (v.isoformat() if hasattr(v, "isoformat") else str(v) if isinstance(v, Decimal) else v)
               for k, v in row.items()}
        out.append(json.dumps(obj).encode())
    return out


def _stream(settings: Settings, pg_schema: str, redis_prefix: str,
            batches: list[list[bytes]]) -> tuple[int, int]:
    """``batches`` as the stream job's micro-batches (offsets counted on across them);
    returns (stored, already present)."""
    proc = StreamProcessor(applicant_schema(), settings, run_id=new_run_id(), dead_letter_topic=None,
                           search_path=pg_schema, key_prefix=redis_prefix)
    proc.open()
    offset = 0
    try:
        for values in batches:
            n = len(values)
            outcome = proc.process(values, pa.array(["ties"] * n), pa.array([0] * n, pa.int32()),
                                   pa.array(range(offset, offset + n), pa.int64()))
            assert not outcome.any()
            offset += n
    finally:
        proc.close()
    s = proc.stats.summary
    assert s.adds_up
    return s.stored, s.already_present


def test_the_stream_stores_the_same_events_as_the_batch_loader_in_any_order_and_split(
        tmp_path: Path, settings: Settings, pg_schema: str, second_pg_schema: str, third_pg_schema: str,
        redis_prefix: str) -> None:
    a, b = _two_versions(200)
    expected = _expected_newest(a, b)
    ra, rb = _records(a), _records(b)
    hot = redis.Redis.from_url(settings.redis_url)
    ids = sorted(expected)
    # a, then b, in micro-batches of 64; b and a interleaved with copies, in batches of 37
    split = [ra[i:i + 64] for i in range(0, 200, 64)] + [rb[i:i + 64] for i in range(0, 200, 64)]
    assert _stream(settings, pg_schema, redis_prefix + "s1:", split) == (400, 0)
    mixed = [r for pair in zip(rb, ra, strict=True) for r in pair] + ra[:30] + rb[:7]
    assert _stream(settings, second_pg_schema, redis_prefix + "s2:",
                   [mixed[i:i + 37] for i in range(0, len(mixed), 37)]) == (400, 37)
    path = tmp_path / "both.parquet"
    pq.write_table(pa.concat_tables([b, a]), path)
    s = load([path], applicant_schema(), settings, search_path=third_pg_schema,
             key_prefix=redis_prefix + "b:")
    assert (s.stored, s.already_present) == (400, 0)
    histories = [_history(settings, ns) for ns in (pg_schema, second_pg_schema, third_pg_schema)]
    assert len(histories[0]) == 400 and histories[0] == histories[1] == histories[2]
    content = [{i: {k: v for k, v in h.items() if k != b"_source"}
                for i, h in _hashes(hot, redis_prefix + p, ids).items()} for p in ("s1:", "s2:", "b:")]
    assert content[0] == content[1] == content[2]
    assert _hot_income(hot, redis_prefix + "s2:", ids) == expected
