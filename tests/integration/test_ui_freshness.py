"""The UI's Freshness and lag page against real stores: a real load into a fresh Postgres
schema and Redis key prefix, a real topic with a consumer group that committed offsets,
and a real ``features ui`` process on a free port read over HTTP (the figures against the
stores, queried directly here), then one headless Chromium screenshot
(``test-artifacts/ui-freshness.png``). A broker that does not answer and an unknown group
come out as messages on the page. The last test runs a real bounded ``features stream``
and checks the lag the page shows against the offsets its job committed."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, search_path_dsn
from test_report_browser import Element, find, one, parse_dom
from test_ui import get, num, page  # page: any site with a url
from ui_server import start_ui, stop_ui

from features.compile import compile_schema
from features.config import Settings
from features.load import load
from features.ops.examples import applicant_events, applicants
from features.schema import load_schemas
from features.stream.kafka import create_topic, entity_keys, produce

pytestmark = pytest.mark.services

ARTIFACTS = ROOT / "test-artifacts"
STALENESS = "max_staleness: 2h"
COMMITTED = {0: 7, 1: 3}  # the offsets the test's consumer group commits, per partition


@dataclass
class Site:
    url: str
    ns: str
    prefix: str
    settings: Settings
    topic: str
    group: str
    unknown_group: str
    schemas: Path

    def sql(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(search_path_dsn(self.settings.postgres_dsn, self.ns), autocommit=True) as conn:
            return conn.execute(query, params).fetchall()


def section(root: Element, schema: str) -> Element:
    [s] = [e for e in find(root, tag="section") if e.attrs.get("data-schema") == schema]
    return s


def lag_block(root: Element, group: str) -> Element:
    [b] = [e for e in find(root, cls="lag") if e.attrs.get("data-group") == group]
    return b


def serve(schemas: Path, settings: Settings, ns: str, prefix: str, streams: list[str], cwd: Path,
          env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """A real ``features ui`` on a free port with ``--key-prefix`` and ``--stream``s; (the
    process, its base URL)."""
    args = ["--key-prefix", prefix, *(a for s in streams for a in ("--stream", s))]
    return start_ui(search_path_dsn(settings.postgres_dsn, ns), schemas, cwd, *args, env=env)


def schemas_with_staleness(folder: Path) -> Path:
    """credit_applicant.yaml with a ``quality: max_staleness`` of 2 h (its file has none)."""
    folder.mkdir()
    text = (ROOT / "schemas" / "credit_applicant.yaml").read_text()
    assert "\nquality:" not in text
    (folder / "credit_applicant.yaml").write_text(text + f"\nquality:\n  {STALENESS}\n")
    shutil.copy(ROOT / "schemas" / "clicks.yaml", folder)
    return folder


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[Site]:
    import psycopg
    import redis
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient
    from psycopg import sql

    tmp = tmp_path_factory.mktemp("ui_fresh")
    ns, prefix = f"t_uif_{uuid.uuid4().hex[:10]}", f"t_uif_{uuid.uuid4().hex[:10]}:"
    topic, group = f"t_uif_{uuid.uuid4().hex[:8]}", f"t_uif_group_{uuid.uuid4().hex[:8]}"
    schemas = schemas_with_staleness(tmp / "schemas")
    compiled = {name: compile_schema(s) for name, s in load_schemas(schemas).items()}
    data = tmp / "a.parquet"
    pq.write_table(applicants(1500, seed=11, invalid_share=0.1), data, row_group_size=500)
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    kafka = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    proc = None
    try:
        load([data], compiled["credit_applicant"], settings, search_path=ns, key_prefix=prefix)
        create_topic(settings.kafka_bootstrap, topic, partitions=2)
        values = applicant_events(40, seed=3, undecodable_every=0)
        produce(settings.kafka_bootstrap, topic, values, keys=entity_keys(values, "application_id"))
        consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": group,
                             "enable.auto.commit": False})
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in COMMITTED.items()],
                        asynchronous=False)
        consumer.close()
        unknown = f"t_uif_nobody_{uuid.uuid4().hex[:8]}"
        proc, url = serve(schemas, settings, ns, prefix, [f"credit_applicant:{topic}:{group}",
                                                          f"credit_applicant:{topic}:{unknown}"], tmp)
        yield Site(url, ns, prefix, settings, topic, group, unknown, schemas)
    finally:
        if proc is not None:
            stop_ui(proc)
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        admin.close()
        kafka.delete_consumer_groups([group])
        kafka.delete_topics([topic])
        client = redis.Redis.from_url(settings.redis_url)
        keys = list(client.scan_iter(match=prefix + "*", count=10_000))
        if keys:
            client.delete(*keys)
        client.close()


def test_newest_event_and_ingestion_times_equal_the_history_max(site: Site) -> None:
    [(newest, ingested)] = site.sql('SELECT max(submitted_at), max(_ingested_at) FROM "credit_applicant"')
    root = page(site, "/freshness")
    [row] = [tr for tr in find(root, tag="tr") if tr.attrs.get("data-schema") == "credit_applicant"]
    assert one(row, cls="newest-event").text() == f"{newest:%Y-%m-%d %H:%M:%S UTC}"
    s = section(root, "credit_applicant")
    assert one(s, cls="newest-event").text() == f"{newest:%Y-%m-%d %H:%M:%S UTC}"
    assert one(s, cls="newest-ingested").text() == f"{ingested:%Y-%m-%d %H:%M:%S UTC}"
    # the example events are years old: past the schema's max_staleness of 2 h
    assert "stale" in one(s, cls="freshness-badge").text() and "2 h" in one(s, cls="freshness-badge").text()
    # clicks is loaded nowhere here: no table, no figures, no error
    assert "No history table" in one(section(root, "clicks"), cls="no-table").text()
    # both maxima come from an index, not a scan of the table
    for column in ("submitted_at", "_ingested_at"):
        plan = "\n".join(r[0] for r in site.sql(f'EXPLAIN SELECT max("{column}") FROM "credit_applicant"'))
        assert "Index Only Scan Backward" in plan, plan
    assert get(site.url + "/freshness/nope")[0] == 404


def test_redis_coverage_counts_the_hot_hashes_exactly(site: Site) -> None:
    import redis

    [(entities,)] = site.sql('SELECT count(DISTINCT application_id) FROM "credit_applicant"')
    ids = [r[0] for r in site.sql('SELECT DISTINCT application_id FROM "credit_applicant" ORDER BY 1')]
    client = redis.Redis.from_url(site.settings.redis_url)
    keys = [f"{site.prefix}features:credit_applicant:{{{i}}}" for i in ids]
    hot = sum(int(client.exists(k)) for k in keys)
    assert hot == entities > 100  # every stored entity was written hot by the load

    def shown() -> dict[str, int]:
        s = section(page(site, "/freshness/credit_applicant"), "credit_applicant")
        return {c: num(one(s, cls=f"coverage-{c}").text()) for c in ("hot", "entities", "missing")}

    assert shown() == {"hot": hot, "entities": entities, "missing": 0}
    gone = keys[::7]
    client.delete(*gone)
    try:
        assert shown() == {"hot": entities - len(gone), "entities": entities, "missing": len(gone)}
        s = section(page(site, "/freshness/credit_applicant"), "credit_applicant")
        assert one(s, cls="coverage-share").text() == f"{100 * (entities - len(gone)) / entities:.2f}%"
        assert "ok" in one(s, cls="fingerprints").text()
        # a hash left by another version of the schema: the mismatch health reports
        client.hset(keys[1], "_schema_fingerprint", "0" * 64)
        s = section(page(site, "/freshness/credit_applicant"), "credit_applicant")
        verdict = one(s, cls="fingerprints").text()
        assert "MISMATCH" in verdict and "1 hold" in verdict, verdict
    finally:
        client.close()


def test_consumer_lag_per_partition_is_end_minus_committed(site: Site) -> None:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": site.settings.kafka_bootstrap, "group.id": site.group})
    try:
        committed = {tp.partition: tp.offset for tp in c.committed(
            [TopicPartition(site.topic, p) for p in (0, 1)], timeout=10)}
        ends = {p: c.get_watermark_offsets(TopicPartition(site.topic, p), timeout=10)[1] for p in (0, 1)}
    finally:
        c.close()
    assert committed == COMMITTED and sum(ends.values()) == 40
    block = lag_block(page(site, "/freshness"), site.group)
    rows = {int(tr.attrs["data-partition"]): tr for tr in find(block, tag="tr")
            if "data-partition" in tr.attrs}
    assert set(rows) == {0, 1}
    for p, tr in rows.items():
        assert num(one(tr, cls="end").text()) == ends[p]
        assert num(one(tr, cls="committed").text()) == committed[p]
        assert num(one(tr, cls="lag-records").text()) == ends[p] - committed[p]
    assert num(one(block, cls="lag-total").text()) == sum(ends[p] - committed[p] for p in (0, 1))
    assert find(block, cls="lag-error") == []


def test_an_unknown_group_and_a_broker_down_are_messages(site: Site, tmp_path: Path) -> None:
    block = lag_block(page(site, "/freshness"), site.unknown_group)
    assert "has committed no offset" in one(block, cls="lag-error").text()
    assert [one(tr, cls="committed").text() for tr in find(block, tag="tr") if "data-partition" in tr.attrs
            ] == ["—", "—"]

    from features.ops.catalog import Catalog
    from features.ui.app import UIApp
    from features.ui.data import UIData
    from features.ui.freshness import FreshnessReader, Stream

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    compiled = {n: compile_schema(s) for n, s in load_schemas(site.schemas).items()}
    data = UIData(compiled, search_path_dsn(site.settings.postgres_dsn, site.ns))
    for bootstrap, topic, want in ((dead, site.topic, f"Kafka at {dead} is unreachable"),
                                   (site.settings.kafka_bootstrap, "t_uif_no_such_topic", "no topic")):
        reader = FreshnessReader(data, dataclasses.replace(site.settings, kafka_bootstrap=bootstrap),
                                 key_prefix=site.prefix, streams=[Stream("credit_applicant", topic, "g")],
                                 timeout_s=1.0)
        app = UIApp(Catalog({}, {}), data, tokens=None, freshness=reader)
        scope = {"type": "http", "method": "GET", "path": "/freshness", "headers": [], "query_string": b""}
        answer = asyncio.run(app.answer(scope))
        assert answer.status == 200, answer.html[-1000:]
        assert want in one(lag_block(parse_dom(answer.html), "g"), cls="lag-error").text()
    # Redis down: the coverage says so, the rest of the page stands
    reader = FreshnessReader(data, dataclasses.replace(site.settings, redis_url=f"redis://{dead}/0"),
                             key_prefix=site.prefix)
    root = parse_dom(asyncio.run(UIApp(Catalog({}, {}), data, tokens=None, freshness=reader).answer(
        {"type": "http", "method": "GET", "path": "/freshness", "headers": [], "query_string": b""})).html)
    s = section(root, "credit_applicant")
    assert "Redis did not answer" in one(s, cls="redis-error").text()
    assert one(s, cls="newest-event").text() != "—"


def test_browser_screenshot_of_the_freshness_page(site: Site) -> None:
    from report_pages import chromium_driver, save_page
    from selenium.webdriver.common.by import By

    ARTIFACTS.mkdir(exist_ok=True)
    drv = chromium_driver(1280, 1000)
    try:
        drv.get(site.url + "/freshness")
        assert drv.find_element(By.ID, "title").text == "Freshness and lag"
        total = drv.find_element(By.CSS_SELECTOR, f'div.lag[data-group="{site.group}"] .lag-total').text
        assert num(total) == 40 - sum(COMMITTED.values())
        save_page(drv, ARTIFACTS / "ui-freshness.png")
    finally:
        drv.quit()


@pytest.mark.flink  # ~18 s: a PyFlink mini-cluster's start included
def test_lag_of_a_real_stream_job(settings: Settings, pg_schema: str, redis_prefix: str,
                                  stream_topic: str, tmp_path: Path) -> None:
    """A bounded ``features stream`` commits its offsets with its checkpoints; records
    produced after it are its lag, per partition: end offset - committed offset."""
    from confluent_kafka import Consumer, TopicPartition

    schemas = schemas_with_staleness(tmp_path / "schemas")
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "FEATURES_POSTGRES_DSN": search_path_dsn(settings.postgres_dsn, pg_schema)}
    first = applicant_events(300, seed=5, undecodable_every=0)
    produce(settings.kafka_bootstrap, stream_topic, first, keys=entity_keys(first, "application_id"))
    done = subprocess.run([sys.executable, "-m", "features.cli", "stream", "--schema", "credit_applicant",
                           "--schemas-dir", str(schemas), "--topic", stream_topic, "--bounded",
                           "--key-prefix", redis_prefix, "--checkpoint-interval-ms", "500",
                           "--restart-attempts", "0", "--state-dir", str(tmp_path / "state"), "--json"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    more = applicant_events(50, seed=6, undecodable_every=0)
    produce(settings.kafka_bootstrap, stream_topic, more, keys=entity_keys(more, "application_id"))

    from features.flink.stream import default_group_id

    group = default_group_id(str(schemas / "credit_applicant.yaml"), stream_topic)
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": group})
    try:
        committed = {tp.partition: tp.offset for tp in c.committed(
            [TopicPartition(stream_topic, p) for p in (0, 1)], timeout=10)}
        ends = {p: c.get_watermark_offsets(TopicPartition(stream_topic, p), timeout=10)[1] for p in (0, 1)}
    finally:
        c.close()
    assert all(o >= 0 for o in committed.values()), committed  # the job committed with its checkpoints
    proc, url = serve(schemas, settings, pg_schema, redis_prefix, [f"credit_applicant:{stream_topic}"],
                      tmp_path)
    try:
        status, html = get(url + "/freshness/credit_applicant")
    finally:
        stop_ui(proc)
    assert status == 200
    block = lag_block(parse_dom(html), group)
    shown = {int(tr.attrs["data-partition"]): num(one(tr, cls="lag-records").text())
             for tr in find(block, tag="tr") if "data-partition" in tr.attrs}
    assert shown == {p: ends[p] - committed[p] for p in (0, 1)}
    assert sum(shown.values()) >= 50
