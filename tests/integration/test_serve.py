"""``features serve`` (the HTTP ingest service) as a real process against the real broker and stores.

Each test starts ``features serve`` in its own process on a free port (``--port 0``; the
URL is read from its ready line), with the test's own Postgres schema and Kafka topics
(``--topic-template``), and talks HTTP to it with ``http.client``:

- hostile payloads posted as NDJSON get exactly the rejects (index, field, rule,
  message) that the stream's own ``prepare_records`` gives the same bytes;
- a mixed batch: 422 naming exactly the bad records; the good ones in the topic, byte for
  byte and keyed by entity, and stored by the stream's micro-batch step
  (``StreamProcessor``) run over the topic; the bad ones in the rejects table and the
  dead-letter topic under ``http://<request id>#<index>``;
- JSON array and single-object bodies (numbers produced as sent); 400, 404, 405, 413;
- auth: 401 / 403 / 202, and refusing to start without a token;
- SIGTERM to a 2-worker server under load from several clients: every record answered
  202 is in the topic, and nothing else is;
- /healthz, /readyz, /metrics (and ``--metrics-port``), the JSON access log.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pytest

from features.config import Settings
from features.observe.metrics import parse_exposition, sample_value
from features.ops.examples import UNDECODABLE, applicant_events, applicant_schema
from features.stream.kafka import ensure_topic, read_topic

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "fuzz" / "corpus" / "decoder"
SCHEMA = "credit_applicant"
TOKENS = ("tok-alpha-1", "tok-beta-2")
NDJSON = {"Content-Type": "application/x-ndjson"}
AUTH = {"Authorization": f"Bearer {TOKENS[0]}"}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture()
def schemas_dir(tmp_path: Path) -> Path:
    """A schemas folder with the one schema served here."""
    d = tmp_path / "schemas"
    d.mkdir()
    shutil.copy(ROOT / "schemas" / f"{SCHEMA}.yaml", d)
    return d


@pytest.fixture()
def topics(settings: Settings) -> Iterator[str]:
    """The topic template ``t_serve_<hex>_{schema}``; the schema's topic (2 partitions) and
    its dead-letter topic are created, and deleted after."""
    from confluent_kafka.admin import AdminClient

    prefix = f"t_serve_{uuid.uuid4().hex[:8]}_"
    topic = prefix + SCHEMA
    ensure_topic(settings.kafka_bootstrap, topic, partitions=2)
    ensure_topic(settings.kafka_bootstrap, topic + ".rejects", partitions=1)
    yield prefix + "{schema}"
    AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).delete_topics([topic, topic + ".rejects"])


@pytest.fixture()
def env(settings: Settings, pg_schema: str) -> dict[str, str]:
    """The server's environment: the test's Postgres schema, the test tokens."""
    sep = "&" if "?" in settings.postgres_dsn else "?"
    out = {k: v for k, v in os.environ.items() if not k.startswith("FEATURES_")}
    dsn = f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}"
    return {**out, "FEATURES_POSTGRES_DSN": dsn,
            "FEATURES_REDIS_URL": settings.redis_url, "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "FEATURES_INGEST_TOKENS": ",".join(TOKENS)}


def _command(*args: str) -> list[str]:
    exe = Path(sys.executable).parent / "features"
    head = [str(exe)] if exe.exists() else [sys.executable, "-m", "features.cli"]
    return [*head, "--log-format", "json", "serve", *args]


class Server:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.log = log

    def conn(self, timeout: float = 30) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
        c = self.conn()
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            hdrs = {k.lower(): v for k, v in r.getheaders()}
            ctype = hdrs.get("content-type", "")
            return r.status, hdrs, json.loads(data) if ctype.startswith("application/json") else data.decode()
        finally:
            c.close()

    def post(self, body: bytes, headers: dict[str, str] | None = None, schema: str = SCHEMA
             ) -> tuple[int, dict[str, str], Any]:
        return self.request("POST", f"/v1/schemas/{schema}/events", body, {**AUTH, **(headers or {})})

    def log_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # librdkafka's own lines, a traceback
        return out


@contextmanager
def serve(tmp_path: Path, env: dict[str, str], *args: str) -> Iterator[Server]:
    """``features serve ARGS --port 0`` until its ready line; SIGTERM and wait after."""
    log = tmp_path / f"serve-{uuid.uuid4().hex[:6]}.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(_command("--port", "0", *args), env=env, stdout=subprocess.PIPE, stderr=err,
                                start_new_session=True)
    assert proc.stdout is not None
    line: list[bytes] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(120)
    try:
        assert line and line[0].startswith(b"features serve: listening on "), (line, log.read_text()[-3000:])
        url = line[0].split()[4].decode()
        yield Server(proc, url, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        proc.stdout.close()


def _ndjson(values: list[bytes]) -> bytes:
    return b"\n".join(values) + b"\n"


def _reference_errors(values: list[bytes], request_id: str) -> list[tuple[int, str, str, str]]:
    """(index, field, rule, message) per field error: the stream's own micro-batch step on
    the same bytes, with the lineage URIs the service gives them."""
    from features.config import resolve_settings
    from features.kernels import transform_program
    from features.lineage import RunContext
    from features.pipeline.prepare import prepare_records
    from features.sources.columnar import ColumnarDecoder

    compiled = applicant_schema()
    now = dt.datetime.now(dt.UTC)
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "ref", now)
    uris = pa.array([f"http://{request_id}#{i}" for i in range(len(values))])
    prepared = prepare_records(list(values), uris, np.arange(len(values), dtype=np.int64), compiled,
                               transform_program(compiled, resolve_settings(root=ROOT)), ctx, now,
                               decoder=ColumnarDecoder(compiled.schema,
                                                       max_bytes=compiled.schema.payload.max_bytes)).prepared
    out = []
    for i, errs in zip(prepared.rejects.column("row_index").to_pylist(),
                       prepared.rejects.column("errors").to_pylist(), strict=True):
        out.extend((i, e["field"], e["rule"], e["message"]) for e in json.loads(errs))
    return sorted(out, key=lambda e: e[0])


def _errors(body: dict[str, Any]) -> list[tuple[int, str, str, str]]:
    return [(e["index"], e["field"], e["rule"], e["message"]) for e in body["errors"]]


def _valid_events(n: int, seed: int) -> list[bytes]:
    values = applicant_events(n, seed=seed, invalid_share=0.0, undecodable_every=0, duplicate_share=0.0)
    return [v for v in values if v is not None]


def _hostile() -> list[bytes]:
    """The stream tests' undecodable payloads, the decoder fuzz corpus and hand-made edge
    cases: every one that fits on an NDJSON line."""
    corpus = [p.read_bytes() for p in sorted(FUZZ.iterdir()) if ".batch." not in p.name]
    good = _valid_events(3, seed=5)
    base = json.loads(good[0])
    edits = [
        {**base, "income_monthly": float("nan")}, {**base, "income_monthly": "NaN"},
        {**base, "income_monthly": 0}, {**base, "income_monthly": "0.001"},
        {**base, "employment_duration_months": 10**30}, {**base, "employment_duration_months": 1.5},
        {**base, "application_id": "APP-12"}, {**base, "submitted_at": "2024-13-01T00:00:00Z"},
        {**base, "submitted_at": None}, {k: v for k, v in base.items() if k != "income_monthly"},
    ]
    made = [json.dumps(e, allow_nan=True).encode() for e in edits] + [
        good[1].replace(b"{", b'{"x": "\\ud800", ', 1), b'{"application_id": Infinity}', b"-0", b"[]",
        b"{" * 10 + b"}" * 10, b'{"a": 1}{"b": 2}', b"\xef\xbb\xbf{}"]
    out = [v for v in (*UNDECODABLE, *corpus, *made, *good)
           if v is not None and v.strip() and b"\n" not in v]
    return out


# --------------------------------------------------------------------------- tests


def test_hostile_payloads_get_the_stream_rejects(tmp_path: Path, env: dict[str, str], schemas_dir: Path,
                                                 topics: str, settings: Settings) -> None:
    values = _hostile()
    assert len(values) > 60
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics) as server:
        status, headers, body = server.post(_ndjson(values), {**NDJSON, "X-Request-Id": "hostile-1"})
    assert status == 422, body
    assert headers["x-request-id"] == body["request_id"] == "hostile-1"
    want = _reference_errors(values, "hostile-1")
    assert _errors(body) == want
    rejected = {e[0] for e in want}
    assert body["rejected"] == len(rejected) and body["accepted"] == len(values) - len(rejected)
    assert body["accepted"] >= 3  # the valid records among them went through
    produced = read_topic(settings.kafka_bootstrap, topics.format(schema=SCHEMA))
    assert sorted(m.value() for m in produced) == sorted(v for i, v in enumerate(values) if i not in rejected)


def test_mixed_batch_422_topic_stream_rejects_and_dead_letters(tmp_path: Path, env: dict[str, str],
                                                               schemas_dir: Path, topics: str,
                                                               settings: Settings, pg_schema: str,
                                                               redis_prefix: str) -> None:
    import psycopg

    from features.lineage import new_run_id
    from features.stream.core import StreamProcessor
    from features.stream.kafka import entity_keys

    values = [v for v in applicant_events(400, seed=3, undecodable_every=60) if v is not None]
    want = _reference_errors(values, "mixed-1")
    bad = sorted({e[0] for e in want})
    assert 5 < len(bad) < 100
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics) as server:
        status, _, body = server.post(_ndjson(values), {**NDJSON, "X-Request-Id": "mixed-1"})
    assert status == 422
    assert sorted({e["index"] for e in body["errors"]}) == bad
    assert _errors(body) == want
    assert body["accepted"] == len(values) - len(bad) and body["rejected"] == len(bad)

    # the topic: exactly the good records, as sent, keyed by entity
    topic = topics.format(schema=SCHEMA)
    good = [v for i, v in enumerate(values) if i not in set(bad)]
    msgs = read_topic(settings.kafka_bootstrap, topic)
    assert Counter(m.value() for m in msgs) == Counter(good)
    for m in msgs:
        assert m.key() == entity_keys([m.value()], "application_id")[0]
        assert dict(m.headers())["featureline-source"].decode().startswith("http://mixed-1#")

    # the stream's micro-batch step over the topic stores them
    proc = StreamProcessor(applicant_schema(), settings, run_id=new_run_id(), dead_letter_topic=None,
                           search_path=pg_schema, key_prefix=redis_prefix)
    proc.open()
    try:
        proc.process([m.value() for m in msgs], pa.array([m.topic() for m in msgs]),
                     pa.array([m.partition() for m in msgs], pa.int32()),
                     pa.array([m.offset() for m in msgs], pa.int64()))
    finally:
        proc.close()
    distinct = {(o["application_id"], o["submitted_at"]) for o in map(json.loads, good)}
    summary = proc.stats.summary
    assert summary.rejected == 0 and summary.read == len(good)
    assert summary.stored == len(distinct) and summary.adds_up
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        stored = conn.execute("SELECT count(*) FROM credit_applicant").fetchone()
        rejects = conn.execute("SELECT _source, row_index FROM credit_applicant__rejects").fetchall()
    assert stored is not None and stored[0] == len(distinct)
    assert sorted(r[0] for r in rejects) == sorted(f"http://mixed-1#{i}" for i in bad)
    assert all(r[0] == f"http://mixed-1#{r[1]}" for r in rejects)

    dead = read_topic(settings.kafka_bootstrap, topic + ".rejects")
    assert sorted(m.key().decode() for m in dead) == sorted(f"http://mixed-1#{i}" for i in bad)
    letter = json.loads(dead[0].value())
    assert letter["schema"] == SCHEMA and letter["errors"] and "raw" in letter


def test_json_array_and_single_object_bodies(tmp_path: Path, env: dict[str, str], schemas_dir: Path,
                                             topics: str, settings: Settings) -> None:
    values = _valid_events(6, seed=21)
    # numbers as a client writes them (a trailing zero, an exponent): produced byte for byte
    obj = json.loads(values[0])
    exact = json.dumps({**obj, "income_monthly": "@"}).encode().replace(b'"@"', b"1234.50")
    array = b"[\n  " + b" ,\n  ".join([exact, *values[1:5]]) + b"\n]\n"
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics) as server:
        status, _, body = server.post(array, {"Content-Type": "application/json"})
        assert (status, body["accepted"], body["rejected"]) == (202, 5, 0), body
        status, _, body = server.post(b"  " + values[5] + b"\n")
        assert (status, body["accepted"], body["rejected"]) == (202, 1, 0), body
        status, _, body = server.post(b"[" + values[0] + b", 42]")
        assert status == 422 and _errors(body) == [
            (1, "_payload", "_payload.decode", "record value is a JSON number, expected an object")]
        status, _, body = server.post(b"[]")
        assert (status, body["accepted"]) == (202, 0)
    got = sorted(m.value() for m in read_topic(settings.kafka_bootstrap, topics.format(schema=SCHEMA)))
    assert got == sorted([exact, *values[1:6], values[0]])
    assert b'"income_monthly": 1234.50' in exact


def test_bad_requests_400_404_405_413_and_readyz_without_topics(tmp_path: Path, env: dict[str, str],
                                                                 schemas_dir: Path) -> None:
    missing = f"t_serve_missing_{uuid.uuid4().hex[:8]}_{{schema}}"
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", missing,
               "--max-body-bytes", "4KiB") as server:
        for body, ctype in [(b"not json", "application/json"), (b"", "application/json"),
                            (b"42", "application/json"), (b'"text"', None), (b"\xff\xfe{}", None),
                            (b'{"a": 1} trailing', None), (b"[1, 2", None)]:
            status, _, out = server.post(body, {"Content-Type": ctype} if ctype else {})
            assert status == 400, (body, out)
            assert out["error"] and out["request_id"]
        status, _, out = server.post(b"{}", schema="nope")
        assert status == 404 and out["schemas"] == [SCHEMA]
        status, _, out = server.request("GET", "/nowhere")
        assert status == 404
        status, headers, _ = server.request("GET", f"/v1/schemas/{SCHEMA}/events", headers=AUTH)
        assert status == 405 and headers["allow"] == "POST"
        status, _, _ = server.request("POST", "/healthz")
        assert status == 405
        status, _, out = server.post(b"{" + b" " * 5000 + b"}")  # Content-Length over the limit
        assert status == 413 and "4,096" in out["error"]
        c = server.conn()  # chunked (no Content-Length): counted while reading
        c.request("POST", f"/v1/schemas/{SCHEMA}/events", body=iter([b"[" + b" " * 3000] * 3),
                  headers={**AUTH, "Content-Type": "application/json"}, encode_chunked=True)
        r = c.getresponse()
        assert r.status == 413
        c.close()
        status, _, out = server.request("GET", "/readyz", headers=AUTH)
        assert status == 503 and "missing topic" in out["reason"]
        # bad request ids are replaced; good ones echoed
        status, headers, out = server.post(b"42", {"X-Request-Id": "bad id with spaces"})
        assert len(headers["x-request-id"]) == 32 and out["request_id"] == headers["x-request-id"]


def test_auth_tokens_and_refusing_to_start_without_one(tmp_path: Path, env: dict[str, str], schemas_dir: Path,
                                                       topics: str) -> None:
    record = _valid_events(1, seed=8)[0]
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics) as server:
        path = f"/v1/schemas/{SCHEMA}/events"
        status, headers, out = server.request("POST", path, record)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer")
        assert server.request("POST", path, record, {"Authorization": f"Basic {TOKENS[0]}"})[0] == 401
        assert server.request("POST", path, record, {"Authorization": "Bearer"})[0] == 401
        assert server.request("POST", path, record, {"Authorization": "Bearer tok-alpha-"})[0] == 403
        assert server.request("POST", path, record, {"Authorization": "Bearer " + TOKENS[0] + "x"})[0] == 403
        # unauthenticated requests learn nothing about schemas
        assert server.request("POST", "/v1/schemas/nope/events", record)[0] == 401
        status, _, out = server.request("POST", path, record, {"Authorization": f"Bearer {TOKENS[1]}"})
        assert (status, out["accepted"]) == (202, 1)
        log = server.log.read_text()
    assert not any(t in log for t in TOKENS), "a token reached the log"

    no_tokens = {k: v for k, v in env.items() if k != "FEATURES_INGEST_TOKENS"}
    proc = subprocess.run(_command("--schemas", str(schemas_dir), "--port", "0"), env=no_tokens,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "FEATURES_INGEST_TOKENS" in proc.stderr, proc.stderr
    proc = subprocess.run(_command("--schemas", str(schemas_dir), "--port", "0", "--insecure-no-auth",
                                   "--host", "0.0.0.0"), env=no_tokens, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "loopback" in proc.stderr, proc.stderr
    with serve(tmp_path, no_tokens, "--schemas", str(schemas_dir), "--topic-template", topics,
               "--insecure-no-auth") as server:
        assert server.request("POST", f"/v1/schemas/{SCHEMA}/events", record)[0] == 202


def test_sigterm_under_load_loses_nothing_acknowledged(tmp_path: Path, env: dict[str, str], schemas_dir: Path,
                                                       topics: str, settings: Settings) -> None:
    from features.stream.kafka import topic_size

    pool = _valid_events(2000, seed=13)
    accepted = Counter[str]()
    answered = Counter[int]()
    lock = threading.Lock()
    stop = threading.Event()

    def client(k: int, server: Server) -> None:
        rng = np.random.default_rng(k)
        conn = server.conn(timeout=60)
        while not stop.is_set():
            batch = [pool[int(i)] for i in rng.integers(0, len(pool), int(rng.integers(1, 40)))]
            try:
                conn.request("POST", f"/v1/schemas/{SCHEMA}/events", body=_ndjson(batch),
                             headers={**AUTH, **NDJSON})
                r = conn.getresponse()
                out = json.loads(r.read())
            except (OSError, http.client.HTTPException):
                conn.close()  # the server closed the connection or is gone: not acknowledged
                conn = server.conn(timeout=60)
                try:
                    conn.connect()
                except OSError:
                    time.sleep(0.05)  # refused: the server stopped listening
                continue
            with lock:
                answered[r.status] += 1
                if r.status in (202, 422):
                    accepted["records"] += out["accepted"]
        conn.close()

    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics, "--workers", "2",
               "--no-access-log") as server:
        threads = [threading.Thread(target=client, args=(k, server)) for k in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # under load: more than 20 requests acknowledged
            with lock:
                before = answered[202]
            if before > 20:
                break
            time.sleep(0.1)
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(90)
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(60)
    assert code == 0, server.log.read_text()[-3000:]
    assert before > 20, answered
    assert set(answered) <= {202}, answered  # refused or cut connections are not answers
    topic = topics.format(schema=SCHEMA)
    assert topic_size(settings.kafka_bootstrap, topic) == accepted["records"]
    assert len(read_topic(settings.kafka_bootstrap, topic, timeout_s=60)) == accepted["records"]


def test_healthz_readyz_metrics_and_access_log(tmp_path: Path, env: dict[str, str], schemas_dir: Path,
                                              topics: str) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    values = [*_valid_events(5, seed=2), b"null"]
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics,
               "--metrics-port", str(metrics_port)) as server:
        status, _, out = server.request("GET", "/healthz")
        assert status == 200 and out["status"] == "ok"
        status, _, out = server.request("GET", "/readyz")
        assert status == 200, out
        status, _, _ = server.post(_ndjson(values), {**NDJSON, "X-Request-Id": "metrics-1"})
        assert status == 422
        status, headers, text = server.request("GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
        samples = parse_exposition(text)
        assert sample_value(samples, "featureline_ingest_requests_total",
                            route="/v1/schemas/{name}/events", status="422") == 1
        records = "featureline_ingest_records_total"
        assert sample_value(samples, records, schema=SCHEMA, outcome="accepted") == 5
        assert sample_value(samples, records, schema=SCHEMA, outcome="rejected") == 1
        assert sample_value(samples, "featureline_ingest_request_seconds_count",
                            route="/v1/schemas/{name}/events") == 1
        c = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=10)
        c.request("GET", "/metrics")
        side = parse_exposition(c.getresponse().read().decode())
        c.close()
        assert sample_value(side, "featureline_ingest_records_total", schema=SCHEMA, outcome="accepted") == 5
    lines = [x for x in server.log_lines() if x.get("logger") == "features.serve.access"]
    line = next(x for x in lines if x.get("request_id") == "metrics-1")
    assert {k: line[k] for k in ("method", "status", "records", "accepted", "rejected")} == {
        "method": "POST", "status": 422, "records": 6, "accepted": 5, "rejected": 1}
    assert line["path"] == f"/v1/schemas/{SCHEMA}/events" and line["ms"] > 0


# --------------------------------------------------------------------------- pure parts


def test_body_shapes_split_into_exact_records() -> None:
    from features.serve.body import BadBody, split_body

    assert split_body(b' [ {"a": 1.10} , 2,{"b":"\xc3\xa9"} ]\n', "application/json") == [
        b'{"a": 1.10}', b"2", b'{"b":"\xc3\xa9"}']
    assert split_body(b'{"a":1}\r\n\n  \n{bad\n', "application/x-ndjson; charset=utf-8") == [
        b'{"a":1}\r', b"{bad"]
    assert split_body(b'\n {"a": 1e5} \n', None) == [b'{"a": 1e5}']
    for bad in (b"", b"3", b"[1,]", b"[1] x", b"\xff", b"[", b'"s"'):
        with pytest.raises(BadBody):
            split_body(bad, "application/json")


def test_ingest_tokens_are_secrets(tmp_path: Path) -> None:
    from features.config import resolve_settings
    from features.errors import ConfigError

    s = resolve_settings(environ={"FEATURES_INGEST_TOKENS": " a1, b2 ,,"}, root=tmp_path)
    assert s.ingest_tokens == ("a1", "b2")
    assert "a1" not in repr(s) and s.redacted()["ingest_tokens"] == ("***", "***")
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('ingest_tokens = ["x9", "y8"]\n')
    secrets.chmod(0o600)
    assert resolve_settings(environ={"FEATURES_SECRETS_FILE": str(secrets)}, root=tmp_path).ingest_tokens == (
        "x9", "y8")
    (tmp_path / "featureline.toml").write_text('[settings]\ningest_tokens = ["z7"]\n')
    with pytest.raises(ConfigError) as info:
        resolve_settings(environ={}, root=tmp_path)
    assert info.value.key == "ingest_tokens" and "z7" not in str(info.value)


# --------------------------------------------------------------------------- issue 29


def _worker_pids(parent: int) -> list[int]:
    """The ``features serve`` parent's worker processes (spawned children, not the
    multiprocessing resource tracker)."""
    out = []
    for task in Path(f"/proc/{parent}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if b"spawn_main" in cmdline:
                out.append(int(pid))
    return out


def test_a_record_too_large_for_the_topic_is_413_not_a_503_retry(
        tmp_path: Path, env: dict[str, str], schemas_dir: Path, settings: Settings) -> None:
    """The broker refuses a record over the topic's ``max.message.bytes``
    (MSG_SIZE_TOO_LARGE): retrying cannot help, so the answer is 413 without Retry-After,
    naming the error, not 503 for ever."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    prefix = f"t_serve_{uuid.uuid4().hex[:8]}_"
    topic = prefix + SCHEMA
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    futures = admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "2000"}),
                                   NewTopic(topic + ".rejects", 1, 1)])
    for f in futures.values():
        f.result(30)
    try:
        record = json.loads(_valid_events(1, seed=4)[0])
        big = json.dumps({**record, "note": "x" * 5000}).encode()  # an unknown key: still valid
        with serve(tmp_path, env, "--schemas", str(schemas_dir),
                   "--topic-template", prefix + "{schema}") as server:
            status, headers, body = server.post(big)
            small = server.post(_valid_events(1, seed=5)[0])
        assert status == 413, body
        assert "retry-after" not in headers
        assert "MSG_SIZE_TOO_LARGE" in body["error"] and body["kafka_error"] == "MSG_SIZE_TOO_LARGE"
        assert small[0] == 202, small  # the producer still works after a refused record
    finally:
        admin.delete_topics([topic, topic + ".rejects"])


