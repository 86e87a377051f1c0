"""features.pipeline.run: the loop the batch loader and the stream share, with in-memory sinks.

The sinks here are test doubles of the ``Sink`` protocol (wiring only, STYLE's
``MockTransport`` case); the stores themselves run the contract suite in
``tests/contract/test_sinks.py``. What is pinned: counts are conserved
(``read == stored + rejected + already_present``), rejects reach every sink with their
field-level errors and lineage, stored rows carry lineage, a failing sink stops the run
with its error and a re-run completes the totals, the ledger, the progress line, the
observer, empty and all-bad input, order independence and the in-flight bound.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from memory_sink import MemorySink

from features.compile import CompiledSchema
from features.config import Settings
from features.errors import SinkError
from features.kernels import TransformProgram, transform_program
from features.lineage import LINEAGE_COLUMNS, BatchLineage, RunContext
from features.observe.progress import Progress
from features.ops.examples import applicant_schema, applicants
from features.pipeline.run import run
from features.pipeline.summary import RunSummary
from features.sinks.base import REJECTED_ROWS_SCHEMA
from features.sources.base import SourceBatch
from features.sources.parquet import ParquetSource
from features.validation import validate

INGESTED = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
#: time_since (customer_tenure_days) is measured from here, so two runs compute the same
REFERENCE = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
#: what a stored row holds that depends on the run or the file rather than the input row
RUN_SPECIFIC = ("_source", "_run_id", "_ingested_at")


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return applicant_schema()


@pytest.fixture(scope="module")
def program(compiled: CompiledSchema) -> TransformProgram | None:
    return transform_program(compiled, Settings(device="cpu"))


def _ctx(compiled: CompiledSchema, run_id: str = "run-1") -> RunContext:
    return RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, run_id, INGESTED)


def _write(tmp_path: Path, table: pa.Table, name: str = "in.parquet", row_group_size: int = 1_000) -> Path:
    path = tmp_path / name
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def _sinks(compiled: CompiledSchema, **cold: Any) -> tuple[MemorySink, MemorySink]:
    """(cold, hot): the first is the primary, whose commits decide ``stored``."""
    entity, event_time = str(compiled.schema.entity), str(compiled.schema.event_time)
    return MemorySink("postgres", entity, event_time, **cold), MemorySink("redis", entity, event_time)


def _load(path: Path, compiled: CompiledSchema, sinks: list[MemorySink], *, program: Any = None,
          batch_rows: int = 128, run_id: str = "run-1", **kw: Any) -> RunSummary:
    source = ParquetSource([path], compiled, batch_rows=batch_rows)
    return run(source, compiled, sinks, ctx=_ctx(compiled, run_id), program=program,
               reference_time=REFERENCE, **kw)


def _edit(table: pa.Table, changes: dict[int, dict[str, Any]]) -> pa.Table:
    """``table`` with the given rows' values replaced (same Arrow schema)."""
    rows = table.to_pylist()
    for i, values in changes.items():
        rows[i].update(values)
    return pa.Table.from_pylist(rows, schema=table.schema)


def _reference(table: pa.Table, compiled: CompiledSchema) -> tuple[int, dict[str, int], set[tuple[Any, Any]]]:
    """(rejected rows, rejects by rule, distinct valid keys) of ``table`` validated whole."""
    result = validate(table.combine_chunks().to_batches()[0], compiled)
    entity, event_time = str(compiled.schema.entity), str(compiled.schema.event_time)
    keys = set(zip(result.valid.column(entity).to_pylist(), result.valid.column(event_time).to_pylist(),
                   strict=True))
    return result.counts.rejected_rows, dict(result.counts.by_rule), keys


def _run_lineage(row: dict[str, Any]) -> tuple[Any, ...]:
    """A stored or rejected row's lineage other than its source: schema, run, ingestion time."""
    return tuple(row[c] for c in LINEAGE_COLUMNS if c != "_source")


def _row_of(source_uri: str) -> int:
    return int(source_uri.rsplit("#", 1)[1])


# --------------------------------------------------------------------------- counts


def test_counts_add_up_and_agree_with_validating_the_whole_input(
        tmp_path: Path, compiled: CompiledSchema, program: TransformProgram | None) -> None:
    table = applicants(2_000, seed=7)
    table = pa.concat_tables([table, table.slice(0, 150)])  # 150 rows sent again: already present
    path = _write(tmp_path, table, row_group_size=700)
    cold, hot = _sinks(compiled)
    summary = _load(path, compiled, [cold, hot], program=program, batch_rows=300)
    rejected, by_rule, keys = _reference(table, compiled)
    assert rejected > 0
    assert summary.read == table.num_rows
    assert summary.rejected == rejected
    assert dict(summary.by_rule) == by_rule
    assert summary.stored == len(keys) == len(cold.keys)
    assert summary.already_present == table.num_rows - rejected - len(keys) > 0
    assert summary.adds_up
    assert summary.units == len(cold.received) == len(hot.received)
    assert summary.sinks["postgres"].written == summary.stored
    assert summary.sinks["postgres"].unchanged == summary.already_present
    assert summary.sinks["redis"].written == len(hot.keys) == len(keys)
    assert summary.as_dict()["adds_up"] is True


