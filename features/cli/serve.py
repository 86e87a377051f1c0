"""``features serve --schemas DIR``: the HTTP ingest service (``docs/ingest.md``).

The parent process checks the settings and the schemas, binds the listening socket once
and runs ``--workers`` worker processes (multiprocessing ``spawn``), each serving
:class:`features.serve.app.IngestApp` with uvicorn on that shared socket (the kernel
spreads the connections); with one worker it serves in its own process. It prints one
line with the URL once every worker is ready.

Signals: SIGTERM or SIGINT to the parent is forwarded to the workers as SIGTERM (each in
its own process group, so a terminal's Ctrl-C reaches only the parent); each worker then
stops accepting, finishes its in-flight requests, runs the lifespan shutdown (flushes the
producer) and exits; the parent closes its copy of the socket, waits for them and exits
0. A worker that dies on its own is replaced after a backoff (0.5 s, doubling per exit of
that worker within ``--restart-window``, at most 30 s); past ``--restart-limit`` restarts
of one worker within the window (e.g. Postgres refuses every new worker) the parent stops
every worker, logs why (the worker's own startup error, which it hands to the parent) and
exits 1. A worker whose parent died stops itself.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import re
import signal
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from features.cli import COMMANDS
from features.cli.arguments import bind_socket, is_loopback, port_number, positive_count, positive_seconds
from features.compile import compile_schema
from features.config import redact, resolve_settings
from features.errors import CompileError, ConfigError, SchemaError
from features.lineage import new_run_id
from features.observe.logs import active_format, set_run_id, setup_logging
from features.schema import load_schemas
from features.sdk import FeatureStore
from features.serve.app import IngestApp
from features.serve.ingest import SchemaIngest
from features.serve.limits import LIMIT_CONCURRENCY, MAX_ERRORS, MAX_QUEUED_BYTES, MAX_RECORDS, MAX_VIEW_ROWS
from features.serve.producer import DELIVERY_TIMEOUT_MS, AsyncProducer
from features.sinks.dead_letter import producer_max_bytes
from features.views import compile_view, load_views

log = logging.getLogger("features.serve")

#: The worker's graceful shutdown waits this long for in-flight requests, then cancels them
#: (a cancelled request was never answered 202, so nothing acknowledged is lost).
GRACEFUL_TIMEOUT_S = 30
#: How long the parent waits for every worker's startup.
STARTUP_TIMEOUT_S = 180.0
#: A worker that exited is started again after RESTART_BACKOFF_S, doubled for each other
#: exit of that worker within the restart window, at most RESTART_BACKOFF_MAX_S.
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0
#: Restarts of one worker allowed within the window (``--restart-limit``, ``--restart-window``).
RESTART_LIMIT = 5
RESTART_WINDOW_S = 300.0
#: Room for why a worker's startup failed (what the parent's log line quotes).
WHY_BYTES = 2048
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]i?B?|B)?\s*$", re.IGNORECASE)


def _size(text: str) -> int:
    """``16MiB``, ``512KiB``, ``1048576``, ``10MB`` -> bytes."""
    m = _SIZE.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (e.g. 16MiB, 512KiB, 1000000)")
    unit = (m.group(2) or "B").upper()
    scale = 1 if unit == "B" else (1024 if "I" in unit else 1000) ** "KMG".index(unit[0]) * (
        1024 if "I" in unit else 1000)
    return int(m.group(1)) * scale


def _workers(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("--workers must be at least 1")
    return n


def _delivery_seconds(text: str) -> float:
    """``--delivery-timeout``: seconds, at least 0.1 (librdkafka's ``delivery.timeout.ms``
    must exceed the producer's ``linger.ms``)."""
    s = positive_seconds(text)
    if s < 0.1:
        raise argparse.ArgumentTypeError(f"must be at least 0.1, got {text}")
    return s


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help=COMMANDS["serve"].summary,
        description="Serve POST /v1/schemas/{name}/events: each posted record (one JSON object, a JSON "
        "array of objects, or NDJSON) is decoded and validated with the stream job's own code; rejects go "
        "to the rejects table and the dead-letter topic, then the valid records (their bytes as sent) are "
        "produced to the schema's Kafka topic, keyed by entity, and the response waits for the broker's "
        "acknowledgement (202 all accepted, 422 some rejected, 503 retry). Also GET /healthz, /readyz and "
        "/metrics. Needs ingest tokens (FEATURES_INGEST_TOKENS or ingest_tokens in the secrets file) "
        "unless --insecure-no-auth on a loopback host. SIGTERM: stop accepting, finish in-flight "
        "requests, flush, exit 0. See docs/ingest.md. Also POST /v1/views/{name}/online for every view "
        "in --views (docs/views.md): request rows in, feature vectors out, read from Redis and Postgres; "
        "--no-ingest serves only those (no Kafka needed). Exit 2 on configuration errors.",
    )
    p.add_argument("--schemas", required=True, metavar="DIR",
                   help="folder of schema YAML files; every schema with an entity and an event time is "
                   "served")
    p.add_argument("--schema", action="append", default=None, metavar="NAME", dest="only",
                   help="ingest this schema only (repeat for several; default: every schema in --schemas "
                   "with an entity and an event time): /readyz then waits for these topics alone")
    p.add_argument("--views", default=None, metavar="DIR",
                   help="folder of view YAML files served on POST /v1/views/{name}/online (default: the "
                   "views_dir setting, views; a missing folder, or a default one that does not compile "
                   "against --schemas, serves none: a warning says why)")
    p.add_argument("--no-ingest", action="store_true",
                   help="serve the views only: no events route, no Kafka producer (/readyz: the views "
                   "compiled)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8000,
                   help="port to listen on (default 8000; 0: a free one, printed)")
    p.add_argument("--workers", type=_workers, default=1,
                   help="worker processes sharing the socket, about one per core (default 1)")
    p.add_argument("--topic-template", default="{schema}",
                   help="each schema's Kafka topic; {schema} is its name (default '{schema}')")
    p.add_argument("--dead-letter-topic-template", default="{topic}.rejects",
                   help="each schema's dead-letter topic; {topic} and {schema} are replaced (default "
                   "'{topic}.rejects'; '' disables dead letters, rejects still go to the rejects table)")
    p.add_argument("--max-body-bytes", type=_size, default=16 * 1024 * 1024, metavar="SIZE",
                   help="largest request body, e.g. 16MiB, 512KiB, 1000000 (default 16MiB; larger: 413)")
    p.add_argument("--max-records", type=positive_count, default=MAX_RECORDS, metavar="N",
                   help=f"most records in one request (default {MAX_RECORDS:,}; more: 413, nothing read)")
    p.add_argument("--max-view-rows", type=positive_count, default=MAX_VIEW_ROWS, metavar="N",
                   help=f"most request rows in one view request (default {MAX_VIEW_ROWS:,}; more: 413, "
                   "nothing read)")
    p.add_argument("--max-errors", type=positive_count, default=MAX_ERRORS, metavar="N",
                   help=f"most field errors listed in a 422 response, of the events or a view route (default "
                   f"{MAX_ERRORS:,}); the response also says errors_total and errors_truncated")
    p.add_argument("--max-queued-bytes", type=_size, default=MAX_QUEUED_BYTES, metavar="SIZE",
                   help="most body bytes waiting to be checked, per worker and schema (default 64MiB; "
                   "past it: 503 Retry-After)")
    p.add_argument("--limit-concurrency", type=positive_count, default=LIMIT_CONCURRENCY, metavar="N",
                   help=f"most connections and requests one worker takes at once (default "
                   f"{LIMIT_CONCURRENCY}; past it uvicorn answers 503)")
    p.add_argument("--delivery-timeout", type=_delivery_seconds, default=DELIVERY_TIMEOUT_MS / 1000,
                   metavar="SECONDS",
                   help=f"Kafka's producer gives up on a record after this long (delivery.timeout.ms) and "
                   f"the request answers 503 (default {DELIVERY_TIMEOUT_MS / 1000:g}; at least 0.1)")
    p.add_argument("--restart-limit", type=positive_count, default=RESTART_LIMIT, metavar="N",
                   help=f"a worker that exits is restarted after a backoff (0.5 s doubling, at most 30 s); "
                   f"after N restarts of one worker within --restart-window the service stops with exit "
                   f"1 (default {RESTART_LIMIT})")
    p.add_argument("--restart-window", type=positive_seconds, default=RESTART_WINDOW_S, metavar="SECONDS",
                   help=f"the window --restart-limit counts in (default {RESTART_WINDOW_S:g})")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="accept requests without a token (refused unless --host is a loopback address)")
    p.add_argument("--metrics-port", type=port_number, default=None, metavar="PORT",
                   help="worker i also serves its metrics on http://127.0.0.1:PORT+i/metrics (GET /metrics "
                   "on the main port shows the worker that answered)")
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True,
                   help="one log line per request: request_id, method, path, status, records, accepted, "
                   "rejected, ms (default on)")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class ServeOptions:
    """What every worker needs (picklable: workers are spawned)."""

    schemas_dir: str
    schemas: tuple[str, ...]
    topic_template: str
    dead_letter_template: str
    max_body_bytes: int
    insecure_no_auth: bool
    metrics_port: int | None
    access_log: bool
    run_id: str
    log_format: str | None
    max_records: int = MAX_RECORDS
    max_errors: int = MAX_ERRORS
    max_view_rows: int = MAX_VIEW_ROWS
    max_queued_bytes: int = MAX_QUEUED_BYTES
    limit_concurrency: int = LIMIT_CONCURRENCY
    restart_limit: int = RESTART_LIMIT
    restart_window_s: float = RESTART_WINDOW_S
    delivery_timeout_s: float = DELIVERY_TIMEOUT_MS / 1000
    views_dir: str = "views"
    views: tuple[str, ...] = ()
    ingest: bool = True

    def topic(self, schema: str) -> str:
        return self.topic_template.format(schema=schema)

    def dead_letter_topic(self, schema: str) -> str | None:
        if not self.dead_letter_template:
            return None
        return self.dead_letter_template.format(topic=self.topic(schema), schema=schema)


