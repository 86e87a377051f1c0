"""``features rollback``: the command line of :mod:`features.ops.rollback` (its docstring says
what it does)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from features.cli import COMMANDS
from features.compile import CompiledSchema, compile_schema, find_schema
from features.config import Settings, resolve_settings
from features.errors import ConfigError
from features.observe.logs import active_format
from features.ops.rollback import DEFAULT_CHUNK_ENTITIES, RollbackPlan, RolledBack, plan_rollback, rollback
from features.schema import load_schemas

DESCRIPTION = (
    "Undo a load or a stream run from its lineage: remove the rows it wrote (_run_id) from the history, "
    "the rejects and the aggregates, compute the aggregations of the entities it touched again, set each "
    "touched Redis hash (hot features, aggregations, request-time tiles) back to the newest remaining row "
    "(or delete it), and clear its ledger units so the same files can be loaded again. Idempotent and "
    "crash-safe: run it again after an interruption and it finishes the work. Refuses, naming them, when "
    "later runs wrote the same entities, unless --include-later. Exit 0 when done (or already done), "
    "2 on an unknown run id, a refusal, usage or store errors.")


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "rollback", help=COMMANDS["rollback"].summary, description=DESCRIPTION)
    p.add_argument("--run", required=True, metavar="RUN_ID", help="the run id to roll back (a load's "
                   "summary prints it; every stored row carries it as _run_id)")
    p.add_argument("--schema", default=None, help="the schema the run wrote (default: every schema of the "
                   "schemas folder holding rows of the run)")
    p.add_argument("--schemas-dir", default=None, help="folder of schema YAML files (default: schemas)")
    p.add_argument("--dry-run", action="store_true", help="show what would change (rows per table, "
                   "entities, Redis hashes, later runs) and change nothing")
    p.add_argument("--include-later", action="store_true", help="also roll back the later runs that wrote "
                   "the same entities (without it the rollback refuses and names them)")
    p.add_argument("--chunk-entities", type=int, default=DEFAULT_CHUNK_ENTITIES,
                   help=f"entities restored at a time (default {DEFAULT_CHUNK_ENTITIES})")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.set_defaults(func=run)


def _schemas(args: argparse.Namespace, settings: Settings) -> list[CompiledSchema]:
    if args.schema is not None:
        return [find_schema(args.schema, settings.schemas_dir)]
    return [compile_schema(s) for s in load_schemas(settings.schemas_dir).values()
            if s.loadable and not s.static]


def _plans(args: argparse.Namespace, settings: Settings) -> list[RollbackPlan]:
    """The plan of each schema holding the run (ConfigError naming the run when none does)."""
    schemas = _schemas(args, settings)
    plans = []
    unknown: list[str] = []
    for c in schemas:
        try:
            plans.append(plan_rollback(c, settings, args.run, include_later=args.include_later))
        except ConfigError as exc:
            if exc.key != "run" or args.schema is not None:
                raise
            unknown.append(c.name)
    if not plans:
        raise ConfigError(f"unknown run id {args.run!r}: no row of any schema carries it", key="run",
                          looked_in=[f"schema {name}" for name in unknown])
    return plans


def _plan_lines(p: RollbackPlan) -> list[str]:
    runs = ", ".join(p.runs)
    lines = [f"rollback {p.schema} run {p.run_id}" + (f" (with {runs})" if len(p.runs) > 1 else "")
             + {"new": "", "resumed": ": resuming a rollback that stopped half way",
                "done": ": rolled back already, nothing to do"}[p.state]]
    if p.state != "done":
        lines += [f"  history rows: {p.history_rows:,}", f"  rejects rows: {p.rejects_rows:,}",
                  f"  aggregates rows of the run: {p.aggregates_rows:,} (those of events still stored: "
                  "computed again)",
                  f"  ledger units: {p.ledger_units:,}",
                  f"  entities: {p.entities:,} (Redis hashes restored from Postgres: {p.hashes_restored:,}, "
                  f"deleted: {p.hashes_deleted:,})"]
    if p.later:
        lines.append("  later runs that wrote the same entities: "
                     + ", ".join(f"{r} ({k:,} rows)" for r, k in p.later.items()))
    return lines


def run(args: argparse.Namespace) -> int:
    if args.chunk_entities < 1:
        raise ConfigError("--chunk-entities must be at least 1", key="chunk_entities")
    settings = resolve_settings(schemas_dir=args.schemas_dir)
    plans = _plans(args, settings)
    if args.dry_run:
        if args.json:
            print(json.dumps({"dry_run": True, "plans": [dataclasses.asdict(p) for p in plans]}))
        else:
            for p in plans:
                print("\n".join(_plan_lines(p)))
            print("dry run: nothing changed")
        return 0
    show = not args.json and active_format() != "json"
    done: list[RolledBack] = []
    for p in plans:
        c = find_schema(p.schema, settings.schemas_dir)

        def progress(r: RolledBack, name: str = c.name) -> None:
            if show:
                print(f"rollback {name}: {r.entities_done:,}/{r.plan.entities:,} entities restored",
                      file=sys.stderr, flush=True)

        done.append(rollback(c, settings, args.run, include_later=args.include_later,
                             chunk_entities=args.chunk_entities, progress=progress))
    if args.json:
        print(json.dumps({"results": [{**dataclasses.asdict(r), "seconds": round(r.seconds, 3)}
                                      for r in done]}))
        return 0
    for r in done:
        print("\n".join(_plan_lines(r.plan)))
        if r.plan.state == "done":
            continue
        print(f"  done in {r.seconds:.1f} s: {r.keys_deleted:,} Redis keys deleted, {r.hashes_written:,} "
              f"hot hashes written, {r.aggregate_rows_written:,} aggregates rows written, "
              f"{r.aggregate_hashes_written:,} aggregates hashes, {r.tiles_written:,} tiles, "
              f"{r.units_cleared:,} Redis ledger units cleared")
        for name, why in r.skipped.items():
            print(f"  not restored {name}: {why}")
    return 0
