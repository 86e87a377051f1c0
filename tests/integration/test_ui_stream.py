"""``features ui`` over a real stream run: a bounded PyFlink job reads a Kafka topic of mixed
events (valid, invalid, undecodable, duplicates) into a fresh Postgres schema, then a real
``features ui`` process shows that run: its stored and rejected figures equal the stores'
counts (the stream writes no ledger rows: its run counts, read = stored + already present +
rejected), its rejects page covers exactly the run's rejects by keyset, the decode-failure
filter counts the job's own ``_payload.decode`` figure, and a reject's lineage is its
``kafka://topic/partition/offset``. A second run over the whole topic again (valid records
added), which stores no reject, is listed too, from its run counts
(``featureline_run_counts``), the first run's records already present. (One test: each
stream job is a PyFlink start.)"""

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
    def __init__(self, url: str, ns: str, settings: Settings, summary: dict[str, Any], topic: str,
                 again: dict[str, Any]) -> None:
        self.url, self.ns, self.settings, self.summary, self.topic = url, ns, settings, summary, topic
        #: the second run's summary: the whole topic again (a new group), valid records added
        self.again = again

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

    def run(state: str, *args: str) -> dict[str, Any]:
        job = subprocess.run([sys.executable, str(JOB), "--schema", "credit_applicant", "--state-dir",
                              str(tmp_path / state), "--json", "--topic", stream_topic, "--bounded",
                              "--batch-size", "400", "--restart-attempts", "0", *args],
                             env=env, capture_output=True, text=True, timeout=400)
        assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-4000:]
        return dict(json.loads(job.stdout))

    summary = run("state")
    assert summary["read"] == len(values) and summary["rejected"] > 0 and summary["already_present"] > 0
    # valid records only, then the whole topic again under another consumer group: a run that
    # stores the new events, rejects nothing new (the old rejects are stored already) and
    # finds the first run's records already present
    more = applicant_events(600, seed=12, undecodable_every=0, invalid_share=0.0)
    produce(settings.kafka_bootstrap, stream_topic, more, keys=entity_keys(more, "application_id"))
    again = run("state-again", "--group-id", f"again-{stream_topic}")
    assert again["read"] == len(values) + len(more) and again["rejected"] == 0 and again["stored"] > 0

    schemas = tmp_path / "schemas"
    schemas.mkdir()
    shutil.copy(ROOT / "schemas" / "credit_applicant.yaml", schemas)
    proc, ui = start_ui(env["FEATURES_POSTGRES_DSN"], schemas, tmp_path, env=env)
    try:
        yield StreamSite(ui, pg_schema, settings, summary, stream_topic, again)
    finally:
        stop_ui(proc)


@pytest.mark.slow
def test_a_stream_run_shows_the_stores_counts_its_rejects_and_kafka_lineage(stream_site: StreamSite) -> None:
    site = stream_site
    run_id = site.summary["run_id"]
    [(stored,)] = site.sql('SELECT count(*) FROM "credit_applicant" WHERE _run_id = %s', [run_id])
    [(rejected,)] = site.sql('SELECT count(*) FROM "credit_applicant__rejects" WHERE _run_id = %s', [run_id])
    # the stores hold what the job reported (duplicates are neither stored nor rejected)
    assert (stored, rejected) == (site.summary["stored"], site.summary["rejected"])

    root = page(site, "/runs?schema=credit_applicant")
    [tr] = [tr for tr in find(root, tag="tr") if tr.attrs.get("data-run") == run_id]
    # the run's counts (featureline_run_counts): read = stored + already present + rejected
    read, present = site.summary["read"], site.summary["already_present"]
    assert tr.attrs["data-kind"] == "stream"
    assert [num(one(tr, cls=c).text()) for c in ("read", "stored", "present", "rejected")] == [
        read, stored, present, rejected]
    assert read == stored + present + rejected
    assert one(tr, cls="rate").text() == f"{100 * rejected / read:.2f}%"

    root = page(site, f"/runs/credit_applicant/{run_id}")
    cards = {c: one(one(root, id=f"card-{c}"), cls="n").text() for c in ("read", "stored", "present",
                                                                         "rejected", "adds-up")}
    assert cards == {"read": f"{read:,}", "stored": f"{stored:,}", "present": f"{present:,}",
                     "rejected": f"{rejected:,}", "adds-up": "yes"}

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
    check_a_run_without_rejects(site)


def check_a_run_without_rejects(site: StreamSite) -> None:
    """The second run stored no reject (the topic's invalid records were rejected by the
    first): the Runs page lists it all the same, from its run counts, not from its rejects;
    its stored rows are the history's rows of that run, the first run's records are
    already present, and its counts add up, as the first run's do."""
    first, again = site.summary["run_id"], site.again["run_id"]
    [(stored,)] = site.sql('SELECT count(*) FROM "credit_applicant" WHERE _run_id = %s', [again])
    assert site.sql('SELECT count(*) FROM "credit_applicant__rejects" WHERE _run_id = %s', [again]) == [(0,)]
    assert stored == site.again["stored"] > 0
    counts = dict(site.sql("SELECT run_id, array[read, stored, already_present, rejected] "
                           "FROM featureline_run_counts WHERE schema_name = 'credit_applicant'"))
    assert set(counts) == {first, again}
    for rid, summary in ((first, site.summary), (again, site.again)):
        read, st, present, rejected = counts[rid]
        assert [read, st, present, rejected] == [summary[k] for k in ("read", "stored", "already_present",
                                                                      "rejected")]
        assert read == st + present + rejected
    assert counts[again][2] >= site.summary["read"]  # every record of the first run, already present

    root = page(site, "/runs?schema=credit_applicant")
    rows = [tr for tr in find(root, tag="tr") if "data-run" in tr.attrs]
    assert [tr.attrs["data-run"] for tr in rows] == [again, first]  # newest first
    tr = rows[0]
    assert tr.attrs["data-kind"] == "stream"
    assert [num(one(tr, cls=c).text()) for c in ("read", "stored", "present", "rejected")] == counts[again]
    root = page(site, f"/runs/credit_applicant/{again}")
    assert one(one(root, id="card-adds-up"), cls="n").text() == "yes"
    assert num(one(one(root, id="card-stored"), cls="n").text()) == stored
