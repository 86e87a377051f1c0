"""``features ui``'s Drift page end to end: a real load of a history whose ``shifted`` field
moves in the recent window while ``stable`` does not (plus a categorical field with hostile
values, a field null in the recent window, an identifier and rows outside both windows),
then a real ``features ui`` process on a free port. The page's PSI and KS per field equal
what :mod:`features.report.drift` computes on the same two windows taken from the loaded
Parquet file with pyarrow; empty windows, a field of nulls and a high-cardinality field
say why they are not compared; bad parameters answer 400 with the reason; hostile category
values come out escaped in the SVG; a headless Chromium screenshot in ``test-artifacts/``."""

from __future__ import annotations

import datetime as dt
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, search_path_dsn
from test_report_browser import Element, find, one, parse_dom
from test_ui import get
from ui_server import ui_namespace

from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.load import load
from features.report.core import Chunk
from features.report.drift import Side, Thresholds, compare
from features.schema import load_schemas

pytestmark = pytest.mark.services

ARTIFACTS = ROOT / "test-artifacts"
SCHEMA = """
name: ui_drift
version: 1.0.0
entity: id
event_time: at
fields:
  - {name: id, type: string, store: [hot, cold], constraints: {required: true}}
  - {name: at, type: "timestamp(us, UTC)", store: cold, constraints: {required: true}}
  - {name: shifted, type: float64, store: cold, constraints: {nullable: true}}
  - {name: stable, type: float64, store: cold, constraints: {nullable: true}}
  - {name: color, type: string, store: cold, constraints: {nullable: true}}
  - {name: gone, type: float64, store: cold, constraints: {nullable: true}}
  - {name: code, type: string, store: cold, constraints: {nullable: true}}
"""
NEWEST = dt.datetime(2026, 3, 10, 12, tzinfo=dt.UTC)
HOSTILE = ['<script>alert("c")</script>', "\"><img src=x onerror=alert(1)>'\x01"]
COLORS = ["red", "green", *HOSTILE]
RECENT, REFERENCE, OLD = 400, 1200, 100


@dataclass
class Site:
    url: str
    ns: str
    settings: Settings
    table: pa.Table  # every row loaded
    compiled: CompiledSchema


def history(rng: np.random.Generator) -> pa.Table:
    """Reference rows over the 7 days before the last 24 h, recent rows over the last 24 h
    (the newest at NEWEST) and older rows outside both windows."""
    def part(n: int, first: dt.datetime, span: dt.timedelta, shift: float, gone: bool, start: int
             ) -> pa.Table:
        offsets = np.sort(rng.uniform(0.001, 0.999, n))
        times = [first + span * float(o) for o in offsets]
        return pa.table({
            "id": [f"e{start + i}" for i in range(n)],
            "at": pa.array(times, pa.timestamp("us", "UTC")),
            "shifted": rng.normal(shift, 1.0, n),
            "stable": rng.normal(5.0, 2.0, n),
            "color": rng.choice(np.array(COLORS, dtype=object), n, p=[0.4, 0.3, 0.2, 0.1]).tolist(),
            "gone": pa.nulls(n, pa.float64()) if gone else pa.array(rng.normal(10, 3, n)),
            "code": [f"c{start + i}" for i in range(n)],
        })

    day = dt.timedelta(days=1)
    recent = part(RECENT - 1, NEWEST - day, day, 1.5, True, 0)
    newest = recent.slice(0, 1).set_column(1, "at", pa.array([NEWEST], pa.timestamp("us", "UTC"))) \
        .set_column(0, "id", pa.array(["newest"])).set_column(6, "code", pa.array(["newest"]))
    reference = part(REFERENCE, NEWEST - 8 * day, 7 * day, 0.0, False, 10_000)
    old = part(OLD, NEWEST - 30 * day, day, 50.0, False, 20_000)
    return pa.concat_tables([reference, recent, newest, old])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("ui_drift")
    schemas = tmp / "schemas"
    schemas.mkdir()
    (schemas / "ui_drift.yaml").write_text(SCHEMA)
    compiled = compile_schema(load_schemas(schemas)["ui_drift"])
    table = history(np.random.default_rng(35))
    path = tmp / "history.parquet"
    pq.write_table(table, path)
    with ui_namespace(settings, "uid") as (ns, prefix, serve):
        assert load([path], compiled, settings, search_path=ns, key_prefix=prefix).rejected == 0
        yield Site(serve(schemas, tmp), ns, settings, table, compiled)


