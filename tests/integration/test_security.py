"""Security against the real stores: hostile names and literals reach SQL only quoted;
credentials never appear in output, logs, reports or errors; TLS to Redis works.

- Hostile schema: names that pass the identifier rules but are SQL key words
  (``drop``, ``values``, ``timestamp``, ``delete``...) and enum values, a pattern, a
  default and ``where`` values full of quotes, backslashes, semicolons, ``$$``,
  ``'); DROP TABLE canary; --``, HTML and unicode. The DDL is applied to a fresh
  Postgres schema, rows go through the batch loader, come back through the SDK and the
  reports, and a canary table proves nothing else ran.
- Credentials: a Postgres role and a Redis ACL user created for the test, with a
  password that shares nothing with the rest of the output; every command and log
  file is searched for it. Neither the shared Redis's default user nor any shared role
  is changed; both test users are removed afterwards.
- TLS: a private ``redis-server`` with a TLS port and a throwaway CA, on a free port.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from conftest import search_path_dsn
from psycopg import sql

from features import FeatureStore
from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.errors import SinkError, SinkUnavailable
from features.load import load
from features.ops.dev.services import kafka_libs
from features.report import rejects_report, table_report, write_report
from features.schema import load_schema

pytestmark = [pytest.mark.services, pytest.mark.scratch_redis_db(9)]

ROOT = Path(__file__).resolve().parents[2]
UTC = dt.UTC

# --------------------------------------------------------------------------- hostile schema

ENUM_VALUES = ["it's", "C:\\dir\\", "x'); DROP TABLE canary; --", "$$", "$tag$ ; $tag$", "日本語 ✓ é",
               '"dq"', "<script>alert(1)</script>", "tab\there"]
WHERE_VALUES = ("it's", "x'); DROP TABLE canary; --", "$$")
DEFAULT = "'); DROP TABLE canary; --"
HOSTILE_YAML = r"""# Names that are allowed but are SQL key words, and literals built to break out of quoting.
name: drop
version: 1.0.0
description: "ends the comment?\nDROP TABLE canary; -- */ $$"
entity: values
event_time: timestamp
hot:
  ttl: 1d
fields:
  - name: values
    type: string
    description: "*/ DROP TABLE canary; /*"
    store: [hot, cold]
    constraints:
      required: true
      pattern: "^[a-z0-9';$\\\\ -]+$"
  - name: timestamp
    type: timestamp(us, UTC)
    store: [hot, cold]
    constraints:
      required: true
  - name: delete
    type: enum
    values: ["it's", "C:\\dir\\", "x'); DROP TABLE canary; --", "$$", "$tag$ ; $tag$", "日本語 ✓ é",
             "\"dq\"", "<script>alert(1)</script>", "tab\there"]
    store: [hot, cold]
    constraints:
      required: true
  - name: insert
    type: string
    store: [hot, cold]
    constraints:
      nullable: true
      default: "'); DROP TABLE canary; --"
      max_length: 200
  - name: update
    type: int32
    store: cold
    constraints:
      nullable: true
      min: 0
features:
  - name: truncate
    from: update
    steps:
      - fill_null: 0
    dtype: int32
    store: [hot, cold]
aggregations:
  allowed_lateness: 1d
  features:
    - name: cascade
      function: count
      where: {delete: ["it's", "x'); DROP TABLE canary; --", "$$"]}
      window: 7d
      store: [hot, cold]
