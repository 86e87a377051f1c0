"""``features demo``: the command line of :mod:`features.ops.demo` (its docstring says what it does)."""

from __future__ import annotations

import argparse
from typing import Any

from features.cli import COMMANDS
from features.ops import demo as _demo


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help=COMMANDS["demo"].summary,
        description=_demo.__doc__.split("\n\n")[1] if _demo.__doc__ else None,
    )
    p.add_argument("--rows", type=int, default=300_000, help="applicant rows to generate (default 300000)")
    p.add_argument("--files", type=int, default=3, help="Parquet files to split them into (default 3)")
    p.add_argument("--out", default=None,
                   help="where the example data goes (default: data/demo in the project folder)")
    p.add_argument("--events", type=int, default=20_000,
                   help="example events to stream through Kafka and the Flink job (default 20000; 0: skip)")
    p.add_argument("--topic", default="featureline-demo-applications", help="Kafka topic for the events")
    p.add_argument("--no-services", action="store_true", help="do not run `features dev up` first")
    p.set_defaults(func=run)



def run(args: argparse.Namespace) -> int:
    return _demo.run(rows=args.rows, files=args.files, out=args.out, events=args.events, topic=args.topic,
                     services_first=not args.no_services)