def drift_page(site: Site, query: dict[str, str] | None = None) -> tuple[Element, str]:
    status, html = get(site.url + "/drift/ui_drift" + ("?" + urllib.parse.urlencode(query) if query else ""))
    assert status == 200, html[-2000:]
    root = parse_dom(html)
    assert find(root, tag="script") == []
    return root, html


def summary(root: Element) -> dict[str, Element]:
    """The summary table's rows by field, in page order."""
    return {tr.attrs["data-field"]: tr for tr in find(one(root, id="summary"), tag="tr")
            if "data-field" in tr.attrs}


def expected(site: Site, end: dt.datetime, recent: dt.timedelta, reference: dt.timedelta) -> dict[str, Any]:
    """The report's drift section on the two windows ``(start, end]`` taken from the loaded
    rows with pyarrow (not through the UI or Postgres)."""
    def side(lo: dt.datetime, hi: dt.datetime) -> Side:
        at = site.table.column("at")
        rows = site.table.filter(pc.and_(pc.greater(at, pa.scalar(lo, at.type)),
                                         pc.less_equal(at, pa.scalar(hi, at.type))))
        s = Side(site.compiled)
        for batch in rows.to_batches():
            s.add(Chunk(batch, 0, lambda i: None))
        return s

    ref, rec = side(end - recent - reference, end - recent), side(end - recent, end)
    return {e["field"]: e for e in compare(ref, rec, Thresholds(), {})["fields"]}


def test_psi_and_ks_equal_the_reports_on_the_same_windows(site: Site) -> None:
    root, _ = drift_page(site)
    assert one(one(root, id="card-recent"), cls="n").text() == f"{RECENT:,}"
    assert one(one(root, id="card-reference"), cls="n").text() == f"{REFERENCE:,}"
    assert one(root, id="read-recent").text() == f"all {RECENT:,} rows"
    assert find(root, id="no-index") == []  # the load's DDL made the event-time index
    want = expected(site, NEWEST, dt.timedelta(hours=24), dt.timedelta(days=7))
    rows = summary(root)
    assert set(rows) == set(want)
    for name, e in want.items():
        tr = rows[name]
        assert tr.attrs["data-status"] == e["status"], name
        for stat in ("psi", "ks"):
            if e.get(stat) is None:
                assert f"data-{stat}" not in tr.attrs, (name, stat)
            else:
                shown = float(tr.attrs[f"data-{stat}"])
                assert shown == pytest.approx(e[stat], rel=1e-12, abs=1e-15), (name, stat)
    assert want["shifted"]["status"] == "fail" and want["shifted"]["psi"] > 0.25
    assert want["stable"]["status"] == "ok" and want["color"]["status"] == "ok"
    # the summary is sorted by PSI, compared fields first
    order = list(rows)
    compared = [n for n in order if "data-psi" in rows[n].attrs]
    assert compared[0] == "shifted"
    assert [float(rows[n].attrs["data-psi"]) for n in compared] == sorted(
        (float(rows[n].attrs["data-psi"]) for n in compared), reverse=True)
    assert order[: len(compared)] == compared
    assert one(one(root, id="card-flagged"), cls="n").text() == str(
        sum(e["status"] in ("fail", "warn") for e in want.values()))
    # the reasons of the fields not compared
    why = {n: one(rows[n], cls="why").text() for n in rows}
    assert why["gone"] == f"no values to compare: all {RECENT:,} rows of the recent window are null"
    assert why["code"].startswith("high cardinality:")
    assert why["id"] == "the entity key" and why["at"] == "dates and times are not compared"
    # one SVG chart per compared field
    charts = {s.attrs["data-field"]: s for s in find(root, tag="section") if "data-field" in s.attrs}
    assert set(charts) == set(compared)
    assert all(len(find(s, tag="svg")) == 1 for s in charts.values())
    assert len(find(charts["shifted"], tag="rect")) > 10


