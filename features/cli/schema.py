"""``features schema``: commands on schema files.

``features schema diff OLD NEW [--json | --sql]`` classifies every change from the schema
file OLD to the schema file NEW (see :mod:`features.schema.diff`), prints each one,
then the changes of the ``quality:`` section (gates, owner, freshness SLA: listed as
``gate``, never a data change, no version bump asked), then the migration DDL of the
compatible changes (:mod:`features.compile.migration`);
``--sql`` prints only that DDL, as one transaction (nothing when breaking changes make
it partial: a partial migration is not for piping).
It lives in ``compile/`` because it prints both: the schema package knows nothing of
the DDL.

With two *view* files (``views/*.yaml``: a top-level ``sources``), the diff classifies
the view's changes instead (:mod:`features.views.diff`: a key changed, an output
column removed or retyped is breaking; a column added is compatible), the views parsed
against the schemas of ``--schemas-dir`` (default: the ``schemas_dir`` setting).

Exit codes: 0 the change is allowed (compatible, or breaking with a new major
version); 1 refused (a breaking change without a major version bump); 2 a usage
error or a schema file that does not parse.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from features.cli import COMMANDS
from features.compile import compile_schema
from features.compile.migration import Migration, change_label, diff_text, plan_migration, title_lines
from features.config import resolve_settings
from features.schema.diff import Change
from features.schema.model import Schema
from features.schema.parse import load_schema, load_schemas, read_text
from features.views import compile_view, parse_view
from features.views.diff import diff_views


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``schema`` and its sub-subcommands on the ``features`` parser."""
    parser = subparsers.add_parser("schema", help=COMMANDS["schema"].summary)
    sub = parser.add_subparsers(dest="schema_command", metavar="SUBCOMMAND", required=True)
    diff = sub.add_parser(
        "diff",
        help="classify the changes between two versions of a schema",
        description="Classify every change from OLD to NEW as compatible or BREAKING, honour "
        "NEW's evolution_rules, gate the version, and print the migration DDL. Exit 0 when "
        "allowed, 1 when refused (breaking without a major version bump), 2 on errors.",
    )
    diff.add_argument("old", metavar="OLD", help="the current schema file (YAML)")
    diff.add_argument("new", metavar="NEW", help="the proposed schema file (YAML)")
    out = diff.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    out.add_argument("--sql", action="store_true",
                     help="print only the migration SQL (BEGIN; ... COMMIT;), to pipe to psql; nothing "
                     "when the tables do not change. `features migrate` applies it and migrates Redis too")
    diff.add_argument("--schemas-dir", metavar="DIR",
                      help="for two view files: the schemas they read (default: the schemas_dir setting)")
    diff.set_defaults(func=run_diff)


def run_diff(args: argparse.Namespace) -> int:
    """Diff ``args.old`` against ``args.new``; returns the exit code (module docstring).

    A file that cannot be read or parsed raises (SchemaError) or, for an OS error,
    prints it and returns 2.
    """
    if _is_view(args.old) or _is_view(args.new):
        return _run_view_diff(args)
    try:
        old = load_schema(args.old)
        new = load_schema(args.new)
    except OSError as exc:
        print(f"features schema diff: error: {exc}", file=sys.stderr)
        return 2
    migration = plan_migration(old, new)
    if args.json:
        print(json.dumps(_as_json(migration), indent=2))
    elif args.sql:
        if migration.statements and migration.diff.compatible:
            print(_sql(migration), end="")
        elif not migration.diff.compatible:
            print("features schema diff: no SQL printed: breaking changes have no generated migration "
                  "(docs/evolution.md)", file=sys.stderr)
    else:
        _print_text(migration)
    if migration.diff.refusal is not None:
        print(f"features schema diff: refused: {migration.diff.refusal}", file=sys.stderr)
        return 1
    return 0


def _is_view(path: str) -> bool:
    """Whether the YAML file at ``path`` is a view (a top-level ``sources`` key); False
    for anything unreadable (the schema diff then reports it)."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(doc, dict) and "sources" in doc


def _run_view_diff(args: argparse.Namespace) -> int:
    if args.sql:
        print("features schema diff: --sql applies to schema files; a view has no tables", file=sys.stderr)
        return 2
    schemas_dir = args.schemas_dir
    if schemas_dir is None:
        schemas_dir = resolve_settings().schemas_dir
    schemas = load_schemas(schemas_dir)
    compiled = {name: compile_schema(s) for name, s in schemas.items()}
    sides = []
    for path in (args.old, args.new):
        try:
            view = parse_view(read_text(Path(path)), path, schemas)
        except OSError as exc:  # pragma: no cover - read_text reports as SchemaError
            print(f"features schema diff: error: {exc}", file=sys.stderr)
            return 2
        sides.append(compile_view(view, compiled, device="cpu"))
    result = diff_views(sides[0], sides[1])
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
    else:
        old, new = result.old, result.new
        names = [c.column for c in result.changes]
        for line in title_lines("view", (old.name, old.version_str), (new.name, new.version_str), names):
            print(line)
        width = max((len(n) for n in names), default=0)
        for c in result.changes:
            print(f"  {change_label(c.compatible):<10}  {c.column:<{width}}  {c.kind}: {c.detail}")
    if result.refusal is not None:
        print(f"features schema diff: refused: {result.refusal}", file=sys.stderr)
        return 1
    return 0


def _rule_json(change: Change) -> dict[str, Any] | None:
    rule = change.honoured_rule
    if rule is None:
        return None
    return {"field": rule.field, "breaking_change": rule.breaking_change, "description": rule.description}


def _as_json(migration: Migration) -> dict[str, Any]:
    result = migration.diff

    def side(schema: Schema) -> dict[str, Any]:
        return {"name": schema.name, "version": schema.version_str, "path": schema.path}

    return {
        "old": side(result.old),
        "new": side(result.new),
        "allowed": result.allowed,
        "compatible": result.compatible,
        "refusal": result.refusal,
        "warnings": list(result.warnings),
        "quality_changes": list(result.quality),
        "changes": [
            {
                "field": c.field,
                "old_field": c.old_field,
                "kind": c.kind.value,
                "scope": c.scope,
                "compatible": c.compatible,
                "classified_compatible": c.classified_compatible,
                "detail": c.detail,
                "rule": _rule_json(c),
                "ddl": list(ddl),
            }
            for c, ddl in zip(result.changes, migration.change_ddl, strict=True)
        ],
        "migration_ddl": list(migration.statements),
    }


def _sql(migration: Migration) -> str:
    """The migration as one transaction, the text ``--sql`` prints."""
    return "BEGIN;\n" + "".join(f"{statement};\n" for statement in migration.statements) + "COMMIT;\n"


def _print_text(migration: Migration) -> None:
    for line in diff_text(migration):
        print(line)
