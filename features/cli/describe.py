"""``features list`` and ``features describe NAME``: what the project defines (its schemas
and views, read from their folders; no store needed), as ``feast feature-views list`` and
``feast feature-views describe`` give it (``features.ops.catalog``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from features.cli import COMMANDS
from features.config import resolve_settings
from features.ops.catalog import describe, list_all, read_catalog, render_describe, render_list


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schemas-dir", default=None, metavar="DIR",
                   help="folder of schema YAML files (default: the schemas_dir setting, schemas)")
    p.add_argument("--views-dir", default=None, metavar="DIR",
                   help="folder of view YAML files (default: the views_dir setting, views; a missing folder "
                   "holds none)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "list", help=COMMANDS["list"].summary,
        description="Every schema (version, fingerprint, entity and event time, how many fields, derived "
        "features and aggregations, which views read it) and every view (keys, sources, features). Exit 0, "
        "or 2 when a file does not parse.")
    _common(p)
    p.set_defaults(func=run_list)
    d: argparse.ArgumentParser = sub.add_parser(
        "describe", help=COMMANDS["describe"].summary,
        description="A schema: its fields (type, hot/cold, rules, input name, description), derived features "
        "and their steps, aggregations and their windows, and the views that read it. A view: its request "
        "keys and fields, sources (join, max age, output names) and request-time features. A feature "
        "(SCHEMA.FEATURE, or a name only one schema defines): its definition and the views that read it. "
        "Exit 2 when NAME is none of those (the message lists what exists).")
    d.add_argument("name", metavar="NAME", help="a schema, a view, or SCHEMA.FEATURE")
    _common(d)
    d.set_defaults(func=run_describe)


def _catalog(args: argparse.Namespace) -> Any:
    settings = resolve_settings(schemas_dir=args.schemas_dir)
    return read_catalog(settings.schemas_dir, args.views_dir or settings.views_dir)


def run_list(args: argparse.Namespace) -> int:
    listing = list_all(_catalog(args))
    print(json.dumps(listing, indent=2) if args.json else render_list(listing))
    return 0


def run_describe(args: argparse.Namespace) -> int:
    found = describe(_catalog(args), args.name)
    print(json.dumps(found, indent=2, default=str) if args.json else render_describe(found))
    return 0
