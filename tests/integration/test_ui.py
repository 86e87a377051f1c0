"""``features ui`` end to end: real loads into a fresh Postgres schema (and Redis keys under a
prefix of their own), then a real ``features ui`` process on a free port, read over HTTP
(each page's figures against the stores, queried directly), with hostile strings in a
schema, a source name and a reject payload (escaped: no element injected), and in a real
headless Chromium under Selenium following run -> rejects -> filter by rule -> one reject
-> its schema, a screenshot of each page saved in ``test-artifacts/``."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, search_path_dsn
from test_report_browser import Element, find, one, parse_dom
from ui_server import ui_namespace

from features.compile import compile_schema
from features.config import Settings
from features.load import load
from features.ops.examples import applicants
from features.schema import load_schemas

pytestmark = pytest.mark.services

ARTIFACTS = ROOT / "test-artifacts"
HOSTILE_SOURCE = "<script>alert(2)</script>"
HOSTILE_DESCRIPTION = "evil <script>alert('d')</script> \"q\" \x01\x1b end"
HOSTILE_SCHEMA = r"""
name: ui_hostile
version: 1.0.0
description: "evil <script>alert('d')</script> \"q\" \x01\x1b end"
entity: id
event_time: at
fields:
  - name: id
    type: string
    source: "<script>alert(2)</script>"
    store: [hot, cold]
    constraints: {required: true, pattern: "^ok[0-9]+$"}
  - name: at
    type: "timestamp(us, UTC)"
    store: cold
    constraints: {required: true}
  - name: note
    type: string
    store: cold
    description: "<b>bold</b> & \"quotes\""
"""
HOSTILE_IDS = ["ok1", '<script>alert("x")</script>\x01', "ok2", "<img src=x onerror=alert(3)>'\"", "ok3"]
HOSTILE_FOLDER = 'h<script>alert("s")\'q'  # no slash: one folder name


@dataclass
class Site:
    url: str
    ns: str
    settings: Settings
    runs: list[str]  # the two credit_applicant runs, in load order
    hostile_run: str

    def sql(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(search_path_dsn(self.settings.postgres_dsn, self.ns), autocommit=True) as conn:
            return conn.execute(query, params).fetchall()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class HasUrl(Protocol):
    url: str


def page(site: HasUrl, path: str) -> Element:
    """The page at ``path`` of any site's UI: answered 200, parsed, with no script element."""
    status, html = get(site.url + path)
    assert status == 200, (path, html[-2000:])
    root = parse_dom(html)
    assert find(root, tag="script") == [], f"a script element on {path}"
    return root


