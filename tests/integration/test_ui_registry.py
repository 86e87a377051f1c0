"""``features ui``'s registry end to end: a schema loaded at 1.0.0 into a fresh Postgres
schema, migrated to 1.1.0 by the code ``features migrate --apply`` runs for Postgres
(:func:`features.ops.migrate.apply_postgres`), while the schemas folder holds 1.2.0; a
view over it with a hostile description. A real ``features ui`` process shows the version
history (both recorded versions), the diff pages (their lines equal ``features schema
diff``'s stdout for the same two YAML texts, verdict and quality gate changes included),
the diff of the held version against the folder's YAML, the GX suite ``features compile``
writes, and the views with links that resolve; a headless Chromium goes registry ->
schema -> diff -> view and saves a screenshot of each page in ``test-artifacts/``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, search_path_dsn
from test_evolution import V1 as EVO_V1
from test_evolution import V2 as EVO_V2
from test_evolution import _parquet, _rows
from test_report_browser import Element, find, one
from test_ui import get, page
from ui_server import ui_namespace

from features.compile import compile_schema
from features.compile.migration import plan_migration
from features.compile.suite import suite_json
from features.config import Settings
from features.load import load
from features.schema.parse import load_schema

pytestmark = pytest.mark.services

ARTIFACTS = ROOT / "test-artifacts"
#: test_evolution's schema under another name: a float and an int field, a hot-only field,
#: an aggregation
V1 = EVO_V1.replace("evo_readings", "ui_reg")
#: compatible (types widened, fields added and moved), plus a quality gate
V2 = EVO_V2.replace("evo_readings", "ui_reg").replace("aggregations:", "quality:\n  max_reject_rate: 0.2\n"
                                                                     "aggregations:")
#: what the schemas folder holds: one more field, a looser gate
V3 = (V2.replace("version: 1.1.0", "version: 1.2.0").replace("max_reject_rate: 0.2", "max_reject_rate: 0.3")
      .replace("quality:", "  - {name: ward, type: string, store: cold, constraints: {nullable: true}}\n"
               "quality:"))
#: a schema never loaded: no history
UNLOADED = """\
name: ui_reg_unloaded
version: 1.0.0
entity: id
event_time: at
fields:
  - {name: id, type: string, store: [hot, cold], constraints: {required: true}}
  - {name: at, type: "timestamp(us, UTC)", store: cold, constraints: {required: true}}
"""
HOSTILE_VIEW_DESCRIPTION = "view <script>alert('v')</script> \"q\" \x01 end"
VIEW = r"""name: ui_reg_view
version: 1.0.0
description: "view <script>alert('v')</script> \"q\" \x01 end"
request:
  keys:
    patient: string
sources:
  - schema: ui_reg
    features: [glucose, trend, readings_1d]
    join: {patient: patient}
    prefix: r_
