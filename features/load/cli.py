"""``features load --schema NAME PATH...``: the batch loader from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "load", help="load Parquet files into Redis (hot) and Postgres (cold), with rejects and lineage",
        description="Read Parquet files row group by row group, validate every row with the compiled "
        "schema, compute the derived features, and write hot features to Redis and the history to "
        "Postgres. Rejected rows go to the <schema>__rejects table. Re-running the same files stores "
        "nothing twice. Exit 0 when the run completed (rejects included), 1 when counts do not add up, "
        "2 on usage, schema, source or store errors.",
    )
    p.add_argument("--schema", required=True, help="schema name (a file in the schemas folder)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="Parquet files, folders or globs")
    p.add_argument("--schemas-dir", default=None, help="folder of schema YAML files (default: schemas)")
    p.add_argument("--batch-rows", type=int, default=None,
                   help="rows per batch within a row group (default 131072)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress line even on a terminal")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from features.compile.postgres import rejects_table_name
    from features.config import resolve_settings
    from features.load import find_schema, load, render_summary
    from features.sources.parquet import DEFAULT_BATCH_ROWS

    settings = resolve_settings(schemas_dir=args.schemas_dir)
    compiled = find_schema(args.schema, settings.schemas_dir)
    summary = load(args.paths, compiled, settings, batch_rows=args.batch_rows or DEFAULT_BATCH_ROWS,
                   progress=not args.no_progress and not args.json)
    if args.json:
        print(json.dumps(summary.as_dict(), indent=2))
    else:
        print(render_summary(summary, rejects_table=rejects_table_name(compiled.schema)))
    if not summary.adds_up:
        print("features load: counts do not add up; this is a bug, please report it", file=sys.stderr)
        return 1
    return 0
