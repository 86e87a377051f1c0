"""``features migrate`` moves a history table made before content digests (keyed by
entity and event time, no ``_digest``) to the key (entity, event time, ``_digest``),
against the real Postgres: a dry run first that changes nothing, then the rows get the
digests a load gives them, a run stopped half way is finished by running it again, and
afterwards a re-load is already present while another event at a stored instant is kept."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import cli_environment

from features.compile.postgres import primary_key_name
from features.config import Settings
from features.errors import SinkError
from features.load import load
from features.ops.digests import migrate_digests, plan_digests
from features.ops.examples import applicant_schema, applicants
from features.sinks import pg
from features.sinks.postgres import PostgresSink

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[2]
NAME = "credit_applicant"
SCHEMA_FILE = ROOT / "schemas" / f"{NAME}.yaml"


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "features.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def _digests(conn: Any) -> list[tuple[str, Any, str]]:
    return sorted(conn.execute(f"SELECT application_id, submitted_at, _digest FROM {NAME}").fetchall())


def _to_old_layout(conn: Any) -> None:
    """The table as an earlier release made it: no _digest, keyed by (entity, event time)."""
    pkey = primary_key_name(NAME)
    conn.execute(f'ALTER TABLE {NAME} DROP CONSTRAINT "{pkey}"')
    conn.execute(f"ALTER TABLE {NAME} DROP COLUMN _digest")
    conn.execute(f'ALTER TABLE {NAME} ADD CONSTRAINT "{pkey}" PRIMARY KEY (application_id, submitted_at)')


def test_migrate_gives_an_old_history_the_digests_a_load_gives_and_the_new_key(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    a = applicants(700, seed=5, invalid_share=0.0)
    path = tmp_path / "a.parquet"
    pq.write_table(a, path)
    s = load([path], applicant_schema(), settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert s.stored == 700
    options = f"-c search_path={pg_schema}"
    with psycopg.connect(settings.postgres_dsn, options=options, autocommit=True) as conn:
        loaded = _digests(conn)
        _to_old_layout(conn)
    # the sink refuses the old table: it would keep one event per instant
    sink = PostgresSink(settings.postgres_dsn, applicant_schema(), search_path=pg_schema)
    with pytest.raises(SinkError, match="predates content digests"):
        sink.open()

    with cli_environment(settings, pg_schema, 13) as env:
        dry = _cli(["migrate", str(SCHEMA_FILE)], env)
        assert dry.returncode == 0, dry.stderr
        assert "predates content digests" in dry.stdout and "700 rows get a _digest" in dry.stdout
        assert "dry run: nothing changed" in dry.stdout
        with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
            assert plan_digests(conn, applicant_schema()).state == "missing"

        # a run stopped after its first batch leaves rows without a digest ...
        class Stop(Exception):
            pass

        def stop(_: int) -> None:
            raise Stop

        with pg.connect(settings.postgres_dsn, autocommit=True, search_path=pg_schema) as conn:
            with pytest.raises(Stop):
                migrate_digests(conn, applicant_schema(), batch_rows=300, progress=stop)
            p = plan_digests(conn, applicant_schema())
            assert (p.state, p.rows) == ("unfilled", 400)
        # ... and the command finishes it
        applied = _cli(["migrate", str(SCHEMA_FILE), "--apply"], env)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert "keyed by (entity, event time, _digest)" in applied.stdout
        again = _cli(["migrate", str(SCHEMA_FILE), "--apply"], env)
        assert again.returncode == 0 and "predates" not in again.stdout

    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        assert _digests(conn) == loaded  # the digests a load gives
        key = conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s",
                           (primary_key_name(NAME),)).fetchone()
        assert key is not None and key[0] == "PRIMARY KEY (application_id, submitted_at, _digest)"
    # a re-load: every event already present; another event at each stored instant: kept
    s = load([path], applicant_schema(), settings, search_path=pg_schema, key_prefix=redis_prefix,
             batch_rows=99)
    assert (s.stored, s.already_present) == (0, 700)
    income = a.column("income_monthly")
    b = a.set_column(a.schema.get_field_index("income_monthly"), a.schema.field("income_monthly"),
                     pc.add(income, pa.scalar(Decimal("1.00"), income.type)).cast(income.type))
    pq.write_table(b, tmp_path / "b.parquet")
    s = load([tmp_path / "b.parquet"], applicant_schema(), settings, search_path=pg_schema,
             key_prefix=redis_prefix)
    assert (s.stored, s.already_present) == (700, 0)
