"""One suite every Source runs, as ``test_sinks.py`` is for the sinks: no fakes.

The Source protocol (``features/sources/base.py``) promises batches of input rows, each
with its lineage: per-row source URIs (``file:///abs/path#row``), source row numbers
and, for sources with stable batches, a ledger unit that names the batch the same way
on every read of the same bytes. The contract pinned here:

- every input row comes out exactly once, with its values, across all batches;
- batches are Arrow record batches (a stream's may be decoded JSON objects) holding the
  declared columns only, in the types the input has them;
- row URIs and ledger units are unique, and the same on a second read (a second
  ``batches()`` call, or a fresh source over the same input);
- a unit changes when the bytes or the batch size change (the ledger never skips a batch
  it did not store);
- no batch holds more than ``batch_rows`` rows; empty input yields no rows;
- a missing, unreadable or incompatible input is a ``SourceError`` naming it, raised
  before anything is read.

``features/sources/`` has one implementation, :class:`ParquetSource`, run here the four
ways it is addressed (file paths, a folder, a folder URI, a glob). Kafka is read by the
PyFlink job and handed to ``StreamProcessor`` record by record, not through a Source;
a Kafka Source joins ``KINDS`` (with the ``kafka_topic`` fixture, marked ``services``)
when there is one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.compile import CompiledSchema
from features.errors import SourceError
from features.ops.examples import applicant_schema, applicants
from features.sources.base import Source, SourceBatch
from features.sources.parquet import ExtraColumnsWarning, ParquetSource

#: kind -> make(root, names, compiled, batch_rows): a source over the files ``names``
#: (relative to ``root``, which holds no others)
MakeSource = Callable[[Path, Sequence[str], CompiledSchema, int], Source]
KINDS: dict[str, MakeSource] = {
    "parquet-paths": lambda root, names, c, n: ParquetSource([root / x for x in names], c, batch_rows=n),
    "parquet-folder": lambda root, _names, c, n: ParquetSource([root], c, batch_rows=n),
    "parquet-folder-uri": lambda root, _names, c, n: ParquetSource([root.as_uri() + "/"], c, batch_rows=n),
    "parquet-glob": lambda root, _names, c, n: ParquetSource([str(root / "**" / "*.parquet")], c,
                                                             batch_rows=n),
}


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return applicant_schema()


@pytest.fixture(params=sorted(KINDS))
def make(request: pytest.FixtureRequest) -> MakeSource:
    return KINDS[str(request.param)]


#: the default input: two files, one in a sub-folder, several row groups each
INPUT = {"a.parquet": (applicants(700, seed=1), 300),
         "sub/b.parquet": (applicants(250, seed=2, first_id=2 * 10**9), 100)}


def _put(root: Path, files: dict[str, tuple[pa.Table, int]]) -> list[str]:
    """Write each table (with its row group size) under ``root``; returns the names."""
    for name, (table, row_group_size) in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, root / name, row_group_size=row_group_size)
    return list(files)


def _expected(root: Path, files: dict[str, tuple[pa.Table, int]]) -> dict[str, dict[str, Any]]:
    """Row URI -> the row's values, for every row of the input."""
    out: dict[str, dict[str, Any]] = {}
    for name, (table, _) in files.items():
        uri = (root / name).resolve().as_uri()
        out.update({f"{uri}#{i}": row for i, row in enumerate(table.to_pylist())})
    return out


def _rows(sb: SourceBatch) -> list[dict[str, Any]]:
    return sb.batch.to_pylist() if isinstance(sb.batch, pa.RecordBatch) else list(sb.batch)


def _read(source: Source) -> list[tuple[str | None, list[str], list[dict[str, Any]]]]:
    """(unit, row URIs, rows) of every batch, in order."""
    out = []
    for sb in source.batches():
        uris = sb.lineage.row_uris().to_pylist()
        rows = _rows(sb)
        assert sb.lineage.num_rows == len(rows) == len(uris)
        out.append((sb.lineage.unit, uris, rows))
    return out


def test_is_a_source_that_knows_its_size(tmp_path: Path, make: MakeSource, compiled: CompiledSchema) -> None:
    source = make(tmp_path, _put(tmp_path, INPUT), compiled, 128)
    assert isinstance(source, Source)
    assert isinstance(source.name, str) and source.name
    assert source.total_rows in (None, 950)
    assert sum(len(rows) for _, _, rows in _read(source)) == 950


