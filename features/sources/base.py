"""Sources yield Arrow batches with their lineage; they know nothing of sinks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features.lineage import BatchLineage

#: rows of a batch (positions) -> their input as JSON text, one per row
RawRows = Callable[[npt.NDArray[np.int64]], list[str]]


@dataclass(frozen=True)
class SourceBatch:
    """One batch of input rows (column names as in the source: a field's ``source:`` name,
    renamed to the field's by :func:`features.sources.names.as_fields` before validation)
    and where it came from.

    ``batch`` is an Arrow record batch: read from files, or decoded from JSON records
    (:mod:`features.sources.records`, :mod:`features.sources.columnar`; a value of the
    wrong JSON kind is that row's field-level reject, never a batch failure).
    """

    batch: pa.RecordBatch
    lineage: BatchLineage
    #: how a rejected row's input is kept (the rejects' ``raw``): None renders the
    #: batch's own values; a batch read from other bytes (JSON records, read columnar
    #: into read types) renders those bytes
    raw: RawRows | None = None
    #: the rows are JSON records (:mod:`features.sources.records`,
    #: :mod:`features.sources.columnar`): ISO text is what a date or timestamp is there,
    #: and a field's absent input is a key, not a column
    json_text: bool = False


@runtime_checkable
class Source(Protocol):
    """Something that yields batches. ``total_rows`` is None when unknown (streams)."""

    name: str

    def batches(self) -> Iterator[SourceBatch]: ...

    @property
    def total_rows(self) -> int | None: ...
