"""Decoded JSON objects as one Arrow record batch, each value keeping its JSON kind.

A stream record or an HTTP ingest record is decoded with ``json.loads`` one at a time
(``features.sources.records``), so one field may hold an integer in one record, text
in the next and no key at all in a third. Each of those is a field-level verdict (a
``type`` reject showing that value, a ``missing`` reject), never a batch failure.
:func:`objects_batch` keeps that in an Arrow batch the validator reads like any other:

- a field whose values are all of one JSON scalar kind (or null), with the key in every
  record, is one typed Arrow column (``pa.array``: int64, float64, string, bool or
  null): the validator converts it as it converts a Parquet column, vectorised;
- any other field (kinds mixed, arrays or objects, an integer beyond int64, a key absent
  from some records) is a string column of each value's JSON text (``json.dumps``, which
  ``json.loads`` reads back to the same value: integers of any size, NaN and
  infinities, lone surrogates as escapes) with null where the record has no key, tagged
  by :data:`JSON_VALUES` in the field's metadata. :func:`json_values` reads it back to
  the Python values, and the validator converts those part by part by Python type
  (``features.validation.convert.convert_pylist``), exactly as it converts a list of
  dicts;
- a key no record holds is no column (a missing column: ``missing`` rejects saying
  ``got no key`` for a required field).

The batch's columns keep the records' keys (a field's ``source:`` name); a key the
caller does not ask for is not read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features.validation.convert import ABSENT

#: the field metadata key of a column of JSON texts (:func:`objects_batch`)
JSON_VALUES = b"featureline.json_values"
_TAG = {JSON_VALUES: b"1"}
#: the Python types ``pa.array`` converts into one typed column, as JSON scalars
_SCALARS = frozenset({type(None), int, float, str, bool})


def objects_batch(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> pa.RecordBatch:
    """One record batch of ``rows`` (decoded JSON objects), a column per key of ``keys``
    that some row holds (see the module docstring). One pass over the rows per key."""
    columns: list[pa.Array] = []
    fields: list[pa.Field] = []
    for key in keys:
        values = [row.get(key, ABSENT) for row in rows]
        kinds = {type(v) for v in values}
        if kinds == {type(ABSENT)}:
            continue
        if kinds <= _SCALARS and len(kinds - {type(None)}) <= 1:
            try:
                arr = pa.array(values)
            except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError):
                pass  # an integer beyond int64: kept as JSON text below
            else:
                columns.append(arr)
                fields.append(pa.field(key, arr.type))
                continue
        columns.append(pa.array([None if v is ABSENT else json.dumps(v) for v in values], pa.string()))
        fields.append(pa.field(key, pa.string(), metadata=_TAG))
    if not columns:  # no key of ``keys`` in any row: the rows, with no column
        return pa.RecordBatch.from_struct_array(pa.array([{}] * len(rows), pa.struct([])))
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


def is_json_values(field: pa.Field) -> bool:
    """Whether ``field`` is a column of JSON texts made by :func:`objects_batch`."""
    return bool(field.metadata) and field.metadata.get(JSON_VALUES) == b"1" and field.type == pa.string()


def json_values(column: pa.Array) -> tuple[list[Any], npt.NDArray[np.int64]]:
    """A column of :func:`objects_batch`'s JSON texts -> its Python values (None where
    the record had no key) and the rows without the key."""
    texts = column.to_pylist()
    absent = np.flatnonzero(np.fromiter((t is None for t in texts), np.bool_, len(texts))).astype(np.int64)
    return [None if t is None else json.loads(t) for t in texts], absent


__all__ = ["JSON_VALUES", "is_json_values", "json_values", "objects_batch"]