def test_a_dead_letter_fits_a_dead_letter_topic_with_a_low_limit(
        tmp_path: Path, env: dict[str, str], schemas_dir: Path, settings: Settings, pg_schema: str) -> None:
    """A rejected record of 30 KB (a region far over ``max_length``) to a dead-letter
    topic that takes 20,000 bytes: serve reads that limit at start and cuts the letter to
    fit (truncated, with the raw record's digest), the request is answered 422, and
    Postgres keeps the whole raw record."""
    import hashlib

    import psycopg
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    prefix = f"t_serve_{uuid.uuid4().hex[:8]}_"
    topic = prefix + SCHEMA
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    futures = admin.create_topics([NewTopic(topic, 1, 1),
                                   NewTopic(topic + ".rejects", 1, 1, config={"max.message.bytes": "20000"})])
    for f in futures.values():
        f.result(30)
    try:
        record = json.loads(_valid_events(1, seed=6)[0])
        big = json.dumps({**record, "region": "r" * 30_000}).encode()
        with serve(tmp_path, env, "--schemas", str(schemas_dir),
                   "--topic-template", prefix + "{schema}") as server:
            status, _, body = server.post(big, {"X-Request-Id": "big-1"})
        assert status == 422, body
        dead = read_topic(settings.kafka_bootstrap, topic + ".rejects")
        assert len(dead) == 1 and len(dead[0].value()) < 20_000
        letter = json.loads(dead[0].value())
        assert letter["truncated"] is True and letter["full_bytes"] > 60_000
        with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
            row = conn.execute("SELECT raw::text FROM credit_applicant__rejects").fetchone()
        assert row is not None and "r" * 30_000 in row[0]
        assert letter["raw_sha256"] == hashlib.sha256(
            json.dumps(json.loads(row[0]), sort_keys=True, separators=(",", ":"),
                       ensure_ascii=False).encode()).hexdigest()
    finally:
        admin.delete_topics([topic, topic + ".rejects"])