"""
#: entity ids: every one matches the pattern ^[a-z0-9';$\\ -]+$
ENTITIES = ["o'brien", "drop table canary; --", "$1 $$", "back\\slash", "a';--", "plain"]
INSERTS = [None, "Robert'); DROP TABLE canary; --", "\\", "$$ $x$", "ünï ✓", "'", ""]


def _hostile_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(valid rows, invalid rows). Each entity gets 5 events an hour apart, in order."""
    base = dt.datetime(2024, 3, 1, tzinfo=UTC)
    valid = []
    for k, entity in enumerate(ENTITIES):
        for j in range(5):
            n = k * 5 + j
            valid.append({"values": entity, "timestamp": base + dt.timedelta(hours=j, microseconds=k),
                          "delete": ENUM_VALUES[n % len(ENUM_VALUES)], "insert": INSERTS[n % len(INSERTS)],
                          "update": None if n % 4 == 0 else n})
    late = base + dt.timedelta(days=1)
    invalid = [
        {"values": "plain", "timestamp": late, "delete": "<img src=x onerror=alert(1)>", "insert": None,
         "update": 1},                                                        # not an enum value
        {"values": "Robert'); DROP TABLE canary; --", "timestamp": late, "delete": "$$", "insert": None,
         "update": 1},                                                        # pattern: upper case, ()
        {"values": "plain", "timestamp": late + dt.timedelta(hours=1), "delete": "$$", "insert": "a\x00b",
         "update": 1},                                                        # NUL: not storable text
        {"values": "plain", "timestamp": late + dt.timedelta(hours=2), "delete": "$$", "insert": None,
         "update": -1},                                                       # min 0
    ]
    return valid, invalid


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.table({
        "values": pa.array([r["values"] for r in rows], pa.string()),
        "timestamp": pa.array([r["timestamp"] for r in rows], pa.timestamp("us", "UTC")),
        "delete": pa.array([r["delete"] for r in rows], pa.string()),
        "insert": pa.array([r["insert"] for r in rows], pa.string()),
        "update": pa.array([r["update"] for r in rows], pa.int32()),
    })


