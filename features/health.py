"""``features health``: can this configuration run? Every store, every schema's fingerprint.

Checks, with the configured settings (``FEATURES_*``, ``featureline.toml``):

- Postgres: connects and reads its version;
- Redis: ``PING``;
- Kafka: fetches the cluster metadata (with ``kafka_properties``: TLS, SASL);
- each loadable schema in the schemas folder: the fingerprint Postgres recorded for it
  (``featureline_schemas``) against the compiled schema's — ``ok``, ``not loaded`` (no
  record yet: nothing written with it), or ``MISMATCH`` (the stores hold another version:
  run the migration from ``features schema diff``).

Prints one line per check (``--json``: an object), never a password. Exit 0 when every
store answers and no fingerprint differs, 1 otherwise, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Check:
    kind: str          # "store" or "schema"
    name: str
    ok: bool
    detail: str
    seconds: float = 0.0


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "health", help="check every configured store and each schema's recorded fingerprint",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--schemas-dir", default=None, help="folder of schema YAML files (default: schemas)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per store check (default 5)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=run)


def _timed(kind: str, name: str, fn: Any) -> Check:
    t0 = time.perf_counter()
    try:
        detail = fn()
        ok = True
    except Exception as exc:  # every failure becomes a line, never a traceback
        from features.config import redact

        # driver messages name hosts, not passwords; redact() is the belt to those braces
        text = redact(str(exc).strip())
        ok, detail = False, f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
    return Check(kind, name, ok, detail, round(time.perf_counter() - t0, 3))


def check_all(settings: Any, *, timeout_s: float = 5.0) -> list[Check]:
    from features.sinks import pg
    from features.sinks.redis_wire import RedisEndpoint

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
            from features.sinks.redis_cluster import Cluster

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
        from confluent_kafka.admin import AdminClient

        from features.stream.kafka import client_config

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
        checks.extend(_schema_checks(settings, timeout_s))
    else:
        checks.append(Check("schema", "*", False, f"not checked: Postgres at {pg_address} is unreachable"))
    return checks


def _schema_checks(settings: Any, timeout_s: float) -> list[Check]:
    from features.compile import compile_schema
    from features.compile.postgres import SCHEMAS_TABLE, quote_ident
    from features.schema import load_schemas
    from features.sinks import pg

    out: list[Check] = []
    schemas = load_schemas(settings.schemas_dir)
    recorded: dict[str, tuple[str, str]] = {}
    timeout = max(int(timeout_s), 1)
    with pg.connect(settings.postgres_dsn, timeout_s=timeout, autocommit=True) as conn, \
            pg.map_psycopg_errors(settings.postgres_dsn, "the fingerprint read"):
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (quote_ident(SCHEMAS_TABLE),)).fetchone()
        if row and row[0]:
            for r in conn.execute(f"SELECT schema_name, version, fingerprint FROM "
                                  f"{quote_ident(SCHEMAS_TABLE)}").fetchall():
                recorded[r[0]] = (r[1], r[2])
    for name, schema in sorted(schemas.items()):
        if not schema.loadable:
            continue
        compiled = compile_schema(schema)
        got = recorded.get(name)
        if got is None:
            out.append(Check("schema", name, True, f"{schema.version_str} ({compiled.fingerprint[:12]}): "
                                                   "not loaded (no fingerprint recorded yet)"))
        elif got[1] == compiled.fingerprint:
            out.append(Check("schema", name, True,
                             f"{schema.version_str} ({compiled.fingerprint[:12]}): ok"))
        else:
            out.append(Check("schema", name, False,
                             f"MISMATCH: the stores hold {got[0]} ({got[1][:12]}), {schema.path or name} is "
                             f"{schema.version_str} ({compiled.fingerprint[:12]}): run "
                             "`features schema diff` and apply its migration"))
    return out


def run(args: argparse.Namespace) -> int:
    from features.config import resolve_settings

    if args.timeout <= 0:
        raise SystemExit("features health: --timeout must be > 0")
    settings = resolve_settings(schemas_dir=args.schemas_dir)
    checks = check_all(settings, timeout_s=args.timeout)
    healthy = all(c.ok for c in checks)
    if args.json:
        print(json.dumps({"healthy": healthy, "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        for c in checks:
            print(f"{c.kind:<7}{c.name:<22}{'ok' if c.ok else 'FAIL':<6}{c.detail}")
        print("healthy" if healthy else "NOT healthy")
    return 0 if healthy else 1