# --------------------------------------------------------------------------- rejects


def test_rejected_rows_reach_every_sink_with_all_their_errors_and_lineage(
        tmp_path: Path, compiled: CompiledSchema, program: TransformProgram | None) -> None:
    table = _edit(applicants(40, seed=1, invalid_share=0), {
        3: {"age": 15},
        20: {"income_monthly": Decimal("0.00"), "region": "X"},  # two errors, one reject row
        33: {"submitted_at": None},
    })
    path = _write(tmp_path, table)
    cold, hot = _sinks(compiled)
    summary = _load(path, compiled, [cold, hot], program=program, batch_rows=16)
    assert (summary.read, summary.stored, summary.rejected) == (40, 37, 3)
    assert dict(summary.by_rule) == {"age.min": 1, "income_monthly.min": 1, "region.min_length": 1,
                                     "submitted_at.not_null": 1}
    for sink in (cold, hot):
        assert all(u.rejects.schema == REJECTED_ROWS_SCHEMA for u in sink.received)
        assert [u.rejects.num_rows for u in sink.received] == [1, 1, 1]  # rows 3, 20, 33: one per batch
    rejects = {r["row_index"]: r for r in cold.rejects}
    assert sorted(rejects) == [3, 20, 33]
    uri = path.resolve().as_uri()
    ids = table.column("application_id").to_pylist()
    for i, r in rejects.items():
        assert r["_source"] == f"{uri}#{i}"
        assert json.loads(r["raw"])["application_id"] == ids[i]
        assert _run_lineage(r) == (compiled.name, "3.2.1", compiled.fingerprint, "run-1", INGESTED)
    errors = {i: json.loads(r["errors"]) for i, r in rejects.items()}
    entry_keys = {"field", "rule", "reason", "message", "value"}
    assert all(set(e) == entry_keys for es in errors.values() for e in es)
    assert [(e["field"], e["reason"], e["value"]) for e in errors[3]] == [("age", "min", "15")]
    assert [(e["rule"], e["message"]) for e in errors[20]] == [
        ("income_monthly.min", "field income_monthly violates constraint min: got 0.00, expected >= 0.01"),
        ("region.min_length", "field region violates constraint min_length: got length 1, expected >= 2"),
    ]
    assert [(e["rule"], e["value"]) for e in errors[33]] == [("submitted_at.not_null", None)]
    assert json.loads(rejects[20]["raw"])["income_monthly"] == "0.00"  # decimals as text, at scale
    stored_ids = {k[0] for k in cold.keys}
    assert stored_ids.isdisjoint({ids[3], ids[20], ids[33]}) and len(stored_ids) == 37
    assert summary.examples["income_monthly.min"] == [errors[20][0]["message"]]


def test_a_batch_of_only_bad_rows_stores_nothing_and_rejects_every_row(
        tmp_path: Path, compiled: CompiledSchema, program: TransformProgram | None) -> None:
    table = applicants(30, seed=2, invalid_share=0)
    table = table.set_column(table.schema.get_field_index("age"), table.schema.field("age"),
                             pa.array([15] * 30, pa.int16()))
    path = _write(tmp_path, table)
    cold, hot = _sinks(compiled)
    summary = _load(path, compiled, [cold, hot], program=program, batch_rows=64)
    assert (summary.read, summary.stored, summary.rejected, summary.already_present) == (30, 0, 30, 0)
    assert summary.adds_up and dict(summary.by_rule) == {"age.min": 30}
    for sink in (cold, hot):
        (unit,) = sink.received
        assert (unit.rows.num_rows, unit.rejects.num_rows, unit.read) == (0, 30, 30)
        # no rows, but still the columns a sink picks from: fields, features, lineage
        assert set(compiled.schema.field_names) | set(LINEAGE_COLUMNS) | {"income_log"} <= \
            set(unit.rows.column_names)
        assert unit.rejects.column("row_index").to_pylist() == list(range(30))
    assert cold.keys == {}


# --------------------------------------------------------------------------- lineage and transforms