def num(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("ui")
    schemas = tmp / "schemas"
    schemas.mkdir()
    shutil.copy(ROOT / "schemas" / "credit_applicant.yaml", schemas)
    (schemas / "ui_hostile.yaml").write_text(HOSTILE_SCHEMA)
    compiled = {name: compile_schema(s) for name, s in load_schemas(schemas).items()}
    a, b = tmp / "a.parquet", tmp / "b.parquet"
    pq.write_table(applicants(700, seed=3, invalid_share=0.1), a, row_group_size=250)
    pq.write_table(applicants(500, seed=4, first_id=2 * 10**9, invalid_share=0.1), b)
    (tmp / HOSTILE_FOLDER).mkdir()
    hostile = tmp / HOSTILE_FOLDER / "h.parquet"
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    pq.write_table(pa.table({HOSTILE_SOURCE: HOSTILE_IDS,
                             "at": pa.array([at + dt.timedelta(minutes=i) for i in range(5)],
                                            pa.timestamp("us", "UTC")),
                             "note": ["<b>n</b>", "\x07bell", None, "&amp;", "ok"]}), hostile)
    with ui_namespace(settings, "ui") as (ns, prefix, serve):
        runs = [load([p], compiled["credit_applicant"], settings, search_path=ns, key_prefix=prefix).run_id
                for p in (a, b)]
        hostile_run = load([hostile], compiled["ui_hostile"], settings, search_path=ns,
                           key_prefix=prefix).run_id
        yield Site(serve(schemas, tmp), ns, settings, runs, hostile_run)


def ledger(site: Site, run_id: str) -> tuple[int, int, int, int]:
    [row] = site.sql("SELECT sum(read), sum(stored), sum(already_present), sum(rejected) "
                     "FROM featureline_ledger WHERE run_id = %s", [run_id])
    return tuple(int(x) for x in row)  # type: ignore[return-value]


def rule_counts(site: Site, table: str, run_id: str) -> dict[str, int]:
    """Rejected rows per rule of one run, counted in Python from the rejects table."""
    counts: dict[str, int] = {}
    for (errors,) in site.sql(f'SELECT errors FROM "{table}" WHERE _run_id = %s', [run_id]):
        for rule in {e["rule"] for e in errors}:
            counts[rule] = counts.get(rule, 0) + 1
    return counts


def test_runs_pages_show_the_ledger_and_rejects_counts(site: Site) -> None:
    root = page(site, "/runs")
    rows = {tr.attrs["data-run"]: tr for tr in find(root, tag="tr") if "data-run" in tr.attrs}
    assert set(site.runs) | {site.hostile_run} == set(rows)
    for run_id in [*site.runs, site.hostile_run]:
        read, stored, present, rejected = ledger(site, run_id)
        assert read == stored + present + rejected and rejected > 0
        tr = rows[run_id]
        shown = [num(one(tr, cls=c).text()) for c in ("read", "stored", "present", "rejected")]
        assert shown == [read, stored, present, rejected]
        assert one(tr, cls="rate").text() == f"{100 * rejected / read:.2f}%"

    run_id = site.runs[1]
    read, stored, present, rejected = ledger(site, run_id)
    [(history,)] = site.sql('SELECT count(*) FROM "credit_applicant" WHERE _run_id = %s', [run_id])
    [(stored_rejects,)] = site.sql('SELECT count(*) FROM "credit_applicant__rejects" WHERE _run_id = %s',
                                   [run_id])
    assert (history, stored_rejects) == (stored, rejected)
    root = page(site, f"/runs/credit_applicant/{run_id}")
    cards = {c: one(one(root, id=f"card-{c}"), cls="n").text()
             for c in ("read", "stored", "rejected", "rate")}
    assert cards == {"read": f"{read:,}", "stored": f"{stored:,}", "rejected": f"{rejected:,}",
                     "rate": f"{100 * rejected / read:.2f}%"}
    assert one(one(root, id="card-adds-up"), cls="n").text() == "yes"
    want = sorted(rule_counts(site, "credit_applicant__rejects", run_id).items(),
                  key=lambda kv: (-kv[1], kv[0]))
    shown_reasons = [(tr.attrs["data-rule"], num(find(tr, tag="td")[1].text()))
                     for tr in find(one(root, id="reasons"), tag="tr") if "data-rule" in tr.attrs]
    assert shown_reasons == want[:5]
    assert get(site.url + "/runs/credit_applicant/no-such-run")[0] == 404
    assert get(site.url + "/runs?schema=nope")[0] == 404


def test_rejects_pages_filter_and_page_by_keyset(site: Site) -> None:
    run_id = site.runs[0]
    [(total,)] = site.sql('SELECT count(*) FROM "credit_applicant__rejects"')
    root = page(site, "/rejects?schema=credit_applicant")
    assert num(one(root, id="total").text()) == total
    seen: list[int] = []
    path = "/rejects?" + urllib.parse.urlencode({"schema": "credit_applicant", "run": run_id})
    while path:  # every page of the run's rejects, by keyset, each id once
        root = page(site, path)
        assert num(one(root, id="total").text()) == ledger(site, run_id)[3]
        seen += [int(tr.attrs["data-reject"]) for tr in find(root, tag="tr") if "data-reject" in tr.attrs]
        nxt = find(root, id="next-page")
        path = nxt[0].attrs["href"] if nxt else ""
    want = [i for (i,) in site.sql('SELECT id FROM "credit_applicant__rejects" WHERE _run_id = %s '
                                   "ORDER BY id", [run_id])]
    assert seen == want and len(want) > 50  # more than one page

    counts = rule_counts(site, "credit_applicant__rejects", run_id)
    rule = max(counts, key=lambda r: counts[r])
    field = rule.split(".")[0]
    root = page(site, "/rejects?" + urllib.parse.urlencode({"schema": "credit_applicant", "run": run_id,
                                                           "rule": rule}))
    assert num(one(root, id="total").text()) == counts[rule]
    for tr in (tr for tr in find(root, tag="tr") if "data-reject" in tr.attrs):
        assert rule in {li.attrs["data-rule"] for li in find(tr, tag="li")}
    [(by_field,)] = site.sql('SELECT count(*) FROM "credit_applicant__rejects" WHERE EXISTS (SELECT 1 FROM '
                             "jsonb_array_elements(errors) e WHERE e->>'field' = %s)", [field])
    root = page(site, "/rejects?" + urllib.parse.urlencode({"schema": "credit_applicant", "field": field}))
    assert num(one(root, id="total").text()) == by_field > 0

    [(rid, source, errors)] = site.sql('SELECT id, _source, errors FROM "credit_applicant__rejects" '
                                       "WHERE _run_id = %s ORDER BY id LIMIT 1", [run_id])
    root = page(site, f"/rejects/credit_applicant/{rid}")
    assert one(root, id="source").text() == source
    assert [td.text() for tr in find(one(root, id="errors"), tag="tr") if "data-rule" in tr.attrs
            for td in find(tr, cls="message")] == [e["message"] for e in errors]
    assert one(root, id="reject-schema").attrs["href"] == "/registry/credit_applicant"
    assert get(site.url + "/rejects/credit_applicant/999999999")[0] == 404
    assert get(site.url + "/rejects?schema=credit_applicant&after=x")[0] == 400


def test_registry_pages_show_every_schema(site: Site) -> None:
    from features.schema import load_schema

    root = page(site, "/registry")
    rows = {tr.attrs["data-schema"]: tr for tr in find(root, tag="tr") if "data-schema" in tr.attrs}
    assert set(rows) == {"credit_applicant", "ui_hostile"}
    s = load_schema(ROOT / "schemas" / "credit_applicant.yaml")
    c = compile_schema(s)
    root = page(site, "/registry/credit_applicant")
    assert one(root, id="version").text() == s.version_str
    assert one(root, id="fingerprint").text() == c.fingerprint
    [(version, fp)] = site.sql("SELECT version, fingerprint FROM featureline_schemas WHERE schema_name = %s",
                               ["credit_applicant"])
    assert one(root, id="recorded").text() == f"{version} {fp}"
    fields = [tr.attrs["data-field"] for tr in find(root, tag="tr") if "data-field" in tr.attrs]
    assert fields == [f.name for f in s.fields]
    derived = [tr.attrs["data-feature"] for tr in find(root, tag="tr") if "data-feature" in tr.attrs]
    assert derived == [f.name for f in s.features]
    assert one(root, id="ddl").text() == " ".join(c.ddl.split())
    assert get(site.url + "/registry/nope")[0] == 404


def test_hostile_strings_come_out_escaped(site: Site) -> None:
    for path in ("/registry", "/registry/ui_hostile", "/runs", "/rejects?schema=ui_hostile"):
        status, html = get(site.url + path)
        assert status == 200
        assert not any(bad in html for bad in ("<script>", "<img", "\x01", "\x1b")), path
    shown = HOSTILE_DESCRIPTION.replace("\x01", "\\x01").replace("\x1b", "\\x1b")
    root = page(site, "/registry")
    [tr] = [tr for tr in find(root, tag="tr") if tr.attrs.get("data-schema") == "ui_hostile"]
    assert find(tr, tag="td")[-1].text() == shown
    root = page(site, "/registry/ui_hostile")
    assert one(root, id="description").text() == shown
    [id_row] = [tr for tr in find(root, tag="tr") if tr.attrs.get("data-field") == "id"]
    assert one(id_row, cls="source").text() == HOSTILE_SOURCE
    assert find(root, tag="b") == [] and find(root, tag="img") == []

    rejects = site.sql('SELECT id, _source, raw FROM "ui_hostile__rejects" ORDER BY id')
    assert len(rejects) == 2
    for rid, source, raw in rejects:
        assert HOSTILE_FOLDER in urllib.parse.unquote(source)  # the loader percent-encodes its URI
        root = page(site, f"/rejects/ui_hostile/{rid}")
        assert find(root, tag="img") == []
        assert one(root, id="source").text() == source
        text = one(root, id="raw").text()
        assert any(v in text for v in ('<script>alert(\\"x\\")</script>\\u0001',
                                       "<img src=x onerror=alert(3)>'"))
        assert raw  # the payload is stored, and shown above as JSON text


def test_auth_and_methods() -> None:
    """With tokens every request needs one (401/403), and the UI answers GET only."""
    import asyncio

    from features.ops.catalog import Catalog
    from features.ui.app import UIApp
    from features.ui.data import UIData

    app = UIApp(Catalog({}, {}), UIData({}, "postgresql://unused"), tokens=["s3cret"])

    def status(headers: list[tuple[bytes, bytes]], method: str = "GET") -> int:
        scope = {"type": "http", "method": method, "path": "/healthz", "headers": headers,
                 "query_string": b""}
        return asyncio.run(app.answer(scope)).status

    assert status([]) == 401
    assert status([(b"authorization", b"Basic s3cret")]) == 401
    assert status([(b"authorization", b"Bearer nope")]) == 403
    assert status([(b"authorization", b"Bearer s3cret")]) == 200
    assert status([(b"authorization", b"Bearer s3cret")], "POST") == 405


def test_a_non_loopback_host_needs_a_token(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEATURES_INGEST_TOKENS": ""}
    done = subprocess.run([sys.executable, "-m", "features.cli", "ui", "--host", "0.0.0.0", "--port", "0",
                           "--schemas-dir", str(ROOT / "schemas")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "needs a token" in done.stderr


def test_browser_follows_run_rejects_rule_reject_schema(site: Site) -> None:
    """One headless Chromium session: runs -> one run -> its rejects -> filtered by its top
    rule -> one reject -> its schema; the figures in the DOM equal the stores'; a screenshot
    of each page in test-artifacts/."""
    from report_pages import chromium_driver, follow, save_page
    from selenium.webdriver.common.by import By

    run_id = site.runs[0]
    read, stored, _, rejected = ledger(site, run_id)
    counts = rule_counts(site, "credit_applicant__rejects", run_id)
    rule = max(counts, key=lambda r: (counts[r], r))
    ARTIFACTS.mkdir(exist_ok=True)
    drv = chromium_driver(1280, 1000)

    def shot(name: str) -> None:
        save_page(drv, ARTIFACTS / f"ui-{name}.png")

    def text(css: str) -> str:
        return str(drv.find_element(By.CSS_SELECTOR, css).text)

    try:
        drv.get(site.url + "/runs")
        shot("runs")
        follow(drv, drv.find_element(By.CSS_SELECTOR, f'tr[data-run="{run_id}"] a.run-link'))
        assert text("#card-read .n") == f"{read:,}"
        assert text("#card-stored .n") == f"{stored:,}"
        assert text("#card-rejected .n") == f"{rejected:,}"
        shot("run")
        follow(drv, drv.find_element(By.ID, "run-rejects"))
        assert num(text("#total")) == rejected
        shot("rejects")
        box = drv.find_element(By.ID, "filter-rule")
        box.clear()
        box.send_keys(rule)
        follow(drv, drv.find_element(By.ID, "filter-go"))
        assert num(text("#total")) == counts[rule]
        shot("rejects-rule")
        follow(drv, drv.find_element(By.CSS_SELECTOR, "a.reject-link"))
        rules = [e.get_attribute("data-rule")
                 for e in drv.find_elements(By.CSS_SELECTOR, "#errors tr[data-rule]")]
        assert rule in rules
        assert text("#reject-run") == run_id
        shot("reject")
        follow(drv, drv.find_element(By.ID, "reject-schema"))
        assert text("#title") == "Schema credit_applicant"
        assert text("#fingerprint") == compile_schema(
            load_schemas(ROOT / "schemas")["credit_applicant"]).fingerprint
        shot("schema")
    finally:
        drv.quit()
