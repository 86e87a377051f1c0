"""Input names -> field names: the one place a field's ``source:`` is applied to data.

A field is read from the input column (Parquet) or JSON key (Kafka, HTTP) named
``Field.input_name``: its ``source:`` when the schema gives one (``Dep Delay``,
``depDelay``), else its own name. Sources and decoders keep the input's names, so a
reject's ``raw`` shows the row as it came; :func:`as_fields` renames the data once,
before validation, and from there on (the validator, the transforms, the stores, the
SDK, the reports) a field is only ever known by its name.

``as_fields`` is the identity when no field has a ``source`` (no copy, no cost). With
one, it keeps each field's input column (or key) under the field's name and drops the
rest: the input's other names are never read, including a column or key spelled like
a field that reads another one (``dep_delay`` when ``dep_delay`` reads ``Dep Delay``);
the decoders count such keys in ``unknown_fields``.
"""

from __future__ import annotations

from typing import TypeVar

import pyarrow as pa

from features.errors import SourceError
from features.schema.model import Schema

#: a ``pa.RecordBatch`` or a ``pa.Table``
Data = TypeVar("Data", pa.RecordBatch, pa.Table)


def as_fields(data: Data, schema: Schema) -> Data:
    """``data`` (an Arrow batch or table; decoded JSON objects are one too, a column per
    key) with its columns renamed from input names to field names (see the module
    docstring). The row count never changes. Raises SourceError when the input holds
    several columns of one field's input name."""
    if not schema.renames_input:
        return data
    indices: list[int] = []
    names: list[str] = []
    for f in schema.fields:
        found = data.schema.get_all_field_indices(f.input_name)
        if len(found) > 1:
            raise SourceError(f"input has several columns named {f.input_name!r} (the input of field "
                              f"{f.name!r})", field=f.name)
        if found:
            indices.append(found[0])
            names.append(f.name)
    return data.select(indices).rename_columns(names)


__all__ = ["as_fields"]
