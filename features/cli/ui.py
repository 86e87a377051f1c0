"""``features ui``: the read-only web pages (``docs/ui.md``), served by uvicorn.

One process serves :class:`features.ui.app.UIApp` on ``--host``/``--port`` (port 0: a free
one); it prints one line with the URL once it listens. Without a token it serves a
loopback host only; elsewhere every request needs ``Authorization: Bearer <token>`` with
one of the service's tokens (``FEATURES_INGEST_TOKENS`` or ``ingest_tokens`` in the
secrets file, as ``features serve``). SIGTERM or Ctrl-C stops it (exit 0).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from features.cli import COMMANDS
from features.cli.arguments import bind_socket, is_loopback, port_number
from features.compile import compile_schema
from features.config import resolve_settings
from features.errors import ConfigError
from features.flink.stream import default_group_id
from features.ops.catalog import read_catalog
from features.ui.app import UIApp
from features.ui.data import UIData
from features.ui.freshness import FreshnessReader, streams_of

log = logging.getLogger("features.ui")


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "ui", help=COMMANDS["ui"].summary,
        description="Serve read-only HTML pages over the project's schemas and the Postgres stores: "
        "Registry (every schema: fields with types, constraints and sources, derived features, "
        "aggregations, hot/cold placement, version, fingerprint, quality gates, generated DDL and GX suite, "
        "its version history with features schema diff between versions; every view and the schemas it "
        "reads), Runs "
        "(every load and stream run: rows read, stored, rejected, reject rate, top reasons) and Rejects "
        "(filter by run, rule and field; each reject's errors, raw payload and lineage), Freshness (per "
        "schema: the newest event and ingestion times against its max_staleness, the consumer lag of each "
        "--stream, the share of the history's entities hot in Redis) and Drift (per "
        "field, a recent window of event time against a reference window: PSI, KS and histograms as the "
        "validation report computes them). The pages load no "
        "script or font. With tokens configured (FEATURES_INGEST_TOKENS or ingest_tokens in the secrets "
        "file, "
        "as features serve) every request needs Authorization: Bearer <token>; without any, the UI serves "
        "a loopback host only (the default, 127.0.0.1) and refuses any other --host (exit 2). See "
        "docs/ui.md.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8080,
                   help="port to listen on (default 8080; 0: a free one, printed)")
    p.add_argument("--schemas-dir", default=None, metavar="DIR",
                   help="folder of schema YAML files (default: the schemas_dir setting, schemas)")
    p.add_argument("--views-dir", default=None, metavar="DIR",
                   help="folder of view YAML files, listed in the registry (default: the views_dir setting, "
                   "views; a missing folder holds none)")
    p.add_argument("--key-prefix", default="",
                   help="text in front of every Redis key, as the loads and streams wrote them (the "
                   "freshness page's Redis coverage; default none)")
    p.add_argument("--stream", action="append", default=[], metavar="SCHEMA:TOPIC[:GROUP]",
                   help="a stream whose consumer lag the freshness page shows: its schema, topic and "
                   "consumer group (default: the group `features stream --schema SCHEMA --topic TOPIC` "
                   "uses); repeatable")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn  # heavy (~90 ms: loops, protocols): only when the command serves

    settings = resolve_settings(schemas_dir=args.schemas_dir)
    tokens: tuple[str, ...] | None = settings.ingest_tokens or None
    if tokens is None and not is_loopback(args.host):
        raise ConfigError(f"features ui --host {args.host} needs a token: set FEATURES_INGEST_TOKENS (comma "
                          "separated) or ingest_tokens in the secrets file (docs/ui.md); without one the UI "
                          "serves a loopback address only (127.0.0.1, ::1)", key="ingest_tokens",
                          looked_in=["FEATURES_INGEST_TOKENS", "secrets file"])
    catalog = read_catalog(settings.schemas_dir, args.views_dir or settings.views_dir)
    data = UIData({name: compile_schema(s) for name, s in catalog.schemas.items()}, settings.postgres_dsn)
    try:
        streams = streams_of(args.stream, {n: s.path for n, s in catalog.schemas.items()}, default_group_id)
    except ValueError as exc:
        raise ConfigError(str(exc), key="stream") from exc
    freshness = FreshnessReader(data, settings, key_prefix=args.key_prefix, streams=streams)
    app = UIApp(catalog, data, tokens=tokens, schemas_dir=settings.schemas_dir, freshness=freshness)
    sock = bind_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"features ui: serving http://{shown}:{port}/ ({len(catalog.schemas)} schemas"
          f"{', token required' if tokens else ''})", flush=True)
    config = uvicorn.Config(app, loop="uvloop", http="httptools", lifespan="on", access_log=False,
                            log_config=None, server_header=False, proxy_headers=False)
    try:
        _quiet_server()(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0


def _quiet_server() -> Any:
    """uvicorn's ``Server`` class, except that the signal that stopped it is not raised again
    once it has shut down (uvicorn re-raises it for process managers): ``features ui`` then
    exits 0. A second signal stops it without waiting for open requests."""

    import uvicorn  # heavy: only when the command serves (see run)

    class QuietServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            self.force_exit = self.should_exit
            self.should_exit = True

    return QuietServer