def run(args: argparse.Namespace) -> int:
    settings = resolve_settings(schemas_dir=args.schemas)
    if args.insecure_no_auth:
        if not is_loopback(args.host):
            raise ConfigError(f"--insecure-no-auth is refused with --host {args.host}: without a token "
                              "anyone who reaches the port can write events; it is allowed on a loopback "
                              "address only (127.0.0.1, ::1)", key="ingest_tokens")
    elif not settings.ingest_tokens:
        raise ConfigError("no ingest token configured: set FEATURES_INGEST_TOKENS (comma separated) or "
                          "ingest_tokens in the secrets file (docs/ingest.md), or pass --insecure-no-auth "
                          "on a loopback host for local development", key="ingest_tokens",
                          looked_in=["FEATURES_INGEST_TOKENS", "secrets file"])
    for template, keys in ((args.topic_template, {"schema": "s"}),
                           (args.dead_letter_topic_template, {"schema": "s", "topic": "t"})):
        try:
            template.format(**keys)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"invalid topic template {template!r}: {exc!r}", key="topic_template") from None
    loaded = load_schemas(args.schemas)
    if args.only and (unknown := sorted(set(args.only) - set(loaded))):
        raise ConfigError(f"--schema {', '.join(unknown)}: no such schema in {args.schemas}; the schemas "
                          f"there: "
                          f"{', '.join(sorted(loaded)) or 'none'}", key="schema", looked_in=[args.schemas])
    served = []
    for name, schema in loaded.items():
        if args.only and name not in args.only:
            continue
        if schema.loadable:
            compile_schema(schema)  # a schema that does not compile fails here, before any worker
            served.append(name)
        else:
            log.warning("serve: schema %s has no entity or event time (validation only): not served", name)
    if not served:
        raise ConfigError(f"no servable schema in {args.schemas} (each needs an entity and an event time)",
                          key="schemas", looked_in=[args.schemas])
    views_dir = args.views if args.views is not None else settings.views_dir
    try:
        views = _compiled_views(views_dir, loaded)
    except (SchemaError, CompileError) as exc:
        if args.views is not None:  # asked for: its errors fail the start
            raise
        # the default folder (the views_dir setting) may hold views over schemas this
        # --schemas folder does not serve: the ingest service starts without views
        log.warning("serve: no views served: %s does not compile against %s (%s); pass --views DIR to "
                    "serve views", views_dir, args.schemas, str(exc).splitlines()[0])
        views = []
    if args.no_ingest and not views:
        raise ConfigError(f"--no-ingest with no view in {views_dir}: nothing to serve", key="views",
                          looked_in=[views_dir])
    run_id = new_run_id()
    set_run_id(run_id)
    options = ServeOptions(args.schemas, tuple(served), args.topic_template, args.dead_letter_topic_template,
                           args.max_body_bytes, args.insecure_no_auth, args.metrics_port, args.access_log,
                           run_id, active_format(), max_records=args.max_records, max_errors=args.max_errors,
                           max_view_rows=args.max_view_rows,
                           max_queued_bytes=args.max_queued_bytes, limit_concurrency=args.limit_concurrency,
                           restart_limit=args.restart_limit, restart_window_s=args.restart_window,
                           delivery_timeout_s=args.delivery_timeout,
                           views_dir=views_dir, views=tuple(views), ingest=not args.no_ingest)
    sock = bind_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def ready() -> None:
        what = f"schemas {', '.join(served)}" if not args.no_ingest else "no ingest"
        shown = f"; views {', '.join(views)}" if views else ""
        print(f"features serve: listening on {url} ({args.workers} worker{'s' if args.workers > 1 else ''}; "
              f"{what}{shown}; run {run_id})", flush=True)

    if args.workers == 1:
        try:
            return serve_worker(0, sock, options, on_ready=ready)
        finally:
            sock.close()
    return _supervise(sock, options, args.workers, ready)


