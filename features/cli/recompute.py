"""``features recompute``: the command line of :mod:`features.ops.recompute` (its docstring says
what it does)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from features.cli import COMMANDS
from features.compile import find_schema
from features.config import resolve_settings
from features.errors import ConfigError
from features.observe.logs import active_format
from features.ops import recompute as _recompute
from features.ops.recompute import DEFAULT_CHUNK_EVENTS, Recomputed


def _description() -> str | None:
    return _recompute.__doc__.split("\n\n")[1] if _recompute.__doc__ else None


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "recompute", help=COMMANDS["recompute"].summary, description=_description())
    p.add_argument("--schema", required=True, help="schema name (a file in the schemas folder)")
    p.add_argument("--schemas-dir", default=None, help="folder of schema YAML files (default: schemas)")
    p.add_argument("--chunk-events", type=int, default=DEFAULT_CHUNK_EVENTS,
                   help=f"history rows computed at a time, whole entities (default {DEFAULT_CHUNK_EVENTS})")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.chunk_events < 1:
        raise ConfigError("--chunk-events must be at least 1", key="chunk_events")
    settings = resolve_settings(schemas_dir=args.schemas_dir)
    c = find_schema(args.schema, settings.schemas_dir)
    show = not args.json and active_format() != "json"

    def progress(r: Recomputed) -> None:
        if show:
            print(f"recompute {c.name}: {r.entities:,} entities, {r.history_rows:,} history rows "
                  f"({r.seconds:.1f} s)", file=sys.stderr, flush=True)

    r = _recompute.recompute(c, settings, chunk_events=args.chunk_events, progress=progress)
    if args.json:
        print(json.dumps({"schema": c.name, **dataclasses.asdict(r), "seconds": round(r.seconds, 3)}))
        return 0
    print(f"recompute {c.name}: {r.history_rows:,} history rows of {r.entities:,} entities in "
          f"{r.seconds:.1f} s")
    if c.schema.aggregations is not None:
        print(f"  aggregations: {r.aggregate_rows_written:,} aggregates rows written (the others held these "
              f"values), {r.aggregate_hashes_written:,} Redis hashes")
    if r.features:
        print(f"  derived features {', '.join(r.features)}: {r.feature_rows_updated:,} history rows updated, "
              f"{r.feature_hashes_rewritten:,} Redis hashes rewritten")
    for name, why in r.skipped.items():
        print(f"  skipped {name}: {why}")
    return 0