def test_hostile_names_and_literals_reach_sql_only_quoted(tmp_path: Path, settings: Settings, pg_schema: str,
                                                          pg_conn: Any, redis_prefix: str) -> None:
    path = tmp_path / "drop.yaml"
    path.write_text(HOSTILE_YAML, encoding="utf-8")
    compiled = compile_schema(load_schema(path))
    assert compiled.schema.fields[2].values == tuple(ENUM_VALUES)  # the YAML says what we think
    pg_conn.execute("CREATE TABLE canary (x text)")
    pg_conn.execute("INSERT INTO canary VALUES ('alive')")
    # The whole file, as psql would run it, in a session that reads backslashes in plain
    # '...' literals as escapes (an old server default): the literals must not care.
    pg_conn.execute("SET standard_conforming_strings = off")
    pg_conn.execute(compiled.ddl)
    pg_conn.execute("RESET standard_conforming_strings")
    pg_conn.commit()

    valid, invalid = _hostile_rows()
    data = tmp_path / "drop.parquet"
    pq.write_table(_table(valid + invalid), data)
    summary = load([data], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert summary.adds_up
    assert (summary.stored, summary.rejected) == (len(valid), len(invalid))

    # Postgres holds exactly the input, the default filling the nulls.
    want = sorted((r["values"], r["timestamp"], r["delete"], DEFAULT if r["insert"] is None else r["insert"],
                   r["update"], r["update"] or 0) for r in valid)
    got = pg_conn.execute('SELECT "values", "timestamp", "delete", "insert", "update", "truncate" '
                          'FROM "drop" ORDER BY 1, 2').fetchall()
    assert got == want
    rejected = pg_conn.execute('SELECT errors FROM "drop__rejects"').fetchall()
    rules = sorted(e["rule"] for (errors,) in rejected for e in errors)
    assert rules == ["delete.enum", "insert.type", "update.min", "values.pattern"]

    # The SDK reads the same values back, from Redis and from Postgres.
    newest = {r["values"]: r for r in valid}   # rows are in event-time order per entity
    counts = {e: sum(r["delete"] in WHERE_VALUES for r in valid if r["values"] == e) for e in ENTITIES}
    as_of = pa.array([dt.datetime(2024, 3, 1, 2, 30, tzinfo=UTC)] * len(ENTITIES), pa.timestamp("us", "UTC"))
    # the windows (7 days) at an hour after the last event: every event counts; the
    # history's windows too (the Postgres-only store has no tiles: its windows are read
    # from the history table, with these names in the SQL)
    at = max(r["timestamp"] for r in valid) + dt.timedelta(hours=1)
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn, schemas=path,
                      search_path=pg_schema, key_prefix=redis_prefix) as fs:
        online = fs.online("drop", ENTITIES, at=at).to_pylist()
        assert fs.online("drop", ENTITIES, windows="event").to_pylist()[0]["cascade"] == online[0]["cascade"]
        history = fs.historical("drop", pa.table({"values": ENTITIES, "timestamp": as_of}),
                                ["delete", "insert", "cascade"]).to_pylist()
    # the same lookups with an empty Redis prefix: every row from Postgres
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn, schemas=path,
                      search_path=pg_schema, key_prefix=redis_prefix + "empty:") as fs:
        fallback = fs.online("drop", ENTITIES, at=at).to_pylist()
    assert [r["_from"] for r in online] == ["redis"] * len(ENTITIES)
    assert [r["_from"] for r in fallback] == ["postgres"] * len(ENTITIES)
    keep = ("values", "delete", "insert", "truncate", "cascade", "_event_time", "_found")
    assert [{k: r[k] for k in keep} for r in fallback] == [{k: r[k] for k in keep} for r in online]
    for row in online:
        src = newest[row["values"]]
        assert row["_found"]
        assert row["delete"] == src["delete"]
        assert row["insert"] == (DEFAULT if src["insert"] is None else src["insert"])
        assert row["truncate"] == (src["update"] or 0)
        assert row["cascade"] == counts[row["values"]]
    for row in history:  # as of 02:30: the event of 02:00 (j = 2)
        src = next(r for r in valid if r["values"] == row["values"] and r["timestamp"].hour == 2)
        assert (row["delete"], row["insert"]) == (src["delete"], DEFAULT if src["insert"] is None
                                                  else src["insert"])
        assert row["cascade"] == sum(r["delete"] in WHERE_VALUES for r in valid
                                     if r["values"] == row["values"] and r["timestamp"] <= src["timestamp"])

    # The reports read the hostile tables; the HTML escapes what the rows hold.
    dsn = search_path_dsn(settings.postgres_dsn, pg_schema)
    table = table_report(dsn, compiled, batch_rows=7)  # re-validates every stored row, GX too
    assert (table["counts"]["input_rows"], table["counts"]["rejected_rows"]) == (len(valid), 0)
    assert table["verdict"] == "PASS" and table["disagreements"] == [], table["verdict_reasons"]
    write_report(table, tmp_path / "table")
    rejects = rejects_report(dsn, compiled, since=None, batch_rows=3)
    _, html_path = write_report(rejects, tmp_path / "rejects")
    html = html_path.read_text(encoding="utf-8")
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img src=x" not in html

    # Nothing else ran: the canary lives, and the schema holds exactly the expected tables.
    assert pg_conn.execute("SELECT x FROM canary").fetchall() == [("alive",)]
    tables = {r[0] for r in pg_conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s", (pg_schema,)).fetchall()}
    assert tables == {"canary", "drop", "drop__rejects", "drop__aggregates", "featureline_schemas",
                      "featureline_ledger", "featureline_schema_versions", "featureline_gate_verdicts",
                      "featureline_run_counts"}


# --------------------------------------------------------------------------- credentials

#: The Redis database of the CLI and stream runs here (10-15 belong to other tests), flushed
#: before and after each test that uses it.
REDIS_DB = 9
#: Characters a URL must percent-encode, so that both spellings are searched for.
AWKWARD = ":/@%'&"


def _secret(tag: str) -> tuple[str, str]:
    """(password, token): the token is the password's unique core; neither its raw nor its
    percent-encoded spelling can appear anywhere without the token."""
    token = f"{tag}{uuid.uuid4().hex[:12]}"
    return f"{token}{AWKWARD}", token


def _pg_admin(settings: Settings) -> psycopg.Connection[Any]:
    """The local cluster's superuser over its Unix socket, with the password ``features
    dev up`` keeps in ``.dev/postgres/superuser-password``: the only way to create a role
    with a password, since the ``featureline`` role may not."""
    from features.ops.dev.services import Postgres

    port = urlsplit(settings.postgres_dsn).port or 5432
    db = urlsplit(settings.postgres_dsn).path.lstrip("/") or "featureline"
    cluster = Postgres(settings)
    try:
        return psycopg.connect(host=str(cluster.run_dir), port=port, user="postgres", dbname=db,
                               password=cluster.superuser_password(), autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"these tests create a Postgres role, as the superuser of the cluster `features dev up` "
                    f"starts (Unix socket under .dev/postgres/run): {exc}")


@pytest.fixture()
def pg_role(settings: Settings, pg_schema: str) -> Iterator[tuple[str, str, str]]:
    """A login role with a password that may create tables in the test's schema only:
    (role, password, token). Its objects go back to the schema's owner, then it is dropped."""
    admin = _pg_admin(settings)
    role = f"t_sec_{uuid.uuid4().hex[:8]}"
    password, token = _secret("pg")
    ident = sql.Identifier(role)
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(ident, sql.Literal(password)))
    admin.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}").format(sql.Identifier(pg_schema), ident))
    try:
        yield role, password, token
    finally:
        owner = admin.execute("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = %s",
                              (pg_schema,)).fetchone()
        admin.execute(sql.SQL("REASSIGN OWNED BY {} TO {}").format(ident, sql.SQL(owner[0] if owner else
                                                                                   "postgres")))
        admin.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        admin.execute(sql.SQL("DROP ROLE {}").format(ident))
        admin.close()


