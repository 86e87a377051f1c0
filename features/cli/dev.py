"""``features dev up | down | status``: the real local services tests and demos use."""

from __future__ import annotations

import argparse
from typing import Any

from features.cli import COMMANDS
from features.config import cache_home, resolve_settings
from features.home import state_home
from features.observe.logs import user_message
from features.ops.dev import services

#: the exit codes of ``up`` and ``status`` (features.ops.dev.services.EXIT_CODES, kept here as
#: text so that ``--help`` needs no import of the services module)
_EXIT_HELP = ("exit codes (up, status): 0 every server healthy and the stream ready; 1 a server "
              "(postgres, redis, kafka; redis-cluster, flink-cluster when they run) is down; 3 every "
              "server healthy but the stream job cannot run here (the Flink Kafka connector jar, "
              "PyFlink or Java missing: the stream: line says which); 4 only chromium or chromedriver "
              "(the report tests' browser) missing")


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "dev", help=COMMANDS["dev"].summary,
        description="Install if missing and start, on loopback only, PostgreSQL and Redis (Debian "
        "packages), Apache Kafka in KRaft mode (Maven Central jars) and the Flink Kafka connector jar. "
        "Data and pid files live in the project's .dev/ (the project folder is FEATURES_HOME, else the "
        "nearest folder holding featureline.toml, else the current one); downloads in the cache "
        "(FEATURES_CACHE_DIR, else the cache_dir setting, else $XDG_CACHE_HOME/featureline or "
        "~/.cache/featureline, shared by every project). A service whose FEATURES_POSTGRES_DSN / "
        "FEATURES_REDIS_URL / FEATURES_KAFKA_BOOTSTRAP points elsewhere than the default is external: "
        "it is checked, never started or stopped. A server already answering at its address (this "
        "project's, or another's it reuses) gets nothing installed or downloaded. `up` and `status` end "
        "with a servers: line and a stream: line (what the PyFlink job needs beside them). " + _EXIT_HELP
        + ".",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    up = verbs.add_parser("up", help="install what is missing and start everything (idempotent)",
                          description="Install what is missing and start everything (idempotent); then "
                          "print the status. " + _EXIT_HELP + ".")
    up.add_argument("--redis-cluster", action="store_true",
                    help="also start a local Redis Cluster (3 primaries + 3 replicas, ports 7101-7106; "
                    "URL redis+cluster://127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103)")
    up.add_argument("--flink-cluster", action="store_true",
                    help="also start this project's standalone Flink cluster (PyFlink's start-cluster.sh: "
                    "one JobManager, one TaskManager of 2 slots) with its conf, logs and pid files under "
                    ".dev/flink and free loopback ports chosen at start (recorded in "
                    ".dev/flink/cluster.json); `features stream --cluster` and `features load --engine "
                    "flink --cluster` submit to it; `status` shows its web UI address, `down` stops it")
    verbs.add_parser("down", help="stop what `up` started (pid files under the project's .dev/pids; "
                     "the Flink cluster's under .dev/flink/pids)")
    verbs.add_parser("status", help="print each service with address, version and health, then the "
                     "servers' and the stream's verdicts; exit 1 when a server is down, 3 when only "
                     "the stream is not ready, 4 when only chromium or chromedriver is missing",
                     description="Print each part with address, version, health and owner, then a "
                     "servers: line and a stream: line. " + _EXIT_HELP + ".")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = resolve_settings()
    user_message(f"project state: {state_home()}  downloads: {cache_home()}")
    if args.verb == "down":
        services.down(settings)
        return 0
    report = (services.up(settings, redis_cluster=args.redis_cluster,
                                   flink_cluster=args.flink_cluster) if args.verb == "up"
              else services.status(settings))
    for line in report.lines():
        print(line)
    return report.exit_code()