def test_stored_rows_carry_their_source_row_the_run_and_the_declared_types(
        tmp_path: Path, compiled: CompiledSchema, program: TransformProgram | None) -> None:
    table = applicants(600, seed=11)  # ~2% invalid: valid rows are not the batch's 0..n-1
    path = _write(tmp_path, table, row_group_size=250)
    cold, _hot = _sinks(compiled)
    summary = _load(path, compiled, [cold], program=program, batch_rows=100, run_id="run-lineage")
    assert 0 < summary.rejected < 600
    uri = path.resolve().as_uri()
    ids = table.column("application_id").to_pylist()
    when = table.column("submitted_at").to_pylist()
    income = table.column("income_monthly").to_pylist()
    sources = [row["_source"] for row in cold.keys.values()]
    assert len(set(sources)) == len(sources) == summary.stored
    for (entity, event_time), row in cold.keys.items():
        assert row["_source"].startswith(uri + "#")
        i = _row_of(row["_source"])
        assert (ids[i], when[i]) == (entity, event_time)
        assert row["income_log"] == pytest.approx(math.log1p(float(income[i])), rel=1e-12)
        assert _run_lineage(row) == (compiled.name, "3.2.1", compiled.fingerprint, "run-lineage", INGESTED)
    declared = compiled.arrow_schema
    for unit in cold.received:
        for f in declared:
            assert unit.rows.schema.field(f.name).type == f.type, f.name  # exact: no silent cast
        assert unit.rows.schema.field("income_log").type == pa.float64()


def test_shuffled_input_stores_the_same_rows_and_rejects(
        tmp_path: Path, compiled: CompiledSchema, program: TransformProgram | None) -> None:
    table = applicants(900, seed=13)
    table = pa.concat_tables([table, table.slice(100, 50)])  # exact duplicates: same bytes again
    shuffled = table.take(pa.array(np.random.default_rng(3).permutation(table.num_rows)))
    results = []
    for name, t in (("a.parquet", table), ("b.parquet", shuffled)):
        cold, _hot = _sinks(compiled)
        summary = _load(_write(tmp_path, t, name, row_group_size=400), compiled, [cold], program=program,
                        batch_rows=170)
        stored = sorted((tuple(sorted((k, v) for k, v in row.items() if k not in RUN_SPECIFIC))
                         for row in cold.keys.values()), key=repr)
        rejected = sorted((json.loads(r["raw"])["application_id"], r["errors"]) for r in cold.rejects)
        results.append(((summary.read, summary.stored, summary.rejected, summary.already_present),
                        dict(summary.by_rule), stored, rejected))
    assert results[0][2] and results[0][3]
    assert results[0] == results[1]


# --------------------------------------------------------------------------- sink failure, ledger


def test_a_failing_sink_stops_the_run_with_its_error_and_a_rerun_completes_the_totals(
        tmp_path: Path, compiled: CompiledSchema) -> None:
    table = applicants(1_000, seed=17)
    path = _write(tmp_path, table, row_group_size=250)
    cold, hot = _sinks(compiled, fail_on=2)
    hot.delay_s = 0.05  # still writing when the primary's error comes back
    with pytest.raises(SinkError, match="write 2 failed") as info:
        _load(path, compiled, [cold, hot], batch_rows=125)
    assert info.value.store == "memory"
    assert hot.active == 0 and cold.active == 0  # the run returned only after started writes ended
    assert len(cold.received) < 8  # it stopped: not every unit was handed on
    before = len(cold.keys)
    cold.fail_on = None
    hot.delay_s = 0.0
    again = _load(path, compiled, [cold, hot], batch_rows=125, run_id="run-2")
    rejected, _by_rule, keys = _reference(table, compiled)
    assert set(cold.keys) == set(hot.keys) == keys  # nothing lost, nothing twice
    assert again.adds_up and again.read == 1_000
    assert again.stored == len(keys) - before  # only what the failed run had not committed
    assert again.skipped_units >= 1 and again.already_present >= 125
    assert again.rejected + again.already_present + again.stored == 1_000
    assert rejected > 0


def test_the_primary_decides_stored_while_another_sink_catches_up(
        tmp_path: Path, compiled: CompiledSchema) -> None:
    path = _write(tmp_path, applicants(500, seed=19), row_group_size=250)
    cold, hot = _sinks(compiled)
    first = _load(path, compiled, [cold, hot])
    entity, event_time = cold.cols
    fresh_hot = MemorySink("redis", entity, event_time)  # a hot store emptied since
    calls = len(cold.received)
    second = _load(path, compiled, [cold, fresh_hot], run_id="run-2")
    assert len(cold.received) == calls  # the primary is not asked to write committed units
    assert (second.read, second.stored, second.rejected, second.already_present) == (500, 0, 0, 500)
    assert second.skipped_units == second.units == first.units
    assert second.sinks["postgres"].skipped_units == second.units
    assert second.sinks["redis"].written == first.stored == len(fresh_hot.keys)
    assert second.adds_up