@pytest.fixture()
def redis_db(settings: Settings) -> Iterator[str]:
    """The URL of database REDIS_DB, flushed before and after the test."""
    url = settings.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


@pytest.fixture()
def redis_user(settings: Settings, redis_db: str) -> Iterator[tuple[str, str, str]]:
    """A Redis ACL user of its own with a password, deleted afterwards (the default user
    is left alone): (user, password, token)."""
    admin = redis.Redis.from_url(redis_db)
    user = f"t_sec_{uuid.uuid4().hex[:8]}"
    password, token = _secret("rd")
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")
    try:
        yield user, password, token
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


def _urls(settings: Settings, pg_schema: str, role: tuple[str, str, str],
          user: tuple[str, str, str]) -> tuple[str, str]:
    pg, rd = urlsplit(settings.postgres_dsn), urlsplit(settings.redis_url)
    dsn = (f"postgresql://{role[0]}:{quote(role[1], safe='')}@{pg.hostname}:{pg.port}{pg.path}"
           f"?options=-csearch_path%3D{pg_schema}")
    url = f"redis://{user[0]}:{quote(user[1], safe='')}@{rd.hostname}:{rd.port}/{REDIS_DB}"
    return dsn, url


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEATURES_")}
    return {**env, **extra}


def _assert_secret_free(tokens: list[str], texts: dict[str, str]) -> None:
    for where, text in texts.items():
        for token in tokens:
            assert token not in text, f"a credential ({token[:2]}...) leaked into {where}"


def _applicants_file(tmp_path: Path, rows: int = 400) -> Path:
    from features.ops.examples import applicants

    path = tmp_path / "applicants.parquet"
    pq.write_table(applicants(rows, seed=5), path)
    return path


