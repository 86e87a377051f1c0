"""A field's ``source:`` (the input column or JSON key it is read from): parsing and its
errors, the fingerprint, the one rename (``features.sources.names.as_fields``), the
Parquet source's checks, the JSON decoders and ``prepare_records`` (stream and HTTP
ingest), and ``features schema diff``. The loads into the real stores are in
``tests/integration/test_source_names_real_data.py``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.compile import CompiledSchema, compile_schema
from features.compile.fingerprint import fingerprint
from features.compile.migration import plan_migration
from features.config import resolve_settings
from features.errors import SchemaErrors, SourceError
from features.kernels import transform_program
from features.lineage import RunContext
from features.pipeline.prepare import prepare_records
from features.schema import parse_schema
from features.schema.diff import ChangeKind
from features.sources.columnar import ColumnarDecoder
from features.sources.names import as_fields
from features.sources.parquet import ExtraColumnsWarning, ParquetSource
from features.sources.records import decode, record_uris
from features.validation.values import is_json_values, json_values, objects_batch

ROOT = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

SCHEMA = """\
name: flights_src
version: 1.0.0
entity: flight_id
event_time: time_hour
fields:
  - name: flight_id
    type: string
    source: Flight ID
    constraints: {required: true}
  - name: time_hour
    type: timestamp(us, UTC)
    source: timeHour
    constraints: {required: true}
  - name: dep_delay
    type: int32
    source: "Dep Delay"
    store: [hot, cold]
  - name: arr_delay
    type: float64
    source: arr-delay
  - name: tail_num
    type: string
    source: tailNum
  - name: carrier
    type: string
features:
  - name: dep_delay_clipped
    from: dep_delay
    steps: [{fill_null: 0}, {clip: {lo: 0, hi: 60}}]
    dtype: float64
    store: cold
"""


def _compiled(text: str = SCHEMA) -> CompiledSchema:
    return compile_schema(parse_schema(text, "flights_src.yaml"))


def _errors(text: str) -> list[tuple[int | None, str, str]]:
    with pytest.raises(SchemaErrors) as info:
        parse_schema(text, "x.yaml")
    return [(e.line, e.key_path or "", e.reason) for e in info.value.errors]


# --------------------------------------------------------------------------- parsing


def test_source_is_parsed_and_the_field_keeps_its_name() -> None:
    schema = _compiled().schema
    assert schema.field_names == ("flight_id", "time_hour", "dep_delay", "arr_delay", "tail_num", "carrier")
    assert schema.input_names == ("Flight ID", "timeHour", "Dep Delay", "arr-delay", "tailNum", "carrier")
    assert schema.field("dep_delay").source == "Dep Delay"
    assert schema.field("carrier").source is None and schema.field("carrier").input_name == "carrier"
    assert schema.renames_input
    compiled = _compiled()
    # every artefact names the field, never the input
    assert compiled.arrow_schema.names[:6] == list(schema.field_names)
    assert all(r.field in schema.field_names for r in compiled.rules)


BASE = """\
version: 1.0.0
fields:
  - name: a
    type: int32
    source: "A col"
  - name: b
    type: string