def test_a_broker_that_is_down_is_still_503_retry_after(tmp_path: Path, env: dict[str, str],
                                                       schemas_dir: Path) -> None:
    """A transient Kafka failure (no broker: the record times out) stays 503 with
    Retry-After: only errors no retry can cure leave the 503. The record times out after
    ``--delivery-timeout`` (2 s here, 15 s by default), not later."""
    with socket_closed_port() as port:
        down = {**env, "FEATURES_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}"}
        with serve(tmp_path, down, "--schemas", str(schemas_dir), "--delivery-timeout", "2") as server:
            began = time.monotonic()
            status, headers, body = server.post(_valid_events(1, seed=6)[0])
            took = time.monotonic() - began
    assert status == 503 and headers.get("retry-after") == "1", (status, body)
    assert 1.5 <= took < 10, f"the 503 came after {took:.1f} s, not after the 2 s --delivery-timeout"
    assert "kafka_error" not in body and "retry the request" in body["error"], body


def test_postgres_refusing_the_rejects_for_good_is_502_not_a_503_retry(
        tmp_path: Path, env: dict[str, str], schemas_dir: Path, topics: str, settings: Settings,
        pg_schema: str) -> None:
    """Postgres refuses the rejects insert for a reason no retry cures (the rejects table is
    gone): 502 without Retry-After, naming Postgres's refusal, not 503 for ever."""
    import psycopg

    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics) as server:
        assert server.post(_ndjson([b"{}"]), NDJSON)[0] == 422  # the rejects table works
        with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP TABLE "{pg_schema}"."{SCHEMA}__rejects" CASCADE')
        status, headers, body = server.post(_ndjson([b"{}"]), NDJSON)
    assert status == 502 and "retry-after" not in headers, (status, body)
    assert "Postgres refused" in body["error"] and "do not retry it unchanged" in body["error"], body


