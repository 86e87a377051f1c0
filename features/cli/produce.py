"""``features produce --schema NAME FILE``: a file's records onto the schema's Kafka topic.

Test and backfill data for the stream job, sent as a producer would send it: each record
a JSON object keyed by its entity id. The work is :mod:`features.stream.produce`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from features.cli import COMMANDS
from features.cli.arguments import add_kafka_arguments
from features.compile import find_schema
from features.config import resolve_settings
from features.errors import ConfigError
from features.observe.logs import active_format
from features.observe.progress import LineProgress
from features.stream.produce import file_records, produce_batches


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "produce", help=COMMANDS["produce"].summary,
        description="Send every record of FILE to the schema's topic (default: the schema's name; create it "
        "with `features topics create`), in file order, each keyed by its entity id as `features serve` "
        "keys it (a string id's bytes, an integer's digits; a record without one is sent without a key and "
        "counted). .jsonl/.ndjson: each non-blank line is a record, sent as its exact bytes. .json: each "
        "element of a top-level array (or the one value), its exact text. .parquet: each row as a JSON "
        "object the stream decodes to the same values: decimals exact as JSON numbers, timestamps ISO 8601 "
        "in UTC with Z, dates YYYY-MM-DD, lists as arrays, nulls as null. Nothing is validated or dropped "
        "here: the stream rejects bad records with their reasons. Waits for the broker to acknowledge every "
        "record (an idempotent producer: no duplicates from retries), then prints `produced N records to "
        "TOPIC (P partitions) in S s`. Exit 0 when every record was acknowledged, 1 when some were not "
        "(the first errors are printed), 2 when Kafka is unreachable, the topic is missing, or on usage, "
        "schema and file errors.",
    )
    p.add_argument("--schema", required=True, metavar="NAME",
                   help="schema name (a file in the schemas folder)")
    p.add_argument("--topic", default=None, help="topic to send to (default: the schema's name)")
    p.add_argument("file", metavar="FILE", help="a .jsonl, .ndjson, .json or .parquet file")
    add_kafka_arguments(p)
    p.add_argument("--no-progress", action="store_true",
                   help="no progress line even on a terminal (there is none with --log-format json)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = resolve_settings(schemas_dir=args.schemas_dir, kafka_bootstrap=args.bootstrap)
    schema = find_schema(args.schema, settings.schemas_dir).schema
    if schema.entity is None:
        raise ConfigError(f"schema {schema.name!r} has no entity: its records cannot be keyed", key="entity")
    topic = args.topic or schema.name
    records = file_records(args.file)
    progress = LineProgress(f"produce {topic}", records.total,
                            enabled=not args.no_progress and active_format() != "json")
    summary = produce_batches(settings.kafka_bootstrap, topic, records.batches,
                              entity=schema.field(schema.entity).input_name,
                              properties=dict(settings.kafka_properties), timeout_s=args.timeout,
                              progress=progress)
    line = (f"produced {summary.delivered:,} records to {topic} ({summary.partitions} partition"
            f"{'s' * (summary.partitions != 1)}) in {summary.seconds:.1f} s")
    if summary.unkeyed:
        line += (f"; {summary.unkeyed:,} without an entity id ({schema.entity}), sent unkeyed (the stream "
                 "rejects them with their reasons)")
    if records.blank_lines[0]:
        line += f"; {records.blank_lines[0]:,} blank lines skipped"
    print(line)
    if summary.ok:
        return 0
    print(f"features produce: {summary.failed:,} of {summary.records:,} records were not delivered: "
          + "; ".join(summary.errors), file=sys.stderr)
    return 1