def _compiled_views(views_dir: str, schemas: dict[str, Any]) -> list[str]:
    """The names of the views in ``views_dir``, each compiled against ``schemas`` (a view
    that does not compile fails here, before any worker)."""
    if not Path(views_dir).exists():
        return []
    found = load_views(views_dir, schemas)
    for view in found.values():
        compile_view(view, {s.schema: compile_schema(schemas[s.schema]) for s in view.sources})
    return sorted(found)


# --------------------------------------------------------------------------- workers


def serve_worker(index: int, sock: socket.socket, options: ServeOptions, *, on_ready: Any = None,
                 on_failure: Any = None, watch_parent: int | None = None) -> int:
    """Run one worker until it is told to stop; returns its exit code (0 after a graceful
    shutdown, 3 when its startup failed: ``on_failure`` is then called with the reason)."""
    import uvicorn  # heavy (~90 ms: loops, protocols): only a worker serves, never --help or the parent

    settings = resolve_settings(schemas_dir=options.schemas_dir)
    loaded = load_schemas(options.schemas_dir)
    ingests = [SchemaIngest(compile_schema(loaded[name]), settings, topic=options.topic(name),
                            dead_letter_topic=options.dead_letter_topic(name), run_id=options.run_id,
                            max_records=options.max_records, max_errors=options.max_errors,
                            max_queued_bytes=options.max_queued_bytes)
               for name in options.schemas]
    max_message = max(producer_max_bytes(i.max_bytes) for i in ingests)

    def producer() -> AsyncProducer:
        return AsyncProducer(settings.kafka_bootstrap, settings.kafka_properties,
                             max_message_bytes=max_message,
                             delivery_timeout_ms=round(options.delivery_timeout_s * 1000))

    def store() -> Any:
        return FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                            schemas=options.schemas_dir, views=options.views_dir)

    app = IngestApp(ingests, producer, tokens=None if options.insecure_no_auth else settings.ingest_tokens,
                    max_body_bytes=options.max_body_bytes, worker=index, metrics_port=options.metrics_port,
                    access_log=options.access_log, on_ready=on_ready, on_failure=on_failure,
                    views=options.views, store_factory=store, ingest=options.ingest,
                    max_view_rows=options.max_view_rows, max_errors=options.max_errors)
    config = uvicorn.Config(app, loop="uvloop", http="httptools", lifespan="on", access_log=False,
                            log_config=None, server_header=False, proxy_headers=False,
                            timeout_graceful_shutdown=GRACEFUL_TIMEOUT_S,
                            limit_concurrency=options.limit_concurrency)
    server = _server_class()(config)
    if watch_parent is not None:
        threading.Thread(target=_watch_parent, args=(server, watch_parent), daemon=True).start()
    try:
        server.run(sockets=[sock])
    except SystemExit as exc:  # uvicorn exits with 3 when the lifespan startup failed
        return int(exc.code) if isinstance(exc.code, int) else 3
    return 0 if server.started else 3