def test_kafka_errors_are_classified_permanent_or_transient() -> None:
    from confluent_kafka import KafkaError

    from features.errors import SinkUnavailable, Transient
    from features.serve.producer import RecordRefused, kafka_failure

    for code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
                 KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.INVALID_RECORD,
                 KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError._UNKNOWN_TOPIC,
                 KafkaError.TOPIC_EXCEPTION):
        err = kafka_failure(KafkaError(code), "t1", "127.0.0.1:9092")
        assert isinstance(err, RecordRefused) and not isinstance(err, Transient), code
        assert err.topic == "t1" and err.code == KafkaError(code).name()
        assert err.too_large == (code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE))
    for code in (KafkaError._MSG_TIMED_OUT, KafkaError._TRANSPORT, KafkaError.NOT_LEADER_FOR_PARTITION,
                 KafkaError._ALL_BROKERS_DOWN, KafkaError.REQUEST_TIMED_OUT):
        err = kafka_failure(KafkaError(code), "t1", "127.0.0.1:9092")
        assert isinstance(err, SinkUnavailable), code


def test_record_limit_capped_errors_and_concurrency_limit(tmp_path: Path, env: dict[str, str],
                                                          schemas_dir: Path, topics: str) -> None:
    import socket

    empty = [b"{}"] * 20
    want = _reference_errors(empty, "cap-1")
    assert len(want) > 20  # several errors per record
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics,
               "--max-records", "50", "--max-errors", "10", "--limit-concurrency", "2") as server:
        status, _, body = server.post(b"[" + b",".join([b"{}"] * 51) + b"]")
        assert status == 413 and "50" in body["error"] and "records" in body["error"], body
        status, _, body = server.post(_ndjson([b"{}"] * 51), NDJSON)
        assert status == 413, body
        status, _, body = server.post(_ndjson(empty), {**NDJSON, "X-Request-Id": "cap-1"})
        assert status == 422 and body["rejected"] == 20
        assert _errors(body) == want[:10]
        assert body["errors_truncated"] is True and body["errors_total"] == len(want)
        status, _, body = server.post(_ndjson([b"{}"]), NDJSON)
        assert status == 422 and body["errors_truncated"] is False
        assert body["errors_total"] == len(body["errors"])
        # one idle connection open: with the request's own that makes 2, the --limit-concurrency
        # (uvicorn answers 503)
        assert server.request("GET", "/healthz")[0] == 200
        with socket.create_connection((server.host, server.port)):
            for _ in range(100):  # until uvicorn has accepted the idle connection
                if (status := server.request("GET", "/healthz")[0]) == 503:
                    break
                time.sleep(0.1)
            assert status == 503
    help_text = subprocess.run(_command("--help"), env=env, capture_output=True, text=True, timeout=60).stdout
    for flag in ("--max-records", "--max-errors", "--max-queued-bytes", "--limit-concurrency",
                 "--restart-limit", "--restart-window", "--delivery-timeout"):
        assert flag in help_text, flag


