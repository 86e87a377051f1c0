"""``features health``: can this configuration run? Every store, every schema's fingerprint.

Checks, with the configured settings (``FEATURES_*``, ``featureline.toml``):

- Postgres: connects and reads its version;
- Redis: ``PING``;
- Kafka: fetches the cluster metadata (with ``kafka_properties``: TLS, SASL);
- each loadable schema in the schemas folder: the fingerprint Postgres recorded for it
  (``featureline_schemas``) against the compiled schema's — ``ok``, ``not loaded`` (no
  record yet: nothing written with it), or ``MISMATCH`` (the stores hold another version:
  whether the change is compatible, and the ``features migrate`` command that moves the
  stores); and, when Postgres holds this version, a sample of the schema's Redis hashes
  (up to 20,000 keys of each kind): ``MISMATCH`` when some hold another version (an
  unfinished migration, or an old writer still running), naming the command that
  rewrites them.

Prints one line per check (``--json``: an object), never a password. Exit 0 when every
store answers and no fingerprint differs, 1 otherwise, 2 on usage errors.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka.admin import AdminClient

from features.compile import compile_schema
from features.compile.layout import aggregates_key, entity_key
from features.compile.migration import plan_migration
from features.config import redact
from features.errors import ConfigError
from features.ops.migrate import glob_escape
from features.schema import load_schemas
from features.sdk.fallback import redis_py_client
from features.sinks import pg
from features.sinks.redis_cluster import Cluster
from features.sinks.redis_wire import RedisEndpoint
from features.sinks.versions import Recorded, compiled_version, read_recorded
from features.stream.kafka import client_config


@dataclass
class Check:
    kind: str          # "store" or "schema"
    name: str
    ok: bool
    detail: str
    seconds: float = 0.0


def _timed(kind: str, name: str, fn: Any) -> Check:
    t0 = time.perf_counter()
    try:
        detail = fn()
        ok = True
    except Exception as exc:  # every failure becomes a line, never a traceback
        # driver messages name hosts, not passwords; redact() is the belt to those braces
        text = redact(str(exc).strip())
        ok, detail = False, f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
    return Check(kind, name, ok, detail, round(time.perf_counter() - t0, 3))


def check_all(settings: Any, *, timeout_s: float = 5.0, schema: str | None = None) -> list[Check]:
    """The stores' checks, then each schema's (``schema``: that one only; a name not in
    the folder raises ConfigError naming those that are)."""
    checks: list[Check] = []
    pg_address = pg.address(settings.postgres_dsn)

    def postgres() -> str:
        with pg.connect(settings.postgres_dsn, timeout_s=timeout_s) as conn, \
                pg.map_psycopg_errors(settings.postgres_dsn, "SHOW server_version"):
            row = conn.execute("SHOW server_version").fetchone()
        return f"{pg_address}: PostgreSQL {row[0] if row else '?'}"

    endpoint = RedisEndpoint.from_url(settings.redis_url)

    def redis_ping() -> str:
        if endpoint.cluster:  # every primary of the slot map answers PING
            cluster = Cluster(endpoint, timeout_s=timeout_s)
            try:
                cluster.refresh()
                for node in cluster.nodes:
                    reply = cluster.conn(node).call(["PING"])
                    if reply != b"PONG":
                        raise RuntimeError(f"{node[0]}:{node[1]}: unexpected reply {reply!r}")
            finally:
                cluster.close()
            return (f"{cluster.address}: Redis Cluster, {len(cluster.nodes)} primaries answer PING, "
                    "every slot served")
        sock = endpoint.connect(timeout_s)
        try:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            reply = sock.recv(64)
        finally:
            sock.close()
        if not reply.startswith(b"+PONG"):
            raise RuntimeError(f"unexpected reply {reply[:40]!r}")
        return f"{endpoint.address}/{endpoint.db}: PONG"

    def kafka() -> str:
        admin = AdminClient(client_config(settings.kafka_bootstrap, settings.kafka_properties))
        try:
            meta = admin.list_topics(timeout=timeout_s)
        finally:
            admin.poll(0)  # deliver its log lines (features.stream.kafka.LibrdkafkaLog)
        return f"{settings.kafka_bootstrap}: {len(meta.brokers)} broker(s), {len(meta.topics)} topic(s)"

    checks.append(_timed("store", "postgres", postgres))
    checks.append(_timed("store", "redis", redis_ping))
    checks.append(_timed("store", "kafka", kafka))
    if checks[0].ok:
        checks.extend(_schema_checks(settings, timeout_s, schema))
    else:
        checks.append(Check("schema", "*", False, f"not checked: Postgres at {pg_address} is unreachable"))
    return checks


def _schema_checks(settings: Any, timeout_s: float, only: str | None = None) -> list[Check]:
    out: list[Check] = []
    schemas = load_schemas(settings.schemas_dir)
    if only is not None:
        if only not in schemas:
            raise ConfigError(f"no schema {only!r} in {settings.schemas_dir}; the schemas there: "
                              f"{', '.join(sorted(schemas)) or 'none'}")
        schemas = {only: schemas[only]}
    recorded: dict[str, Recorded] = {}
    timeout = max(int(timeout_s), 1)
    with pg.connect(settings.postgres_dsn, timeout_s=timeout, autocommit=True) as conn, \
            pg.map_psycopg_errors(settings.postgres_dsn, "the fingerprint read"):
        for name, schema in schemas.items():
            if schema.loadable:
                recorded[name] = read_recorded(conn, name)
    for name, schema in sorted(schemas.items()):
        if not schema.loadable:
            continue
        compiled = compile_schema(schema)
        got = recorded[name]
        where = schema.path or name
        head = f"{schema.version_str} ({compiled.fingerprint[:12]})"
        if got.fingerprint is None:
            out.append(Check("schema", name, True, f"{head}: not loaded (no fingerprint recorded yet)"))
        elif got.fingerprint == compiled.fingerprint:
            t0 = time.perf_counter()
            try:
                ok, detail = _redis_versions(settings, compiled, got, timeout_s)
            except Exception as exc:  # Redis down is the store line's FAIL; this says what it missed
                ok, detail = False, f"{head}: Postgres ok, Redis not sampled ({type(exc).__name__}: {exc})"
            out.append(Check("schema", name, ok, detail, round(time.perf_counter() - t0, 3)))
        else:
            out.append(Check("schema", name, False,
                             f"MISMATCH: the stores hold {got.version} ({got.fingerprint[:12]}), {where} is "
                             f"{head}: " + _mismatch_fix(schema, compiled.fingerprint, got)))
    return out


def _mismatch_fix(schema: Any, fp: str, got: Any) -> str:
    """What to do when Postgres holds another version than the schema file."""
    assert got.fingerprint is not None
    if fp in got.ancestors(got.fingerprint):
        return (f"the stores were migrated from this version to {got.version}: give the readers and writers "
                "the newer schema file")
    old = got.versions.get(got.fingerprint)
    verdict = ""
    if old is not None and old.text is not None:
        try:
            diff = plan_migration(compiled_version(old, schema.name).schema, schema).diff
            verdict = ("a compatible change; " if diff.compatible and diff.refusal is None
                       else "a BREAKING change (docs/evolution.md), which `features migrate` refuses; ")
        except Exception:  # the verdict is a courtesy: the fix below stands without it
            verdict = ""
    return (f"{verdict}run `features migrate {schema.path or schema.name + '.yaml'}` (a dry run), then again "
            "with --apply")


#: SCAN calls (of 1,000 keys each) ``features health`` makes per schema to sample Redis.
_SAMPLE_SCANS = 20


def _redis_versions(settings: Any, c: Any, got: Any, timeout_s: float) -> tuple[bool, str]:
    """``ok``, or ``MISMATCH`` when a sample of the schema's Redis hashes holds another version."""
    client = redis_py_client(settings.redis_url, timeout_s)
    tally: dict[str, int] = {}
    seen = 0
    try:
        for key in (entity_key(c.name, "*"), aggregates_key(c.name, "*")):
            pattern = glob_escape(key[:-2]) + "*}"
            keys: list[Any] = []
            # a cluster: the SCAN calls shared among its primaries (each key lives on one)
            nodes = ([client.get_redis_connection(n) for n in client.get_primaries()]
                     if getattr(client, "nodes_manager", None) is not None else [client])
            for node in nodes:
                cursor = 0
                for _ in range(max(_SAMPLE_SCANS // len(nodes), 1)):
                    cursor, part = node.scan(cursor, match=pattern, count=1000)
                    keys.extend(part)
                    if cursor == 0:
                        break
            for fp, n in fingerprint_tally(client, keys).items():
                tally[fp] = tally.get(fp, 0) + n
            seen += len(keys)
    finally:
        client.close()
    return fingerprint_verdict(c, got, tally, seen)


def fingerprint_tally(client: Any, keys: Sequence[Any]) -> dict[str, int]:
    """How many of the Redis hashes ``keys`` hold each schema fingerprint (their
    ``_schema_fingerprint`` field, one pipelined HGET per key; ``client`` a redis-py
    client, a cluster one included). A key that does not exist, or holds no fingerprint,
    is not counted."""
    tally: dict[str, int] = {}
    if not keys:
        return tally
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.hget(k, "_schema_fingerprint")
    for fp in pipe.execute():
        if fp is not None:
            text = fp.decode()
            tally[text] = tally.get(text, 0) + 1
    return tally


def fingerprint_verdict(c: Any, got: Any, tally: dict[str, int], seen: int) -> tuple[bool, str]:
    """``ok``, or ``MISMATCH`` when some of the ``seen`` Redis hashes sampled hold another
    version than the compiled schema ``c`` (``tally``: :func:`fingerprint_tally`; ``got``:
    the versions Postgres recorded, :func:`features.sinks.versions.read_recorded`), naming
    the command that rewrites them."""
    head = f"{c.schema.version_str} ({c.fingerprint[:12]})"
    others = {fp: n for fp, n in tally.items() if fp != c.fingerprint}
    if not others:
        return True, f"{head}: ok" + (f" ({seen:,} Redis hashes sampled)" if seen else "")
    older = set(got.ancestors(c.fingerprint))
    parts = []
    for fp, n in sorted(others.items(), key=lambda kv: -kv[1]):
        v = got.versions.get(fp)
        label = f"{v.version if v is not None else 'an unknown version'} ({fp[:12]})"
        parts.append(f"{n:,} hold {label}{'' if fp in older else ', which readers refuse'}")
    return False, (f"MISMATCH: Postgres holds {head}, but of {seen:,} Redis hashes sampled "
                   + "; ".join(parts)
            + f": run `features migrate {c.schema.path or c.name + '.yaml'} --apply` to rewrite them")


