"""Quality gates on ``features load`` against the real Postgres and Redis (issue 34): a load
over a ``fail`` gate stores nothing in either store but its rejects and exits 1 naming the
gate, the measured rate and the top reasons; under the gate it stores everything; per-rule
and min-rows gates; ``warn``; ``--check-gates``; a fixed re-run loads; a gate change is no
new data version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from features.compile import compile_schema
from features.config import Settings
from features.ops.examples import EXAMPLE_SCHEMAS, applicants, click_history
from features.schema import load_schema
from features.validation import validate

pytestmark = [pytest.mark.services, pytest.mark.scratch_redis_db(13)]
ROOT = Path(__file__).resolve().parents[2]
REDIS_DB = 13  # a scratch database of its own: the CLI writes keys without a prefix


@pytest.fixture()
def redis_db(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}")
    client.flushdb()
    yield client
    client.flushdb()


def env_for(settings: Settings, pg_schema: str) -> dict[str, str]:
    dsn = settings.postgres_dsn + ("&" if "?" in settings.postgres_dsn else "?") + \
        "options=" + quote(f"-c search_path={pg_schema}")
    url = settings.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    return {**os.environ, "FEATURES_POSTGRES_DSN": dsn, "FEATURES_REDIS_URL": url,
            "PYTHONPATH": str(ROOT)}


def schemas_dir(tmp: Path, name: str, quality: str) -> Path:
    """A schemas folder holding the example schema ``name`` with ``quality`` appended."""
    folder = tmp / "schemas"
    folder.mkdir(exist_ok=True)
    text = (EXAMPLE_SCHEMAS / f"{name}.yaml").read_text()
    (folder / f"{name}.yaml").write_text(text + quality)
    return folder


def features_load(env: dict[str, str], schema: str, folder: Path, paths: list[Path],
                  *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "features.cli", "load", "--no-progress", "--schema", schema,
                           "--schemas-dir", str(folder), *more, *map(str, paths)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def hot_keys(client: redis.Redis, schema: str) -> int:
    """The schema's Redis hashes (entities; with ``schema__aggregates`` or ``__tiles`` those)."""
    return sum(1 for _ in client.scan_iter(match=f"features:{schema}:{{*", count=5_000))


def table_rows(settings: Settings, pg_schema: str) -> dict[str, int]:
    """Rows per table of the test's namespace (featureline's own bookkeeping included)."""
    with psycopg.connect(settings.postgres_dsn) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (pg_schema,))]
        return {n: conn.execute(f'SELECT count(*) FROM "{pg_schema}"."{n}"').fetchone()[0] for n in names}


def expected(table: pa.Table, name: str) -> tuple[int, dict[str, int]]:
    """Rows rejected and rows per rule, by the validator itself (not the loader)."""
    c = validate(table, compile_schema(load_schema(EXAMPLE_SCHEMAS / f"{name}.yaml"))).counts
    return c.rejected_rows, dict(c.by_rule)


def applicant_file(tmp: Path, rows: int, too_rich: int, name: str = "applicants.parquet") -> Path:
    """``rows`` valid applicants, the first ``too_rich`` of them with an income over the
    schema's max (99999999.99): exactly ``too_rich`` rows fail income_monthly.max and nothing else."""
    table = applicants(rows, invalid_share=0.0)
    income = table.column("income_monthly").to_pylist()
    for i in range(too_rich):
        income[i] = income[i].__class__("100000000.00")
    table = table.set_column(table.schema.get_field_index("income_monthly"), "income_monthly",
                             pa.array(income, table.schema.field("income_monthly").type))
    path = tmp / name
    pq.write_table(table, path)
    by_rule = {"income_monthly.max": too_rich} if too_rich else {}
    assert expected(table, "credit_applicant") == (too_rich, by_rule)
    return path