def test_readyz_tells_details_only_to_an_authenticated_client(tmp_path: Path, env: dict[str, str],
                                                               schemas_dir: Path) -> None:
    missing = f"t_serve_missing_{uuid.uuid4().hex[:8]}_{{schema}}"
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", missing) as server:
        for headers in ({}, {"Authorization": "Bearer wrong-token"}):
            status, _, out = server.request("GET", "/readyz", headers=headers)
            assert status == 503 and set(out) == {"request_id", "status"}, out
            assert out["status"] == "not ready"
        status, _, out = server.request("GET", "/readyz", headers=AUTH)
        assert status == 503 and "missing topic" in out["reason"] and out["schemas"] == [SCHEMA]


def test_supervisor_backs_off_and_stops_after_the_restart_budget(tmp_path: Path, env: dict[str, str],
                                                                 schemas_dir: Path, topics: str,
                                                                 settings: Settings, pg_schema: str) -> None:
    """A worker that dies is replaced; when its replacements cannot start (Postgres
    refuses: here the server's schema is gone), the parent stops after the restart budget
    with an error that says why, instead of restarting every 0.5 s for ever."""
    import psycopg

    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics, "--workers", "2",
               "--restart-limit", "2", "--restart-window", "300") as server:
        pids = _worker_pids(server.proc.pid)
        assert len(pids) == 2, pids
        with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{pg_schema}" CASCADE')
        os.kill(pids[0], signal.SIGKILL)
        try:
            code = server.proc.wait(120)
        finally:
            with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{pg_schema}"')
    assert code == 1, server.log.read_text()[-3000:]
    lines = server.log_lines()
    restarts = [x for x in lines if "starting a new one" in x.get("message", "")]
    assert len(restarts) == 2, [x.get("message") for x in lines]
    final = [x for x in lines if "restart budget" in x.get("message", "")]
    assert final and "worker 0" in final[-1]["message"] and "3 times" in final[-1]["message"], final
    # the parent says why, not only that: the replacement's own startup error, quoted
    assert "-9" in restarts[0]["message"]  # the SIGKILL
    for line in (*restarts[1:], final[-1]):
        assert "exit code 3: " in line["message"] and "no schema has been selected" in line["message"], line