def test_credentials_stay_out_of_output_reports_and_errors(tmp_path: Path, settings: Settings,
                                                           pg_schema: str, pg_role: tuple[str, str, str],
                                                           redis_user: tuple[str, str, str]) -> None:
    dsn, url = _urls(settings, pg_schema, pg_role, redis_user)
    kafka_secret, kafka_token = _secret("kf")
    tokens = [pg_role[2], redis_user[2], kafka_token]
    # Postgres from the environment; Redis and the Kafka properties from the secrets file.
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(f"redis_url = {json.dumps(url)}\n[kafka_properties]\n"
                       f'"sasl.username" = "app"\n"sasl.password" = {json.dumps(kafka_secret)}\n')
    secrets.chmod(0o600)
    env = _clean_env(FEATURES_POSTGRES_DSN=dsn, FEATURES_SECRETS_FILE=str(secrets),
                     FEATURES_KAFKA_BOOTSTRAP=settings.kafka_bootstrap)
    data = _applicants_file(tmp_path)
    seen: dict[str, str] = {}

    def cli(label: str, *args: str, **overrides: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "features.cli", *args, "--schemas-dir",
                               str(ROOT / "schemas")], env={**env, **overrides}, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        seen[f"{label} stdout"], seen[f"{label} stderr"] = proc.stdout, proc.stderr
        return proc

    ok = cli("load", "load", "--schema", "credit_applicant", str(data), "--json", "--no-progress")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert json.loads(ok.stdout)["stored"] > 300                  # the RunSummary JSON
    health = cli("health", "health", "--json")
    assert health.returncode == 0 and json.loads(health.stdout)["healthy"], health.stdout + health.stderr
    for kind in ("table", "rejects"):
        rep = cli(f"report {kind}", "report", "--schema", "credit_applicant", f"--{kind}", "--out",
                  str(tmp_path / kind), "--no-progress")
        assert rep.returncode in (0, 1), rep.stderr[-3000:]
        for f in (tmp_path / kind).iterdir():
            seen[f"report {kind} {f.name}"] = f.read_text(encoding="utf-8")
        assert seen[f"report {kind} report.json"]

    # Failures name the store and its address, never the password.
    pg, rd = urlsplit(settings.postgres_dsn), urlsplit(settings.redis_url)
    pg_down = dsn.replace(f"@{pg.hostname}:{pg.port}/", f"@{pg.hostname}:1/")
    wrong_pg = dsn.replace(quote(pg_role[1], safe=""), quote("x" + pg_role[1], safe=""))
    rd_down = url.replace(f":{rd.port}/", ":1/")
    wrong_rd = url.replace(quote(redis_user[1], safe=""), quote("x" + redis_user[1], safe=""))
    load = ("load", "--schema", "credit_applicant", str(data), "--no-progress")
    for label, overrides, fragment in [
        ("load pg down", {"FEATURES_POSTGRES_DSN": pg_down}, f"{pg.hostname}:1"),
        ("load pg password", {"FEATURES_POSTGRES_DSN": wrong_pg}, "password authentication failed"),
        ("load redis down", {"FEATURES_REDIS_URL": rd_down}, f"{rd.hostname}:1"),
        ("load redis password", {"FEATURES_REDIS_URL": wrong_rd}, "AUTH"),
        ("load bad dsn", {"FEATURES_POSTGRES_DSN": dsn.replace("%40", "%zz")}, "not a valid libpq"),
    ]:
        bad = cli(label, *load, **overrides)
        assert bad.returncode == 2 and fragment in bad.stderr, (label, bad.stderr[-2000:])
    down = cli("health down", "health", "--timeout", "2", FEATURES_POSTGRES_DSN=pg_down,
               FEATURES_REDIS_URL=wrong_rd)
    assert down.returncode == 1 and "FAIL" in down.stdout
    rep = cli("report down", "report", "--schema", "credit_applicant", "--table", "--out",
              str(tmp_path / "down"), FEATURES_POSTGRES_DSN=wrong_pg)
    assert rep.returncode == 2 and "password authentication failed" in rep.stderr

    # The SDK: its reads work, its errors and its settings' repr show no password.
    with FeatureStore(redis_url=url, postgres_dsn=dsn, schemas=ROOT / "schemas") as fs:
        ids = pq.read_table(data, columns=["application_id"]).column(0).to_pylist()[:20]
        assert any(fs.online("credit_applicant", ids).column("_found").to_pylist())
    for store_args, error in [({"redis_url": wrong_rd, "postgres_dsn": dsn}, SinkError),
                              ({"redis_url": rd_down, "postgres_dsn": dsn}, SinkUnavailable),
                              ({"redis_url": url, "postgres_dsn": pg_down}, SinkUnavailable)]:
        with FeatureStore(schemas=ROOT / "schemas", fallback=True, timeout_s=2, **store_args) as fs:
            with pytest.raises(error) as info:
                fs.online("credit_applicant", ["APP-000000000001"])  # missing from Redis: falls back
        seen[f"sdk {error.__name__} {len(seen)}"] = f"{info.value!s} {info.value!r}"
    from features.config import resolve_settings

    seen["settings repr"] = repr(resolve_settings(environ=env, root=ROOT))

    _assert_secret_free(tokens, seen)
    assert "***" in seen["settings repr"]


