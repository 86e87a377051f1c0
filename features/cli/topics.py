"""``features topics create --schema NAME | list``: the Kafka topics a schema's stream reads.

``create`` makes the schema's topic and its dead-letter topic ``<topic>.rejects`` (the
names ``features serve`` and ``features stream`` default to), and is safe to re-run: a
topic that exists is reported and left as it is. The work is
:func:`features.stream.kafka.create_topic`.
"""

from __future__ import annotations

import argparse
from typing import Any

from features.cli import COMMANDS
from features.cli.arguments import add_kafka_arguments, positive_count
from features.compile import find_schema
from features.config import resolve_settings
from features.stream.kafka import create_topic, topic_partitions

#: partitions of a schema's topic unless --partitions says otherwise (the demo's and the tests')
DEFAULT_PARTITIONS = 2


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "topics", help=COMMANDS["topics"].summary,
        description="Create or list Kafka topics. Exit 2 when the broker does not answer (the message "
        "names its address) or refuses.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    create = verbs.add_parser(
        "create", help="create a schema's topic and <topic>.rejects (idempotent)",
        description="Create the schema's topic (default name: the schema's name, as `features serve "
        "--topic-template` defaults) with --partitions partitions, and its dead-letter topic "
        "<topic>.rejects with 1 partition (the name `features stream` and `features serve` default to). "
        "Replication factor 1 (the local single-node broker). A topic that already exists is reported "
        "and left as it is, with the partitions it has, even when they differ from --partitions (said in "
        "its line). Exit 0 when both topics exist afterwards, 2 when Kafka is unreachable or refuses, or "
        "on usage and schema errors.")
    create.add_argument("--schema", required=True, metavar="NAME", help="schema name (a file in the schemas "
                        "folder)")
    create.add_argument("--topic", default=None, help="the topic's name (default: the schema's name)")
    create.add_argument("--partitions", type=positive_count, default=DEFAULT_PARTITIONS, metavar="N",
                        help=f"partitions of the topic (default {DEFAULT_PARTITIONS}; the dead-letter topic "
                        "gets 1)")
    create.add_argument("--dead-letter", action=argparse.BooleanOptionalAction, default=True,
                        help="also create <topic>.rejects, the dead-letter topic (default on)")
    add_kafka_arguments(create)
    create.set_defaults(func=run)
    listing = verbs.add_parser(
        "list", help="list the broker's topics and their partitions",
        description="Print each topic on the broker (internal ones, starting with '__', left out) with its "
        "partition count, one per line, sorted by name. Exit 2 when Kafka is unreachable.")
    add_kafka_arguments(listing)
    listing.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = resolve_settings(schemas_dir=args.schemas_dir, kafka_bootstrap=args.bootstrap)
    bootstrap, props = settings.kafka_bootstrap, dict(settings.kafka_properties)
    if args.verb == "list":
        for name, n in sorted(topic_partitions(bootstrap, timeout_s=args.timeout, properties=props).items()):
            if not name.startswith("__"):
                print(f"{name}\t{n}")
        return 0
    compiled = find_schema(args.schema, settings.schemas_dir)  # a ConfigError names the known schemas
    topic = args.topic or compiled.name
    wanted = [(topic, args.partitions)] + ([(f"{topic}.rejects", 1)] if args.dead_letter else [])
    for name, partitions in wanted:
        outcome, have = create_topic(bootstrap, name, partitions=partitions, timeout_s=args.timeout,
                                     properties=props)
        if outcome == "created":
            print(f"created topic {name} ({have} partition{'s' * (have != 1)})")
        elif outcome == "exists":
            print(f"topic {name} exists ({have} partition{'s' * (have != 1)})")
        else:
            print(f"topic {name} exists with {have} partition{'s' * (have != 1)}, not {partitions}: "
                  "left as it is (adding partitions moves entities to other partitions; do it with "
                  "Kafka's tools if you mean to)")
    return 0