def _watch_parent(server: Any, parent: int) -> None:
    """Stop the worker gracefully when its parent is gone (killed without forwarding)."""
    while not server.should_exit:
        if os.getppid() != parent:
            log.warning("serve: the parent process is gone; stopping")
            server.should_exit = True
            return
        time.sleep(1.0)


def _server_class() -> Any:
    import uvicorn  # heavy: imported by the worker that serves only (see serve_worker)

    class Server(uvicorn.Server):
        """uvicorn's server, except that the signal that stopped it is not raised again
        after the shutdown (uvicorn does, for process managers): the worker then exits 0."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting for in-flight requests
            self.should_exit = True

    return Server


def _worker_main(index: int, sock: socket.socket, options: ServeOptions, ready: Any, why: Any,
                 parent: int) -> None:
    """A spawned worker: its own process group (only the parent's SIGTERM stops it), the
    parent's log format and run id, then :func:`serve_worker`. Why its startup failed goes
    to ``why`` (a shared byte array the parent reads once the worker exited)."""
    def failed(reason: str) -> None:
        text = redact(" ".join(reason.split())).encode("utf-8", "replace")[:WHY_BYTES - 1]
        why.value = text.decode("utf-8", "ignore").encode()  # not a character cut in two

    os.setpgrp()
    setup_logging(options.log_format)
    set_run_id(options.run_id)
    try:
        code = serve_worker(index, sock, options, on_ready=ready.set, on_failure=failed, watch_parent=parent)
    except Exception as exc:  # recorded for the parent's log line, then raised (the traceback: here)
        failed(f"{type(exc).__name__}: {exc}")
        raise
    sock.close()
    sys.exit(code)


def _exit_reason(code: Any, why: Any) -> str:
    """What the parent says of a worker that exited: its exit code and, when it reported
    one, why its startup failed."""
    reason = bytes(why.value).decode("utf-8", "replace")
    return f"exit code {code}: {reason}" if reason else f"exit code {code}"


def _supervise(sock: socket.socket, options: ServeOptions, workers: int, ready: Any) -> int:
    ctx = multiprocessing.get_context("spawn")
    stopping = threading.Event()
    procs: dict[int, Any] = {}
    events: dict[int, Any] = {}
    whys: dict[int, Any] = {}  # worker -> why its startup failed (written by the worker)

    def start(i: int) -> None:
        events[i] = ctx.Event()
        whys[i] = ctx.Array("c", WHY_BYTES, lock=False)  # read only after the worker exited
        proc = ctx.Process(target=_worker_main, args=(i, sock, options, events[i], whys[i], os.getpid()),
                           name=f"features-serve-{i}")
        proc.start()
        procs[i] = proc

    def on_signal(sig: int, frame: Any) -> None:
        if not stopping.is_set():
            log.info("serve: signal %d: stopping the workers gracefully", sig)
        stopping.set()
        for p in procs.values():
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for i in range(workers):
        start(i)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not all(e.is_set() for e in events.values()):
        dead = [i for i, p in procs.items() if not p.is_alive()]
        if dead or stopping.is_set() or time.monotonic() > deadline:
            on_signal(signal.SIGTERM, None)
            for p in procs.values():
                p.join(GRACEFUL_TIMEOUT_S + 10)
            sock.close()
            if stopping.is_set() and not dead:
                return 0
            why = f" ({_exit_reason(procs[dead[0]].exitcode, whys[dead[0]])})" if dead else ""
            raise ConfigError(f"worker {dead[0] if dead else '?'} did not start{why} (see its log lines "
                              "above)", key="workers")
        time.sleep(0.05)
    ready()
    exits: dict[int, deque[float]] = {i: deque() for i in procs}  # each worker's exits in the window
    due: dict[int, float] = {}  # worker -> when its replacement starts
    code = 0
    while not stopping.is_set():
        now = time.monotonic()
        for i, p in list(procs.items()):
            if i in due or p.is_alive() or stopping.is_set():
                continue
            recent = exits[i]
            recent.append(now)
            while recent and recent[0] < now - options.restart_window_s:
                recent.popleft()
            reason = _exit_reason(p.exitcode, whys[i])
            if len(recent) > options.restart_limit:
                log.error("serve: worker %d exited %d times in the last %g s (last: %s): the restart "
                          "budget (--restart-limit %d in --restart-window %g s) is spent; stopping the "
                          "service", i, len(recent), options.restart_window_s, reason, options.restart_limit,
                          options.restart_window_s)
                code = 1
                on_signal(signal.SIGTERM, None)
                break
            wait = min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2 ** (len(recent) - 1))
            log.error("serve: worker %d exited (%s); starting a new one in %g s (restart %d of %d "
                      "allowed in %g s)", i, reason, wait, len(recent), options.restart_limit,
                      options.restart_window_s)
            due[i] = now + wait
        for i, when in list(due.items()):
            if when <= now and not stopping.is_set():
                del due[i]
                start(i)
        stopping.wait(0.1)
    sock.close()  # the workers close theirs while stopping: new connections are refused
    for p in procs.values():
        p.join()
    return code