def test_every_input_row_comes_out_exactly_once_with_its_values(
        tmp_path: Path, make: MakeSource, compiled: CompiledSchema) -> None:
    source = make(tmp_path, _put(tmp_path, INPUT), compiled, 128)
    expected = _expected(tmp_path, INPUT)
    seen: dict[str, dict[str, Any]] = {}
    for _, uris, rows in _read(source):
        for uri, row in zip(uris, rows, strict=True):
            assert uri not in seen, f"{uri} came out twice"
            seen[uri] = row
    assert seen.keys() == expected.keys()
    assert all(seen[uri] == expected[uri] for uri in expected)


def test_batches_are_arrow_with_the_declared_columns_in_their_types(
        tmp_path: Path, make: MakeSource, compiled: CompiledSchema) -> None:
    table = applicants(90, seed=3)
    extra = table.append_column("notes", pa.array(["n"] * 90))  # not in the schema
    files = {"a.parquet": (extra, 40)}
    with pytest.warns(ExtraColumnsWarning, match="notes"):
        source = make(tmp_path, _put(tmp_path, files), compiled, 32)
    batches = [sb.batch for sb in source.batches()]
    assert batches
    declared = compiled.arrow_schema
    for batch in batches:
        assert isinstance(batch, pa.RecordBatch)
        assert batch.schema.names == declared.names
        assert [f.type for f in batch.schema] == [f.type for f in declared]
    assert pa.Table.from_batches(batches).equals(table)


def test_row_uris_and_units_are_unique_and_the_same_on_every_read(
        tmp_path: Path, make: MakeSource, compiled: CompiledSchema) -> None:
    names = _put(tmp_path, INPUT)
    source = make(tmp_path, names, compiled, 64)
    first = _read(source)
    assert _read(source) == first                                # batches() again
    assert _read(make(tmp_path, names, compiled, 64)) == first   # a fresh source
    units = [unit for unit, _, _ in first]
    # Every source here has ledger units (the loader's commit ledger needs them): one that
    # lost them is a failure, not a skip.
    assert None not in units, f"batches without a ledger unit: {units.count(None)} of {len(units)}"
    assert len(set(units)) == len(units)
    uris = [uri for _, batch_uris, _ in first for uri in batch_uris]
    assert len(set(uris)) == len(uris) == 950
    for sb in source.batches():  # the row numbers behind the URIs
        numbers = sb.lineage.row_numbers().to_pylist()
        assert [u.rsplit("#", 1)[1] for u in sb.lineage.row_uris().to_pylist()] == [str(i) for i in numbers]
        assert sb.lineage.row_uris(pa.array([0])).to_pylist() == sb.lineage.row_uris().to_pylist()[:1]


def test_a_unit_changes_with_the_bytes_and_with_the_batch_size(
        tmp_path: Path, make: MakeSource, compiled: CompiledSchema) -> None:
    names = _put(tmp_path, INPUT)
    before = {u for u, _, _ in _read(make(tmp_path, names, compiled, 64))}
    assert None not in before, "a batch without a ledger unit"
    other_size = {u for u, _, _ in _read(make(tmp_path, names, compiled, 65))}
    assert before.isdisjoint(other_size)
    _put(tmp_path, {"a.parquet": (applicants(700, seed=9), 300)})  # a rewritten a.parquet
    after = {u for u, _, _ in _read(make(tmp_path, names, compiled, 64))}
    b_uri = (tmp_path / "sub" / "b.parquet").resolve().as_uri()
    assert {u for u in after if u.startswith(b_uri)} == {u for u in before if u.startswith(b_uri)}
    assert {u for u in after if not u.startswith(b_uri)}.isdisjoint(before)
    assert len(after) == len(before)


@pytest.mark.parametrize("batch_rows", [1, 7, 300, 100_000])
def test_no_batch_holds_more_than_batch_rows(tmp_path: Path, make: MakeSource, compiled: CompiledSchema,
                                             batch_rows: int) -> None:
    files = {"a.parquet": (applicants(120, seed=4), 50), "sub/b.parquet": (applicants(30, seed=5), 30)}
    sizes = [len(rows) for _, _, rows in _read(make(tmp_path, _put(tmp_path, files), compiled, batch_rows))]
    assert sum(sizes) == 150
    assert max(sizes) <= batch_rows
    if batch_rows == 1:
        assert sizes == [1] * 150