"""


@dataclass
class Site:
    url: str
    ns: str
    settings: Settings
    files: dict[str, Path]  # v1, v2, v3 (the served folder's)

    def sql(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(search_path_dsn(self.settings.postgres_dsn, self.ns), autocommit=True) as conn:
            return conn.execute(query, params).fetchall()


def raw(el: Element) -> str:
    """An element's text as sent (whitespace kept; parse_dom's ``text`` collapses it)."""
    return "".join(c if isinstance(c, str) else raw(c) for c in el.children)


def cli_diff(old: Path, new: Path, refused: bool = False) -> list[str]:
    """The stdout lines of ``features schema diff OLD NEW`` (exit 1 when ``refused``)."""
    done = subprocess.run([sys.executable, "-m", "features.cli", "schema", "diff", str(old), str(new)],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == (1 if refused else 0), done.stderr
    return done.stdout.splitlines()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[Site]:
    from features.ops.migrate import apply_postgres, plan
    from features.sdk.connections import Connections

    tmp = tmp_path_factory.mktemp("ui_registry")
    files: dict[str, Path] = {}
    for name, text in (("v1", V1), ("v2", V2), ("v3", V3)):
        (tmp / name).mkdir()
        files[name] = tmp / name / "ui_reg.yaml"
        files[name].write_text(text)
    (tmp / "v3" / "ui_reg_unloaded.yaml").write_text(UNLOADED)
    views = tmp / "views"
    views.mkdir()
    (views / "ui_reg_view.yaml").write_text(VIEW)
    data = _parquet(_rows([f"p{i}" for i in range(7)], 6, seed=5), tmp / "a.parquet")
    with ui_namespace(settings, "uireg") as (ns, prefix, serve):
        load([data], compile_schema(load_schema(files["v1"])), settings, search_path=ns, key_prefix=prefix)
        with Connections(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn, search_path=ns,
                         key_prefix=prefix) as store:
            p = plan(store, compile_schema(load_schema(files["v2"])), None)
            assert p.refusal is None and p.migration is not None
            apply_postgres(store, p)
        yield Site(serve(tmp / "v3", tmp, views=views), ns, settings, files)


def history_rows(root: Element) -> list[tuple[str, str]]:
    return [(tr.attrs["data-version"], tr.attrs["data-fingerprint"]) for tr in find(one(root, id="history"),
                                                                                   tag="tr")
            if "data-version" in tr.attrs]


def test_history_lists_both_versions_and_the_diff_is_the_commands(site: Site) -> None:
    recorded = site.sql("SELECT version, fingerprint, migrated_from FROM featureline_schema_versions "
                        "WHERE schema_name = 'ui_reg' ORDER BY version")
    v1, v2 = (compile_schema(load_schema(site.files[v])) for v in ("v1", "v2"))
    assert recorded == [("1.0.0", v1.fingerprint, None), ("1.1.0", v2.fingerprint, v1.fingerprint)]
    root = page(site, "/registry/ui_reg")
    assert history_rows(root) == [("1.0.0", v1.fingerprint), ("1.1.0", v2.fingerprint)]
    [held] = [tr for tr in find(one(root, id="history"), tag="tr") if find(tr, cls="ok")]
    assert held.attrs["data-version"] == "1.1.0"
    links = [a.attrs["href"] for a in find(root, cls="diff-link")]
    assert links == ["/registry/ui_reg/diff?from=1.0.0&to=1.1.0"]

    diff = page(site, links[0])
    assert raw(one(diff, id="diff-text")).splitlines() == cli_diff(site.files["v1"], site.files["v2"])
    want = plan_migration(v1.schema, v2.schema).diff
    assert want.compatible and want.allowed and want.quality
    assert one(one(diff, id="card-compatible"), cls="n").text() == "compatible"
    assert one(one(diff, id="card-allowed"), cls="n").text() == "allowed"
    assert one(one(diff, id="card-changes"), cls="n").text() == str(len(want.changes))
    assert [li.text() for li in find(one(diff, id="quality-changes"), tag="li")] == list(want.quality)
    assert find(diff, id="refusal") == []
    # by fingerprint too, and backwards: a downgrade, breaking without a major version
    back = page(site, f"/registry/ui_reg/diff?from={v2.fingerprint}&to={v1.fingerprint}")
    assert raw(one(back, id="diff-text")).splitlines() == cli_diff(site.files["v2"], site.files["v1"], True)
    refusal = plan_migration(v2.schema, v1.schema).diff.refusal
    assert refusal is not None
    assert one(back, id="refusal").text() == " ".join(f"refused: {refusal}".split())
    assert [one(one(back, id=f"card-{c}"), cls="n").text() for c in ("compatible", "allowed")] == [
        "BREAKING", "refused"]

    # the stores hold 1.1.0, the folder 1.2.0: that diff on the schema page and its own
    assert raw(one(root, id="other-text")).splitlines() == cli_diff(site.files["v2"], site.files["v3"])
    other = page(site, one(root, id="other-link").attrs["href"])
    assert raw(one(other, id="diff-text")).splitlines() == cli_diff(site.files["v2"], site.files["v3"])

    assert get(site.url + "/registry/ui_reg/diff?from=9.9.9&to=1.1.0")[0] == 404
    assert get(site.url + "/registry/ui_reg/diff?from=1.0.0")[0] == 400
    assert get(site.url + "/registry/nope/diff?from=1.0.0&to=1.1.0")[0] == 404


def test_the_gx_suite_is_the_one_compile_writes(site: Site) -> None:
    c = compile_schema(load_schema(site.files["v3"]))
    root = page(site, "/registry/ui_reg")
    suites = {pre.attrs["data-suite"]: raw(pre)
              for d in find(root, tag="details") for pre in find(d, tag="pre")}
    assert c.aggregates_expectations is not None
    assert suites == {"ui_reg.json": suite_json(c.expectations),
                      "ui_reg__aggregates.json": suite_json(c.aggregates_expectations)}


def test_no_history_is_said(site: Site, settings: Settings, pg_schema: str) -> None:
    root = page(site, "/registry/ui_reg_unloaded")
    assert "records no version of ui_reg_unloaded" in one(root, id="history-none").text()
    assert find(root, id="history") == [] and find(root, id="other-title") == []
    # a Postgres schema where nothing was ever loaded: no versions table at all
    from features.ops.catalog import read_catalog
    from features.ui import registry
    from features.ui.data import UIData

    catalog = read_catalog(site.files["v3"].parent, None)
    data = UIData({n: compile_schema(s) for n, s in catalog.schemas.items()},
                  search_path_dsn(settings.postgres_dsn, pg_schema))
    h = registry.history(data, "ui_reg")
    assert (h.table, h.rows, h.held) == (False, [], None)


def test_views_are_listed_with_links_that_resolve(site: Site) -> None:
    from features.views.compile import view_fingerprint
    from features.views.parse import load_views

    root = page(site, "/registry")
    [row] = [tr for tr in find(one(root, id="views"), tag="tr") if "data-view" in tr.attrs]
    assert row.attrs["data-view"] == "ui_reg_view"
    hrefs = [a.attrs["href"] for a in find(row, tag="a")]
    assert hrefs == ["/views/ui_reg_view", "/registry/ui_reg"]
    for href in hrefs:
        page(site, href)
    view = load_views(site.files["v3"].parent.parent / "views",
                      {"ui_reg": load_schema(site.files["v3"]),
                       "ui_reg_unloaded": load_schema(site.files["v3"].parent / "ui_reg_unloaded.yaml")}
                      )["ui_reg_view"]
    root = page(site, "/views/ui_reg_view")
    assert one(root, id="fingerprint").text() == view_fingerprint(view)
    assert [li.attrs["data-column"] for li in find(one(root, id="sources"), tag="li")] == [
        "r_glucose", "r_trend", "r_readings_1d"]
    assert [li.text() for li in find(one(root, id="sources"), tag="li")] == [
        "glucose as r_glucose (field)", "trend as r_trend (field)",
        "readings_1d as r_readings_1d (aggregation)"]
    for a in find(root, tag="a"):
        if a.attrs["href"].startswith("/registry/"):
            page(site, a.attrs["href"])
    schema = page(site, "/registry/ui_reg")
    assert [a.attrs["href"] for a in find(one(schema, id="read-by"), tag="a")] == ["/views/ui_reg_view"]
    assert get(site.url + "/views/nope")[0] == 404

    # the hostile description: escaped, its control character shown as \x01
    shown = HOSTILE_VIEW_DESCRIPTION.replace("\x01", "\\x01")
    assert one(root, id="description").text() == shown
    assert find(row, tag="td")[-1].text() == shown
    for path in ("/registry", "/views/ui_reg_view"):
        status, html = get(site.url + path)
        assert status == 200 and "<script>" not in html and "\x01" not in html, path


def test_browser_registry_schema_diff_view(site: Site) -> None:
    """One headless Chromium session: registry -> the schema -> its diff -> back -> the view
    that reads it; a screenshot of each page in test-artifacts/."""
    from report_pages import chromium_driver, follow, save_page
    from selenium.webdriver.common.by import By

    ARTIFACTS.mkdir(exist_ok=True)
    drv = chromium_driver(1280, 1000)

    def shot(name: str) -> None:
        drv.set_window_size(1280, 600)  # the page's own height, not the last page's
        save_page(drv, ARTIFACTS / f"ui-{name}.png",  # + 200: the window's own frame
                  height_js="return document.body.getBoundingClientRect().height", pad=200)

    try:
        drv.get(site.url + "/registry")
        link = drv.find_element(By.CSS_SELECTOR, 'tr[data-view="ui_reg_view"] a.view-link')
        assert link.text == "ui_reg_view"
        shot("registry")
        follow(drv, drv.find_element(By.CSS_SELECTOR, 'tr[data-schema="ui_reg"] a'))
        assert drv.find_element(By.ID, "title").text == "Schema ui_reg"
        versions = [e.get_attribute("data-version")
                    for e in drv.find_elements(By.CSS_SELECTOR, "#history tr[data-version]")]
        assert versions == ["1.0.0", "1.1.0"]
        shot("schema-history")
        follow(drv, drv.find_element(By.CSS_SELECTOR, "a.diff-link"))
        assert drv.find_element(By.CSS_SELECTOR, "#card-compatible .n").text == "compatible"
        shown = drv.find_element(By.ID, "diff-text").text.splitlines()  # as rendered, lines trimmed
        want = cli_diff(site.files["v1"], site.files["v2"])
        assert [s.strip() for s in shown if s.strip()] == [s.strip() for s in want if s.strip()]
        shot("diff")
        follow(drv, drv.find_element(By.ID, "diff-schema"))
        follow(drv, drv.find_element(By.CSS_SELECTOR, "#read-by a.view-link"))
        assert drv.find_element(By.ID, "title").text == "View ui_reg_view"
        shot("view")
    finally:
        drv.quit()
