"""``features historical --schema S | --view V --entities FRAME.parquet --out train.parquet``:
a point-in-time-correct training set from the command line (``FeatureStore.historical``,
or ``historical_view`` for a feature view, over the frame, one chunk of rows at a time,
written to Parquet as it goes).

The frame file is read in batches of ``--chunk-rows`` rows; each batch is one
``historical`` call (its entities' history copied out of Postgres and joined,
``features.sdk.asof``) and one row group of the output, so memory holds one chunk whatever
the frame's length. :func:`write_training_set` takes any iterator of result tables:
the same writer serves another source of rows (e.g. a view's).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.cli import COMMANDS
from features.config import resolve_settings
from features.errors import ConfigError
from features.observe.logs import active_format
from features.observe.progress import LineProgress
from features.schema.syntax import duration_seconds
from features.sdk.asof import CHUNK_ROWS
from features.sdk.store import FeatureStore


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "historical", help=COMMANDS["historical"].summary,
        description="For each row of the entity frame (a Parquet file with the schema's entity column and a "
        "timestamp column; other columns, such as labels, pass through), the schema's stored values as of "
        "that time: the entity's newest Postgres row at or before it, never a later one. Writes Parquet in "
        "chunks; prints a summary (--json: one JSON line). Exit 0 on success, 2 on usage, schema, file or "
        "store errors.",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--schema", help="schema name (a file in the schemas folder)")
    which.add_argument("--view", help="view name (a file in the views folder, docs/views.md): the frame "
                       "holds the view's request keys and fields and the timestamp; every source as of "
                       "that time, then the request-time features")
    p.add_argument("--entities", required=True, metavar="FRAME.parquet",
                   help="the entity frame: the entity column, the timestamp column, anything else")
    p.add_argument("--out", required=True, metavar="PATH", help="the training set to write (Parquet)")
    p.add_argument("--features", default=None, metavar="A,B",
                   help="cold features and aggregations to read (default: every one, in schema order)")
    p.add_argument("--timestamp-column", default="timestamp",
                   help="the frame's as-of time column (default: timestamp)")
    p.add_argument("--max-age", default=None, metavar="DURATION",
                   help="ignore stored rows older than this before each row's time (7d, 12h, 30m, 45s)")
    p.add_argument("--windows", choices=("request-time", "event"), default="request-time",
                   help="what an aggregation column holds: its window evaluated at the row's time over the "
                   "history (request-time, the default: what online reads serve at that time; a quiet "
                   "entity's counts fall to 0), or its value as of the entity's newest event at or before "
                   "the row's time (event; docs/aggregations.md)")
    p.add_argument("--chunk-rows", type=int, default=None, metavar="N",
                   help="frame rows per chunk: one history fetch and one output row group each "
                   "(default 1,000,000)")
    p.add_argument("--schemas-dir", default=None, help="folder of schema YAML files (default: schemas)")
    p.add_argument("--views-dir", default=None, help="folder of view YAML files (default: views)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line on stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress line even on a terminal")
    p.set_defaults(func=run)


def write_training_set(rows_iter: Iterable[Any], out_path: str | Path,
                       progress: Any = None) -> dict[str, Any]:
    """Write the Arrow tables (or record batches) of ``rows_iter`` to one Parquet file at
    ``out_path``, each as it comes (a temporary file beside it, renamed when complete: a
    failed run leaves no partial training set). ``progress``: a
    :class:`features.observe.progress.LineProgress` (or None). Returns ``{"rows", "matched"}``
    (rows with an ``_event_time``, when the tables have one)."""
    out = Path(out_path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    writer = None
    rows = matched = 0
    try:
        for part in rows_iter:
            table = pa.Table.from_batches([part]) if isinstance(part, pa.RecordBatch) else part
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
            rows += table.num_rows
            if "_event_time" in table.column_names:
                matched += table.num_rows - table.column("_event_time").null_count
            else:  # a view's rows: matched where every source found a row
                found = [n for n in table.column_names if n.endswith("._found")]
                if found:
                    every = table.column(found[0])
                    for name in found[1:]:
                        every = pc.and_(every, table.column(name))
                    matched += int(pc.sum(every).as_py() or 0)
            if progress is not None:
                progress.update(rows, 0)
        if writer is None:
            raise ConfigError("no rows to write: the row source yielded no table", key="entities")
        writer.close()
        writer = None
        tmp.replace(out)
    finally:
        if writer is not None:
            writer.close()
        tmp.unlink(missing_ok=True)
    if progress is not None:
        progress.close(rows, 0)
    return {"rows": rows, "matched": matched}


def _frame_chunks(path: str, chunk_rows: int) -> tuple[Iterator[Any], int]:
    """The frame file's rows as tables of ``chunk_rows`` rows (at least one, possibly
    empty), and its row count."""
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ConfigError(f"cannot read the entity frame {path}: {exc}", key="entities") from exc

    def chunks() -> Iterator[Any]:
        seen = False
        for batch in pf.iter_batches(batch_size=chunk_rows):
            seen = True
            yield pa.Table.from_batches([batch])
        if not seen:
            yield pf.schema_arrow.empty_table()

    return chunks(), pf.metadata.num_rows


def _max_age(text: str | None) -> dt.timedelta | None:
    if text is None:
        return None
    seconds = duration_seconds(text)
    if seconds is None:
        raise ConfigError(f"--max-age {text!r} is not a duration such as 7d, 12h, 30m or 45s", key="max_age")
    return dt.timedelta(seconds=seconds)


def run(args: argparse.Namespace) -> int:
    chunk_rows = args.chunk_rows or CHUNK_ROWS
    if chunk_rows < 1:
        raise ConfigError(f"--chunk-rows must be at least 1, not {chunk_rows}", key="chunk_rows")
    max_age = _max_age(args.max_age)
    features = [f.strip() for f in args.features.split(",") if f.strip()] if args.features else None
    if args.view is not None and (features is not None or max_age is not None):
        raise ConfigError("--features and --max-age are the view's own (its sources' features and max_age): "
                          "not given with --view", key="view")
    settings = resolve_settings(schemas_dir=args.schemas_dir, views_dir=args.views_dir)
    frames, total = _frame_chunks(args.entities, chunk_rows)
    show = not args.no_progress and not args.json and active_format() != "json"
    what = args.schema if args.view is None else f"view {args.view}"
    progress = LineProgress(f"historical {what}", total, enabled=show)
    t0 = time.perf_counter()
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=settings.schemas_dir, views=settings.views_dir) as fs:
        if args.view is not None:
            fs.view(args.view)  # an unknown view fails before the output is opened
            parts: Iterator[Any] = (fs.historical_view(args.view, f, timestamp_column=args.timestamp_column,
                                                       windows=args.windows.replace("-", "_"))
                                    for f in frames)
        else:
            fs.schema(args.schema)  # an unknown schema fails before the output is opened
            parts = (fs.historical(args.schema, f, features, timestamp_column=args.timestamp_column,
                                   max_age=max_age, windows=args.windows.replace("-", "_")) for f in frames)
        result = write_training_set(parts, args.out, progress)
    seconds = time.perf_counter() - t0
    summary = {("schema" if args.view is None else "view"): args.schema or args.view,
               "entities": args.entities, "out": args.out, **result, "seconds": round(seconds, 3)}
    if args.json:
        print(json.dumps(summary))
    else:
        found = "with a stored row at or before their time" if args.view is None else "every source found"
        print(f"historical {what}: {result['rows']:,} rows ({result['matched']:,} {found}) written to "
              f"{args.out} in {seconds:.1f}s")
    sys.stdout.flush()
    return 0


__all__ = ["add_parser", "run", "write_training_set"]
