"""``POST /v1/views/{name}/online`` (docs/views.md, "Over HTTP") on a real ``features serve``
process over the real stores the loader filled (the worked example ``docs/examples/fraud``):
auth, 404/405/400/422/503, a batch request equal to the SDK's rows, the latency histogram,
and SIGTERM under load (every request sent before it answered 200, exit 0)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import redis
from test_serve import TOKENS, serve
from test_views import EXAMPLE, VIEW, generate, load_history

from features import FeatureStore
from features.config import Settings
from features.observe.metrics import parse_exposition, sample_value
from features.serve.app import _json_value

pytestmark = [pytest.mark.services, pytest.mark.scratch_redis_db(3)]
AUTH = {"Authorization": f"Bearer {TOKENS[0]}", "Content-Type": "application/json"}
#: the Redis database these tests own (the server reads without a key prefix)
DB = 3
ROUTE = f"/v1/views/{VIEW}/online"


def _db_url(url: str, db: int) -> str:
    base = url.rsplit("/", 1)[0] if url.count("/") > 2 else url
    return f"{base}/{db}"


@pytest.fixture()
def stores(tmp_path: Path, settings: Settings, pg_schema: str) -> Iterator[Settings]:
    """The example's three schemas loaded (seed 7) into the test's Postgres schema and
    Redis database DB (emptied before and after)."""
    on_db = dataclasses.replace(settings, redis_url=_db_url(settings.redis_url, DB))
    client = redis.Redis.from_url(on_db.redis_url)
    client.flushdb()
    load_history(tmp_path, generate(7), on_db, pg_schema, "", 7)
    yield on_db
    client.flushdb()
    client.close()


def _env(settings: Settings, pg_schema: str, **over: str) -> dict[str, str]:
    sep = "&" if "?" in settings.postgres_dsn else "?"
    out = {k: v for k, v in os.environ.items() if not k.startswith("FEATURES_")}
    dsn = f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}"
    return {**out, "FEATURES_POSTGRES_DSN": dsn,
            "FEATURES_REDIS_URL": settings.redis_url, "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "FEATURES_INGEST_TOKENS": ",".join(TOKENS), **over}


def _args() -> tuple[str, ...]:
    return ("--schemas", str(EXAMPLE / "schemas"), "--views", str(EXAMPLE / "views"), "--no-ingest")


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"card_id": f"c{i % 130}", "merchant_id": 1 + i % 33, "amount": i + 0.5} for i in range(n)]


def test_the_view_endpoint_end_to_end(tmp_path: Path, stores: Settings, pg_schema: str) -> None:
    rows = _rows(60)
    with serve(tmp_path, _env(stores, pg_schema), *_args()) as server:
        # auth, method, route, body
        assert server.request("POST", ROUTE, b'{"rows": []}')[0] == 401
        assert server.request("POST", ROUTE, b'{"rows": []}', {"Authorization": "Bearer nope"})[0] == 403
        assert server.request("GET", ROUTE, None, AUTH)[0] == 405
        status, _, body = server.request("POST", "/v1/views/nope/online", b'{"rows": []}', AUTH)
        assert status == 404 and body["views"] == [VIEW]
        assert server.request("POST", ROUTE, b"{not json", AUTH)[0] == 400
        assert server.request("POST", ROUTE, b'{"rows": [1, 2]}', AUTH)[0] == 400
        # every field error of every bad row
        bad = [{"card_id": "c1", "merchant_id": 2, "amount": -1},
               {"card_id": "x!", "merchant_id": "seven", "amount": "1.00"}, rows[0]]
        status, _, body = server.request("POST", ROUTE, json.dumps({"rows": bad}).encode(), AUTH)
        assert status == 422, body
        assert body["rejected"] == 2
        assert {(e["row"], e["field"]) for e in body["errors"]} == {
            (0, "amount"), (1, "merchant_id"), (1, "amount")}  # a key is checked for its type only
        assert all(e["message"].startswith(f"field {e['field']} ") for e in body["errors"])
        # a batch: the SDK's rows, as JSON (decimals as text, times in ISO 8601)
        status, headers, body = server.request("POST", ROUTE, json.dumps({"rows": rows}).encode(),
                                               {**AUTH, "X-Request-Id": "req-views-1"})
        assert status == 200, body
        assert headers["x-request-id"] == "req-views-1"
        assert body["view"] == VIEW and body["version"] == "1.0.0"
        with FeatureStore(redis_url=stores.redis_url, postgres_dsn=stores.postgres_dsn,
                          schemas=EXAMPLE / "schemas", views=EXAMPLE / "views", search_path=pg_schema,
                          fill=False) as fs:
            sdk = fs.online_view_dicts(VIEW, [{**r, "amount": Decimal(str(r["amount"]))} for r in rows])
        want = json.loads(json.dumps(sdk, default=_json_value))
        assert body["rows"] == want
        assert sum(r["card_txn._found"] for r in body["rows"]) > 30
        # by default the windows are evaluated now, weeks after every transaction: all empty
        assert [r["card_txn_count_24h"] for r in body["rows"]] == [0] * len(rows)
        assert [r["card_amount_sum_24h"] for r in body["rows"]] == ["0.00"] * len(rows)
        per_event = json.dumps({"rows": rows, "windows": "event"}).encode()
        status, _, stale = server.request("POST", ROUTE, per_event, AUTH)
        assert status == 200, stale
        assert any(r["card_txn_count_24h"] for r in stale["rows"])  # as of each card's newest event
        _request_time_windows(server, stores, pg_schema, rows, stale["rows"])
        # one row, keep-alive: the latency histogram counts the route
        conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
        one = json.dumps({"rows": rows[:1]}).encode()
        for _ in range(20):
            conn.request("POST", ROUTE, one, AUTH)
            r = conn.getresponse()
            assert r.status == 200
            r.read()
        conn.close()
        status, _, text = server.request("GET", "/metrics")
        count = sample_value(parse_exposition(text), "featureline_ingest_request_seconds_count",
                             route="/v1/views/{name}/online")
        assert count is not None and count >= 22


def _request_time_windows(server: Any, stores: Settings, pg_schema: str, rows: list[dict[str, Any]],
                          stale: list[dict[str, Any]]) -> None:
    """``"windows": "request_time"`` and ``"at"``: the SDK's rows at that instant (inside
    the history: rows newer than it re-read as of it; two days after it: every 24-hour
    window empty, where ``"windows": "event"`` keeps the values of the newest event); bad
    values are 400s."""
    decimal_rows = [{**r, "amount": Decimal(str(r["amount"]))} for r in rows]
    with FeatureStore(redis_url=stores.redis_url, postgres_dsn=stores.postgres_dsn,
                      schemas=EXAMPLE / "schemas", views=EXAMPLE / "views", search_path=pg_schema,
                      fill=False) as fs:
        for at in ("2026-10-27T13:30:00+00:00", "2026-11-03T00:00:00Z", "2026-10-31T23:00:00"):
            when = dt.datetime.fromisoformat(at.replace("Z", "+00:00"))
            when = when if when.tzinfo else when.replace(tzinfo=dt.UTC)
            payload = {"rows": rows, "windows": "request_time", "at": at}
            status, _, body = server.request("POST", ROUTE, json.dumps(payload).encode(), AUTH)
            assert status == 200, body
            sdk = fs.online_view_dicts(VIEW, decimal_rows, windows="request_time", at=when)
            assert body["rows"] == json.loads(json.dumps(sdk, default=_json_value)), at
            counts = [r["card_txn_count_24h"] for r in body["rows"]]
            if when > dt.datetime(2026, 11, 2, tzinfo=dt.UTC):  # after every event: all windows empty
                assert counts == [0] * len(rows)
                assert any(r["card_txn_count_24h"] for r in stale)
            else:
                assert any(counts), at
    for bad, says in (({"windows": "now"}, "windows must be one of"), ({"windows": 7}, '"windows" must be'),
                      ({"windows": "request_time", "at": "yesterday"}, '"at" must be an ISO 8601'),
                      ({"windows": "event", "at": "2026-10-27T13:30:00Z"}, "at= is the request time")):
        status, _, body = server.request("POST", ROUTE, json.dumps({"rows": rows[:2], **bad}).encode(), AUTH)
        assert status == 400 and says in body["error"], (bad, body)


def test_stores_down_is_503(tmp_path: Path, stores: Settings, pg_schema: str) -> None:
    env = _env(stores, pg_schema, FEATURES_REDIS_URL="redis://127.0.0.1:1/0",
               FEATURES_POSTGRES_DSN="postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    with serve(tmp_path, env, *_args()) as server:
        status, headers, body = server.request("POST", ROUTE, json.dumps({"rows": _rows(2)}).encode(), AUTH)
    assert status == 503, body
    assert headers.get("retry-after") == "1" and "127.0.0.1:1" in body["error"]


def test_sigterm_under_load_answers_every_request(tmp_path: Path, stores: Settings, pg_schema: str) -> None:
    payload = json.dumps({"rows": _rows(5)}).encode()
    answers: list[int] = []
    errors: list[str] = []
    stop = threading.Event()
    with serve(tmp_path, _env(stores, pg_schema), *_args()) as server:
        def client() -> None:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
            try:
                while not stop.is_set():
                    try:
                        conn.request("POST", ROUTE, payload, AUTH)
                    except OSError:
                        return  # the server closed: nothing was sent
                    try:
                        r = conn.getresponse()
                        r.read()
                        answers.append(r.status)
                    except (OSError, http.client.HTTPException) as exc:  # sent, never answered: a loss
                        errors.append(repr(exc))
                        return
                    if r.getheader("connection", "").lower() == "close":
                        conn.close()
                        conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
            finally:
                conn.close()  # never left to the collector (an unclosed socket's ResourceWarning)

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        served_before = len(answers)
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(60)
        stop.set()
        for t in threads:
            t.join(30)
    assert code == 0, server.log.read_text()[-3000:]
    assert served_before > 20, (served_before, errors)
    assert set(answers) == {200}, (sorted(set(answers)), errors)
    # a request the server read before it stopped was answered; one sent into a closing
    # connection may see it close (http.client raises RemoteDisconnected) without a status
    assert all("RemoteDisconnected" in e or "Connection reset" in e for e in errors), errors


def test_hostile_and_oversized_bodies_are_refused_in_one_line(tmp_path: Path, stores: Settings,
                                                              pg_schema: str) -> None:
    """Rows per request are bounded (413 naming --max-view-rows, before a body of many small
    objects becomes dicts), a 422 lists the first --max-errors errors with values cut, and
    nesting, lone surrogates, a non-boolean lineage and a body that is not JSON are 400/415
    answered in one log line each, never a 500."""
    with serve(tmp_path, _env(stores, pg_schema), *_args(), "--max-view-rows", "50",
               "--max-errors", "5") as server:
        def post(body: bytes, ctype: str = "application/json") -> tuple[int, dict[str, Any]]:
            status, _, out = server.request("POST", ROUTE, body, {**AUTH, "Content-Type": ctype})
            return status, out

        assert post(json.dumps({"rows": _rows(50)}).encode())[0] == 200
        status, out = post(json.dumps({"rows": _rows(51)}).encode())
        assert status == 413 and out["max_view_rows"] == 50 and "--max-view-rows" in out["error"], out
        status, out = post(b'{"rows": [' + b",".join([b"{}"] * 2_000_000) + b"]}")  # 6 MB of {}
        assert status == 413, out
        # 40 bad rows (a key of the wrong type), one value 100,000 characters long: 5 listed, cut
        bad = [{"card_id": "c1", "merchant_id": "s" * 100_000 if i == 3 else "seven", "amount": 1.0}
               for i in range(40)]
        status, out = post(json.dumps({"rows": bad}).encode())
        assert status == 422 and out["rejected"] == 40, out
        assert len(out["errors"]) == 5 and out["errors_total"] == 40 and out["errors_truncated"] is True
        assert max(len(json.dumps(e)) for e in out["errors"]) < 1000
        assert any("(100,000 characters)" in str(e["value"]) for e in out["errors"]), out["errors"]
        for body in [b'{"rows": ' + b"[" * 1_200 + b"]" * 1_200 + b"}",
                     b'{"rows": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                     b'{"rows": [{"card_id": "\\ud800", "merchant_id": 1, "amount": 1.0}]}',
                     b'{"rows": [{"card_id\\udfff": "c1", "merchant_id": 1, "amount": 1.0}]}',
                     b'{"rows": [], "lineage": "false"}', b'{"rows": [], "lineage": 1}']:
            status, out = post(body)
            assert status == 400, (body[:60], out)
            assert out["error"] and "Traceback" not in out["error"]
        assert post(b'{"rows": [], "lineage": true}')[0] == 200
        # a pair of surrogates is one character (U+1F600): a key like any other
        status, out = post(b'{"rows": [{"card_id": "c\\ud83d\\ude00", "merchant_id": 1, "amount": 1.0}]}')
        assert status == 200 and out["rows"][0]["card_id"] == "c\U0001f600", out
        status, out = post(json.dumps({"rows": _rows(1)}).encode(), "text/plain")
        assert status == 415 and "application/json" in out["error"], out
        assert post(json.dumps({"rows": _rows(1)}).encode(), "application/json; charset=utf-8")[0] == 200
    log = server.log.read_text()
    assert "Traceback" not in log and " 500" not in log, log[-3000:]


#: card_txn 1.1.0: a compatible change of the example's schema (a nullable field, an
#: aggregation, and ``amount`` widened from decimal(12,2) to decimal(14,2))
CARD_TXN_1_1 = ((EXAMPLE / "schemas" / "card_txn.yaml").read_text()
                .replace("version: 1.0.0", "version: 1.1.0")
                .replace("    type: decimal(12,2)\n", "    type: decimal(14,2)\n")
                .replace("aggregations:\n",
                         "  - name: channel\n    type: string\n    store: [hot, cold]\n"
                         "    constraints:\n      nullable: true\naggregations:\n")
                + "    - name: amount_max_24h\n      function: max\n      of: amount\n      window: 24h\n"
                  "      store: [hot, cold]\n")


def test_a_running_view_server_keeps_serving_across_a_compatible_migration(
        tmp_path: Path, stores: Settings, pg_schema: str) -> None:
    """Issue 45 item 5: `features migrate NEW --apply` of a compatible change while a
    `features serve --no-ingest` still holds the old schema files: every view request
    before, during and after it answers 200 with the same rows (the server reads the newer
    layout in its own types), and a row a writer of the new version stores is served too."""
    new = tmp_path / "v11" / "card_txn.yaml"
    new.parent.mkdir()
    new.write_text(CARD_TXN_1_1)
    env = _env(stores, pg_schema)
    rows = _rows(60)
    payload = json.dumps({"rows": rows}).encode()
    with serve(tmp_path, env, *_args()) as server:
        status, _, before = server.request("POST", ROUTE, payload, AUTH)
        assert status == 200, before
        migrated = subprocess.run([sys.executable, "-m", "features.cli", "migrate", str(new), "--apply"],
                                  env=env, capture_output=True, text=True, timeout=300)
        assert migrated.returncode == 0, migrated.stdout[-2000:] + migrated.stderr[-2000:]
        assert "1.1.0" in migrated.stdout
        status, _, after = server.request("POST", ROUTE, payload, AUTH)
        assert status == 200, after
        assert after["rows"] == before["rows"]
        # a card the new version writes (with the new field and a widened amount that
        # still fits the old type), read by the old server from its v1.1.0 hash
        with FeatureStore(redis_url=stores.redis_url, postgres_dsn=stores.postgres_dsn,
                          schemas=new, search_path=pg_schema, fill=False) as fs:
            wrote = fs.write("card_txn", pa.table({
                "txn_id": ["t-new-1"], "card_id": ["c999"],
                "ts": pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC)], pa.timestamp("us", "UTC")),
                "amount": pa.array([Decimal("12.34")], pa.decimal128(14, 2)), "channel": ["web"]}),
                run_id="v11-writer")
        assert wrote.stored == 1, wrote
        one = json.dumps({"rows": [{"card_id": "c999", "merchant_id": 1, "amount": 1.0}]}).encode()
        status, _, body = server.request("POST", ROUTE, one, AUTH)
        assert status == 200, body
        assert body["rows"][0]["card_txn._found"] is True and body["rows"][0]["card_amount"] == "12.34"
    assert "newer version" not in server.log.read_text()


def test_sigterm_answers_the_requests_it_holds(tmp_path: Path, stores: Settings, pg_schema: str) -> None:
    """Requests the server provably holds when SIGTERM comes are answered 200, none dropped:
    each asks for cards no store holds (Redis misses: the Postgres fallback), and a lock
    this test holds on ``card_txn`` keeps that read waiting, seen in ``pg_stat_activity``,
    until after the signal; then the lock goes and every one of them must be answered."""
    import psycopg

    k = 3
    answers: list[int] = []
    errors: list[str] = []
    with serve(tmp_path, _env(stores, pg_schema), *_args()) as server, \
            psycopg.connect(stores.postgres_dsn, options=f"-c search_path={pg_schema}") as lock:
        assert server.request("POST", ROUTE, json.dumps({"rows": _rows(2)}).encode(), AUTH)[0] == 200
        lock.execute("LOCK TABLE card_txn IN ACCESS EXCLUSIVE MODE")  # held until the commit below
        pid = lock.info.backend_pid

        def client(i: int) -> None:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
            body = json.dumps({"rows": [{"card_id": f"nowhere-{i}", "merchant_id": 1, "amount": 1.5}]})
            try:
                conn.request("POST", ROUTE, body.encode(), AUTH)
                r = conn.getresponse()
                r.read()
                answers.append(r.status)
            except (OSError, http.client.HTTPException) as exc:  # sent and held, never answered: a loss
                errors.append(repr(exc))
            finally:
                conn.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(k)]
        for t in threads:
            t.start()
        with psycopg.connect(stores.postgres_dsn, autocommit=True) as watch:
            deadline = time.monotonic() + 30
            waiting = 0
            while waiting == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
                row = watch.execute("SELECT count(*) FROM pg_stat_activity "
                                    "WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)).fetchone()
                waiting = row[0] if row else 0
        assert waiting >= 1, "the server's fallback read never waited on the lock"
        time.sleep(0.5)  # the other requests reach the server too (its one connection is busy)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert server.proc.poll() is None, "the server exited with requests in flight"
        assert answers == [] and errors == [], (answers, errors)
        lock.commit()
        code = server.proc.wait(60)
        for t in threads:
            t.join(30)
    assert code == 0, server.log.read_text()[-3000:]
    assert errors == [] and answers == [200] * k, (answers, errors)
