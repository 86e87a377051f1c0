"""Writing from Python: a pandas DataFrame or an Arrow table into both stores.

``FeatureStore.write(schema, data, run_id=..., source=...)`` runs the batch loader's own
core (:func:`features.pipeline.run.load_source`) over the table: the same column checks
as a Parquet file (a column that could never convert refuses the whole table), the
compiled rules, the transform program, Postgres (history, rejects with every
field-level error, the commit ledger) and Redis (newest event per entity), then the
schema's windowed aggregations over the entity histories. Counts add up as a load's do:
``rows == stored + rejected + already_present``.

Lineage names the caller's run: every row's ``_run_id`` is ``run_id`` (a fresh one when
None, returned in the summary), its ``_source`` ``python://<run id>#<row>``
(``python://<run id>/<source>#<row>`` with ``source``; :func:`features.lineage.python_prefix`).

Idempotent like a file: the table is cut into batches of
:data:`~features.sources.parquet.DEFAULT_BATCH_ROWS` rows whose ledger units are named
by the lineage prefix and a digest of the table's content
(``python://<run id>@<sha256[:16]>/b<j>x<rows>``), so writing the same rows again with
the same run id skips every unit the stores committed (Postgres and Redis keep their own
ledgers: after a failure, the same call finishes what one store lacks). Under another
run id or ``source`` (a retry without a run id gets a fresh one) the valid rows are
already present in the history, and so are the rejects: each unit carries its content
without the run (``@<sha256[:16]>/b<j>x<rows>``, ``BatchLineage.content``), and Postgres
stores no rejects for a unit whose content its ledger holds (they are stored under the
first run's ``_source``): one table's rejects are stored once, counted
``already_present`` by the later writes. One run id (and ``source``) names one table:
writing other rows under a prefix that already wrote a table is refused (their reject
rows would share ``_source`` URIs), so a pipeline that writes several tables in one run
names each with ``source``.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.compile.postgres import quote_ident, rejects_table_name
from features.config import resolve_settings
from features.errors import ConfigError, FeaturesError, SinkUnavailable, SourceError
from features.lineage import SOURCE, BatchLineage, new_run_id, python_prefix
from features.pipeline.run import load_source
from features.sinks import pg
from features.sinks.postgres import LEDGER_TABLE
from features.sources.base import SourceBatch
from features.sources.parquet import DEFAULT_BATCH_ROWS, ExtraColumnsWarning, refusal

if TYPE_CHECKING:
    from features.pipeline.summary import RunSummary


class FeatureStore(Protocol):
    """What a write needs of :class:`features.sdk.store.FeatureStore` (a protocol: this
    part does not import the facade that calls it)."""

    redis_url: str
    postgres_dsn: str
    search_path: str | None
    key_prefix: str
    timeout_s: float

    def loadable_schema(self, name: str) -> CompiledSchema: ...

#: How many rejected rows a :class:`WriteSummary` carries (all of them are in the rejects table).
SAMPLE_ROWS = 10


@dataclass(frozen=True)
class RejectedRow:
    """One rejected row of the table written, as the rejects table holds it: ``row`` its
    0-based row in the table, ``source`` its ``_source``, ``errors`` every failed rule
    (``field``, ``rule``, ``reason``, ``message``, ``value``)."""

    row: int
    source: str
    errors: tuple[dict[str, Any], ...]

    @property
    def messages(self) -> list[str]:
        """The field-level messages, e.g. ``field income_monthly violates constraint min: ...``."""
        return [str(e.get("message")) for e in self.errors]


@dataclass(frozen=True)
class WriteSummary:
    """What one :func:`write` did. ``rows == stored + rejected + already_present``
    (``rejected``: the rejects this write stored, under its run id; ``already_present``:
    valid rows the cold store held, rejected rows whose rejects were stored already (the
    same table written under another run id), every row of a unit already committed: the
    whole table when the same rows are written again with the same run id).
    ``rejects``: the first :data:`SAMPLE_ROWS` rejected rows with their field-level errors,
    read back from the rejects table (``rejects_table``) where every one of them is."""

    run_id: str
    schema: str
    source: str
    rows: int
    stored: int
    rejected: int
    already_present: int
    rejects: tuple[RejectedRow, ...]
    rejects_table: str
    seconds: float
    #: the windowed aggregations' counts (as ``RunSummary.aggregations``), None without any
    aggregations: dict[str, Any] | None = None
    #: the loader's own summary of the run (per-store counts, reject reasons)
    run: RunSummary | None = field(default=None, repr=False, compare=False)

    @property
    def adds_up(self) -> bool:
        agg_ok = self.aggregations is None or bool(self.aggregations.get("adds_up"))
        return self.rows == self.stored + self.rejected + self.already_present and agg_ok


class _TableSource:
    """The batches of one in-memory table, with ``python://`` lineage and ledger units."""

    name = "python"

    def __init__(self, table: pa.Table, prefix: str, digest: str,
                 batch_rows: int = DEFAULT_BATCH_ROWS) -> None:
        self.table = table
        self.prefix = prefix
        self.digest = digest
        self.batch_rows = batch_rows

    @property
    def total_rows(self) -> int:
        return int(self.table.num_rows)

    def unit_prefix(self) -> str:
        return f"{self.prefix}@{self.digest}/"

    def batches(self) -> Iterator[SourceBatch]:
        for j, batch in enumerate(slices(self.table, self.batch_rows)):
            content = f"@{self.digest}/b{j}x{self.batch_rows}"  # the unit without the run's prefix
            yield SourceBatch(batch, BatchLineage(self.prefix, j * self.batch_rows, batch.num_rows,
                                                  self.prefix + content, content=content))


