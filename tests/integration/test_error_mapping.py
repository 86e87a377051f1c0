"""Driver errors are translated at the edge (features.sinks.pg, features.sinks.redis_wire):
what each real server failure becomes, and that no psycopg or redis-py exception reaches
the callers of the sinks, the SDK, the report and health.

- Postgres: a refused statement -> SinkError naming what was done; a backend terminated
  under a connection -> SinkUnavailable naming the address; an unreachable server ->
  SinkUnavailable naming the address, never the password; passthrough errors stay raw.
- Redis (redis-py): a wrong password -> SinkError (AUTH, not transient); an unreachable
  server -> SinkUnavailable; an error reply -> SinkError naming the command.
- The SDK and the report, pointed at a dead Postgres, raise the package's errors.
"""

from __future__ import annotations

import psycopg
import pytest
import redis
from conftest import ROOT
from psycopg import errors

from features.config import Settings
from features.errors import FeaturesError, SinkError, SinkUnavailable
from features.sinks import pg
from features.sinks.redis_wire import RedisEndpoint, map_redis_errors

pytestmark = pytest.mark.services

DEAD_DSN = "postgresql://featureline:s3cret-pw@127.0.0.1:1/featureline"


def test_refused_statement_is_a_sink_error_naming_what(settings: Settings) -> None:
    with pg.connect(settings.postgres_dsn) as conn:
        with pytest.raises(SinkError, match="Postgres refused the probe: division by zero") as info:
            with pg.map_psycopg_errors(settings.postgres_dsn, "the probe"):
                conn.execute("SELECT 1 / 0")
    assert not isinstance(info.value, SinkUnavailable)  # retrying will not help
    assert isinstance(info.value.__cause__, errors.DivisionByZero)
    assert info.value.address == pg.address(settings.postgres_dsn)


def test_a_search_path_naming_no_schema_says_which_and_the_fix(settings: Settings) -> None:
    """issue 47: "no schema has been selected to create in" named neither the schema nor the fix."""
    from features.compile import find_schema
    from features.sinks.postgres import PostgresSink

    sep = "&" if "?" in settings.postgres_dsn else "?"
    dsn = f"{settings.postgres_dsn}{sep}options=-csearch_path%3Dno_such_schema_x"
    sink = PostgresSink(dsn, find_schema("credit_applicant", ROOT / "schemas"))
    with pytest.raises(SinkError) as info:
        sink.open()
    sink.close()
    text = str(info.value)
    assert "search_path no_such_schema_x names no schema" in text and "CREATE SCHEMA no_such_schema_x" in text


def test_terminated_backend_is_unavailable(settings: Settings) -> None:
    with pg.connect(settings.postgres_dsn, autocommit=True) as victim, \
            pg.connect(settings.postgres_dsn, autocommit=True) as killer:
        pid = victim.info.backend_pid
        assert killer.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        with pytest.raises(SinkUnavailable, match=r"Postgres at 127\.0\.0\.1:\d+/\w* failed during the read"):
            with pg.map_psycopg_errors(settings.postgres_dsn, "the read"):
                victim.execute("SELECT 1")


def test_passthrough_stays_raw(settings: Settings) -> None:
    with pg.connect(settings.postgres_dsn) as conn:
        with pytest.raises(errors.UndefinedTable):
            with pg.map_psycopg_errors(settings.postgres_dsn, "x", passthrough=(errors.UndefinedTable,)):
                conn.execute('SELECT * FROM "no such table here"')


def test_unreachable_postgres_names_the_address_not_the_password() -> None:
    with pytest.raises(SinkUnavailable, match=r"Postgres unreachable at 127\.0\.0\.1:1/featureline") as info:
        pg.connect(DEAD_DSN, timeout_s=2)
    assert "s3cret" not in str(info.value) and info.value.address == "127.0.0.1:1/featureline"


def test_session_options_keep_the_dsns_own(settings: Settings, pg_schema: str) -> None:
    dsn = f"{settings.postgres_dsn}{'&' if '?' in settings.postgres_dsn else '?'}options=-c%20work_mem%3D7MB"
    with pg.connect(dsn, utc=True, search_path=pg_schema) as conn:
        got = [conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
               for name in ("work_mem", "TimeZone", "search_path")]
    assert got == ["7MB", "UTC", pg_schema]


def test_redis_wrong_password_is_not_transient(settings: Settings) -> None:
    endpoint = RedisEndpoint.from_url(settings.redis_url)
    if endpoint.cluster or endpoint.password:
        pytest.skip("needs the plain local Redis without a password")
    client = redis.Redis(host=endpoint.host, port=endpoint.port, password="wrong", socket_timeout=5)
    try:
        with pytest.raises(SinkError) as info, map_redis_errors(endpoint.address, "PING"):
            client.ping()
    finally:
        client.close()
    # a server without a password answers AUTH with an error: "AUTH" or "refused PING"
    assert not isinstance(info.value, SinkUnavailable), info.value
    assert isinstance(info.value.__cause__, redis.RedisError)


def test_redis_unreachable_and_error_reply(settings: Settings, redis_prefix: str) -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_timeout=2)
    with pytest.raises(SinkUnavailable, match=r"Redis unreachable at 127\.0\.0\.1:1"), \
            map_redis_errors("127.0.0.1:1", "PING"):
        dead.ping()
    endpoint = RedisEndpoint.from_url(settings.redis_url)
    if endpoint.cluster:
        return
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
    try:
        client.set(redis_prefix + "s", "text")
        with pytest.raises(SinkError, match="refused HGET: WRONGTYPE") as info, \
                map_redis_errors(endpoint.address, "HGET"):
            client.hget(redis_prefix + "s", "f")
        assert not isinstance(info.value, SinkUnavailable)
    finally:
        client.close()


def test_sdk_and_report_raise_the_packages_errors(settings: Settings, tmp_path: object) -> None:
    from features import FeatureStore
    from features.report.sources import Postgres

    store = FeatureStore(redis_url=settings.redis_url, postgres_dsn=DEAD_DSN, fill=False, timeout_s=2)
    try:
        with pytest.raises(SinkUnavailable, match=r"127\.0\.0\.1:1/featureline") as info:
            store.historical("credit_applicant", _entity_df(), timestamp_column="ts")
        assert "s3cret" not in str(info.value)
    finally:
        store.close()
    with pytest.raises(SinkUnavailable, match="is it running"), Postgres(DEAD_DSN):
        pass


def test_no_driver_exception_escapes_the_report_on_a_refused_read(settings: Settings) -> None:
    from psycopg import sql

    from features.report.sources import Postgres

    with Postgres(settings.postgres_dsn) as source:
        with pytest.raises(FeaturesError, match="Postgres refused the read of a probe") as info:
            list(source.stream(sql.SQL("SELECT 1 / 0"), (), 10, "a probe"))
        assert isinstance(info.value.__cause__, psycopg.Error)


def _entity_df() -> object:
    import datetime as dt

    import pyarrow as pa

    return pa.table({"application_id": ["APP-1"],
                     "ts": pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC)], pa.timestamp("us", "UTC"))})
