"""``features prewarm --schema S [--since DURATION | --ids FILE]``: fill Redis from Postgres.

Reads the newest stored row of each entity of schema S from the history table (and,
for a schema with aggregations, its newest aggregation row) and writes it to Redis with
the fill script (docs/redis.md, "Filled hashes"): newest wins, so a hash Redis already
holds with a newer or the same event is left as it is, and a stream writing meanwhile
is never overwritten. For deploys, and after a Redis loss (a ``FLUSHDB``, a restart
without persistence), so that ``FeatureStore.online`` is served from Redis again
instead of falling back to Postgres for every entity. Hot features Postgres does not
hold (``store: hot`` only) stay absent until the pipeline writes the entity again.

Exit 0 when done, 2 on usage, schema or store errors.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

from features.cli import COMMANDS
from features.config import resolve_settings
from features.errors import ConfigError
from features.observe.logs import active_format
from features.schema.syntax import duration_seconds
from features.sdk.store import FeatureStore


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "prewarm", help=COMMANDS["prewarm"].summary,
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--schema", required=True, help="schema name (a file in the schemas folder)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--since", type=_duration, default=None, metavar="DURATION",
                       help="only entities with an event in this span before now (7d, 12h, 30m, 3600)")
    which.add_argument("--ids", type=Path, default=None, metavar="FILE",
                       help="only these entities: a text file with one id per line")
    p.add_argument("--schemas-dir", default=None, help="folder of schema YAML files (default: schemas)")
    p.add_argument("--chunk-rows", type=int, default=50_000,
                   help="rows read and written at a time (default 50000)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.set_defaults(func=run)


def _duration(text: str) -> dt.timedelta:
    seconds = int(text) if text.isdigit() else duration_seconds(text)
    if seconds is None or seconds <= 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use seconds (3600) or 7d, 12h, 30m")
    return dt.timedelta(seconds=seconds)


def run(args: argparse.Namespace) -> int:
    settings = resolve_settings(schemas_dir=args.schemas_dir)
    ids = None
    if args.ids is not None:
        try:
            ids = [line.strip() for line in args.ids.read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError as exc:
            raise ConfigError(f"cannot read --ids {args.ids}: {exc.strerror}", key="ids") from exc
    if args.chunk_rows < 1:
        raise ConfigError("--chunk-rows must be at least 1", key="chunk_rows")
    t0 = time.perf_counter()
    show = not args.json and active_format() != "json"

    def progress(rows: int, written: int) -> None:
        if show:
            print(f"prewarm {args.schema}: {rows:,} entities read, {written:,} hashes written "
                  f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)

    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=settings.schemas_dir) as fs:
        result: dict[str, Any] = fs.prewarm(args.schema, since=args.since, ids=ids,
                                            chunk_rows=args.chunk_rows, progress=progress)
    result["seconds"] = round(time.perf_counter() - t0, 3)
    if args.json:
        print(json.dumps({"schema": args.schema, **result}))
    else:
        print(f"prewarm {args.schema}: {result['rows']:,} entities read from Postgres, {result['written']:,} "
              f"Redis hashes written (the others already held that event or a newer one) in "
              f"{result['seconds']:.1f} s")
    return 0
