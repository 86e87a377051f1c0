"""One source batch -> validate -> transform -> rows for the stores + rejects (pure).

:func:`process_batch` validates a batch with the compiled rules, runs the transform
program on the valid rows, computes each stored event's content digest, attaches
lineage, and groups the rejects (one per failed rule) into one row per rejected input
row, with its raw values as JSON (:func:`group_rejects`). It writes nothing: the
writer (:mod:`features.pipeline.write`) hands the result to the sinks.

:func:`prepare_records` is the same step for JSON record values (a stream's
micro-batch, an HTTP ingest request): decoded into one batch in record order by
:mod:`features.sources.micro_batch`, then one :func:`process_batch`, with a reject for
every record that does not decode.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.compile.rejects import REJECTED_ROWS_SCHEMA
from features.kernels.digest import content_digests, field_defaults
from features.lineage import DIGEST, BatchLineage, RunContext
from features.pipeline.summary import MAX_EXAMPLES
from features.sources.base import RawRows, SourceBatch
from features.sources.columnar import ColumnarDecoder
from features.sources.micro_batch import COLUMNAR_MIN_RECORDS, decode_micro_batch
from features.sources.names import as_fields
from features.sources.records import TopCounter, payload_json
from features.validation import validate
from features.validation.values import is_json_values, json_values

if TYPE_CHECKING:
    from features.kernels import TransformProgram


@dataclass(frozen=True)
class Prepared:
    """One source batch after validation and transforms: what the sinks receive."""

    rows: pa.Table
    rejects: pa.Table
    rejected_rows: int
    reject_rules: Counter[str]
    examples: dict[str, list[str]]
    #: for each row of ``rows``, its row in the source batch (None: not tracked)
    index: npt.NDArray[np.int64] | None = None
    #: one row per failed rule of ``rejects`` (``group``: its row in ``rejects``, ``row``:
    #: its row in the source batch, ``field``, ``rule``, ``reason``, ``message``,
    #: ``value``: the structured form of the JSON ``errors`` of ``rejects``), in the order
    #: ``reject_rules`` and ``examples`` were counted from
    entries: pa.Table | None = None

    def reasons(self, held: npt.NDArray[np.int64] | None) -> tuple[Counter[str], dict[str, list[str]]]:
        """``reject_rules`` and ``examples`` of the rejects other than the rows ``held``
        (positions in ``rejects``: the ones the store already held, counted already
        present); all of them when ``held`` is None or empty."""
        if held is None or len(held) == 0 or self.entries is None:
            return self.reject_rules, self.examples
        kept = self.entries.filter(pc.invert(pc.is_in(self.entries.column("group"),
                                                      value_set=pa.array(held, pa.int64()))))
        return reject_reasons(kept)


#: the columns of a reject entry (the validator's, the transforms') that ``Prepared.entries`` keeps
_ENTRY_COLUMNS = ("field", "rule", "reason", "message", "value")


def reject_reasons(entries: pa.Table) -> tuple[Counter[str], dict[str, list[str]]]:
    """Per rule, how many of ``entries`` (one row per failed rule: ``rule``, ``message``)
    are of it, and up to three example messages from the first 200 entries."""
    rule_counts: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    if entries.num_rows == 0:
        return rule_counts, examples
    for entry in pc.value_counts(entries.column("rule").combine_chunks()).to_pylist():
        rule_counts[str(entry["values"])] = int(entry["counts"])
    head = entries.slice(0, 200)
    for rule, message in zip(head.column("rule").to_pylist(), head.column("message").to_pylist(),
                             strict=True):
        ex = examples.setdefault(rule, [])
        if len(ex) < MAX_EXAMPLES:
            ex.append(message)
    return rule_counts, examples


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


# jsonb refuses the escape \u0000 (a NUL character): keep it as the six characters
# \u0000 instead. Only an escape, i.e. one preceded by an even run of backslashes.
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def _json_safe(value: Any) -> Any:
    """NaN and ±inf are not JSON (and Postgres jsonb refuses them): keep them as text,
    also inside lists and objects (a decoded record's ``[NaN]``). Nested values are
    copied without recursion: a record may nest as deep as ``json.loads`` allows."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # 'nan', 'inf', '-inf'
    if not isinstance(value, list | dict):
        return value
    root: list[Any] | dict[Any, Any] = [] if isinstance(value, list) else {}
    todo: list[tuple[Any, list[Any] | dict[Any, Any]]] = [(value, root)]
    while todo:
        source, target = todo.pop()
        for key, item in (source.items() if isinstance(source, dict) else enumerate(source)):
            if isinstance(item, list | dict):
                copied: Any = [] if isinstance(item, list) else {}
                todo.append((item, copied))
            else:
                copied = _json_safe(item)
            if isinstance(target, list):
                target.append(copied)
            else:
                target[key] = copied
    return root


def _raw_json(batch: pa.RecordBatch, rows: npt.NDArray[np.int64]) -> list[str]:
    """The input values of ``rows`` as JSON objects (only rejected rows come here).

    Always valid JSON that Postgres jsonb accepts: decimals, dates and times become
    strings, NaN/inf become the strings ``nan``/``inf``/``-inf``, bytes are decoded as
    UTF-8 with replacement, a NUL character becomes the text ``\\u0000``.
    """
    taken = batch.take(pa.array(rows, pa.int64()))
    objects = taken.to_pylist()
    for i, f in enumerate(taken.schema):
        if is_json_values(f):  # decoded JSON objects (features.validation.values): their values
            values, absent = json_values(taken.column(i))
            for obj, value in zip(objects, values, strict=True):
                obj[f.name] = value
            for r in absent.tolist():
                del objects[r][f.name]
    return [_raw_object(r) for r in objects]


def _raw_object(row: dict[str, Any]) -> str:
    """One input row (an Arrow row, a decoded JSON object) as :func:`_raw_json` renders it."""
    return _dumps({k: _json_safe(v) for k, v in row.items()})


def _dumps(obj: Any) -> str:
    """JSON text that Postgres jsonb accepts (see :func:`_raw_json`)."""
    text = json.dumps(obj, default=_json_default, ensure_ascii=False, allow_nan=False)
    return _NUL_ESCAPE.sub(r"\1\\\\u0000", text)


def group_rejects(rejects: pa.Table, raw: RawRows, row_uris: Callable[[pa.Array], pa.Array],
                   ctx: RunContext, row_offset: int = 0,
                   row_numbers: Callable[[pa.Array], pa.Array] | None = None) -> pa.Table:
    """Reject entries (one per failed rule) -> one row per rejected input row, its input
    rendered by ``raw``. ``row_index`` is the row in the source: ``row_numbers(rows)`` when given, else the
    batch's first row (``row_offset``) + its row in the batch."""
    if rejects.num_rows == 0:
        return REJECTED_ROWS_SCHEMA.empty_table()
    rejects = rejects.sort_by([("row", "ascending")])
    rows = rejects.column("row").to_numpy()
    uniq, starts = np.unique(rows, return_index=True)
    entries = rejects.select(["field", "rule", "reason", "message", "value"]).to_pylist()
    bounds = [*starts.tolist(), len(entries)]
    errors = [_dumps(entries[bounds[i]:bounds[i + 1]])
              for i in range(len(uniq))]  # loop over rejected rows only: the exception path
    raws = raw(uniq)
    idx = pa.array(uniq, pa.int64())
    lineage = ctx.columns(row_uris(idx))
    n = len(uniq)
    return pa.table({
        "_source": lineage["_source"],
        "row_index": (row_numbers(idx) if row_numbers is not None
                      else pc.add(idx, row_offset) if row_offset else idx),
        "raw": pa.array(raws, pa.string()),
        "errors": pa.array(errors, pa.string()),
        "event_time": pa.nulls(n, pa.timestamp("us", "UTC")),
        **{k: v for k, v in lineage.items() if k != "_source"},
    }, schema=REJECTED_ROWS_SCHEMA)


def process_batch(sb: SourceBatch, compiled: CompiledSchema, program: TransformProgram | None,
                  ctx: RunContext, reference_time: dt.datetime) -> Prepared:
    """Validate, transform and attach lineage to one source batch.

    ``program`` is a compiled transform program (``features.kernels``) or None. Its
    rejects (a transform producing NaN/inf under ``on_invalid: reject``) join the
    validator's. The batch has the input's names (a field's ``source:``,
    :mod:`features.sources.names`): it is renamed to field names for validation, and the
    rejects' ``raw`` keeps the input's names (``sb.raw`` renders it when the source
    gives its own rendering). Pure: writes nothing.
    """
    batch = sb.batch
    # validated with field names; rejects' raw is rendered from ``batch`` (input names)
    result = validate(as_fields(batch, compiled.schema), compiled, json_text=sb.json_text)
    valid = result.valid
    valid_index = result.valid_row_index.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    reject_parts = [result.rejects]
    columns: dict[str, pa.Array] = {name: valid.column(i) for i, name in enumerate(valid.schema.names)}
    kept_index = valid_index
    if program is not None:
        out = program.run(valid, reference_time=reference_time)
        if out.rejects.num_rows:
            # transform rejects index rows of ``valid``: map them back to input rows
            bad = out.rejects.column("row").to_numpy()
            mapped = out.rejects.set_column(out.rejects.schema.get_field_index("row"), "row",
                                            pa.array(valid_index[bad], pa.int64()))
            reject_parts.append(mapped.select(result.rejects.column_names).cast(result.rejects.schema))
            kept = out.kept_row_index
            columns = {name: arr.take(kept) for name, arr in columns.items()}
            kept_index = valid_index[kept.to_numpy()]
    # every stored event's content digest (the history's key beside entity and event
    # time, Redis's tie-break): over the declared fields, so every entry point agrees
    digest = (content_digests({f.name: columns[f.name] for f in compiled.schema.fields}, len(kept_index),
                              field_defaults(compiled.schema))
              if compiled.schema.loadable else None)
    if program is not None:
        for i, name in enumerate(out.features.schema.names):
            columns[name] = out.features.column(i)
    data = dict(columns)
    if digest is not None:
        data[DIGEST] = digest
    data.update(ctx.columns(sb.lineage.row_uris(pa.array(kept_index, pa.int64()))))
    rows = pa.table(data)
    rejects = pa.concat_tables(reject_parts) if len(reject_parts) > 1 else reject_parts[0]
    grouped = group_rejects(rejects, sb.raw or partial(_raw_json, batch), sb.lineage.row_uris, ctx,
                            row_numbers=sb.lineage.row_numbers)
    entries = None
    if rejects.num_rows:
        # each entry's row in ``grouped`` (one row per rejected input row, by input row)
        row = rejects.column("row").to_numpy()
        group = np.searchsorted(np.unique(row), row)
        entries = pa.table({"group": pa.array(group, pa.int64()), "row": rejects.column("row"),
                            **{name: rejects.column(name) for name in _ENTRY_COLUMNS}})
    rule_counts, examples = reject_reasons(entries) if entries is not None else (Counter(), {})
    return Prepared(rows, grouped, grouped.num_rows, rule_counts, examples, kept_index, entries)


@dataclass
class PreparedRecords:
    """One micro-batch of records, prepared for the stores: ``prepared`` (rows in record
    order; rejects, decode rejects first, with ``row_index`` = Kafka offset), the
    ``unknown_fields`` count, and how many records took the per-record path (``slow``)."""

    prepared: Prepared
    unknown_fields: TopCounter
    slow: int
    decode_rejects: int
    #: the rejects' errors in their structured form, one row per failed rule: ``group``
    #: (its row in ``prepared.rejects``), ``row`` (its record's position), ``field``,
    #: ``rule``, ``reason``, ``message``, ``value``; by ``group``, a record's errors in
    #: the order of its ``errors`` JSON (what the HTTP answer lists)
    entries: pa.Table


def prepare_records(values: Sequence[bytes | None], uris: pa.Array, offsets: npt.NDArray[np.int64],
                    compiled: CompiledSchema, program: TransformProgram | None, ctx: RunContext,
                    now: dt.datetime, *,
                    decoder: ColumnarDecoder | None = None,
                    columnar_min: int = COLUMNAR_MIN_RECORDS) -> PreparedRecords:
    """Decode, validate and transform one micro-batch of record values (pure: writes nothing).

    The records are decoded into one batch in record order and decode rejects
    (:func:`features.sources.micro_batch.decode_micro_batch`: with ``decoder``, the
    stream's default, and at least ``columnar_min`` records, what Arrow reads exactly is
    read columnar, the rest one record at a time), then validated and transformed once
    (:func:`process_batch`). Rows, rejects and counts are those of the per-record path
    alone, which ``decoder=None`` runs for the whole micro-batch
    (``tests/property/test_stream_columnar.py`` holds the two equal).
    """
    max_bytes = compiled.schema.payload.max_bytes
    dec = decode_micro_batch(values, compiled, decoder=decoder, columnar_min=columnar_min)
    pos = dec.index
    prepared = process_batch(records_source_batch(dec.batch, values, pos, uris, max_bytes),
                             compiled, program, ctx, now)
    decoded = dec.rejects.num_rows
    decode_rejects = _with_offsets(
        group_rejects(dec.rejects, lambda idx: [payload_json(values[int(i)], max_bytes) for i in idx],
                      lambda idx: uris.take(idx), ctx), offsets)
    rule_counts: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    if decoded:
        rule_counts["_payload.decode"] += decoded
        examples["_payload.decode"] = dec.rejects.column("message").to_pylist()[:3]
    rule_counts.update(prepared.reject_rules)
    examples.update(prepared.examples)
    entry_parts = [_entries(dec.rejects, np.arange(decoded, dtype=np.int64), dec.failed)]
    rejects = decode_rejects
    if prepared.rejects.num_rows:
        at = pos[prepared.rejects.column("row_index").to_numpy()]
        rejects = pa.concat_tables([decode_rejects, _with_offsets(prepared.rejects, offsets, at)])
        if prepared.entries is not None:
            entries = prepared.entries
            entry_parts.append(_entries(entries, decoded + entries.column("group").to_numpy(),
                                        pos[entries.column("row").to_numpy()]))
    assert prepared.index is not None
    merged = Prepared(prepared.rows, rejects, rejects.num_rows, rule_counts, examples, pos[prepared.index])
    entries = pa.concat_tables(entry_parts).sort_by([("group", "ascending")])
    return PreparedRecords(merged, dec.unknown_fields, dec.slow, decoded, entries)


def _entries(rejects: pa.Table, group: npt.NDArray[np.int64], records: npt.NDArray[np.int64]) -> pa.Table:
    """Reject entries (one per failed rule) as :attr:`PreparedRecords.entries` holds them:
    ``group`` their reject row, ``row`` their record."""
    return pa.table({"group": pa.array(group, pa.int64()), "row": pa.array(records, pa.int64()),
                     **{name: rejects.column(name) for name in _ENTRY_COLUMNS}})


def records_source_batch(batch: pa.Table | pa.RecordBatch, values: Sequence[bytes | None],
                   positions: npt.NDArray[np.int64], uris: pa.Array, max_bytes: int) -> SourceBatch:
    """Decoded records (``batch``: the records of ``positions`` in ``values``, read columnar
    or one at a time; ``uris``: every record's lineage) as a source batch whose rejects'
    raw is each record's own JSON object, all its keys (the payload when not one)."""
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else \
            pa.RecordBatch.from_pylist([], schema=batch.schema)

    def raw(idx: npt.NDArray[np.int64]) -> list[str]:
        return _raw_records(values, positions[idx], max_bytes)

    lineage = BatchLineage("kafka://", 0, batch.num_rows, unit=None, explicit=uris.take(pa.array(positions)))
    return SourceBatch(batch, lineage, raw=raw, json_text=True)


def _raw_records(values: Sequence[bytes | None], positions: npt.NDArray[np.int64],
                 max_bytes: int) -> list[str]:
    """The raw payload of rejected records (by the validator or the transforms): the
    record's JSON object (from ``json.loads``) as :func:`_raw_json` renders a row."""
    out = []
    for p in positions.tolist():  # rejected rows only: the exception path
        value = values[p]
        try:
            obj = json.loads(value.decode("utf-8")) if value is not None else None
        except (UnicodeDecodeError, ValueError, RecursionError):
            obj = None
        out.append(_raw_object(obj) if isinstance(obj, dict) else payload_json(value, max_bytes))
    return out


def _with_offsets(rejects: pa.Table, offsets: npt.NDArray[np.int64],
                  positions: npt.NDArray[np.int64] | None = None) -> pa.Table:
    """Rejects of Kafka records: ``row_index`` is the record's offset in its partition."""
    if rejects.num_rows == 0:
        return rejects
    pos = rejects.column("row_index").to_numpy() if positions is None else positions
    i = rejects.schema.get_field_index("row_index")
    return rejects.set_column(i, "row_index", pa.array(offsets[pos], pa.int64()))
