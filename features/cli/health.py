"""``features health``: the command line of :mod:`features.ops.health` (its docstring says what it does)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from features.cli import COMMANDS
from features.config import resolve_settings
from features.ops import health as _health


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "health", help=COMMANDS["health"].summary,
        description=_health.__doc__.split("\n\n")[1] if _health.__doc__ else None)
    p.add_argument("--schemas-dir", default=None, help="folder of schema YAML files (default: schemas)")
    p.add_argument("--schema", default=None, metavar="NAME",
                   help="check this schema only (its `name:`; default: every schema in the folder)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per store check (default 5)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise SystemExit("features health: --timeout must be > 0")
    settings = resolve_settings(schemas_dir=args.schemas_dir)
    checks = _health.check_all(settings, timeout_s=args.timeout, schema=args.schema)
    healthy = all(c.ok for c in checks)
    if args.json:
        print(json.dumps({"healthy": healthy, "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        for c in checks:
            print(f"{c.kind:<7}{c.name:<22}{'ok' if c.ok else 'FAIL':<6}{c.detail}")
        print("healthy" if healthy else "NOT healthy")
    return 0 if healthy else 1

