"""Sources yield Arrow batches with their lineage; they know nothing of sinks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from features.lineage import BatchLineage


@dataclass(frozen=True)
class SourceBatch:
    """One batch of input rows (column names as in the source: a field's ``source:`` name,
    renamed to the field's by :func:`features.sources.names.as_fields` before validation)
    and where it came from.

    ``batch`` is an Arrow record batch (files), or decoded JSON objects (streams: each
    record keeps its own Python types, so a wrong type is a per-row reject).
    """

    batch: pa.RecordBatch | list[dict[str, Any]]
    lineage: BatchLineage


@runtime_checkable
class Source(Protocol):
    """Something that yields batches. ``total_rows`` is None when unknown (streams)."""

    name: str

    def batches(self) -> Iterator[SourceBatch]: ...

    @property
    def total_rows(self) -> int | None: ...