def test_batch_rows_below_one_is_refused(tmp_path: Path, make: MakeSource, compiled: CompiledSchema) -> None:
    names = _put(tmp_path, INPUT)
    with pytest.raises(SourceError, match="batch_rows must be >= 1, got 0"):
        make(tmp_path, names, compiled, 0)


def test_empty_input_yields_no_rows(tmp_path: Path, make: MakeSource, compiled: CompiledSchema) -> None:
    empty = make(tmp_path, _put(tmp_path, {"a.parquet": (applicants(0), 10)}), compiled, 16)
    assert empty.total_rows in (None, 0)
    assert sum(len(rows) for _, _, rows in _read(empty)) == 0
    files = {"a.parquet": (applicants(0), 10), "sub/b.parquet": (applicants(25, seed=6), 10)}
    mixed = _read(make(tmp_path, _put(tmp_path, files), compiled, 16))
    assert {uri for _, uris, _ in mixed for uri in uris} == set(_expected(tmp_path, files))


def test_missing_input_is_a_source_error_naming_it(tmp_path: Path, make: MakeSource,
                                                   compiled: CompiledSchema) -> None:
    root = tmp_path / "nothing-here"
    root.mkdir()
    with pytest.raises(SourceError, match="no Parquet file found at") as info:
        make(root, ["missing.parquet"], compiled, 16)
    assert str(root) in str(info.value)
    assert info.value.path is not None and str(root) in info.value.path  # context as attributes too
    assert info.value.field is None


def test_an_unreadable_file_is_a_source_error_naming_it_before_anything_is_read(
        tmp_path: Path, make: MakeSource, compiled: CompiledSchema) -> None:
    names = _put(tmp_path, INPUT)
    (tmp_path / "sub" / "c.parquet").write_bytes(b"PAR1 these bytes are not a Parquet file")
    with pytest.raises(SourceError, match=r"c\.parquet: not a readable Parquet file") as info:
        make(tmp_path, [*names, "sub/c.parquet"], compiled, 16)
    assert info.value.path is not None and info.value.path.endswith("c.parquet")


@pytest.mark.parametrize(("change", "message", "field"), [
    (lambda t: t.drop_columns(["application_id"]), "missing required column 'application_id'",
     "application_id"),
    (lambda t: t.set_column(t.schema.get_field_index("age"), "age", pa.array(["x"] * t.num_rows)),
     "column 'age' has type string, incompatible with int16", "age"),
])
def test_a_file_that_cannot_fit_the_schema_refuses_to_start(
        tmp_path: Path, make: MakeSource, compiled: CompiledSchema,
        change: Callable[[pa.Table], pa.Table], message: str, field: str) -> None:
    files = {"a.parquet": (applicants(20, seed=7), 10), "sub/b.parquet": (change(applicants(20, seed=8)), 10)}
    with pytest.raises(SourceError, match="refusing to load") as info:
        make(tmp_path, _put(tmp_path, files), compiled, 16)
    assert message in str(info.value) and "b.parquet" in str(info.value)
    assert info.value.field == field and info.value.path is not None and info.value.path.endswith("b.parquet")


# --------------------------------------------------------------------------- Parquet only


@pytest.mark.parametrize("shards", [1, 3])
def test_entity_shards_partition_the_rows_with_the_same_lineage(tmp_path: Path, compiled: CompiledSchema,
                                                                shards: int) -> None:
    """``features load --workers``: each worker reads one shard; together they read every
    row once, each with the URI the unsharded source gives it, each entity in one shard."""
    table = applicants(400, seed=10)
    table = pa.concat_tables([table, table.slice(0, 60)])  # an entity's second event: same shard
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=150)
    whole = {uri: row for _, uris, rows in _read(ParquetSource([tmp_path], compiled, batch_rows=64))
             for uri, row in zip(uris, rows, strict=True)}
    parts = [_read(ParquetSource([tmp_path], compiled, batch_rows=64, shard=(i, shards)))
             for i in range(shards)]
    seen: dict[str, dict[str, Any]] = {}
    shard_of: dict[str, int] = {}
    for i, part in enumerate(parts):
        for _, uris, rows in part:
            for uri, row in zip(uris, rows, strict=True):
                assert uri not in seen
                seen[uri] = row
                assert shard_of.setdefault(row["application_id"], i) == i
    assert seen == whole
    units = [u for part in parts for u, _, _ in part]
    assert len(set(units)) == len(units)
    assert shards == 1 or len(set(shard_of.values())) == shards
