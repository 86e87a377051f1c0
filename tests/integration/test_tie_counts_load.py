"""What ``features validate`` counts before a load is what the load then does (issue 48):
on empty stores, ``already present`` is the exact copies and ``stored`` the events, the
distinct events at one instant all in the history."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from tie_files import tie_files

from features.config import Settings
from features.load import load
from features.ops.examples import applicant_schema
from features.validation.ties import TieCounter

pytestmark = pytest.mark.services


def test_a_first_load_stores_the_events_and_skips_the_exact_copies(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    import pyarrow.parquet as pq

    from features.validation import validate

    compiled = applicant_schema()
    first, second = tie_files(tmp_path)
    ties = TieCounter(compiled)
    for path in (first, second):
        ties.add(validate(pq.read_table(path), compiled).valid)
    counts = ties.counts()
    summary = load([first, second], compiled, settings, batch_rows=64, search_path=pg_schema,
                   key_prefix=redis_prefix)
    assert (summary.read, summary.rejected) == (220, 3)
    assert summary.stored == counts.events == 205
    assert summary.already_present == counts.exact_copies == 12
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        (rows, instants), = conn.execute('SELECT count(*), count(DISTINCT (application_id, submitted_at)) '
                                         'FROM "credit_applicant"').fetchall()
    assert (rows, instants) == (205, 200)
