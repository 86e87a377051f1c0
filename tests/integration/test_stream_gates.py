"""The stream's breaker in its micro-batch step (``StreamProcessor``, what the PyFlink job
runs) against the real Postgres and Redis: a breached ``fail`` gate stores nothing of the
tripping micro-batch but its rejects and names the offsets a restart resumes from; the
same micro-batch replayed with the gate raised stores exactly once; a ``warn`` gate
stores everything and counts the breach (metrics, summary, log); both verdicts are
recorded under the run, which ``features ui`` shows. The PyFlink job itself:
``tests/integration/test_stream.py``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from conftest import search_path_dsn
from test_report_browser import find, one
from test_ui import page
from ui_server import start_ui, stop_ui

from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.errors import GateBreached
from features.lineage import new_run_id
from features.observe.metrics import Registry, RunMetrics, parse_exposition, sample_value
from features.ops.examples import applicant_events
from features.schema import parse_schema
from features.stream.core import StreamProcessor

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "t_gates"


def gated(quality: str) -> CompiledSchema:
    text = (ROOT / "schemas" / "credit_applicant.yaml").read_text()
    return compile_schema(parse_schema(text + quality))


def good_events(n: int, seed: int) -> list[bytes]:
    values = applicant_events(n, seed=seed, invalid_share=0.0, undecodable_every=0, duplicate_share=0.0)
    return [v for v in values if v is not None]


def income_zero(values: list[bytes]) -> list[bytes]:
    """Each rejected by ``income_monthly.min`` (0 < 0.01)."""
    return [json.dumps({**json.loads(v), "income_monthly": 0}).encode() for v in values]


def feed(proc: StreamProcessor, values: list[bytes], first_offset: int) -> None:
    n = len(values)
    proc.process(list(values), pa.array([TOPIC] * n), pa.array([0] * n, pa.int32()),
                 pa.array(range(first_offset, first_offset + n), pa.int64()))


def processor(compiled: CompiledSchema, settings: Settings, pg_schema: str, redis_prefix: str,
              metrics: RunMetrics | None = None) -> StreamProcessor:
    proc = StreamProcessor(compiled, settings, run_id=new_run_id(), dead_letter_topic=None,
                           search_path=pg_schema, key_prefix=redis_prefix, metrics=metrics)
    proc.open()
    return proc


def verdicts(settings: Settings, pg_schema: str, run_id: str) -> list[tuple[object, ...]]:
    """The run's rows of ``featureline_gate_verdicts``: gate, on_breach, breached, measured,
    rows, refused, read, rejected."""
    import psycopg

    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        return conn.execute("SELECT gate, on_breach, breached, measured, rows, refused, read, rejected FROM "
                            "featureline_gate_verdicts WHERE run_id = %s ORDER BY gate", [run_id]).fetchall()


def stored(settings: Settings, pg_schema: str) -> tuple[list[str], list[str]]:
    """The sources of the history rows and of the rejects."""
    import psycopg

    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        rows = [r[0] for r in conn.execute("SELECT _source FROM credit_applicant").fetchall()]
        rejects = [r[0] for r in conn.execute("SELECT _source FROM credit_applicant__rejects").fetchall()]
    return rows, rejects


def test_a_tripped_micro_batch_stores_only_its_rejects_and_a_replay_with_the_gate_raised_is_exact(
        settings: Settings, pg_schema: str, redis_prefix: str, tmp_path: Path) -> None:
    import redis

    quality = ("quality:\n  owner: risk-data\n  max_reject_rate: {}\n  window_records: 200\n"
               "  window_min_records: 100\n")
    good = good_events(400, seed=31)
    first = good[:200]
    burst = [*good[200:250], *income_zero(good[250:350])]     # offsets 200..349, 100 bad
    proc = processor(gated(quality.format(0.25)), settings, pg_schema, redis_prefix)
    try:
        feed(proc, first, 0)
        with pytest.raises(GateBreached) as caught:
            feed(proc, burst, 200)
    finally:
        proc.close()
    message = str(caught.value)
    assert caught.value.gates == ("max_reject_rate",)
    # the window (last 200 records) first holds more than 25% bad at the burst's 51st bad record
    assert "max_reject_rate: 51 of 200 rows rejected = 25.5% > limit 25%" in message, message
    assert f"up to kafka://{TOPIC}/0/300" in message
    assert f"{TOPIC}/0 200" in message and "income_monthly.min (51 records)" in message
    assert "data owner: risk-data" in message
    tripped = proc.stats.gates["tripped"] if proc.stats.gates else None
    assert tripped is not None and tripped["resume_offsets"] == {f"{TOPIC}/0": 200}
    # the tripping verdict, under the run (the window's counts; refused false: records 0..199 are stored)
    assert verdicts(settings, pg_schema, proc.run_id) == [
        ("max_reject_rate", "fail", True, 0.255, 51, False, 200, 51)]
    # features ui: the run is a stream (its rejects), badge "tripped", its gate measured vs limit
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "credit_applicant.yaml").write_text(
        (ROOT / "schemas" / "credit_applicant.yaml").read_text() + quality.format(0.25))
    ui, url = start_ui(search_path_dsn(settings.postgres_dsn, pg_schema), tmp_path / "schemas", tmp_path)
    try:
        site = SimpleNamespace(url=url)
        (tr,) = [tr for tr in find(one(page(site, "/runs"), id="runs"), tag="tr")
                 if tr.attrs.get("data-run") == proc.run_id]
        assert tr.attrs["data-kind"] == "stream" and one(tr, cls="badge").text() == "tripped"
        root = page(site, f"/runs/credit_applicant/{proc.run_id}")
        assert one(root, id="verdict").text() == "tripped"
        (gate,) = [g for g in find(one(root, id="gates"), tag="tr") if g.attrs.get("data-gate")]
        assert gate.attrs["data-gate"] == "max_reject_rate"
        assert (one(gate, cls="measured").text(), one(gate, cls="limit").text()) == ("25.50%", "25.00%")
    finally:
        stop_ui(ui)
    assert proc.stats.summary.read == 200 and proc.stats.summary.adds_up

    rows, rejects = stored(settings, pg_schema)
    assert sorted(rows) == sorted(f"kafka://{TOPIC}/0/{i}" for i in range(200))  # nothing of the burst
    assert sorted(rejects) == sorted(f"kafka://{TOPIC}/0/{i}" for i in range(250, 350))  # its evidence
    burst_entities = {json.loads(v)["application_id"] for v in good[200:250]} - {
        json.loads(v)["application_id"] for v in first}
    client = redis.Redis.from_url(settings.redis_url)
    assert burst_entities and not any(client.exists(f"{redis_prefix}features:credit_applicant:{{{e}}}")
                                      for e in burst_entities)

    # the gate raised (not a new data version: the same tables), the micro-batch replayed
    raised = gated(quality.format(0.9))
    assert raised.fingerprint == proc.compiled.fingerprint
    again = processor(raised, settings, pg_schema, redis_prefix)
    try:
        feed(again, burst, 200)
    finally:
        again.close()
    rows, rejects = stored(settings, pg_schema)
    assert sorted(rows) == sorted(f"kafka://{TOPIC}/0/{i}" for i in range(250))
    assert sorted(rejects) == sorted(f"kafka://{TOPIC}/0/{i}" for i in range(250, 350))  # once each
    assert all(client.exists(f"{redis_prefix}features:credit_applicant:{{{e}}}") for e in burst_entities)
    s = again.stats.summary
    # the rejects stored at the trip count as already present now (the rejects table held them)
    assert (s.read, s.stored, s.rejected + s.already_present) == (150, 50, 100) and s.adds_up
    assert again.stats.gates is not None
    assert again.stats.gates["tripped"] is None


def test_a_breached_warn_gate_stores_everything_and_reports_it(settings: Settings, pg_schema: str,
                                                               redis_prefix: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    compiled = gated("quality:\n  on_breach: warn\n  max_rule_rate:\n    income_monthly.min: 0.1\n"
                     "  window_records: 100\n  window_min_records: 100\n")
    registry = Registry()
    good = good_events(300, seed=32)
    proc = processor(compiled, settings, pg_schema, redis_prefix,
                     metrics=RunMetrics(registry, "credit_applicant", stream=True))
    values = [*good[:80], *income_zero(good[80:120]), *good[120:200]]
    try:
        with caplog.at_level(logging.WARNING, logger="features.stream"):
            feed(proc, values[:100], 0)
            feed(proc, values[100:], 100)
    finally:
        proc.close()
    s = proc.stats.summary
    assert (s.read, s.stored, s.rejected) == (200, 160, 40) and s.adds_up
    gates = proc.stats.as_dict()["gates"]
    assert gates["breached_batches"] == {"max_rule_rate[income_monthly.min]": 2}
    # judged at each micro-batch's first breach: the first full window (records 0..99: 20 bad)
    # = 20%, then the window at record 100 (1..100: 21 bad) = 21%
    assert gates["worst"]["max_rule_rate[income_monthly.min]"] == pytest.approx(0.21)
    assert gates["tripped"] is None
    assert gates["last_breach"]["breached"] == ["max_rule_rate[income_monthly.min]"]
    samples = parse_exposition(registry.exposition())
    assert sample_value(samples, "featureline_gate_breaches_total", schema="credit_applicant",
                        gate="max_rule_rate[income_monthly.min]", on_breach="warn") == 2
    warned = [r for r in caplog.records if "quality gate breached (warn)" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]   # logged when the breach starts
    rows, rejects = stored(settings, pg_schema)
    assert len(rows) == 160 and len(rejects) == 40
    # recorded where the breach started (the first micro-batch: 20 of 100), not again while it lasted
    assert verdicts(settings, pg_schema, proc.run_id) == [
        ("max_rule_rate[income_monthly.min]", "warn", True, 0.2, 20, False, 100, 20)]