@pytest.mark.flink
def test_stream_job_keeps_credentials_out_of_its_output_and_flink_logs(
        tmp_path: Path, settings: Settings, pg_schema: str, stream_topic: str,
        pg_role: tuple[str, str, str], redis_user: tuple[str, str, str]) -> None:
    from features.ops.examples import applicant_events
    from features.stream.kafka import entity_keys, produce

    dsn, url = _urls(settings, pg_schema, pg_role, redis_user)
    rdk, rdk_token = _secret("kf")
    java, java_token = _secret("jv")
    tokens = [pg_role[2], redis_user[2], rdk_token, java_token]
    values = applicant_events(300, seed=3)
    produce(settings.kafka_bootstrap, stream_topic, values, keys=entity_keys(values, "application_id"))
    # Secret Kafka properties for both clients; the broker speaks PLAINTEXT, which both
    # clients accept alongside unused SASL settings: the point is where the values go.
    env = _clean_env(
        FEATURES_POSTGRES_DSN=dsn, FEATURES_REDIS_URL=url, FEATURES_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
        FEATURES_KAFKA_PROPERTIES=json.dumps({"sasl.username": "app", "sasl.password": rdk}),
        FEATURES_KAFKA_JAVA_PROPERTIES=json.dumps({"sasl.jaas.config": "org.apache.kafka.common.security"
                                                   f'.plain.PlainLoginModule required username="app" '
                                                   f'password="{java}";'}))
    state = tmp_path / "state"
    cmd = [sys.executable, str(ROOT / "jobs" / "stream_job.py"), "--schema", "credit_applicant", "--topic",
           stream_topic, "--bounded", "--restart-attempts", "0", "--state-dir", str(state), "--json",
           "--log-every-s", "0"]  # the lag is measured with every micro-batch's status line
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["adds_up"] and summary["stored"] > 0 and summary["read"] == len(values)
    assert "stream: submitting" in proc.stderr and "***" in proc.stderr  # the config line, masked
    files = {str(p): p.read_bytes().decode("utf-8", errors="replace")
             for p in state.rglob("*") if p.is_file()}     # logs, summaries, checkpoints
    logs = [p for p in files if p.endswith(".log")]
    assert logs and any(len(files[p]) > 10_000 for p in logs), f"no Flink log under {state}: {sorted(files)}"
    _assert_secret_free(tokens, {"stdout": proc.stdout, "stderr": proc.stderr, **files})


# --------------------------------------------------------------------------- Redis over TLS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture()
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path, str]]:
    """A private redis-server speaking only TLS (a throwaway CA; the server certificate
    names 127.0.0.1 and localhost, not 127.0.0.2, where it listens too) with a password:
    (port, CA file, password)."""
    for tool in ("openssl", "redis-server"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is needed for the Redis TLS test (`features dev up` installs redis-server)")
    d = tmp_path / "tls"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "2", "-subj", "/CN=featureline test CA", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "san.ext", cwd=d)
    port = _free_port()
    password, _ = _secret("tl")
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "127.0.0.2",
         "--tls-cert-file", str(d / "server.pem"), "--tls-key-file", str(d / "server.key"),
         "--tls-ca-cert-file", str(d / "ca.pem"), "--tls-auth-clients", "no", "--requirepass", password,
         "--save", "", "--appendonly", "no", "--dir", str(d)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            assert proc.poll() is None, "redis-server with TLS exited at start (built without TLS?)"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "redis-server with TLS did not listen within 30 s"
                time.sleep(0.2)
        yield port, d / "ca.pem", password
    finally:
        proc.terminate()
        proc.wait(30)


def test_redis_over_tls_with_a_ca_file(tmp_path: Path, settings: Settings, pg_schema: str,
                                       tls_redis: tuple[int, Path, str]) -> None:
    import dataclasses

    from features.ops.examples import applicant_schema
    from features.ops.health import check_all

    port, ca, password = tls_redis
    auth = f":{quote(password, safe='')}@"
    url = f"rediss://{auth}127.0.0.1:{port}/0?ssl_ca_certs={ca}"
    compiled: CompiledSchema = applicant_schema()
    data = _applicants_file(tmp_path, 300)
    tls_settings = dataclasses.replace(settings, redis_url=url)
    summary = load([data], compiled, tls_settings, search_path=pg_schema)   # RedisSink: raw TLS + redis-py
    assert summary.adds_up and summary.sinks["redis"].written > 0
    ids = pq.read_table(data, columns=["application_id"]).column(0).to_pylist()[:50]
    with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, search_path=pg_schema,
                      schemas=ROOT / "schemas", fallback=False) as fs:
        sync = fs.online("credit_applicant", ids)                             # the raw TLS reader

        async def lookup() -> pa.Table:                                       # redis-py asyncio over TLS
            try:
                return await fs.online_async("credit_applicant", ids)
            finally:
                await fs.aclose()

        asyncd = asyncio.run(lookup())
    assert sum(sync.column("_found").to_pylist()) > 10
    assert sync.drop_columns(["_age_seconds"]).equals(asyncd.drop_columns(["_age_seconds"]))
    checks = {c.name: c for c in check_all(tls_settings, timeout_s=5) if c.kind == "store"}
    assert checks["redis"].ok, checks["redis"].detail

    # Without the CA (the system's CAs do not know it), or under a name the certificate does
    # not carry (127.0.0.2): refused at the handshake, naming the address, never the password.
    for bad, host in ((url.split("?")[0], "127.0.0.1"),
                      (url.replace("127.0.0.1", "127.0.0.2", 1), "127.0.0.2")):
        with FeatureStore(redis_url=bad, postgres_dsn=settings.postgres_dsn, schemas=ROOT / "schemas",
                          fallback=False, timeout_s=3) as fs, pytest.raises(SinkUnavailable) as info:
            fs.online("credit_applicant", ids[:1])
        assert "certificate verify failed" in str(info.value) and f"{host}:{port}" in str(info.value)
        assert password not in str(info.value)
    # Accepted: 'localhost' (in the certificate); 127.0.0.2 with the host-name check off;
    # any certificate with verification off (tests only).
    for ok_url in (url.replace("127.0.0.1", "localhost", 1),
                   url.replace("127.0.0.1", "127.0.0.2", 1) + "&ssl_check_hostname=false",
                   f"rediss://{auth}127.0.0.1:{port}/0?ssl_cert_reqs=none"):
        with FeatureStore(redis_url=ok_url, postgres_dsn=settings.postgres_dsn, search_path=pg_schema,
                          schemas=ROOT / "schemas", fallback=False) as fs:
            assert fs.online("credit_applicant", ids).column("_found").to_pylist() == \
                sync.column("_found").to_pylist()