def test_ndjson_vertical_tab_and_form_feed_lines_are_decode_rejects() -> None:
    from features.serve.body import split_body

    body = b'{"a":1}\r\n\x0b\n\x0c\n \t\r\n\x0b{"b":2}\n'
    records = split_body(body, "application/x-ndjson")
    assert records == [b'{"a":1}\r', b"\x0b", b"\x0c", b'\x0b{"b":2}']
    rules = {(i, rule) for i, _, rule, _ in _reference_errors(records, "vt")}
    assert {(1, "_payload.decode"), (2, "_payload.decode"), (3, "_payload.decode")} <= rules


def test_a_full_producer_queue_gives_up_after_its_deadline(settings: Settings) -> None:
    """librdkafka's queue stays full (one message at most, a broker that is not there):
    ``send`` stops retrying after ``queue_timeout_s`` with a clear SinkUnavailable."""
    import asyncio

    from features.errors import SinkUnavailable
    from features.serve.producer import AsyncProducer

    with socket_closed_port() as port:
        producer = AsyncProducer(f"127.0.0.1:{port}", {"queue.buffering.max.messages": "1"},
                                 queue_timeout_s=1.0)
        try:
            with pytest.raises(SinkUnavailable) as info:
                asyncio.run(producer.send("t", [(None, b"{}", None)] * 3))
            assert "queue" in str(info.value) and info.value.store == "kafka"
        finally:
            producer.close(0)