def test_observer_sees_every_batch_of_valid_rows_in_order_committed_units_included(
        tmp_path: Path, compiled: CompiledSchema) -> None:
    table = applicants(400, seed=23)
    path = _write(tmp_path, table, row_group_size=150)
    cold, hot = _sinks(compiled)
    seen: list[list[list[str]]] = [[], []]
    for i in range(2):  # the second run: every unit committed in both sinks
        _load(path, compiled, [cold, hot], batch_rows=60,
              observer=lambda rows, i=i: seen[i].append(rows.column("application_id").to_pylist()))
    assert len(cold.received) == len(hot.received) == len(seen[0])  # no write in the second run
    assert seen[0] == seen[1]
    valid = validate(table.combine_chunks().to_batches()[0], compiled).valid
    assert [x for batch in seen[0] for x in batch] == valid.column("application_id").to_pylist()


# --------------------------------------------------------------------------- empty input


class _Terminal:
    """A stderr that says it is a terminal and keeps what is written."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass


def test_empty_input_runs_to_a_zero_summary(tmp_path: Path, compiled: CompiledSchema,
                                            program: TransformProgram | None) -> None:
    path = _write(tmp_path, applicants(0))
    cold, hot = _sinks(compiled)
    terminal = _Terminal()
    summary = _load(path, compiled, [cold, hot], program=program,
                    progress=Progress(0, enabled=True, stream=terminal))
    assert (summary.read, summary.stored, summary.rejected, summary.already_present) == (0, 0, 0, 0)
    assert summary.adds_up
    assert sum(u.rows.num_rows + u.rejects.num_rows for s in (cold, hot) for u in s.received) == 0
    assert terminal.text.rstrip().rsplit("\r", 1)[-1].startswith(f"{compiled.name}: 0 rows")


def test_an_empty_batch_is_a_unit_of_nothing(tmp_path: Path, compiled: CompiledSchema,
                                             program: TransformProgram | None) -> None:
    path = _write(tmp_path, applicants(5, seed=29, invalid_share=0))
    source = ParquetSource([path], compiled)
    (sb,) = source.batches()
    empty = SourceBatch(sb.batch.slice(0, 0), BatchLineage(sb.lineage.prefix, 0, 0, "empty-unit"))
    cold, hot = _sinks(compiled)
    summary = run(source, compiled, [cold, hot], ctx=_ctx(compiled), program=program,
                  reference_time=REFERENCE, batches=[empty, sb])
    assert (summary.read, summary.stored, summary.units) == (5, 5, 2) and summary.adds_up
    for sink in (cold, hot):
        first = sink.received[0]
        assert (first.unit, first.read, first.rows.num_rows, first.rejects.num_rows) == \
            ("empty-unit", 0, 0, 0)
        assert first.rejects.schema == REJECTED_ROWS_SCHEMA
    assert "empty-unit" in cold.committed_units()


# --------------------------------------------------------------------------- progress, order, in flight


def test_progress_line_ends_with_the_run_s_final_counts(tmp_path: Path, compiled: CompiledSchema) -> None:
    table = applicants(1_200, seed=31)
    path = _write(tmp_path, table, row_group_size=500)
    terminal = _Terminal()
    progress = Progress(table.num_rows, enabled=True, stream=terminal)
    cold, hot = _sinks(compiled)
    summary = _load(path, compiled, [cold, hot], batch_rows=200, progress=progress)
    assert terminal.text.endswith("\n")
    last = terminal.text.rstrip().rsplit("\r", 1)[-1]
    assert last.startswith(f"{compiled.name}: 1,200/1,200 (100%) rows")
    assert f"rejected {summary.rejected:,}" in last and f"stored {summary.stored:,}" in last
    assert summary.rejected > 0


def test_units_reach_each_sink_in_source_order_and_in_flight_bounds_what_is_read_ahead(
        tmp_path: Path, compiled: CompiledSchema) -> None:
    path = _write(tmp_path, applicants(1_000, seed=37), row_group_size=1_000)
    source = ParquetSource([path], compiled, batch_rows=100)
    order = [sb.lineage.unit for sb in source.batches()]
    pulled = 0

    def counted() -> Iterator[SourceBatch]:
        nonlocal pulled
        for sb in source.batches():
            pulled += 1
            yield sb

    gate = threading.Event()
    cold, hot = _sinks(compiled, gate=gate)
    outcome: list[RunSummary] = []
    worker = threading.Thread(target=lambda: outcome.append(run(
        source, compiled, [cold, hot], ctx=_ctx(compiled), batches=counted(), in_flight=3)))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while pulled < 3 + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # time enough to read far ahead, were nothing bounding it
        assert pulled == 3 + 1  # three units waiting on the hung store, a fourth prepared
    finally:
        gate.set()
        worker.join(30)
    assert not worker.is_alive() and outcome[0].adds_up and pulled == 10
    assert [u.unit for u in cold.received] == [u.unit for u in hot.received] == order
