"""Two loads of one file at once, against the real Postgres and Redis: the first stores
the unit, the second finds it committed (already present) and finishes normally."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from features.compile import CompiledSchema
from features.config import Settings
from features.load import load
from features.ops.examples import applicant_schema, applicants
from features.pipeline.summary import RunSummary

pytestmark = pytest.mark.services


def _blocked_behind(conn: Any, pid: int) -> set[int]:
    """Backends waiting, directly or through another waiter, on ``pid``'s locks."""
    waits = dict(conn.execute("SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity "
                              "WHERE cardinality(pg_blocking_pids(pid)) > 0").fetchall())
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {w for w, by in waits.items() if w not in found and frontier & set(by)}
        found |= frontier
    return found


def test_two_concurrent_loads_of_one_file_store_once_and_both_succeed(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    compiled: CompiledSchema = applicant_schema()
    path = tmp_path / "one.parquet"
    pq.write_table(applicants(1_500, seed=3, first_id=10**9), path)
    dsn_opts = f"-c search_path={pg_schema}"
    with psycopg.connect(settings.postgres_dsn, options=dsn_opts, autocommit=True) as setup:
        setup.execute(compiled.ddl)
    # Hold the history table so both loads have read the (empty) ledger and wait at their
    # COPY, in the same transaction as their ledger claim: the race, made certain.
    gate = psycopg.connect(settings.postgres_dsn, options=dsn_opts)
    gate.execute("LOCK TABLE credit_applicant IN SHARE MODE")
    gate_pid = gate.info.backend_pid
    results: list[RunSummary] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(load([path], compiled, settings, batch_rows=10_000, search_path=pg_schema,
                                key_prefix=redis_prefix))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as watch:
        deadline = time.monotonic() + 120
        while len(_blocked_behind(watch, gate_pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(_blocked_behind(watch, gate_pid)) == 2, "both loads should be waiting"
    gate.rollback()
    gate.close()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    first, second = sorted(results, key=lambda s: -s.stored)
    assert first.read == second.read == 1_500
    assert first.adds_up and second.adds_up
    assert first.stored + first.rejected == 1_500 and first.already_present == 0
    assert (second.stored, second.rejected, second.already_present) == (0, 0, 1_500)
    assert second.skipped_units == second.units == 1
    with psycopg.connect(settings.postgres_dsn, options=dsn_opts) as conn:
        assert conn.execute("SELECT count(*) FROM credit_applicant").fetchone()[0] == first.stored
        assert conn.execute("SELECT count(*) FROM credit_applicant__rejects").fetchone()[0] == first.rejected
        assert conn.execute("SELECT count(*) FROM featureline_ledger").fetchone()[0] == 1
