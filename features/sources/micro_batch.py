"""One micro-batch of JSON record values -> ONE Arrow batch in record order + decode rejects.

A stream's micro-batch and an HTTP ingest request are decoded here, then validated and
transformed once (``features.pipeline.prepare.prepare_records``). With a
:class:`~features.sources.columnar.ColumnarDecoder` and enough records, the records
Arrow reads with the meaning ``json.loads`` gives them are read columnar (the fast
part); every other record is decoded one at a time
(:func:`features.sources.records.decode`: the per-record part, or a decode reject).
The two parts become one batch:

- a column of the same Arrow type in both parts (neither a column of JSON texts) is
  the two concatenated;
- any other column (kinds differ, one part has JSON texts, one part lacks the key) is a
  column of JSON texts for the whole batch (:mod:`features.validation.values`): the
  per-record part keeps its texts (null where a record has no key), the fast part's
  values are written as JSON (``json.dumps`` of the value Arrow read, ``null`` for a
  null), which the validator reads back to the same values and converts part by part
  by Python type, as it converts each part's own column;
- the rows are taken back into record order.

Before that, the fast part's rows with a ``type`` failure in a field read as float64
join the per-record part: the validator's message shows the value, and Arrow's
``100.0`` may have been the JSON integer ``100`` that ``json.loads`` keeps (every other
failure shows the converted value, which both parts hold equal). So rows, rejects and
counts are those of the per-record path alone (``decoder=None``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features.compile import CompiledSchema
from features.sources.columnar import ColumnarDecoder
from features.sources.records import TopCounter, decode
from features.validation.convert import convert
from features.validation.values import JSON_VALUES, is_json_values

#: Fewer records than this take the per-record path even with a columnar decoder: Arrow's
#: JSON reader costs ~1 ms a call, more than ``json.loads`` of a few hundred records
#: (measured with the applicant records: equal at ~800, per-record 15% faster at 256; the
#: HTTP ingest's small requests, a stream's small micro-batches).
COLUMNAR_MIN_RECORDS = 256

_TEXTS = pa.field("", pa.string(), metadata={JSON_VALUES: b"1"})


@dataclass
class MicroBatch:
    """``batch``: the decoded records, one row each in record order (columns named by the
    records' keys); ``index``: their positions in the micro-batch; ``rejects``:
    validator-shaped ``decode`` rejects (``row`` = record position) of ``failed``;
    ``unknown_fields``; ``slow``: how many records took the per-record path."""

    batch: pa.RecordBatch
    index: npt.NDArray[np.int64]
    rejects: pa.Table
    failed: npt.NDArray[np.int64]
    unknown_fields: TopCounter
    slow: int


def decode_micro_batch(values: Sequence[bytes | None], compiled: CompiledSchema, *,
                       decoder: ColumnarDecoder | None = None,
                       columnar_min: int = COLUMNAR_MIN_RECORDS) -> MicroBatch:
    """Decode one micro-batch (see the module docstring). With ``decoder`` and at least
    ``columnar_min`` records, what Arrow reads exactly is read columnar."""
    schema = compiled.schema
    known = frozenset(schema.input_names)  # JSON keys: a field's source:, else its name
    n = len(values)
    unknown = TopCounter()
    slow = np.arange(n, dtype=np.int64)
    fast: pa.Table | None = None
    fast_index = np.zeros(0, dtype=np.int64)
    if decoder is not None and n >= max(columnar_min, 1):
        col = decoder.decode(values)
        slow = col.slow
        if col.table.num_rows:
            reread = _float_type_failures(col.table, decoder, compiled)
            keep = np.ones(col.table.num_rows, dtype=np.bool_)
            keep[reread] = False
            if len(reread):
                slow = np.union1d(slow, col.index[reread])
                unknown.update(col.unknown_fields(np.flatnonzero(keep)))
                fast = col.table.filter(pa.array(keep))
            else:
                unknown.update(col.unknown_fields())
                fast = col.table
            fast_index = col.index[keep]
    dec = decode([values[int(i)] for i in slow], max_bytes=schema.payload.max_bytes, known=known)
    unknown.update(dec.unknown_fields)
    slow_index = slow[dec.index]
    batch, index = _one_batch(fast, fast_index, dec.batch, slow_index)
    failed = slow[dec.failed]
    rejects = dec.rejects.set_column(0, "row", pa.array(failed, pa.int64()))
    return MicroBatch(batch, index, rejects, failed, unknown, len(slow))


def _float_type_failures(table: pa.Table, decoder: ColumnarDecoder,
                         compiled: CompiledSchema) -> npt.NDArray[np.int64]:
    """Rows of the fast part with a ``type`` failure in a field read as float64 (the
    validator's conversion of that column, run here on those columns only)."""
    floats = decoder.float_read()
    bad = np.zeros(table.num_rows, dtype=np.bool_)
    for f in compiled.schema.fields:
        if f.name not in floats:
            continue
        column = table.column(f.input_name)
        raw = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        converted = convert(raw, f, compiled.arrow_schema.field(f.name).type)
        if converted.failed:
            bad[converted.fail_rows] = True
    return np.flatnonzero(bad).astype(np.int64)


def _one_batch(fast: pa.Table | None, fast_index: npt.NDArray[np.int64], slow: pa.RecordBatch,
               slow_index: npt.NDArray[np.int64]) -> tuple[pa.RecordBatch, npt.NDArray[np.int64]]:
    """The fast part (a table in read types) and the per-record part (an
    :func:`~features.validation.values.objects_batch`) as one batch in record order."""
    if fast is None or fast.num_rows == 0:
        return slow, slow_index
    fast_batch = fast.combine_chunks().to_batches()[0] if fast.num_columns else \
        pa.RecordBatch.from_struct_array(pa.array([{}] * fast.num_rows, pa.struct([])))
    if slow.num_rows == 0:
        return fast_batch, fast_index
    names = list(fast_batch.schema.names)
    seen = set(names)
    names += [name for name in slow.schema.names if name not in seen]
    columns: list[pa.Array] = []
    fields: list[pa.Field] = []
    for name in names:
        a = _column(fast_batch, name)
        b = _column(slow, name)
        if a is not None and b is not None and a[0].type == b[0].type and not a[1] and not b[1]:
            columns.append(pa.concat_arrays([a[0], b[0]]))
            fields.append(pa.field(name, a[0].type))
            continue
        texts = [_as_texts(a, fast_batch.num_rows), _as_texts(b, slow.num_rows)]
        columns.append(pa.concat_arrays(texts))
        fields.append(_TEXTS.with_name(name))
    positions = np.concatenate([fast_index, slow_index])
    order = np.argsort(positions, kind="stable")
    merged = pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))
    return merged.take(pa.array(order, pa.int64())), positions[order]


def _column(batch: pa.RecordBatch, name: str) -> tuple[pa.Array, bool] | None:
    """A column of ``batch`` and whether it holds JSON texts; None when it has none."""
    i = batch.schema.get_field_index(name)
    if i < 0:
        return None
    return batch.column(i), is_json_values(batch.schema.field(i))


def _as_texts(column: tuple[pa.Array, bool] | None, n: int) -> pa.Array:
    """A part's column as JSON texts (null: the record has no key; a missing column: no
    record has it). A typed column's values are written as JSON, a null as ``null``."""
    if column is None:
        return pa.nulls(n, pa.string())
    values, texts = column
    if texts:
        return values
    # the fields whose kinds differ between the parts only: json.dumps per value
    return pa.array([json.dumps(v) for v in values.to_pylist()], pa.string())


__all__ = ["COLUMNAR_MIN_RECORDS", "MicroBatch", "decode_micro_batch"]
