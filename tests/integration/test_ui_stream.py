"""``features ui`` over a real stream run: a bounded PyFlink job reads a Kafka topic of mixed
events (valid, invalid, undecodable, duplicates) into a fresh Postgres schema, then a real
``features ui`` process shows that run: its stored and rejected figures equal the stores'
counts (the stream writes no ledger rows: the run is found by ``_run_id``), its rejects page
covers exactly the run's rejects by keyset, the decode-failure filter counts the job's own
``_payload.decode`` figure, and a reject's lineage is its ``kafka://topic/partition/offset``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, search_path_dsn
from test_report_browser import find, one
from test_stream import JOB, REDIS_DB
from test_ui import get, num, page
from ui_server import start_ui, stop_ui

from features.config import Settings
from features.ops.examples import applicant_events
from features.stream.kafka import entity_keys, produce

pytestmark = [pytest.mark.services, pytest.mark.flink, pytest.mark.scratch_redis_db(REDIS_DB)]


class StreamSite:
    def __init__(self, url: str, ns: str, settings: Settings, summary: dict[str, Any], topic: str) -> None:
        self.url, self.ns, self.settings, self.summary, self.topic = url, ns, settings, summary, topic

    def sql(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(search_path_dsn(self.settings.postgres_dsn, self.ns), autocommit=True) as conn:
            return conn.execute(query, params).fetchall()


@pytest.fixture()
def stream_site(settings: Settings, pg_schema: str, stream_topic: str,
                tmp_path: Path) -> Iterator[StreamSite]:
    import redis

    url = settings.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    redis.Redis.from_url(url).flushdb()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEATURES_INGEST_TOKENS": "",
           "FEATURES_POSTGRES_DSN": search_path_dsn(settings.postgres_dsn, pg_schema),
           "FEATURES_REDIS_URL": url, "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
    values = applicant_events(1500, seed=11, undecodable_every=150)
    produce(settings.kafka_bootstrap, stream_topic, values, keys=entity_keys(values, "application_id"))
    job = subprocess.run([sys.executable, str(JOB), "--schema", "credit_applicant", "--state-dir",
                          str(tmp_path / "state"), "--json", "--topic", stream_topic, "--bounded",
                          "--batch-size", "400", "--restart-attempts", "0"],
                         env=env, capture_output=True, text=True, timeout=400)
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-4000:]
    summary = json.loads(job.stdout)
    assert summary["read"] == len(values) and summary["rejected"] > 0 and summary["already_present"] > 0

    schemas = tmp_path / "schemas"
    schemas.mkdir()
    shutil.copy(ROOT / "schemas" / "credit_applicant.yaml", schemas)
    proc, ui = start_ui(env["FEATURES_POSTGRES_DSN"], schemas, tmp_path, env=env)
    try:
        yield StreamSite(ui, pg_schema, settings, summary, stream_topic)
    finally:
        stop_ui(proc)


def test_a_stream_run_shows_the_stores_counts_its_rejects_and_kafka_lineage(stream_site: StreamSite) -> None:
    site = stream_site
    run_id = site.summary["run_id"]
    [(stored,)] = site.sql('SELECT count(*) FROM "credit_applicant" WHERE _run_id = %s', [run_id])
    [(rejected,)] = site.sql('SELECT count(*) FROM "credit_applicant__rejects" WHERE _run_id = %s', [run_id])
    # the stores hold what the job reported (duplicates are neither stored nor rejected)
    assert (stored, rejected) == (site.summary["stored"], site.summary["rejected"])

    root = page(site, "/runs?schema=credit_applicant")
    [tr] = [tr for tr in find(root, tag="tr") if tr.attrs.get("data-run") == run_id]
    assert [num(one(tr, cls=c).text()) for c in ("stored", "rejected")] == [stored, rejected]
    assert num(one(tr, cls="read").text()) == stored + rejected  # a stream's read: stored + rejected
    assert one(tr, cls="rate").text() == f"{100 * rejected / (stored + rejected):.2f}%"

    root = page(site, f"/runs/credit_applicant/{run_id}")
    cards = {c: one(one(root, id=f"card-{c}"), cls="n").text() for c in ("stored", "rejected")}
    assert cards == {"stored": f"{stored:,}", "rejected": f"{rejected:,}"}

    seen: list[int] = []
    path = "/rejects?" + urllib.parse.urlencode({"schema": "credit_applicant", "run": run_id})
    while path:  # every page of the run's rejects, by keyset, each id once
        root = page(site, path)
        assert num(one(root, id="total").text()) == rejected
        seen += [int(tr.attrs["data-reject"]) for tr in find(root, tag="tr") if "data-reject" in tr.attrs]
        nxt = find(root, id="next-page")
        path = nxt[0].attrs["href"] if nxt else ""
    assert seen == [i for (i,) in site.sql('SELECT id FROM "credit_applicant__rejects" WHERE _run_id = %s '
                                            "ORDER BY id", [run_id])]

    decode = site.summary["by_rule"]["_payload.decode"]
    root = page(site, "/rejects?" + urllib.parse.urlencode(
        {"schema": "credit_applicant", "run": run_id, "rule": "_payload.decode"}))
    assert num(one(root, id="total").text()) == decode > 0

    [(rid, source)] = site.sql('SELECT id, _source FROM "credit_applicant__rejects" WHERE _run_id = %s '
                               "AND NOT errors @> '[{\"rule\": \"_payload.decode\"}]' ORDER BY id LIMIT 1",
                               [run_id])
    assert source.startswith(f"kafka://{site.topic}/")
    root = page(site, f"/rejects/credit_applicant/{rid}")
    assert one(root, id="source").text() == source
    assert one(root, id="reject-run").text() == run_id
    assert get(site.url + f"/runs/credit_applicant/{run_id}")[0] == 200