@contextmanager
def socket_closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, not listening, while in use)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def test_the_check_queue_is_bounded(settings: Settings) -> None:
    """A worker's queue of bodies waiting to be checked holds at most ``max_queued_bytes``
    (one body always fits): a request past it is refused as busy (503), not queued."""
    from features.serve.ingest import IngestBusy, SchemaIngest

    ingest = SchemaIngest(applicant_schema(), settings, topic="t", dead_letter_topic=None, run_id="r",
                          max_queued_bytes=100)
    first = ingest.submit(b"x" * 150, "application/json", "q-1")  # not opened: nothing checks it
    assert not first.done()
    with pytest.raises(IngestBusy) as info:
        ingest.submit(b"y", "application/json", "q-2")
    assert info.value.limit == 100


def _peak_rss_mib(pid: int) -> float:
    """A process's peak resident set (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def test_a_body_of_many_empty_records_costs_bounded_memory(tmp_path: Path, env: dict[str, str],
                                                           schemas_dir: Path, topics: str) -> None:
    """1 MiB of ``[{},{},...]`` is 340,000 records, each with an error per required field:
    with the default limits it is refused (413) before any record is listed, and the
    worker's peak memory grows by far less than the body expanded would take."""
    body = b"[" + b",".join([b"{}"] * 340_000) + b"]"
    assert len(body) < 1024 * 1024
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics) as server:
        assert server.post(_ndjson(_valid_events(3, seed=1)), NDJSON)[0] == 202  # warm: every path imported
        before = _peak_rss_mib(server.proc.pid)
        status, _, out = server.post(body, {"Content-Type": "application/json"})
        grown = _peak_rss_mib(server.proc.pid) - before
    assert grown < 100, f"peak RSS grew {grown:.0f} MiB for a 1 MiB body"
    assert status == 413 and "50,000" in out["error"], out


def test_deep_nesting_and_lone_surrogates_are_answered_not_500(tmp_path: Path, env: dict[str, str],
                                                                 schemas_dir: Path, topics: str) -> None:
    """Bodies the review's fuzzing turned into 500s: JSON nested 1,200 and 100,000 levels and
    a lone surrogate (``"\\ud800"``) in a value or a key, as an object, an array and NDJSON.
    Each is a refused body (400) or a record the decoder rejects (422), never a 500."""
    good = json.loads(_valid_events(1, seed=5)[0])
    deep = [b"[" * n + b"]" * n for n in (1_200, 100_000)]
    cases = [*(({"Content-Type": "application/json"}, b'{"a": ' + d + b"}") for d in deep),
             *((NDJSON, b'{"a": ' + d + b"}\n") for d in deep),
             ({"Content-Type": "application/json"}, b"[" + deep[0] + b"]"),
             ({"Content-Type": "application/json"}, json.dumps({**good, "region": "\ud800"}).encode()),
             ({"Content-Type": "application/json"}, json.dumps([{**good, "region\udfff": "x"}]).encode()),
             (NDJSON, json.dumps({**good, "application_id": "APP-\ud800"}).encode() + b"\n")]
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics) as server:
        for headers, body in cases:
            status, _, out = server.post(body, headers)
            assert status in (400, 422), (body[:80], status, out)
            if status == 422:
                assert out["rejected"] == 1 and out["accepted"] == 0, out
    log = server.log.read_text()
    assert "Traceback" not in log and '"status": 500' not in log, log[-3000:]