# --------------------------------------------------------------------------- Kafka with SASL

KAFKA_LIBS = kafka_libs()


@pytest.fixture()
def sasl_kafka(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A private single-node Kafka (KRaft, the jars `features dev up` fetched) whose only
    client listener is SASL_PLAINTEXT with mechanism PLAIN and one user ``app``:
    (bootstrap, app's password). Stopped and deleted after the test."""
    if not list(KAFKA_LIBS.glob("kafka_2.13-*.jar")) or shutil.which("java") is None:
        pytest.fail(f"the SASL test starts its own broker from {KAFKA_LIBS} with java: run `features dev up`")
    d = tmp_path / "kafka"
    d.mkdir()
    port, controller = _free_port(), _free_port()
    password, _ = _secret("ka")
    admin_pw = uuid.uuid4().hex
    jaas = (f'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
            f'password="{admin_pw}" user_admin="{admin_pw}" user_app="{password}";')
    (d / "server.properties").write_text("\n".join([
        "process.roles=broker,controller", "node.id=1",
        f"controller.quorum.bootstrap.servers=127.0.0.1:{controller}",
        f"listeners=SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        f"advertised.listeners=SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "controller.listener.names=CONTROLLER", "inter.broker.listener.name=SASL_PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms=PLAIN", "sasl.mechanism.inter.broker.protocol=PLAIN",
        f"listener.name.sasl_plaintext.plain.sasl.jaas.config={jaas}",
        f"log.dirs={d / 'data'}", "num.partitions=1", "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=1", "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1", "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1", "group.initial.rebalance.delay.ms=0", ""]))
    (d / "log4j2.properties").write_text("\n".join([
        "rootLogger.level = warn", "appender.f.type = File", "appender.f.name = F",
        f"appender.f.fileName = {d / 'kafka.log'}", "appender.f.layout.type = PatternLayout",
        "appender.f.layout.pattern = %d %p %m%n", "rootLogger.appenderRef.f.ref = F", ""]))
    java = ["java", "-Xms256m", "-Xmx512m", "-cp", f"{KAFKA_LIBS}/*",
            f"-Dlog4j2.configurationFile=file:{d / 'log4j2.properties'}"]
    cluster = subprocess.run([*java, "kafka.tools.StorageTool", "random-uuid"], capture_output=True,
                             text=True, check=True, timeout=120).stdout.strip().splitlines()[-1]
    subprocess.run([*java, "kafka.tools.StorageTool", "format", "--standalone", "-t", cluster, "-c",
                    str(d / "server.properties")], capture_output=True, check=True, timeout=120)
    proc = subprocess.Popen([*java, "kafka.Kafka", str(d / "server.properties")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    bootstrap = f"127.0.0.1:{port}"
    try:
        from confluent_kafka.admin import AdminClient

        from features.stream.kafka import client_config

        admin = AdminClient(client_config(bootstrap, _sasl_properties(password), log_level=0))
        deadline = time.time() + 120
        while True:
            log = d / "kafka.log"
            assert proc.poll() is None, log.read_text()[-3000:] if log.exists() else "the broker exited"
            try:
                if admin.list_topics(timeout=2).brokers:
                    break
            except Exception:  # KafkaException while the broker starts
                pass
            assert time.time() < deadline, "the SASL broker did not answer within 120 s"
            time.sleep(0.5)
        yield bootstrap, password
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def _sasl_properties(password: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "app",
            "sasl.password": password}


@pytest.mark.flink
@pytest.mark.slow
def test_kafka_sasl_properties_reach_every_client(tmp_path: Path, settings: Settings, pg_schema: str,
                                                 redis_db: str, sasl_kafka: tuple[str, str]) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from features.ops.examples import applicant_events
    from features.stream.kafka import client_config, ensure_topic, entity_keys, produce, read_topic

    bootstrap, password = sasl_kafka
    token = password[:14]
    props = _sasl_properties(password)
    # The broker really demands the credentials: without them there is no metadata.
    with pytest.raises(KafkaException):
        AdminClient(client_config(bootstrap, log_level=0)).list_topics(timeout=3)
    topic = f"t_sasl_{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, partitions=2, properties=props)
    ensure_topic(bootstrap, topic + ".rejects", partitions=1, properties=props)
    values = applicant_events(300, seed=9)
    produce(bootstrap, topic, values, keys=entity_keys(values, "application_id"), properties=props)

    env = _clean_env(
        FEATURES_POSTGRES_DSN=search_path_dsn(settings.postgres_dsn, pg_schema), FEATURES_REDIS_URL=redis_db,
        FEATURES_KAFKA_BOOTSTRAP=bootstrap, FEATURES_KAFKA_PROPERTIES=json.dumps(props))
    seen: dict[str, str] = {}

    def cli(label: str, *args: str, **overrides: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, *args], env={**env, **overrides}, cwd=ROOT,
                              capture_output=True, text=True, timeout=400)
        seen[f"{label} stdout"], seen[f"{label} stderr"] = proc.stdout, proc.stderr
        return proc

    health = cli("health", "-m", "features.cli", "health", "--json", "--schemas-dir", str(ROOT / "schemas"))
    kafka = next(c for c in json.loads(health.stdout)["checks"] if c["name"] == "kafka")
    assert kafka["ok"] and "1 broker(s)" in kafka["detail"], health.stdout
    wrong = json.dumps({**props, "sasl.password": "x" + password})
    bad = cli("health wrong password", "-m", "features.cli", "health", "--json", "--timeout", "3",
              "--schemas-dir", str(ROOT / "schemas"), FEATURES_KAFKA_PROPERTIES=wrong)
    assert not next(c for c in json.loads(bad.stdout)["checks"] if c["name"] == "kafka")["ok"]

    state = tmp_path / "state"
    job = [str(ROOT / "jobs" / "stream_job.py"), "--schema", "credit_applicant", "--topic", topic,
           "--bounded", "--restart-attempts", "0", "--state-dir", str(state), "--json",
           "--log-every-s", "0"]  # the lag is measured with every micro-batch's status line
    # Secured librdkafka clients but no Java properties: refused before Flink starts.
    refused = cli("stream without java properties", *job)
    assert refused.returncode == 2 and "FEATURES_KAFKA_JAVA_PROPERTIES" in refused.stderr
    # The login module as Kafka's documentation names it: the job relocates it for the connector jar.
    java = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
                                f'username="app" password="{password}";'}
    proc = cli("stream", *job, FEATURES_KAFKA_JAVA_PROPERTIES=json.dumps(java))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["adds_up"] and summary["read"] == len(values) and summary["rejected"] > 0
    # The lag consumer authenticated: it measured both partitions (a failure there is only a
    # warning, and the lag stays unmeasured). Not the worker's "stream finished" line: Flink
    # does not always let a worker finish closing (CI lost it once).
    assert summary["lag_total"] is not None, proc.stderr[-4000:]
    assert set(summary["lag"]) == {f"{topic}/0", f"{topic}/1"}
    # the dead-letter producer (librdkafka, in the Python worker) authenticated too
    assert len(read_topic(bootstrap, topic + ".rejects", properties=props)) == summary["dead_letters"] \
        == summary["rejected"]
    files = {str(p): p.read_bytes().decode("utf-8", errors="replace")
             for p in state.rglob("*") if p.is_file()}
    _assert_secret_free([token], {**seen, **files})
