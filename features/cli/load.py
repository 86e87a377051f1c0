"""``features load --schema NAME PATH...``: the batch loader from the command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from features.cli import COMMANDS
from features.cli.arguments import (
    EXIT_GATE_REFUSED,
    add_cluster_argument,
    add_metrics_arguments,
    flink_cluster,
)
from features.compile import CompiledSchema, find_schema
from features.compile.postgres import rejects_table_name
from features.config import Settings, resolve_settings
from features.errors import ConfigError, GateBreached
from features.flink.batch import load_flink
from features.lineage import new_run_id
from features.load import load, render_summary
from features.load.gates import check_gates
from features.observe.logs import active_format, bind_run_id, set_run_id, user_message
from features.observe.metrics import Registry, RunMetrics, linger
from features.observe.metrics import serve as serve_metrics
from features.pipeline.gates import GateVerdict
from features.sources.parquet import DEFAULT_BATCH_ROWS

log = logging.getLogger("features.load")


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "load", help=COMMANDS["load"].summary,
        description="Read Parquet files row group by row group, validate every row with the compiled "
        "schema, compute the derived features, and write hot features to Redis and the history to "
        "Postgres. Rejected rows go to the <schema>__rejects table. Re-running the same files stores "
        "nothing twice. A schema's quality gates (its quality: section) are checked over the whole "
        "input first: a breached fail gate stores nothing but the rejects (docs/operations.md). Exit 0 "
        "when the run completed (rejects and warn gates included), 1 when counts do not add up, 2 on "
        "usage, schema, source or store errors, 3 when a fail gate refused the load (nothing stored but "
        "its rejects).",
    )
    p.add_argument("--schema", required=True, help="schema name (a file in the schemas folder)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="Parquet files, folders or globs")
    p.add_argument("--schemas-dir", default=None, help="folder of schema YAML files (default: schemas)")
    p.add_argument("--batch-rows", type=int, default=None,
                   help="rows per batch within a row group (default 131072)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="load with N local processes, each taking one shard of the entities (rows hashed "
                   "by entity, so no two workers write one key; same counts, lineage and aggregations as "
                   "one process; default 1). A re-run uses the same N to skip what is committed")
    p.add_argument("--engine", choices=("local", "flink"), default=None,
                   help="local: this process (or --workers processes); flink: a Flink job in BATCH mode "
                   "with --parallelism tasks, one shard of the entities each, on a local mini-cluster, on a "
                   "running cluster with --cluster or, "
                   "under `flink run -py \"$(features job-file batch)\"`, on that cluster (default: local; "
                   "flink under `flink run`)")
    p.add_argument("--parallelism", type=int, default=None, metavar="N",
                   help="with --engine flink: tasks (shards) of the job (default: Flink's default "
                   "parallelism: the cores of this machine locally, `flink run -p N` on a cluster; "
                   "`flink run` takes a --parallelism after the script as its own -p)")
    add_cluster_argument(p, "with --engine flink: ")
    p.add_argument("--check-gates", action="store_true",
                   help="dry run: validate the whole input, judge it against the schema's quality gates, "
                   "print the verdict (each gate, measured vs limit, the top reasons) and store nothing, "
                   "not even the rejects (no store is needed); exit 3 when a fail gate is breached, else 0")
    p.add_argument("--json", action="store_true", help="print the summary as one line of JSON on stdout")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress line even on a terminal (there is none with --log-format json)")
    add_metrics_arguments(p, "while the load runs", "after the load ends")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # under `flink run -py`, the client talks to the cluster's gateway: run there by default
    engine = args.engine or ("flink" if "PYFLINK_GATEWAY_PORT" in os.environ else "local")
    if args.parallelism is not None and engine != "flink":
        raise ConfigError("--parallelism is for --engine flink (locally, use --workers)", key="parallelism")
    if args.workers != 1 and engine == "flink":
        raise ConfigError("--workers is for the local engine (with --engine flink, use --parallelism)",
                          key="workers")
    if args.cluster is not None and engine != "flink":
        raise ConfigError("--cluster is for --engine flink", key="cluster")
    cluster = flink_cluster(args.cluster)
    run_id = new_run_id()
    set_run_id(run_id)  # every log line of this process, the sinks' threads included
    settings = resolve_settings(schemas_dir=args.schemas_dir)
    compiled = find_schema(args.schema, settings.schemas_dir)
    if args.check_gates:
        return _check_gates(args, compiled, settings, run_id)
    metrics = server = None
    if args.metrics_port is not None:
        registry = Registry()
        metrics = RunMetrics(registry, compiled.name)
        try:
            server = serve_metrics(registry, args.metrics_port, args.metrics_host)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}",
                              key="metrics_port") from exc
        log.info("metrics on %s", server.url, extra={"metrics_url": server.url})
    try:
        batch_rows = args.batch_rows or DEFAULT_BATCH_ROWS
        if engine == "flink":
            with bind_run_id(run_id):
                try:
                    summary = load_flink(args.paths, compiled, settings, parallelism=args.parallelism,
                                         batch_rows=batch_rows, run_id=run_id, cluster=cluster)
                except GateBreached as exc:
                    return _refused(args, exc)
        else:
            try:
                summary = load(args.paths, compiled, settings, batch_rows=batch_rows,
                               progress=not args.no_progress and not args.json and active_format() != "json",
                               run_id=run_id, metrics=metrics, workers=args.workers)
            except GateBreached as exc:
                return _refused(args, exc)
        if args.json:
            print(json.dumps(summary.as_dict()))  # one line: a log of runs is JSON Lines
        else:
            print(render_summary(summary, rejects_table=rejects_table_name(compiled.schema)))
        sys.stdout.flush()
        if server is not None and args.metrics_linger_s > 0:
            log.info("metrics: serving %.0f s more", args.metrics_linger_s,
                     extra={"metrics_url": server.url, "linger_s": args.metrics_linger_s})
            linger(server, args.metrics_linger_s)
    finally:
        if server is not None:
            server.close()
    if not summary.adds_up:
        user_message("features load: counts do not add up; this is a bug, please report it",
                     level=logging.ERROR)
        return 1
    return 0


def _refused(args: argparse.Namespace, exc: GateBreached) -> int:
    """A load a fail gate refused: the message on stderr (and the verdict as JSON on stdout
    with ``--json``); exit 3 (:data:`EXIT_GATE_REFUSED`)."""
    if args.json and isinstance(exc.verdict, GateVerdict):
        print(json.dumps({"run_id": exc.run_id, "schema": exc.schema, "refused": True,
                          "rejects_stored": exc.rejects_stored, "gates": exc.verdict.as_dict()}))
        sys.stdout.flush()
    user_message(f"features load: {exc}", level=logging.ERROR)
    return EXIT_GATE_REFUSED


def _check_gates(args: argparse.Namespace, compiled: CompiledSchema, settings: Settings, run_id: str) -> int:
    """``--check-gates``: the verdict over the whole input, nothing stored; exit 3 when a
    fail gate is breached."""
    verdict = check_gates(args.paths, compiled, settings, run_id=run_id,
                          batch_rows=args.batch_rows or DEFAULT_BATCH_ROWS, dry_run=True)
    if args.json:
        print(json.dumps(verdict.as_dict()))
    else:
        print("\n".join(verdict.lines()))
        outcome = "REFUSED (a fail gate is breached)" if verdict.failed else "passes"
        print(f"verdict: {outcome}; nothing was stored (dry run)")
    sys.stdout.flush()
    return EXIT_GATE_REFUSED if verdict.failed else 0