def test_schema_filter_serves_the_named_schemas_only(tmp_path: Path, env: dict[str, str], schemas_dir: Path,
                                                     topics: str) -> None:
    """issue 47: every schema in the folder was served, so /readyz was "not ready" over the topics
    of schemas never meant to be ingested. --schema NAME serves that one (repeatable)."""
    shutil.copy(ROOT / "schemas" / "clicks.yaml", schemas_dir)  # no topic for clicks
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics) as server:
        status, _, out = server.request("GET", "/readyz", headers=AUTH)
        assert status == 503 and "clicks" in out["reason"], out
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics,
               "--schema", SCHEMA) as server:
        status, _, out = server.request("GET", "/readyz", headers=AUTH)
        assert status == 200 and out["schemas"] == [SCHEMA], out
        status, _, out = server.post(b"{}", schema="clicks")
        assert status == 404 and out["schemas"] == [SCHEMA], out
    bad = subprocess.run(_command("--schemas", str(schemas_dir), "--schema", "nope"), env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--schema nope: no such schema" in bad.stderr, bad.stderr
    assert "clicks, credit_applicant" in bad.stderr


# --------------------------------------------------------------------------- quality gates


def _with_gates(schemas_dir: Path, quality: str) -> None:
    path = schemas_dir / f"{SCHEMA}.yaml"
    path.write_text(path.read_text() + quality)


def _income_zero(values: list[bytes]) -> list[bytes]:
    """``values`` with income_monthly 0 (under its min 0.01): each rejected by income_monthly.min."""
    return [json.dumps({**json.loads(v), "income_monthly": 0}).encode() for v in values]


def test_a_breached_fail_gate_refuses_the_request_and_stores_nothing_of_it(
        tmp_path: Path, env: dict[str, str], schemas_dir: Path, topics: str, settings: Settings,
        pg_schema: str) -> None:
    import psycopg

    _with_gates(schemas_dir, "quality:\n  owner: risk-data\n  max_reject_rate: 0.2\n"
                             "  max_rule_rate:\n    income_monthly.min: {limit: 0.05, on_breach: warn}\n"
                             "  window_records: 100\n  window_min_records: 50\n")
    good = _valid_events(200, seed=21)
    first, later = good[:60], good[60:120]
    burst = [*good[120:150], *_income_zero(good[150:190])]   # 40 of 70 rejected
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics) as server:
        status, _, body = server.post(_ndjson(first), {**NDJSON, "X-Request-Id": "gate-ok"})
        assert status == 202 and "gates_breached" not in body, body
        status, _, body = server.post(_ndjson(burst), {**NDJSON, "X-Request-Id": "gate-bad"})
        # the window of the last 100 records breaches 20% at the burst's 21st bad record
        assert status == 422, body
        assert body["accepted"] == 0 and body["refused"] == 70 and body["rejected"] == 40
        by_gate = {g["gate"]: g for g in body["gates_breached"]}
        reject = by_gate["max_reject_rate"]
        assert reject["on_breach"] == "fail" and reject["limit"] == 0.2
        assert reject["rows"] == 21 and reject["measured"] == 21 / body["window_records"]
        assert reject["measured"] > 0.2 and body["window_records"] == 100
        assert by_gate["max_rule_rate[income_monthly.min]"]["on_breach"] == "warn"
        assert body["top_reasons"] == [{"rule": "income_monthly.min", "count": 21}]
        assert body["owner"] == "risk-data" and "max_reject_rate" in body["error"]
        assert {e["index"] for e in body["errors"]} == set(range(30, 70))
        # a refused request is not in the window: clean records pass again
        status, _, body = server.post(_ndjson(later), {**NDJSON, "X-Request-Id": "gate-later"})
        assert status == 202, body
        status, _, text = server.request("GET", "/metrics")
    samples = parse_exposition(text)
    assert sample_value(samples, "featureline_gate_breaches_total", schema=SCHEMA, gate="max_reject_rate",
                        on_breach="fail") == 1
    assert sample_value(samples, "featureline_ingest_records_total", schema=SCHEMA, outcome="refused") == 70
    produced = read_topic(settings.kafka_bootstrap, topics.format(schema=SCHEMA))
    assert sorted(m.value() for m in produced) == sorted([*first, *later])   # nothing of the burst
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        exists = conn.execute("SELECT to_regclass('credit_applicant__rejects')").fetchone()
        rejects = (conn.execute("SELECT count(*) FROM credit_applicant__rejects").fetchone()
                   if exists and exists[0] else (0,))
        verdicts = conn.execute("SELECT run_id, gate, on_breach, breached, measured, rows, refused, read, "
                                "rejected FROM featureline_gate_verdicts WHERE schema_name = %s "
                                "ORDER BY gate",
                                [SCHEMA]).fetchall()
    assert rejects is not None and rejects[0] == 0
    assert read_topic(settings.kafka_bootstrap, topics.format(schema=SCHEMA) + ".rejects") == []
    # the refused request's verdict, under the worker's run (the later clean request breached
    # nothing, so nothing replaced it): the window's counts, refused false (the run stored the rest)
    assert len({v[0] for v in verdicts}) == 1, verdicts
    assert [v[1:] for v in verdicts] == [
        ("max_reject_rate", "fail", True, 0.21, 21, False, 100, 21),
        ("max_rule_rate[income_monthly.min]", "warn", True, 0.21, 21, False, 100, 21)], verdicts


def test_a_breached_warn_gate_stores_the_request_and_says_so(tmp_path: Path, env: dict[str, str],
                                                             schemas_dir: Path, topics: str,
                                                             settings: Settings, pg_schema: str) -> None:
    import psycopg

    _with_gates(schemas_dir, "quality:\n  on_breach: warn\n  max_reject_rate: 0.2\n  window_records: 100\n"
                             "  window_min_records: 50\n")
    good = _valid_events(120, seed=22)
    burst = [*good[:30], *_income_zero(good[30:70])]
    with serve(tmp_path, env, "--schemas", str(schemas_dir), "--topic-template", topics) as server:
        status, _, body = server.post(_ndjson(burst), {**NDJSON, "X-Request-Id": "warn-1"})
        assert status == 422 and body["accepted"] == 30 and body["rejected"] == 40, body
        (g,) = body["gates_breached"]
        # the first record whose window (>= 50 records) is over 20%: the 50th, 20 of 50 = 40%
        assert g["gate"] == "max_reject_rate" and g["on_breach"] == "warn" and g["measured"] == 0.4
        assert "error" not in body
        status, _, text = server.request("GET", "/metrics")
    samples = parse_exposition(text)
    assert sample_value(samples, "featureline_gate_breaches_total", schema=SCHEMA, gate="max_reject_rate",
                        on_breach="warn") == 1
    produced = read_topic(settings.kafka_bootstrap, topics.format(schema=SCHEMA))
    assert sorted(m.value() for m in produced) == sorted(good[:30])
    assert any(x.get("gate") == "max_reject_rate" for x in server.log_lines())
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        verdicts = conn.execute("SELECT gate, on_breach, breached, measured, refused FROM "
                                "featureline_gate_verdicts WHERE schema_name = %s", [SCHEMA]).fetchall()
    assert verdicts == [("max_reject_rate", "warn", True, 0.4, False)]   # where the breach started
