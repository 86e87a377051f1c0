"""``features init``: the command line of :mod:`features.ops.init` (its docstring says what it does)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from features.cli import COMMANDS
from features.ops import init as _init


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "init", help=COMMANDS["init"].summary,
        description=_init.__doc__.split("\n\n")[1] if _init.__doc__ else None)
    p.add_argument("directory", nargs="?", default=".", metavar="DIR",
                   help="the project folder (default: the current one; created when missing)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    written = _init.init(args.directory)
    for path in written:
        print(f"wrote {path}")
    print(f"next: {_init.next_steps(args.directory)}", file=sys.stdout)
    return 0