def test_a_load_over_its_reject_rate_gate_stores_nothing_then_loads_once_the_gate_is_raised(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_db: redis.Redis) -> None:
    history = click_history(4_000)
    path = tmp_path / "clicks.parquet"
    pq.write_table(history, path)
    rejected, by_rule = expected(history, "clicks")
    assert rejected / history.num_rows > 0.001  # the example history breaks ~0.4% of its rows
    env = env_for(settings, pg_schema)
    folder = schemas_dir(tmp_path, "clicks", "quality:\n  owner: clicks-team\n  max_reject_rate: 0.001\n")
    proc = features_load(env, "clicks", folder, [path])
    assert proc.returncode == 3, proc.stderr
    rate = f"{rejected / history.num_rows * 100:.4g}%"
    assert (f"load of clicks refused: quality gate max_reject_rate: {rejected:,} of {history.num_rows:,} "
            f"rows rejected = {rate} > limit 0.1% (on_breach: fail)") in proc.stderr
    top_rule, top_count = max(by_rule.items(), key=lambda kv: (kv[1], [-ord(c) for c in kv[0]]))
    assert f"top reasons: {top_rule} ({top_count:,} rows)" in proc.stderr
    assert "nothing was stored in Redis or Postgres" in proc.stderr
    assert "data owner: clicks-team" in proc.stderr
    # nothing stored: no history, no aggregates, no ledger unit, no Redis key (hot values,
    # aggregates, tiles); only the rejects, every one of them
    rows = table_rows(settings, pg_schema)
    assert rows["clicks__rejects"] == rejected
    # (featureline_schemas and _schema_versions record the schema's version, as any load does;
    # featureline_gate_verdicts the verdict: one row per gate, this one refused)
    books = ("featureline_schemas", "featureline_schema_versions", "featureline_gate_verdicts")
    kept = {n: c for n, c in rows.items() if c and n not in books}
    assert kept == {"clicks__rejects": rejected} and rows.get("featureline_ledger", 0) == 0
    assert rows["featureline_gate_verdicts"] == 1
    assert "clicks" in rows and "clicks__aggregates" in rows  # the tables exist, empty
    assert redis_db.dbsize() == 0
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        runs = conn.execute("SELECT DISTINCT _run_id FROM clicks__rejects").fetchall()
        recorded = conn.execute("SELECT fingerprint FROM featureline_schemas").fetchall()
    assert len(runs) == 1 and runs[0][0] in proc.stderr  # the evidence names its run
    # a gate change is not a new data version: the raised gate loads the same files into
    # the stores that recorded the first fingerprint, with no migration
    folder = schemas_dir(tmp_path, "clicks", "quality:\n  owner: clicks-team\n  max_reject_rate: 0.01\n")
    assert compile_schema(load_schema(folder / "clicks.yaml")).fingerprint == recorded[0][0]
    proc = features_load(env, "clicks", folder, [path], "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["adds_up"] and summary["read"] == history.num_rows
    # the refused run's rejects are held: this run counts them already present
    assert summary["rejected"] == 0 and summary["stored"] + summary["already_present"] == history.num_rows
    assert summary["gates"]["passed"] and summary["gates"]["breached"] == []
    rows = table_rows(settings, pg_schema)
    assert rows["clicks"] == summary["stored"] > 0 and rows["clicks__aggregates"] > 0
    assert rows["clicks__rejects"] == rejected and hot_keys(redis_db, "clicks") > 0
    assert hot_keys(redis_db, "clicks__aggregates") > 0


def test_under_the_gate_everything_is_stored(tmp_path: Path, settings: Settings, pg_schema: str,
                                             redis_db: redis.Redis) -> None:
    path = applicant_file(tmp_path, 2_000, 20)  # 1 %
    folder = schemas_dir(tmp_path, "credit_applicant", "quality:\n  max_reject_rate: 0.01\n"
                         "  max_rule_rate:\n    income_monthly.max: 0.01\n  min_rows: 2000\n")
    proc = features_load(env_for(settings, pg_schema), "credit_applicant", folder, [path], "--json")
    assert proc.returncode == 0, proc.stderr  # exactly at the limits: passes
    s = json.loads(proc.stdout)
    assert (s["read"], s["stored"], s["rejected"]) == (2_000, 1_980, 20)
    gates = {g["gate"]: g for g in s["gates"]["gates"]}
    assert gates["max_reject_rate"]["measured"] == 0.01
    assert gates["max_rule_rate[income_monthly.max]"]["measured"] == 0.01
    assert gates["min_rows"]["measured"] == 2_000 and not any(g["breached"] for g in gates.values())
    rows = table_rows(settings, pg_schema)
    assert (rows["credit_applicant"], rows["credit_applicant__rejects"]) == (1_980, 20)
    assert hot_keys(redis_db, "credit_applicant") == 1_980


def test_a_per_rule_gate_refuses_then_a_fixed_file_loads(tmp_path: Path, settings: Settings, pg_schema: str,
                                                         redis_db: redis.Redis) -> None:
    path = applicant_file(tmp_path, 2_000, 21)  # 1.05 % over a 1 % gate, the overall rate unlimited
    folder = schemas_dir(tmp_path, "credit_applicant", "quality:\n  max_reject_rate: 0.5\n"
                         "  max_rule_rate:\n    income_monthly.max: 0.01\n    age.min: 0.0\n")
    env = env_for(settings, pg_schema)
    # --workers N: the gates judge the whole input once, before any worker starts
    proc = features_load(env, "credit_applicant", folder, [path], "--workers", "2")
    assert proc.returncode == 3, proc.stderr
    assert ("quality gate max_rule_rate[income_monthly.max]: 21 of 2,000 rows rejected by income_monthly.max "
            "= 1.05% > limit 1% (on_breach: fail)") in proc.stderr
    assert "max_reject_rate" not in proc.stderr and "age.min" not in proc.stderr  # the gates that held
    assert "top reasons: income_monthly.max (21 rows)" in proc.stderr
    rows = table_rows(settings, pg_schema)
    assert (rows["credit_applicant"], rows["credit_applicant__rejects"], redis_db.dbsize()) == (0, 21, 0)
    # the producer fixes the file in place: the same command loads it (no unit was committed)
    fixed = applicant_file(tmp_path, 2_000, 0)
    assert fixed == path
    proc = features_load(env, "credit_applicant", folder, [path], "--json")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert (s["read"], s["stored"], s["rejected"], s["already_present"]) == (2_000, 2_000, 0, 0)
    assert table_rows(settings, pg_schema)["credit_applicant"] == 2_000
    assert hot_keys(redis_db, "credit_applicant") == 2_000


def test_min_rows_refuses_a_short_load(tmp_path: Path, settings: Settings, pg_schema: str,
                                       redis_db: redis.Redis) -> None:
    path = applicant_file(tmp_path, 500, 0)
    folder = schemas_dir(tmp_path, "credit_applicant", "quality:\n  min_rows: 1000\n")
    proc = features_load(env_for(settings, pg_schema), "credit_applicant", folder, [path])
    assert proc.returncode == 3, proc.stderr
    assert "quality gate min_rows: 500 rows read < minimum 1,000 (on_breach: fail)" in proc.stderr
    rows = table_rows(settings, pg_schema)
    assert (rows["credit_applicant"], rows["credit_applicant__rejects"], redis_db.dbsize()) == (0, 0, 0)


def test_a_warn_gate_stores_everything_and_says_so(tmp_path: Path, settings: Settings, pg_schema: str,
                                                   redis_db: redis.Redis) -> None:
    path = applicant_file(tmp_path, 1_000, 30)
    folder = schemas_dir(tmp_path, "credit_applicant", "quality:\n  on_breach: warn\n"
                         "  max_reject_rate: 0.01\n"
                         "  min_rows: {limit: 10, on_breach: fail}\n")
    proc = features_load(env_for(settings, pg_schema), "credit_applicant", folder, [path])
    assert proc.returncode == 0, proc.stderr
    assert ("quality gate breached (warn: the load is stored): max_reject_rate: 30 of 1,000 rows "
            "rejected = 3% > limit 1%") in proc.stderr
    assert "quality gates: 2 checked, max_reject_rate BREACHED (warn: 3% > 1%)" in proc.stdout
    rows = table_rows(settings, pg_schema)
    assert (rows["credit_applicant"], rows["credit_applicant__rejects"]) == (970, 30)
    assert hot_keys(redis_db, "credit_applicant") == 970


def test_gate_metrics_count_a_warn_breach(tmp_path: Path, settings: Settings, pg_schema: str,
                                          redis_prefix: str) -> None:
    from features.load import load
    from features.observe.metrics import Registry, RunMetrics
    from features.schema import parse_schema

    path = applicant_file(tmp_path, 1_000, 30)
    text = (EXAMPLE_SCHEMAS / "credit_applicant.yaml").read_text()
    compiled = compile_schema(parse_schema(text + "quality:\n  on_breach: warn\n  max_reject_rate: 0.01\n"
                                                  "  max_rule_rate:\n    age.min: 0.5\n"))
    registry = Registry()
    summary = load([path], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix,
                   metrics=RunMetrics(registry, compiled.name))
    assert summary.stored == 970 and summary.gates is not None
    assert summary.gates["breached"] == ["max_reject_rate"]
    text = registry.exposition()
    assert ('featureline_gate_breaches_total{gate="max_reject_rate",on_breach="warn",'
            'schema="credit_applicant"} 1.0') in text
    assert 'featureline_gate_measured{gate="max_reject_rate",schema="credit_applicant"} 0.03' in text
    assert 'featureline_gate_measured{gate="max_rule_rate[age.min]",schema="credit_applicant"} 0.0' in text
    assert 'gate="max_rule_rate[age.min]",on_breach' not in text


def test_check_gates_is_a_dry_run(tmp_path: Path, settings: Settings, pg_schema: str,
                                  redis_db: redis.Redis) -> None:
    path = applicant_file(tmp_path, 1_000, 30)
    env = env_for(settings, pg_schema)
    folder = schemas_dir(tmp_path, "credit_applicant", "quality:\n  max_reject_rate: 0.01\n")
    proc = features_load(env, "credit_applicant", folder, [path], "--check-gates")
    assert proc.returncode == 3, proc.stderr
    assert "BREACHED (fail)  max_reject_rate: 30 of 1,000 rows rejected = 3% > limit 1%" in proc.stdout
    assert "top reasons: income_monthly.max 30" in proc.stdout
    assert "verdict: REFUSED (a fail gate is breached); nothing was stored (dry run)" in proc.stdout
    assert table_rows(settings, pg_schema) == {} and redis_db.dbsize() == 0  # not even a table
    folder = schemas_dir(tmp_path, "credit_applicant", "quality:\n  max_reject_rate: 0.05\n")
    proc = features_load(env, "credit_applicant", folder, [path], "--check-gates", "--json")
    assert proc.returncode == 0, proc.stderr
    verdict: dict[str, Any] = json.loads(proc.stdout)
    assert verdict["passed"] and (verdict["read"], verdict["rejected"]) == (1_000, 30)
    assert verdict["top_reasons"] == [{"rule": "income_monthly.max", "count": 30}]
    assert table_rows(settings, pg_schema) == {} and redis_db.dbsize() == 0


def test_the_parquet_report_shows_the_gates_and_what_load_would_do(tmp_path: Path) -> None:
    from features.report.build import parquet_report, write_report
    from features.schema import parse_schema

    path = applicant_file(tmp_path, 1_000, 30)
    text = (EXAMPLE_SCHEMAS / "credit_applicant.yaml").read_text()
    compiled = compile_schema(parse_schema(text + "quality:\n  owner: risk\n  max_reject_rate: 0.01\n"
                                                  "  max_rule_rate:\n    income_monthly.max: {limit: 0.02, "
                                                  "on_breach: warn}\n  min_rows: 10\n"))
    report = parquet_report([path], compiled, batch_rows=400)
    assert report["schema"]["quality"] == ("max_reject_rate 0.01 (fail), max_rule_rate[income_monthly.max] "
                                           "0.02 (warn), min_rows 10 (fail); owner risk")
    assert report["schema"]["gates_fingerprint"] == compiled.gates_fingerprint
    gates = report["quality_gates"]
    assert (gates["failed"], gates["warned"], gates["read"], gates["rejected"]) == (
        ["max_reject_rate"], ["max_rule_rate[income_monthly.max]"], 1_000, 30)
    assert ("quality gates breached (max_reject_rate): `features load` would refuse this input"
            in report["verdict_reasons"])
    assert any("on_breach: warn (max_rule_rate[income_monthly.max])" in n for n in report["verdict_notes"])
    _, html = write_report(report, tmp_path / "out")
    page = html.read_text()
    assert ("max_reject_rate: BREACHED (fail); max_rule_rate[income_monthly.max]: BREACHED (warn); "
            "min_rows: ok") in page
    plain = compile_schema(parse_schema(text))
    assert parquet_report([path], plain, batch_rows=400)["quality_gates"] is None