def test_other_windows_and_a_sample(site: Site) -> None:
    end = NEWEST - dt.timedelta(days=2)
    query = {"end": end.isoformat(), "recent": "2d", "reference": "3d"}
    root, _ = drift_page(site, query)
    want = expected(site, end, dt.timedelta(days=2), dt.timedelta(days=3))
    rows = summary(root)
    for name in ("shifted", "stable", "color"):
        assert float(rows[name].attrs["data-psi"]) == pytest.approx(want[name]["psi"], rel=1e-12)
    assert rows["shifted"].attrs["data-status"] == "ok"  # both windows before the shift

    root, _ = drift_page(site, {"sample": "100"})
    text = one(root, id="read-reference").text()
    m = re.fullmatch(r"a stratified sample of ([\d,]+) of ([\d,]+) rows", text)
    assert m is not None, text
    assert int(m.group(2).replace(",", "")) == REFERENCE and int(m.group(1).replace(",", "")) == 100
    assert summary(root)["shifted"].attrs["data-status"] == "fail"


def test_empty_windows_say_why(site: Site) -> None:
    root, _ = drift_page(site, {"end": "2020-01-01T00:00:00Z"})
    assert "holds no rows" in one(root, id="empty-recent").text()
    assert "holds no rows" in one(root, id="empty-reference").text()
    rows = summary(root)
    assert one(rows["shifted"], cls="why").text() == (
        "no values to compare: the reference window holds no rows; the recent window holds no rows")
    assert all(tr.attrs["data-status"] == "skipped" for tr in rows.values())
    # a recent window after the newest event: only it is empty
    root, _ = drift_page(site, {"end": (NEWEST + dt.timedelta(days=3)).isoformat(), "recent": "1d",
                                "reference_end": NEWEST.isoformat()})
    assert find(root, id="empty-reference") == []
    assert one(summary(root)["stable"], cls="why").text() == (
        "no values to compare: the recent window holds no rows")


@pytest.mark.parametrize(("query", "message"), [
    ({"recent": "abc"}, "recent must be a duration"),
    ({"reference": "0s"}, "reference must be a duration"),
    ({"sample": "0"}, "sample must be a whole number of rows from 1 to 100,000"),
    ({"sample": "x"}, "sample must be a whole number"),
    ({"end": "yesterday"}, "end must be an ISO 8601 time"),
    ({"reference_end": NEWEST.isoformat()}, "the reference window must end at or before the recent window"),
    ({"bogus": "1"}, "unknown parameter(s) 'bogus'"),
])
def test_bad_parameters_answer_400(site: Site, query: dict[str, str], message: str) -> None:
    status, html = get(site.url + "/drift/ui_drift?" + urllib.parse.urlencode(query))
    assert status == 400, html[-1000:]
    assert message in one(parse_dom(html), id="error").text()
    assert get(site.url + "/drift/nope")[0] == 404


def test_hostile_categories_are_escaped(site: Site) -> None:
    root, html = drift_page(site)
    assert not any(bad in html for bad in ("<script>", "<img", "\x01"))
    [color] = [s for s in find(root, tag="section") if s.attrs.get("data-field") == "color"]
    titles = {t.text() for t in find(color, tag="title")}
    shown = {v.replace("\x01", "\\x01") for v in COLORS}
    assert shown <= titles
    labels = [t.text() for t in find(color, tag="text")]
    assert HOSTILE[0] in labels  # short enough to be shown whole
    assert find(color, tag="img") == []


def test_a_history_without_the_index_gets_it_on_the_next_load(site: Site, tmp_path: Path) -> None:
    """The page says when the event-time index is missing; a load creates it on an older table."""
    import psycopg
    from psycopg import sql

    from features.compile.postgres import event_time_index_name
    from features.ops.catalog import Catalog
    from features.ui.app import UIApp
    from features.ui.data import UIData

    path = tmp_path / "few.parquet"
    pq.write_table(site.table.slice(0, 20), path)
    index = event_time_index_name(site.compiled.schema)
    with ui_namespace(site.settings, "uidx") as (ns, prefix, _):
        load([path], site.compiled, site.settings, search_path=ns, key_prefix=prefix)
        dsn = search_path_dsn(site.settings.postgres_dsn, ns)
        app = UIApp(Catalog({}, {}), UIData({"ui_drift": site.compiled}, dsn), tokens=None)  # in process
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(index)))
            assert 'id="no-index"' in app._page(["drift", "ui_drift"], {}).html
            load([path], site.compiled, site.settings, search_path=ns, key_prefix=prefix)
            [(found,)] = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [index]).fetchall()
        assert found
        assert 'id="no-index"' not in app._page(["drift", "ui_drift"], {}).html