def slices(table: pa.Table, rows: int) -> Iterator[pa.RecordBatch]:
    """``table`` as record batches of ``rows`` rows (the last one shorter): the same
    batches for the same rows however the table is chunked."""
    for start in range(0, table.num_rows, rows):
        # one chunk per column: one batch (zero-copy when the slice lies in one chunk)
        yield table.slice(start, rows).combine_chunks().to_batches()[0]


def as_table(data: Any) -> pa.Table:
    """``data`` (an Arrow table or record batch, a pandas DataFrame) as an Arrow table;
    SourceError when pandas cannot convert a column, ConfigError for anything else."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pd.DataFrame):
        try:
            return pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise SourceError(f"the DataFrame does not convert to Arrow: {exc}") from exc
    raise ConfigError(f"write takes a pyarrow.Table, a pyarrow.RecordBatch or a pandas DataFrame, "
                      f"got {type(data).__name__}", key="data")


def _check_name(value: str, what: str) -> None:
    if not value or "#" in value or "@" in value or any(c.isspace() for c in value):
        raise ConfigError(f"{what} {value!r}: expected a non-empty name without '#', '@' or spaces "
                          "(it is part of every row's _source URI)", key=what)


def _columns(table: pa.Table, compiled: CompiledSchema, where: str) -> pa.Table:
    """The schema's columns of ``table`` (the loader's column checks: a column that could
    never convert refuses the table; extra columns are ignored with a warning)."""
    refused = refusal(where, table.schema, compiled)
    if refused is not None:
        raise refused
    declared = set(compiled.schema.input_names)
    extra = [n for n in table.column_names if n not in declared]
    if extra:
        warnings.warn(f"{where}: ignoring column(s) not in schema {compiled.name!r}: {', '.join(extra)}",
                      ExtraColumnsWarning, stacklevel=4)
    return table.select([n for n in table.column_names if n in declared])


def digest(table: pa.Table, rows: int = DEFAULT_BATCH_ROWS) -> str:
    """sha256[:16] of the table's column names, types and values: the same rows give the
    same digest however the table is chunked or sliced (Arrow IPC alone does not: a slice
    serialises with its parent's buffers). Per :func:`slices` and column: the validity bits,
    then the IPC message of the valid values copied into fresh buffers. One slice in
    memory at a time."""
    h = hashlib.sha256(memoryview(table.schema.remove_metadata().serialize()))
    for batch in slices(table, rows):
        for column in batch.columns:
            valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
            values = column.take(pa.array(np.flatnonzero(valid), pa.int64()))
            h.update(np.packbits(valid).tobytes())
            h.update(memoryview(pa.record_batch([values], ["v"]).serialize()))
    return h.hexdigest()[:16]


class _Rejected:
    """Observer of the valid rows of every batch: which rows of the table were valid."""

    def __init__(self, rows: int, prefix: str) -> None:
        self.valid = np.zeros(rows, dtype=bool)
        self.start = len(prefix) + 1  # "<prefix>#"

    def __call__(self, rows: pa.Table) -> None:
        if rows.num_rows:
            numbers = pc.utf8_slice_codeunits(rows.column(SOURCE), self.start).cast(pa.int64())
            self.valid[numbers.to_numpy()] = True

    def first(self, n: int) -> npt.NDArray[np.int64]:
        return np.flatnonzero(~self.valid)[:n].astype(np.int64)


def _earlier(fs: FeatureStore, compiled: CompiledSchema, run_id: str, prefix: str, unit_prefix: str
             ) -> tuple[bool, bool]:
    """What the ledger holds of run ``run_id`` besides this table's units (``unit_prefix``):
    (another table under ``prefix``, any other unit of the run)."""
    mark = prefix + "@"
    with pg.map_psycopg_errors(fs.postgres_dsn, "the ledger read"), \
            pg.connect(fs.postgres_dsn, search_path=fs.search_path, timeout_s=fs.timeout_s) as conn:
        if conn.execute("SELECT to_regclass(%s) IS NULL", (LEDGER_TABLE,)).fetchone() == (True,):
            return False, False
        row = conn.execute(
            "SELECT coalesce(bool_or(left(unit, %s) = %s AND left(unit, %s) <> %s), false), "
            f"coalesce(bool_or(left(unit, %s) <> %s), false) FROM {quote_ident(LEDGER_TABLE)} "
            "WHERE schema_name = %s AND fingerprint = %s AND run_id = %s",
            (len(mark), mark, len(unit_prefix), unit_prefix, len(unit_prefix), unit_prefix,
             compiled.name, compiled.fingerprint, run_id)).fetchone()
    assert row is not None  # an aggregate without GROUP BY: always one row
    return bool(row[0]), bool(row[1])


def _sample(fs: FeatureStore, compiled: CompiledSchema, prefix: str,
            rows: npt.NDArray[np.int64]) -> tuple[RejectedRow, ...]:
    """The rejects table's rows of ``rows`` (their ``_source`` URIs: the unique key)."""
    if rows.size == 0:
        return ()

    uris = [f"{prefix}#{int(r)}" for r in rows]  # at most SAMPLE_ROWS
    with pg.map_psycopg_errors(fs.postgres_dsn, "the rejects read"), \
            pg.connect(fs.postgres_dsn, search_path=fs.search_path, timeout_s=fs.timeout_s) as conn:
        found = conn.execute(
            f"SELECT row_index, _source, errors FROM {quote_ident(rejects_table_name(compiled.schema))} "
            "WHERE _source = ANY(%s) AND _schema_fingerprint = %s ORDER BY row_index",
            (uris, compiled.fingerprint)).fetchall()
    return tuple(RejectedRow(int(r[0]), str(r[1]), tuple(r[2])) for r in found)


def write(fs: FeatureStore, schema: str, data: Any, *, run_id: str | None = None,
          source: str | None = None) -> WriteSummary:
    """Write ``data`` (a pandas DataFrame, an Arrow table or record batch) into ``fs``'s
    stores with the schema's rules, transforms and aggregations (see the module docstring).

    Raises SourceError before writing anything when a column can never convert (or is a
    missing required one), ConfigError for a bad ``run_id``/``source``, for data of
    another kind, or for other rows under a run id (and source) that already wrote a
    table; SinkUnavailable when a store is unreachable at start (nothing is written) or
    stays unreachable during the write: its message names the run id to write the same
    table again with, which finishes the write exactly; SinkError as the loader raises it
    (e.g. the stores hold another version of the schema).
    """
    t0 = time.perf_counter()
    compiled = fs.loadable_schema(schema)
    run_id = run_id if run_id is not None else new_run_id()
    _check_name(run_id, "run_id")
    if source is not None:
        _check_name(source, "source")
    prefix = python_prefix(run_id, source)
    table = _columns(as_table(data), compiled, prefix)
    src = _TableSource(table, prefix, digest(table))
    other_table, other_units = _earlier(fs, compiled, run_id, prefix, src.unit_prefix())
    if other_table:
        raise ConfigError(f"run {run_id!r} already wrote other rows to {compiled.name!r} as {prefix}: "
                          "name this table with source=... or write it under a new run id", key="run_id")
    # The stores are this FeatureStore's; the device and the rest as the loader resolves them.
    settings = resolve_settings(redis_url=fs.redis_url, postgres_dsn=fs.postgres_dsn)
    seen = _Rejected(table.num_rows, prefix)
    try:
        summary = load_source(src, compiled, settings, search_path=fs.search_path, key_prefix=fs.key_prefix,
                              run_id=run_id, started={"source": prefix}, observer=seen,
                              read_own=other_units)
    except SinkUnavailable as exc:  # transient: the same call again finishes the write
        again = f"run_id={run_id!r}" + ("" if source is None else f", source={source!r}")
        raise SinkUnavailable(f"write of {table.num_rows:,} rows to {compiled.name} (run {run_id}) stopped: "
                              f"{exc}. What the stores committed stays; write the same table again with "
                              f"{again} to finish it exactly", store=exc.store, address=exc.address) from exc
    try:
        sample = _sample(fs, compiled, prefix, seen.first(SAMPLE_ROWS)) if summary.rejected else ()
    except FeaturesError:  # the rows are written and counted; the sample is a convenience
        sample = ()
    return WriteSummary(run_id=run_id, schema=compiled.name, source=prefix, rows=summary.read,
                        stored=summary.stored, rejected=summary.rejected,
                        already_present=summary.already_present, rejects=sample,
                        rejects_table=rejects_table_name(compiled.schema), seconds=time.perf_counter() - t0,
                        aggregations=summary.aggregations, run=summary)


__all__ = ["SAMPLE_ROWS", "RejectedRow", "WriteSummary", "as_table", "digest", "write"]
