"""The ``features`` command line: one subcommand per stage.

Each subcommand lives beside the stage it drives and exposes
``add_parser(subparsers)``; this table names them. Modules here import only
argparse-level code at the top, so ``features --help`` stays fast; the heavy
imports (pyarrow, psycopg, pyflink, ...) happen inside the command that needs them.

Exit codes: 0 success, 1 the command ran and found a problem (rejected rows, a stale
file, a failing check), 2 usage or configuration errors.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from features import __version__
from features.errors import FeaturesError

#: subcommand name -> module with ``add_parser(subparsers)``, in ``--help`` order.
COMMANDS: dict[str, str] = {
    "compile": "features.compile.cli",
    "demo": "features.demo",
    "dev": "features.dev.cli",
    "health": "features.health",
    "load": "features.load.cli",
    "kernels": "features.kernels.cli",
    "report": "features.report.cli",
    "schema": "features.schema.cli",
    "stream": "features.stream.cli",
    "validate": "features.validate.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="features",
        description="featureline: validated, traceable features from Kafka and Parquet "
        "into Redis and Postgres.",
    )
    parser.add_argument("--version", action="version", version=f"featureline {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except FeaturesError as exc:
        print(f"features {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"features {args.command}: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