"""


@pytest.mark.parametrize(("text", "line", "key_path", "fragment"), [
    (BASE.replace('"A col"', '""'), 5, "fields[0].source", "source must name the input column: it is empty"),
    (BASE.replace('"A col"', "2019"), 5, "fields[0].source",
     "expected the input column name (a string), got int 2019 (quote it: '2019')"),
    (BASE.replace('"A col"', "[x]"), 5, "fields[0].source", "expected the input column name (a string), got"),
    (BASE.replace('"A col"', "null"), 5, "fields[0].source", "expected the input column name (a string)"),
    (BASE + '    source: "A col"\n', 8, "fields[1].source",
     "field 'b' reads source 'A col', as field 'a' does (line 3): each input column feeds one field"),
    (BASE.replace('"A col"', "b"), 5, "fields[0].source",
     "source 'b' of field 'a' is the name of field 'b', which reads its own column 'b': give 'b' a source "
     "too (two fields may swap names) or read another column"),
    # the same when the field named comes first, and when it names itself as its source
    (BASE.replace('    source: "A col"\n', "") + "    source: a\n", 7, "fields[1].source",
     "source 'a' of field 'b' is the name of field 'a'"),
    (BASE.replace('"A col"', "a") + "    source: a\n", 8, "fields[1].source",
     "source 'a' of field 'b' is the name of field 'a', which reads its own column 'a'"),
    (BASE + "    sources: x\n", 8, "fields[1].sources",
     "unknown key 'sources' in a field (did you mean 'source'?)"),
])
def test_bad_sources_are_refused_with_their_place(text: str, line: int, key_path: str, fragment: str) -> None:
    errors = _errors(text)
    assert len(errors) == 1, errors
    assert errors[0][:2] == (line, key_path)
    assert fragment in errors[0][2]


def test_source_on_a_derived_feature_is_refused() -> None:
    text = SCHEMA + "  - name: tail_hash\n    from: tail_num\n    source: tailNum\n" \
                    "    steps: [{hash_bucket: 8}]\n    dtype: int64\n    store: cold\n"
    errors = _errors(text)
    assert len(errors) == 1, errors
    line, key_path, reason = errors[0]
    assert (line, key_path) == (len(SCHEMA.splitlines()) + 3, "features[1].source")
    assert reason.startswith("source applies to input fields")
    assert "name its field with from:, and put source on that field" in reason


def test_every_source_problem_of_a_file_is_reported_at_once() -> None:
    text = BASE.replace('"A col"', '""') + "    source: x\n  - name: c\n    type: int8\n    source: x\n"
    places = [(line, kp) for line, kp, _ in _errors(text)]
    assert places == [(5, "fields[0].source"), (11, "fields[2].source")]


def test_two_fields_may_swap_names_and_a_source_may_be_the_own_name() -> None:
    swap = BASE.replace('"A col"', "b") + "    source: a\n"
    schema = parse_schema(swap, "x.yaml")
    assert schema.input_names == ("b", "a")
    # a name freed by a field that maps away may be another field's source
    freed = parse_schema(BASE + "    source: a\n", "x.yaml")
    assert freed.input_names == ("A col", "a")
    same = parse_schema(BASE.replace('"A col"', "a"), "x.yaml")
    assert same.input_names == ("a", "b") and not same.renames_input


def test_source_is_not_in_the_fingerprint_but_from_still_is() -> None:
    plain = SCHEMA.replace('    source: "Dep Delay"\n', "")
    assert fingerprint(_compiled().schema) == fingerprint(_compiled(plain).schema)
    renamed_input = SCHEMA.replace("Dep Delay", "DEP")
    assert fingerprint(_compiled().schema) == fingerprint(_compiled(renamed_input).schema)
    # the attribute named source on a derived feature (its field) is semantic
    other = SCHEMA.replace("from: dep_delay", "from: arr_delay")
    assert fingerprint(_compiled().schema) != fingerprint(_compiled(other).schema)


# --------------------------------------------------------------------------- the rename


def test_as_fields_renames_arrow_input_and_ignores_the_shadowed_name() -> None:
    schema = _compiled().schema
    batch = pa.record_batch({"Dep Delay": [1, 2], "dep_delay": [98, 99], "carrier": ["AA", "UA"],
                             "extra": [0, 0]})
    out = as_fields(batch, schema)
    assert out.schema.names == ["dep_delay", "carrier"]
    assert out.column(0).to_pylist() == [1, 2]            # "Dep Delay", not the column named dep_delay
    table = as_fields(pa.Table.from_batches([batch]), schema)
    assert isinstance(table, pa.Table) and table.column("dep_delay").to_pylist() == [1, 2]
    # no declared column at all: the rows are still there (each is then a row of the batch)
    only = as_fields(pa.record_batch({"dep_delay": [1, 2, 3]}), schema)
    assert only.num_rows == 3 and only.num_columns == 0
    dupes = pa.RecordBatch.from_arrays([pa.array([1]), pa.array([2])], names=["Dep Delay", "Dep Delay"])
    with pytest.raises(SourceError, match=r"several columns named 'Dep Delay' \(the input of field 'dep_de"):
        as_fields(dupes, schema)


def test_as_fields_renames_json_objects_and_swaps() -> None:
    schema = parse_schema(BASE.replace('"A col"', "b") + "    source: a\n", "x.yaml")
    rows: list[dict[str, Any]] = [{"a": "text", "b": 7, "z": 1}, {"b": 8}]
    batch = objects_batch(rows, ["a", "b"])  # decoded JSON objects, as the stream decodes them
    renamed = as_fields(batch, schema)
    assert sorted(renamed.schema.names) == ["a", "b"]
    assert renamed.column("a").to_pylist() == [7, 8]
    assert json_values(renamed.column("b"))[0] == ["text", None]  # absent from the second object
    assert is_json_values(renamed.schema.field("b"))  # the column keeps what it is through the rename
    plain = parse_schema(BASE.replace('    source: "A col"\n', ""), "x.yaml")
    assert as_fields(batch, plain) is batch  # no source: no copy


# --------------------------------------------------------------------------- Parquet


def test_parquet_checks_name_the_input_column_and_the_field(tmp_path: Path) -> None:
    compiled = _compiled()
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"flight_id": ["x"], "timeHour": ["not a time"]}), path)
    with pytest.raises(SourceError) as info:
        ParquetSource([path], compiled)
    message = str(info.value)
    assert "missing required column 'Flight ID' (source of field 'flight_id')" in message
    assert ("column 'timeHour' (source of field 'time_hour') has type string, incompatible with "
            "timestamp(us, UTC)") in message


def test_parquet_batches_keep_the_input_names_and_warn_about_the_shadowed_one(tmp_path: Path) -> None:
    compiled = _compiled()
    path = tmp_path / "ok.parquet"
    ts = pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.UTC)], pa.timestamp("us", "UTC"))
    pq.write_table(pa.table({"Flight ID": ["f1"], "timeHour": ts, "Dep Delay": pa.array([3], pa.int32()),
                             "dep_delay": pa.array([9], pa.int32())}), path)
    with pytest.warns(ExtraColumnsWarning, match=r"dep_delay \(field dep_delay reads 'Dep Delay'\)"):
        source = ParquetSource([path], compiled)
    (sb,) = list(source.batches())
    assert isinstance(sb.batch, pa.RecordBatch)
    assert sb.batch.schema.names == ["Flight ID", "timeHour", "Dep Delay"]


def test_entity_shards_read_the_entity_from_its_source_column() -> None:
    from features.sources.parquet import entity_shards

    ids = [f"f{i}" for i in range(200)]
    mapped = entity_shards(pa.record_batch({"Flight ID": ids, "flight_id": ["same"] * 200}), _compiled(), 8)
    plain = _compiled(SCHEMA.replace("    source: Flight ID\n", ""))
    assert mapped.tolist() == entity_shards(pa.record_batch({"flight_id": ids}), plain, 8).tolist()
    assert len(set(mapped.tolist())) == 8  # by the ids, not by the decoy column (one shard) or row numbers
    by_rows = entity_shards(pa.record_batch({"other": ids}), _compiled(), 8)
    assert by_rows.tolist() == [i % 8 for i in range(200)] != mapped.tolist()


# --------------------------------------------------------------------------- JSON


def test_decode_counts_the_field_name_of_a_mapped_field_as_unknown() -> None:
    known = frozenset(_compiled().schema.input_names)
    d = decode([b'{"Dep Delay": 1, "dep_delay": 2, "carrier": "AA", "x": null}'], max_bytes=1000, known=known)
    # a column per known key, by the record's own keys; the unknown ones are not read
    assert d.batch.column("Dep Delay").to_pylist() == [1] and d.batch.column("carrier").to_pylist() == ["AA"]
    assert "dep_delay" not in d.batch.schema.names and "x" not in d.batch.schema.names
    assert d.unknown_fields == {"dep_delay": 1}


RECORDS: list[dict[str, Any]] = [
    {"Flight ID": "f1", "timeHour": "2024-01-01T10:00:00Z", "Dep Delay": 5, "arr-delay": -2.5,
     "tailNum": "N1", "carrier": "AA"},
    # the field names instead of the input names: flight_id and time_hour are missing
    {"flight_id": "f2", "time_hour": "2024-01-01T11:00:00Z", "dep_delay": 7, "carrier": "UA"},
    # a malformed value under a mapped key
    {"Flight ID": "f3", "timeHour": "2024-01-01T12:00:00Z", "Dep Delay": "late", "carrier": "AA"},
    # both names: the source is read, the field's own name is an unknown key
    {"Flight ID": "f4", "timeHour": "2024-01-01T13:00:00Z", "Dep Delay": 90, "dep_delay": 1},
]


def _prepare(decoder: ColumnarDecoder | None) -> Any:
    compiled = _compiled()
    program = transform_program(compiled, resolve_settings(root=ROOT, device="cpu"))
    values: list[bytes | None] = [json.dumps(r).encode() for r in RECORDS]
    offsets = np.arange(10, 10 + len(values), dtype=np.int64)
    uris = record_uris(pa.array(["t"] * len(values)), pa.array([0] * len(values), pa.int32()),
                       pa.array(offsets))
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "run", NOW)
    return prepare_records(values, uris, offsets, compiled, program, ctx, NOW, decoder=decoder,
                           columnar_min=1)


@pytest.mark.parametrize("columnar", [False, True], ids=["per-record", "columnar"])
def test_prepare_records_reads_the_sources_and_keeps_the_input_in_raw(columnar: bool) -> None:
    decoder = ColumnarDecoder(_compiled().schema, max_bytes=1 << 20) if columnar else None
    part = _prepare(decoder)
    rows = part.prepared.rows
    assert rows.column("flight_id").to_pylist() == ["f1", "f4"]
    assert rows.column("dep_delay").to_pylist() == [5, 90]
    assert rows.column("arr_delay").to_pylist() == [-2.5, None]
    assert rows.column("tail_num").to_pylist() == ["N1", None]
    assert rows.column("dep_delay_clipped").to_pylist() == [5.0, 60.0]
    assert "Dep Delay" not in rows.column_names
    rejects = part.prepared.rejects
    assert rows.num_rows + rejects.num_rows == len(RECORDS)   # counts conserved
    by_offset = {o: (json.loads(raw), json.loads(errs)) for o, raw, errs in zip(
        rejects.column("row_index").to_pylist(), rejects.column("raw").to_pylist(),
        rejects.column("errors").to_pylist(), strict=True)}
    assert set(by_offset) == {11, 12}
    raw, errors = by_offset[11]
    assert raw == RECORDS[1]
    assert {(e["field"], e["reason"]) for e in errors} == {("flight_id", "missing"), ("time_hour", "missing")}
    raw, errors = by_offset[12]
    assert raw == RECORDS[2] and raw["Dep Delay"] == "late"      # the input key, as it came
    assert [(e["field"], e["reason"]) for e in errors] == [("dep_delay", "type")]
    assert errors[0]["message"].startswith("field dep_delay ")
    # keys named like fields that read other keys are unknown (and so are flight_id, time_hour)
    assert part.unknown_fields == {"flight_id": 1, "time_hour": 1, "dep_delay": 2}


def test_the_columnar_and_per_record_paths_agree_on_mapped_records() -> None:
    slow, fast = _prepare(None), _prepare(ColumnarDecoder(_compiled().schema, max_bytes=1 << 20))
    assert fast.slow < len(RECORDS)  # the columnar path did read some records
    assert fast.prepared.rows.drop_columns(["_ingested_at"]).equals(
        slow.prepared.rows.drop_columns(["_ingested_at"]))
    assert fast.prepared.rejects.select(["row_index", "raw", "errors"]).equals(
        slow.prepared.rejects.select(["row_index", "raw", "errors"]))


# --------------------------------------------------------------------------- schema diff


def test_diff_reports_a_changed_source_as_breaking_and_a_kept_one_as_nothing() -> None:
    old = _compiled().schema
    bumped = dataclasses.replace(old, version=(1, 1, 0))
    assert not [c for c in plan_migration(old, bumped).diff.changes if c.kind is ChangeKind.SOURCE]
    new = dataclasses.replace(bumped, fields=tuple(
        dataclasses.replace(f, source="DepDelay") if f.name == "dep_delay" else f for f in old.fields))
    migration = plan_migration(old, new)
    ((change, ddl),) = [(c, d) for c, d in zip(migration.diff.changes, migration.change_ddl, strict=True)
                        if c.kind is ChangeKind.SOURCE]
    assert change.field == "dep_delay" and not change.compatible and ddl == ()
    assert "'Dep Delay' -> 'DepDelay'" in change.detail
    # a stored field renamed while its input keeps the old name: a rename, not a source change
    renamed = dataclasses.replace(bumped, fields=tuple(
        dataclasses.replace(f, name="carrier_code", source="carrier") if f.name == "carrier" else f
        for f in old.fields))
    kinds = {c.kind for c in plan_migration(old, renamed).diff.changes}
    assert ChangeKind.FIELD_RENAMED in kinds and ChangeKind.SOURCE not in kinds


def test_features_validate_reads_the_source_columns(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from features.cli import main as cli_main

    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "src.yaml").write_text(BASE.replace("version:", "name: src\nversion:") +
                                      "    constraints: {required: true}\n")
    path = tmp_path / "in.parquet"
    # "A col" feeds the int32 field a; the text column named a is not read (it would be a type
    # reject on every row); b is required: the row without it is the one reject
    pq.write_table(pa.table({"A col": pa.array([1, None, 3], pa.int32()), "a": ["x", "y", "z"],
                             "b": ["p", None, "r"]}), path)
    code = cli_main(["validate", "--schema", "src", "--schemas-dir", str(schemas), "--json", str(path)])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert (out["input_rows"], out["valid_rows"], out["rejected_rows"]) == (3, 2, 1)
    assert out["by_rule"] == {"b.not_null": 1}
