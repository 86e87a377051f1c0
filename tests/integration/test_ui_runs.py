"""``features ui``'s Runs pages (issue 35) against real loads in a fresh Postgres schema: the
chart's points are the ledger's figures; a load its ``fail`` gate refused shows its verdict
(each gate: measured vs limit) and is not called a stream; the runs' pages cover every run
exactly once; a freshly created rejects table has its indexes, and a store made before
them gets them on its next load. One headless Chromium session saves the chart and the
refused run's page in test-artifacts/."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, search_path_dsn
from test_report_browser import Element, find, one
from test_ui import get, num, page
from ui_server import ui_namespace

from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.errors import GateBreached
from features.load import load
from features.ops.examples import applicants
from features.schema import load_schemas

pytestmark = pytest.mark.services

ARTIFACTS = ROOT / "test-artifacts"
GATES = "quality:\n  max_reject_rate: 0.08\n  max_rule_rate:\n    income_monthly.max: 0.5\n"


@dataclass
class Site:
    url: str
    ns: str
    settings: Settings
    compiled: dict[str, CompiledSchema]
    loads: list[str]  # the credit_applicant runs stored, in load order
    refused: str  # the credit_applicant run its gate refused

    def sql(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(search_path_dsn(self.settings.postgres_dsn, self.ns), autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description is not None else []


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("ui_runs")
    schemas = tmp / "schemas"
    schemas.mkdir()
    (schemas / "credit_applicant.yaml").write_text(
        (ROOT / "schemas" / "credit_applicant.yaml").read_text() + GATES)
    shutil.copy(ROOT / "schemas" / "clicks.yaml", schemas)  # no run at all: the chart's empty state
    compiled = {name: compile_schema(s) for name, s in load_schemas(schemas).items()}
    files = []
    for i, (rows, share) in enumerate([(400, 0.03), (600, 0.05), (300, 0.02), (500, 0.4)]):
        path = tmp / f"f{i}.parquet"
        pq.write_table(applicants(rows, seed=10 + i, first_id=10**9 + i * 10**6, invalid_share=share), path)
        files.append(path)
    with ui_namespace(settings, "uir") as (ns, prefix, serve):
        ca = compiled["credit_applicant"]
        loads = [load([p], ca, settings, search_path=ns, key_prefix=prefix).run_id for p in files[:3]]
        with pytest.raises(GateBreached) as refused:
            load([files[3]], ca, settings, search_path=ns, key_prefix=prefix)
        yield Site(serve(schemas, tmp), ns, settings, compiled, loads, refused.value.run_id)


def ledger_runs(site: Site) -> dict[str, tuple[int, int, int]]:
    """run -> (read, stored, rejected) summed over its ledger units."""
    return {r: (int(a), int(b), int(c)) for r, a, b, c in site.sql(
        "SELECT run_id, sum(read), sum(stored), sum(rejected) FROM featureline_ledger "
        "WHERE schema_name = 'credit_applicant' GROUP BY run_id")}


def rows_of(root: Element) -> dict[str, Element]:
    return {tr.attrs["data-run"]: tr for tr in find(one(root, id="runs"), tag="tr") if "data-run" in tr.attrs}


def test_the_chart_points_are_the_ledgers_figures(site: Site) -> None:
    root = page(site, "/runs?schema=credit_applicant")
    chart = one(root, id="runs-chart")
    bars = find(chart, tag="rect", cls="bar")
    want = ledger_runs(site)
    assert set(want) == set(site.loads)
    # every run of the schema is a bar, oldest to newest; the refused one stored nothing
    assert [b.attrs["data-run"] for b in bars] == [*site.loads, site.refused]
    for b in bars[:-1]:
        read, stored, rejected = want[b.attrs["data-run"]]
        assert int(b.attrs["data-stored"]) == stored
        assert float(b.attrs["height"]) > 0
    assert int(bars[-1].attrs["data-stored"]) == 0
    rates = {c.attrs["data-run"]: float(c.attrs["data-rate"]) for c in find(chart, tag="circle")}
    for run, (read, _, rejected) in want.items():
        assert rates[run] == pytest.approx(rejected / read, abs=1e-6)
    # bar heights are proportional to the rows stored
    heights = {b.attrs["data-run"]: float(b.attrs["height"]) for b in bars}
    a, b = site.loads[0], site.loads[1]
    assert heights[a] / heights[b] == pytest.approx(want[a][1] / want[b][1], rel=0.02)
    assert find(chart, tag="text", cls="rows-tick") and find(chart, tag="text", cls="time-tick")
    # a schema without a run: the empty state, no chart
    root = page(site, "/runs?schema=clicks")
    assert find(root, id="runs-chart") == [] and one(root, id="chart-empty")
    assert find(page(site, "/runs"), id="runs-chart") == []  # all schemas: choose one


def test_a_refused_load_shows_its_verdict_and_is_not_a_stream(site: Site) -> None:
    [(rejects,)] = site.sql('SELECT count(*) FROM "credit_applicant__rejects" WHERE _run_id = %s',
                            [site.refused])
    verdicts = {g: (m, lim, b, refused, read) for g, m, lim, b, refused, read in site.sql(
        'SELECT gate, measured, "limit", breached, refused, read FROM featureline_gate_verdicts '
        "WHERE run_id = %s", [site.refused])}
    assert set(verdicts) == {"max_reject_rate", "max_rule_rate[income_monthly.max]"}
    read = verdicts["max_reject_rate"][4]
    assert read == 500 and all(v[3] for v in verdicts.values())
    assert verdicts["max_reject_rate"][0] == pytest.approx(rejects / read) and verdicts["max_reject_rate"][2]

    rows = rows_of(page(site, "/runs?schema=credit_applicant"))
    tr = rows[site.refused]
    assert tr.attrs["data-kind"] == "refused" and one(tr, cls="kind").text() == "refused"
    assert one(tr, cls="badge").text() == "refused"
    assert [num(one(tr, cls=c).text()) for c in ("read", "stored", "rejected")] == [read, 0, rejects]
    for run in site.loads:  # judged and passed
        assert rows[run].attrs["data-kind"] == "load" and one(rows[run], cls="badge").text() == "passed"

    root = page(site, f"/runs/credit_applicant/{site.refused}")
    assert one(root, id="verdict").text() == "refused"
    about = one(root, id="run-about").text()
    assert "(refused: its quality gates refused the load" in about and "stream" not in about
    gates = {tr.attrs["data-gate"]: tr for tr in find(one(root, id="gates"), tag="tr")
             if "data-gate" in tr.attrs}
    assert set(gates) == set(verdicts)
    for gate, (measured, limit, breached, _, _) in verdicts.items():
        assert one(gates[gate], cls="measured").text() == f"{100 * measured:.2f}%"
        assert one(gates[gate], cls="limit").text() == f"{100 * limit:.2f}%"
        assert find(gates[gate], tag="td")[-1].text() == ("breached" if breached else "no")
    root = page(site, f"/runs/credit_applicant/{site.loads[0]}")
    assert one(root, id="verdict").text() == "passed"


def test_the_runs_pages_cover_every_run_once(site: Site) -> None:
    from features.ui.data import UIData

    data = UIData(site.compiled, search_path_dsn(site.settings.postgres_dsn, site.ns))
    everything = [*site.loads, site.refused]
    for size in (1, 2, 3, 50):
        first, _ = data.runs_page("credit_applicant", 1, size)
        assert first.total == len(everything) and first.pages == -(-len(everything) // size)
        seen = [r.run_id for n in range(1, first.pages + 1)
                for r in data.runs_page("credit_applicant", n, size)[0].runs]
        assert seen == everything[::-1]  # newest first, each once
        assert data.runs_page("credit_applicant", first.pages + 1, size)[0].runs == []
    # over HTTP: one page holds them all; a bad page number is a 400
    root = page(site, "/runs?schema=credit_applicant")
    assert list(rows_of(root)) == everything[::-1] and num(one(root, id="runs-total").text()) == 4
    assert find(root, id="next-page") == []
    assert get(site.url + "/runs?page=0")[0] == 400 and get(site.url + "/runs?page=x")[0] == 400
    assert rows_of(page(site, "/runs?schema=credit_applicant&page=2")) == {}


def test_the_rejects_table_is_indexed_fresh_and_once_an_old_store_reopens(site: Site) -> None:
    from features.sinks.postgres import PostgresSink

    def indexes() -> dict[str, str]:
        return dict(site.sql("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND "
                             "tablename = 'credit_applicant__rejects'", [site.ns]))

    fresh = indexes()
    assert "USING btree (_run_id, id)" in fresh["credit_applicant__rejects__by_run"]
    assert "USING gin (errors jsonb_path_ops)" in fresh["credit_applicant__rejects__by_error"]
    # a store created before the indexes: its next open builds them
    site.sql('DROP INDEX "credit_applicant__rejects__by_run", "credit_applicant__rejects__by_error"')
    assert set(indexes()) == {"credit_applicant__rejects_pkey", "credit_applicant__rejects__source_key"}
    sink = PostgresSink(site.settings.postgres_dsn, site.compiled["credit_applicant"], search_path=site.ns)
    sink.open()
    sink.close()
    assert indexes() == fresh
    plan = "\n".join(r[0] for r in site.sql(
        "EXPLAIN SELECT id FROM credit_applicant__rejects WHERE _run_id = %s AND id > 0 ORDER BY id LIMIT 51",
        [site.loads[0]]))
    assert "credit_applicant__rejects__by_run" in plan or "Seq Scan" in plan  # a tiny table may scan


def test_browser_shows_the_chart_and_a_refused_run(site: Site) -> None:
    """One headless Chromium session: the chart of credit_applicant's runs, a click on the
    refused run, its gates; screenshots in test-artifacts/."""
    from report_pages import chromium_driver, save_page
    from selenium.webdriver.common.by import By

    ARTIFACTS.mkdir(exist_ok=True)
    drv = chromium_driver(1280, 1000)

    def shot(name: str) -> None:
        save_page(drv, ARTIFACTS / f"ui-{name}.png")

    try:
        drv.get(site.url + "/runs?schema=credit_applicant")
        bars = drv.find_elements(By.CSS_SELECTOR, "#runs-chart rect.bar")
        assert len(bars) == 4 and bars[0].size["height"] > 0
        shot("runs-chart")
        drv.find_element(By.CSS_SELECTOR, f'tr[data-run="{site.refused}"] a.run-link').click()
        assert drv.find_element(By.ID, "verdict").text == "refused"
        assert len(drv.find_elements(By.CSS_SELECTOR, "#gates tr[data-gate]")) == 2
        shot("run-refused")
    finally:
        drv.quit()


def test_stream_runs_are_listed_from_their_run_counts_and_older_ones_from_their_rejects(
        settings: Settings, pg_schema: str) -> None:
    """Stream micro-batches written counted (``featureline_run_counts``) are listed with
    those counts, a run that stored no reject included, and the page reads no history row
    for them; a run written without counts (a stream older than the table, an HTTP
    ingest) is still found by its rejects and its stored rows counted in the history."""
    import datetime as dt

    import psycopg

    from features.kernels import transform_program
    from features.lineage import BatchLineage, RunContext
    from features.pipeline.prepare import process_batch
    from features.sinks.base import WriteUnit
    from features.sinks.postgres import PostgresSink
    from features.sources.base import SourceBatch
    from features.ui.runs import RunIndex

    ca = compile_schema(load_schemas(ROOT / "schemas")["credit_applicant"])
    program = transform_program(ca, settings)
    sink = PostgresSink(settings.postgres_dsn, ca, search_path=pg_schema)
    sink.open()
    n = 300

    def write(run: str, seed: int, share: float, counted: str | None) -> None:
        batch = applicants(n, seed=seed, first_id=10**9 + seed * 10**6, invalid_share=share).to_batches()[0]
        now = dt.datetime.now(dt.UTC)
        ctx = RunContext(ca.name, ca.schema.version_str, ca.fingerprint, run, now)
        prepared = process_batch(SourceBatch(batch, BatchLineage(f"kafka://t/{seed}", 0, n)), ca, program,
                                 ctx, now)
        sink.write(WriteUnit(prepared.rows, prepared.rejects, None, n, counted=counted))

    try:
        write("old", 1, 0.1, None)  # no run counts: found by its rejects
        write("mixed", 2, 0.1, "stream")
        write("clean", 3, 0.0, "stream")
        write("clean", 3, 0.0, "stream")  # a replay of the same records: already present
    finally:
        sink.close()

    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        def history_scans() -> int:  # this transaction's reads of the history table
            row = conn.execute("SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) "
                               "FROM pg_stat_xact_user_tables WHERE relid = 'credit_applicant'::regclass"
                               ).fetchone()
            return int(row[0]) if row else 0

        stored = dict(conn.execute("SELECT _run_id, count(*) FROM credit_applicant GROUP BY 1").fetchall())
        rejected = dict(conn.execute("SELECT _run_id, count(*) FROM credit_applicant__rejects GROUP BY 1"
                                     ).fetchall())
        before = history_scans()
        index = RunIndex(conn, [ca])
        runs = {r.run_id: r for r in index.runs}
        assert [r.run_id for r in index.runs if r.counted] == ["clean", "mixed"]  # newest first
        index.fill([runs["clean"], runs["mixed"]])
        assert history_scans() == before, "the counted runs' figures come from their run counts alone"
        index.fill([runs["old"]])
        assert history_scans() > before  # an uncounted run's stored rows: counted in the history
    for r in runs.values():
        assert r.kind == "stream" and r.adds_up
        assert (r.stored, r.rejected) == (stored.get(r.run_id, 0), rejected.get(r.run_id, 0))
    clean, mixed, old = runs["clean"], runs["mixed"], runs["old"]
    assert (clean.read, clean.rejected, clean.units) == (2 * n, 0, 2) and clean.already_present >= n
    assert (mixed.read, mixed.units) == (n, 1) and mixed.rejected > 0
    assert (old.read, old.already_present, old.units) == (old.stored + old.rejected, 0, 0)
    assert not old.counted and old.rejected > 0