def test_browser_screenshot(site: Site) -> None:
    """Headless Chromium: the schema's page -> its drift; the figures visible; a screenshot."""
    from report_pages import chromium_driver, follow, save_page
    from selenium.webdriver.common.by import By

    ARTIFACTS.mkdir(exist_ok=True)
    drv = chromium_driver(1280, 2400)  # headless: a window shrinks to the page, never grows
    try:
        drv.get(site.url + "/registry/ui_drift")
        follow(drv, drv.find_element(By.ID, "schema-drift"))
        assert drv.find_element(By.ID, "title").text == "Drift of ui_drift"
        assert drv.find_element(By.CSS_SELECTOR, "#card-recent .n").text == f"{RECENT:,}"
        badge = drv.find_element(By.CSS_SELECTOR, 'tr[data-field="shifted"] .badge')
        assert badge.text == "FAIL" and badge.is_displayed()
        save_page(drv, ARTIFACTS / "ui-drift.png", height_js="return document.body.scrollHeight", cap=2400)
    finally:
        drv.quit()


def test_allocate_shares_a_sample_in_proportion() -> None:
    from features.ui.drift import allocate

    assert allocate(10, [5, 5, 0, 10]) == [3, 2, 0, 5]
    rng = np.random.default_rng(7)
    for _ in range(200):
        counts = [int(n) for n in rng.integers(0, 50, int(rng.integers(1, 120)))]
        total = sum(counts)
        if total < 2:
            continue
        sample = int(rng.integers(1, total))
        take = allocate(sample, counts)
        assert sum(take) == sample and all(0 <= t <= n for t, n in zip(take, counts, strict=True))
        assert all(abs(t - sample * n / total) < 1 for t, n in zip(take, counts, strict=True))


@pytest.mark.parametrize(("kind", "arrow_type"),
                         [("timestamp(us)", pa.timestamp("us")), ("date", pa.date32())])
def test_a_naive_or_date_event_time_has_windows_too(site: Site, tmp_path: Path, kind: str,
                                                    arrow_type: pa.DataType) -> None:
    """An event time without a zone (``timestamp(us)``) or a ``date``: the windows' bounds
    compare as UTC wall time; the rows counted are the ones inside them."""
    from features.ops.catalog import Catalog
    from features.schema import load_schema
    from features.ui.app import UIApp
    from features.ui.data import UIData

    (tmp_path / "s.yaml").write_text(SCHEMA.replace('"timestamp(us, UTC)"', f'"{kind}"'))
    compiled = compile_schema(load_schema(tmp_path / "s.yaml"))
    days = [NEWEST.replace(tzinfo=None) - dt.timedelta(days=d) for d in range(20)]
    at = pa.array([d if kind != "date" else d.date() for d in days for _ in range(5)], arrow_type)
    n = len(at)
    table = pa.table({"id": [f"n{i}" for i in range(n)], "at": at, "shifted": np.arange(n, dtype=float),
                      "stable": np.ones(n), "color": ["a"] * n, "gone": np.ones(n), "code": ["x"] * n})
    pq.write_table(table, tmp_path / "t.parquet")
    with ui_namespace(site.settings, "uidn") as (ns, prefix, _):
        load([tmp_path / "t.parquet"], compiled, site.settings, search_path=ns, key_prefix=prefix)
        dsn = search_path_dsn(site.settings.postgres_dsn, ns)
        app = UIApp(Catalog({}, {}), UIData({"ui_drift": compiled}, dsn), tokens=None)
        page = app._page(["drift", "ui_drift"], {"recent": "2d", "reference": "3d"})
        assert page.status == 200, page.html[-1000:]
        root = parse_dom(page.html)
        # (newest - 2d, newest]: the two newest days; (newest - 5d, newest - 2d]: three days
        assert one(one(root, id="card-recent"), cls="n").text() == "10"
        assert one(one(root, id="card-reference"), cls="n").text() == "15"
