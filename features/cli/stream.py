"""``features stream --schema NAME --topic T``: the PyFlink streaming job from the command line.

``python jobs/stream_job.py ...`` and ``flink run -py jobs/stream_job.py ...`` run the
same code with the same flags.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from features.cli import COMMANDS
from features.cli.arguments import (
    EXIT_GATE_REFUSED,
    add_cluster_argument,
    add_metrics_arguments,
    flink_cluster,
)
from features.compile import find_schema
from features.config import resolve_settings
from features.flink.stream import StreamConfig, latest_checkpoint, merged_summary, serve_final_metrics
from features.flink.stream import run as run_job
from features.home import shown, state_home
from features.lineage import new_run_id
from features.observe.logs import active_format, set_run_id, user_message
from features.sinks.stores import check_stores, store_sinks
from features.stream.summary import render


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "stream", help=COMMANDS["stream"].summary,
        description="Read a Kafka topic with Flink's Kafka connector, validate every record with the "
        "compiled schema, compute the derived features and write hot features to Redis and the history "
        "to Postgres, in micro-batches. Undecodable records and rule violations go to the rejects table "
        "and to the dead-letter topic. Checkpointed: offsets advance only with checkpoints and writes are "
        "idempotent, so a restart from the last checkpoint changes nothing. Runs on Flink's local "
        "mini-cluster, on a running cluster with --cluster (this project's: `features dev up "
        "--flink-cluster`), or on a cluster under `flink run -py \"$(features job-file stream)\"`. "
        "Exit 0 when a bounded "
        "run completed with counts that add up, 1 when they do not, 2 on usage, schema or store errors, "
        "3 when a fail quality gate stopped the stream (the message names the gate and the offsets a "
        "restart resumes from).",
    )
    p.add_argument("--schema", required=True, help="schema name (a file in the schemas folder)")
    p.add_argument("--topic", required=True, help="Kafka topic to read")
    p.add_argument("--schemas-dir", default=None, help="folder of schema YAML files (default: schemas)")
    p.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: the settings' "
                   "kafka_bootstrap, FEATURES_KAFKA_BOOTSTRAP)")
    p.add_argument("--group-id", default=None,
                   help="consumer group (default: featureline-<project>-<8 hex>-<schema>-<topic>, one per "
                   "project, schema and topic; earlier versions used featureline-<schema>: pass it to keep "
                   "those offsets)")
    p.add_argument("--dead-letter-topic", default=None,
                   help="topic for rejects (default: <topic>.rejects; '' to disable)")
    p.add_argument("--batch-size", type=int, default=StreamConfig.batch_size,
                   help=f"records per micro-batch (default {StreamConfig.batch_size})")
    p.add_argument("--max-wait-ms", type=int, default=StreamConfig.max_wait_ms,
                   help="longest a record waits for its micro-batch to fill "
                        f"(default {StreamConfig.max_wait_ms})")
    p.add_argument("--parallelism", type=int, default=1, help="Flink parallelism (default 1)")
    p.add_argument("--checkpoint-interval-ms", type=int, default=5000,
                   help="checkpoint every N ms (default 5000)")
    p.add_argument("--state-dir", default=None,
                   help="checkpoints and run summaries go here (default: .dev/stream in the project "
                   "folder, which is FEATURES_HOME or the folder holding featureline.toml, else the "
                   "current one)")
    p.add_argument("--from-checkpoint", default=None, metavar="PATH|latest",
                   help="resume from a retained checkpoint (a chk-N folder, or 'latest' under --state-dir); "
                   "without it the job resumes from the consumer group's offsets, which the source "
                   "commits with each checkpoint; not with --bounded (connector bug FLINK-31006)")
    p.add_argument("--startup", default="group-offsets",
                   choices=["group-offsets", "earliest-offset", "latest-offset"],
                   help="where a job without a checkpoint starts (default group-offsets; a new group "
                   "starts at the earliest offset)")
    p.add_argument("--bounded", action="store_true",
                   help="stop at the end offsets seen at start (tests, backfills)")
    p.add_argument("--restart-attempts", type=int, default=3,
                   help="Flink restarts after a failure before the job fails (default 3; 0: none)")
    p.add_argument("--log-every-s", type=float, default=10.0,
                   help="seconds between a subtask's JSON status lines (default 10)")
    add_metrics_arguments(p, "from each subtask's Python worker: with --parallelism P, each subtask takes "
                          "the first free port of PORT..PORT+P-1",
                          "after the job ends (bounded runs): this command then serves each subtask's final "
                          "values on its port (not with --detach)")
    p.add_argument("--run-id", default=None, help="run id for lineage (default: a fresh one)")
    p.add_argument("--key-prefix", default="",
                   help="text in front of every Redis key this job writes (namespacing; default none)")
    add_cluster_argument(p)
    p.add_argument("--detach", action="store_true",
                   help="submit and return at once, printing the job id (for long-running jobs on a "
                   "cluster; stop them with `flink cancel` or `flink stop`)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = resolve_settings(schemas_dir=args.schemas_dir, kafka_bootstrap=args.bootstrap)
    compiled = find_schema(args.schema, settings.schemas_dir)  # fails early on a bad schema
    path = compiled.schema.path
    if path is None:
        raise SystemExit(f"features stream: schema {args.schema!r} has no file")
    state_dir = Path(args.state_dir) if args.state_dir else Path(shown(state_home() / "stream"))
    state = state_dir / compiled.name
    checkpoint = args.from_checkpoint
    if checkpoint == "latest":
        checkpoint = latest_checkpoint(state / "checkpoints")
        if checkpoint is None:
            user_message(f"features stream: no completed checkpoint under {state / 'checkpoints'}; "
                         "starting from the group offsets")
    cluster = flink_cluster(args.cluster)
    _check_stores(compiled, settings)
    run_id = args.run_id or new_run_id()
    set_run_id(run_id)
    # Flink's own log for this run (the local gateway JVM reads FLINK_LOG_DIR when it
    # starts); otherwise every local job overwrites the same file inside the venv.
    os.environ.setdefault("FLINK_LOG_DIR", str((state / "logs" / run_id).resolve()))
    cfg = StreamConfig(
        schema_path=str(Path(path).resolve()), topic=args.topic, bootstrap=settings.kafka_bootstrap,
        postgres_dsn=settings.postgres_dsn, redis_url=settings.redis_url, device=settings.device,
        kafka_properties=dict(settings.kafka_properties),
        kafka_java_properties=dict(settings.kafka_java_properties), group_id=args.group_id,
        dead_letter_topic=args.dead_letter_topic, batch_size=args.batch_size,
        max_wait_ms=args.max_wait_ms, parallelism=args.parallelism,
        checkpoint_interval_ms=args.checkpoint_interval_ms,
        checkpoint_dir=str(state / "checkpoints"), from_checkpoint=checkpoint, bounded=args.bounded,
        startup=args.startup, run_id=run_id, summary_dir=str((state / "summaries").resolve()),
        restart_attempts=args.restart_attempts, log_every_s=args.log_every_s, key_prefix=args.key_prefix,
        metrics_port=args.metrics_port, metrics_host=args.metrics_host,
        metrics_linger_s=args.metrics_linger_s, log_format=active_format(), cluster=cluster)
    cfg.check()
    # The gateway JVM (started by run_job) and the Python workers it starts inherit this
    # process's fd 1: their console output (a Kafka admin client's stack trace at shutdown)
    # would land inside the summary on stdout and break --json. They get stderr as their
    # stdout; fd 1 is restored once the JVM has its copy.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        result = run_job(cfg, wait=not args.detach)
    except Exception:
        # a job stopped by its breaker fails in Flink: say why, from the subtasks' summaries
        tripped = (merged_summary(state / "summaries", run_id).get("gates") or {}).get("tripped")
        if tripped is None:
            raise
        os.dup2(saved, 1)
        os.close(saved)
        saved = -1
        return _stopped_by_gate(merged_summary(state / "summaries", run_id), compiled.name, args.json)
    finally:
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)
    if args.detach:
        client = result.get_job_client()
        job_id = str(client.get_job_id()) if client is not None else "unknown"
        print(json.dumps({"job_id": job_id, "run_id": run_id}) if args.json else
              f"submitted job {job_id} (run {run_id}); summaries will appear in {cfg.summary_dir}")
        return 0
    summary = merged_summary(state / "summaries", run_id)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(render(summary, compiled.name))
    if args.metrics_port is not None and args.metrics_linger_s > 0:
        sys.stdout.flush()
        serve_final_metrics(state / "summaries", run_id, args.metrics_host, args.metrics_linger_s)
    return 0 if summary["adds_up"] else 1


def _stopped_by_gate(summary: dict[str, Any], schema: str, as_json: bool) -> int:
    """A stream stopped by a breached ``fail`` gate: the message (gate, measured vs limit,
    top reasons, the offsets a restart resumes from, the owner) on stderr, the summary on
    stdout; exit 3 (:data:`EXIT_GATE_REFUSED`)."""
    tripped = summary["gates"]["tripped"]
    user_message(f"features stream: {tripped['message']}")
    print(json.dumps(summary, indent=2) if as_json else render(summary, schema))
    return EXIT_GATE_REFUSED


def _check_stores(compiled: Any, settings: Any) -> None:
    """Both stores reachable and the cold table's fingerprint right, before Flink starts
    (a clear error naming the store, instead of a failing Flink job)."""
    cold, hot = store_sinks(compiled, settings)
    check_stores((hot, cold))
