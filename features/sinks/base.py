"""Sinks write one unit of work (stored rows + rejects) to one store.

A *unit* is what the runner hands a sink for one source batch: the rows to store (in
the declared Arrow types plus lineage columns), the rejected rows (raw payload,
errors, lineage), and, for sources with stable batches (files), a ledger key. A sink
that keeps a commit ledger records the key in the same transaction as the rows, so a
re-run skips what is already stored; without a key (streams) it writes idempotently
(keyed upserts), so a replay changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt
import pyarrow as pa

# the rejects table's rows (compile/rejects.py): imported from here too
from features.compile.rejects import REJECTED_ROWS_SCHEMA as REJECTED_ROWS_SCHEMA
from features.errors import SinkUnavailable
from features.kernels.digest import digests
from features.lineage import DIGEST
from features.schema.model import Schema

T = TypeVar("T")


def retrying(fn: Callable[[], T], *, attempts: int, backoff_s: float,
             transient: tuple[type[BaseException], ...], reset: Callable[[], None],
             give_up: Callable[[BaseException, int], SinkUnavailable]) -> T:
    """``fn()``, tried up to ``attempts`` times: after a ``transient`` error ``reset()``
    (drop the connection; ``fn`` reconnects), wait ``backoff_s`` (doubling each time) and
    try again; the last failure raises ``give_up(error, attempts)``. The sinks' one retry
    loop: a store restarting under a load costs a pause, not the run."""
    delay = backoff_s
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except transient as exc:
            reset()
            if attempt == attempts:
                raise give_up(exc, attempt) from exc
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class WriteUnit:
    """What one sink write receives.

    - ``rows``: valid, transformed rows: entity, event time, fields, features and
      lineage columns (each sink picks the columns it stores);
    - ``rejects``: one row per rejected input row (:data:`REJECTED_ROWS_SCHEMA`);
    - ``unit``: ledger key, or None for idempotent (stream) writes;
    - ``read``: how many input rows the unit covers (for the ledger's counts);
    - ``content``: with a ``unit``, what names its input regardless of the run
      (``BatchLineage.content``), when the rejects' ``_source`` names the run: a store
      that committed a unit of that content holds these rejects already;
    - ``counted``: without a ``unit``, the kind of run (``stream``) whose per-run counts
      a store that keeps them (Postgres' ``featureline_run_counts``) adds this unit's to,
      in the unit's own transaction; None (the default): not counted (a rollback's or an
      upgrade's rewrite, the SDK fallback's fill, an aggregation row).
    """

    rows: pa.Table
    rejects: pa.Table
    unit: str | None
    read: int
    content: str | None = None
    counted: str | None = None


@dataclass(frozen=True)
class WriteResult:
    """``stored``: rows newly written; ``already_present``: rows the store already held
    (same key), left as they were; ``skipped``: True when the ledger said the unit was
    already committed and nothing was written. ``rejects_stored``:
    rejects newly written; ``rejects_held`` (a store that keeps rejects): the positions in
    ``WriteUnit.rejects`` of those it already held (an earlier run read those input
    records), which the run counts as already present; None: none held."""

    stored: int = 0
    already_present: int = 0
    rejects_stored: int = 0
    skipped: bool = False
    seconds: float = 0.0
    rejects_held: npt.NDArray[np.int64] | None = None


@runtime_checkable
class Sink(Protocol):
    """A store. ``open`` checks it is reachable and compatible (raising SinkUnavailable /
    SinkError before anything is written); ``write`` writes one unit; ``close`` frees it."""

    name: str

    def open(self) -> None: ...

    def committed_units(self) -> set[str]: ...

    def write(self, unit: WriteUnit) -> WriteResult: ...

    def close(self) -> None: ...


def with_digest(rows: pa.Table, schema: Schema) -> pa.Table:
    """``rows`` with its ``_digest`` column (``features.kernels.digest``): as it is when
    present (the pipeline's ``process_batch`` computes it), else computed from the rows'
    declared fields (a unit written without the pipeline). Rows lacking a declared field
    come back as they are."""
    if DIGEST in rows.column_names or any(f.name not in rows.column_names for f in schema.fields):
        return rows
    return rows.append_column(DIGEST, digests(rows, schema))


# --- Arrow helpers for the sinks' wire formats ---------------------------------------


def binary_rows(block: npt.NDArray[Any]) -> pa.Array:
    """Each row of ``block`` (NumPy records, or an ``(n, width)`` array) as one binary
    value: fixed-width headers and fields made ready for a binary join."""
    block = np.ascontiguousarray(block)
    width = block.dtype.itemsize * int(np.prod(block.shape[1:], dtype=np.int64))
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(block), [None, pa.py_buffer(block)])
    return fixed.cast(pa.binary())


def laid_end_to_end(arr: pa.Array) -> memoryview:
    """The bytes of a null-free string or binary array laid end to end (no copy)."""
    width: np.dtype[Any] = np.dtype(np.int32)
    if not (pa.types.is_string(arr.type) or pa.types.is_binary(arr.type)):
        arr = arr.cast(pa.large_binary()) if not pa.types.is_large_binary(arr.type) else arr
        width = np.dtype(np.int64)
    offsets = np.frombuffer(arr.buffers()[1], dtype=width)[arr.offset: arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    if len(offsets) == 0 or data is None:
        return memoryview(b"")
    return memoryview(data)[int(offsets[0]):int(offsets[-1])]
