"""``features validate``: check Parquet files against a schema, without loading them.

``features validate --schema NAME [--schemas-dir DIR] [--json] [--top N] FILE...``

The schema NAME is looked up among the schema files of ``--schemas-dir`` (else the
``schemas_dir`` setting, ``schemas/`` by default). Every file's columns are checked
first, with the very check ``features load`` makes before it reads anything
(:func:`features.sources.parquet.refusal`): a file the loader would refuse (a missing
required column, a column of an incompatible type, e.g. text for a number without
``accept_strings``) is refused here with the loader's message and hint. Then each file
is read batch by batch (only the declared columns) and validated with the compiled
rules. Printed: the row counts, then the rules that rejected rows, most frequent
first, each with its count and up to 3 example messages (``file#row: message``).
For a loadable schema the valid rows of all the files are also counted as a load would
store them (issue 48, :mod:`features.validation.ties`): ``valid = events + exact copies``
(an exact copy has the entity, event time and content of another row: stored once), and
the distinct events that share their entity and event time with another (all stored).
``--json`` prints one JSON document instead.

Exit codes: 0 every row is valid; 1 some rows were rejected; 2 usage errors (unknown
schema, unreadable file, invalid schema files) and a file the loader would refuse.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.cli import COMMANDS
from features.compile import CompiledSchema, compile_schema
from features.config import resolve_settings
from features.errors import SchemaError
from features.schema.parse import load_schemas
from features.sources.names import as_fields
from features.sources.parquet import refusal
from features.validation import validate
from features.validation.ties import TieCounter, TieCounts, tie_line

#: Rows per batch read from a Parquet file.
BATCH_ROWS = 1 << 20
EXAMPLES_PER_RULE = 3


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``validate`` on the ``features`` parser."""
    p = subparsers.add_parser(
        "validate",
        help=COMMANDS["validate"].summary,
        description="Validate Parquet files against the schema NAME: print the row counts and "
        "the rules that rejected rows with example messages. A file that `features load` would "
        "refuse (a missing required column, a column of an incompatible type) is refused with the "
        "same message. Exit 0 when every row is valid, 1 when some rows were rejected, 2 on usage "
        "errors and refused files.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="Parquet files to validate")
    p.add_argument("--schema", required=True, metavar="NAME", help="schema name (its `name:` key)")
    p.add_argument("--schemas-dir", metavar="DIR", help="schema folder (default: the schemas_dir setting)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.add_argument("--top", type=int, default=10, metavar="N", help="show the N most frequent rules (10)")
    p.set_defaults(func=run_validate)


@dataclass
class Summary:
    """Counts over every file, and example messages per rule id."""

    schema: str
    version: str
    fingerprint: str
    files: list[str] = field(default_factory=list)
    input_rows: int = 0
    valid_rows: int = 0
    rejected_rows: int = 0
    by_rule: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    ties: TieCounts | None = None

    def as_json(self, top: int) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "version": self.version,
            "fingerprint": self.fingerprint,
            "files": self.files,
            "input_rows": self.input_rows,
            "valid_rows": self.valid_rows,
            "rejected_rows": self.rejected_rows,
            **(self.ties.as_json() if self.ties is not None else {}),
            "by_rule": dict(self.by_rule.most_common()),
            "top": [
                {"rule": rule, "count": count, "examples": self.examples.get(rule, [])}
                for rule, count in self.by_rule.most_common(top)
            ],
        }


def run_validate(args: argparse.Namespace) -> int:
    """Validate ``args.files`` against ``args.schema``; returns the exit code."""
    schemas_dir = args.schemas_dir
    if schemas_dir is None:
        schemas_dir = resolve_settings().schemas_dir
    if args.top < 0:
        return _usage("--top must be >= 0")
    try:
        schemas = load_schemas(schemas_dir)
    except SchemaError as exc:
        return _usage(f"invalid schema files:\n{exc}")
    schema = schemas.get(args.schema)
    if schema is None:
        known = ", ".join(sorted(schemas)) or "none"
        return _usage(f"no schema named {args.schema!r} in {schemas_dir} (found: {known})")
    compiled = compile_schema(schema)
    summary = Summary(schema.name, schema.version_str, compiled.fingerprint)
    opened = []
    for path in args.files:  # every file checked before any is read, as by the loader
        pf, error = _open_file(path, compiled)
        if error is not None:
            return _usage(error)
        opened.append((path, pf))
    ties = TieCounter(compiled)
    for path, pf in opened:
        error = _validate_file(path, pf, compiled, summary, ties)
        if error:
            return _usage(error)
    if ties.active:
        summary.ties = ties.counts()
    if args.json:
        print(json.dumps(summary.as_json(args.top), indent=2))
    else:
        _print_text(summary, args.top)
    return 1 if summary.rejected_rows else 0


def _usage(message: str) -> int:
    print(f"features validate: error: {message}", file=sys.stderr)
    return 2


def _open_file(path: str, compiled: CompiledSchema) -> tuple[Any, str | None]:
    """(the Parquet file, None), or (None, why it cannot be validated): unreadable, or
    refused by the loader's column check with its message."""
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        return None, f"cannot read {path}: {exc}"
    refused = refusal(path, pf.schema_arrow, compiled)
    return (None, str(refused)) if refused is not None else (pf, None)


def _validate_file(path: str, pf: Any, compiled: CompiledSchema, summary: Summary,
                   ties: TieCounter) -> str | None:
    """Validate one opened file into ``summary``; returns an error message, or None."""
    present = set(pf.schema_arrow.names)
    columns = [name for name in compiled.schema.input_names if name in present]  # a field's source:
    summary.files.append(path)
    offset = 0
    try:
        batches = pf.iter_batches(batch_size=BATCH_ROWS, columns=columns)
        for batch in batches:
            result = validate(as_fields(batch, compiled.schema), compiled)
            counts = result.counts
            summary.input_rows += counts.input_rows
            summary.valid_rows += counts.valid_rows
            summary.rejected_rows += counts.rejected_rows
            summary.by_rule.update(counts.by_rule)
            ties.add(result.valid)
            if result.rejects.num_rows:
                _collect_examples(result.rejects, path, offset, summary)
            offset += batch.num_rows
    except (OSError, pa.ArrowException) as exc:
        return f"cannot read {path}: {exc}"
    return None


def _collect_examples(rejects: Any, path: str, offset: int, summary: Summary) -> None:
    for rule in pc.unique(rejects.column("rule")).to_pylist():
        have = summary.examples.setdefault(rule, [])
        if len(have) >= EXAMPLES_PER_RULE:
            continue
        rows = rejects.filter(pc.equal(rejects.column("rule"), rule)).slice(0, EXAMPLES_PER_RULE - len(have))
        pairs = zip(rows.column("row").to_pylist(), rows.column("message").to_pylist(), strict=True)
        for row, message in pairs:
            have.append(f"{path}#{offset + row}: {message}")


def _print_text(s: Summary, top: int) -> None:
    share = f" ({s.rejected_rows / s.input_rows:.2%})" if s.input_rows else ""
    files = f"{len(s.files)} file" + ("s" if len(s.files) != 1 else "")
    print(
        f"{s.schema} {s.version} ({s.fingerprint[:12]}): {files}, {s.input_rows:,} rows: "
        f"{s.valid_rows:,} valid, {s.rejected_rows:,} rejected{share}"
    )
    if s.ties is not None:
        print(tie_line(s.ties))
    if not s.by_rule:
        return
    shown = s.by_rule.most_common(top)
    print(f"top reasons ({len(shown)} of {len(s.by_rule)} rules):")
    width = max(len(rule) for rule, _ in shown) if shown else 0
    for rule, count in shown:
        print(f"  {rule:<{width}}  {count:,}")
        for example in s.examples.get(rule, []):
            print(f"    {example}")
