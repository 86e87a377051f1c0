"""A field's ``null_values``: the texts that mean null in the input (``[nil, NA, ""]``),
read as null by the one conversion every input path shares (Parquet batches, lists of
dicts, the stream's two JSON paths), then checked like any null; the schema errors of a
bad list; the fingerprint; the GX suite's preparation. And the one hint a string gets
where a field does not ``accept_strings``, per row and per file (issue 30, item 4)."""

from __future__ import annotations

import datetime as dt
import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.cli import main as cli_main
from features.compile import CompiledSchema, compile_schema
from features.compile.expectations import run_suite
from features.compile.fingerprint import fingerprint
from features.errors import SchemaErrors, SourceError
from features.lineage import RunContext
from features.pipeline.prepare import prepare_records
from features.schema import parse_schema
from features.schema.parse import _FIELD_KEYS
from features.sources.columnar import ColumnarDecoder
from features.sources.parquet import ParquetSource
from features.sources.records import record_uris
from features.validation import validate

ROOT = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HINT = "(set accept_strings: true to parse text)"


def compiled(fields_yaml: str, name: str = "t", head: str = "") -> CompiledSchema:
    text = (f"name: {name}\nversion: 1.0.0\n{head}fields:\n"
            + textwrap.indent(textwrap.dedent(fields_yaml), "  "))
    return compile_schema(parse_schema(text, f"{name}.yaml"))


def errors(fields_yaml: str) -> list[tuple[int | None, str, str]]:
    with pytest.raises(SchemaErrors) as info:
        compiled(fields_yaml)
    return [(e.line, e.key_path or "", e.reason) for e in info.value.errors]


def column(result: Any, name: str = "x") -> list[Any]:
    return list(result.valid.column(name).to_pylist())


def messages(result: Any) -> list[str]:
    return list(result.rejects.column("message").to_pylist())


# --------------------------------------------------------------------------- parsing


def test_markers_are_parsed_sorted_and_unique() -> None:
    c = compiled("- {name: x, type: float64, null_values: [nil, NA, '']}")
    assert c.schema.field("x").null_values == ("", "NA", "nil")
    assert "null_values" in _FIELD_KEYS
    assert compiled("- {name: x, type: string, null_values: []}").schema.field("x").null_values == ()


@pytest.mark.parametrize(("yaml", "key_path", "fragment"), [
    ("null_values: nil", "fields[0].null_values",
     "expected a list of null markers, got string 'nil' (write a list: ['nil'])"),
    ("null_values: {a: 1}", "fields[0].null_values", "(a list), got a mapping"),
    ("null_values: [nil, 1]", "fields[0].null_values[1]",
     "expected a null marker (a string), got int 1 (quote it: '1')"),
    ("null_values: [null]", "fields[0].null_values[0]",
     "expected a null marker (a string), got null (quote it: 'null'; '' is the empty string)"),
    ("null_values: [true]", "fields[0].null_values[0]", "got bool true (quote it: 'true')"),
    ("null_values: [NA, nil, NA]", "fields[0].null_values[2]", "duplicate null marker 'NA'"),
    ("null_values: [[nil]]", "fields[0].null_values[0]", "expected a null marker (a string), got a list"),
])
def test_bad_null_values_are_schema_errors_with_their_place(yaml: str, key_path: str, fragment: str) -> None:
    found = errors(f"- name: x\n  type: float64\n  {yaml}\n")
    assert len(found) == 1, found
    line, kp, reason = found[0]
    assert (line, kp) == (6, key_path) and fragment in reason, found


def test_a_marker_may_not_be_an_enum_value_or_the_default() -> None:
    found = errors("- {name: e, type: enum, values: [a, NA], null_values: [NA]}\n"
                   "- {name: s, type: string, null_values: [nil], constraints: {default: nil}}\n")
    assert [(kp, reason) for _, kp, reason in found] == [
        ("fields[0].null_values[0]",
         "null marker 'NA' is one of the enum values: it would never be read as that value"),
        ("fields[1].null_values[0]", "null marker 'nil' is the default: the default would be read as null"),
    ]


def test_markers_count_in_the_fingerprint_but_not_their_order() -> None:
    plain = compiled("- {name: x, type: float64}").schema
    none = compiled("- {name: x, type: float64, null_values: []}").schema
    some = compiled("- {name: x, type: float64, null_values: [nil, NA]}").schema
    reordered = compiled("- {name: x, type: float64, null_values: [NA, nil]}").schema
    assert fingerprint(plain) == fingerprint(none)  # a schema without markers keeps its fingerprint
    assert fingerprint(some) == fingerprint(reordered)
    assert fingerprint(some) != fingerprint(plain)


# --------------------------------------------------------------------------- validation


def test_markers_are_nulls_before_the_text_is_parsed() -> None:
    c = compiled("- {name: x, type: float64, accept_strings: true, null_values: [nil, NA, '']}")
    r = validate(pa.table({"x": ["22.59", "nil", "NA", "", None, "na", " nil", "7"]}), c)
    assert r.rejects.column("row").to_pylist() == [5, 6]  # exact, case-sensitive, no trimming
    assert column(r) == [22.59, None, None, None, None, 7.0]
    # a dictionary-encoded column (pandas categoricals) is read the same
    dictionary = pa.array(["nil", "1.5", "nil"]).dictionary_encode()
    assert column(validate(pa.table({"x": dictionary}), c)) == [None, 1.5, None]


def test_markers_on_a_string_field_and_then_the_null_rules() -> None:
    c = compiled("""\
        - {name: s, type: string, null_values: [nil, '-']}
        - {name: r, type: string, null_values: [nil], constraints: {required: true}}
        - {name: d, type: int32, null_values: [nil], accept_strings: true, constraints: {default: 0}}
    """)
    r = validate(pa.table({"s": ["a", "nil", "-", "NIL"], "r": ["x", "nil", "y", "z"],
                           "d": ["nil", "3", None, "4"]}), c)
    assert r.rejects.column("rule").to_pylist() == ["r.not_null"]
    assert r.rejects.column("row").to_pylist() == [1]
    assert messages(r) == ["field r violates constraint not_null: got null, expected a value"]
    assert column(r, "s") == ["a", None, "NIL"]   # rows 0, 2, 3: '-' is a marker
    assert column(r, "d") == [0, 0, 4]            # a marker is filled with the default like a null


def test_markers_without_accept_strings_and_never_a_number() -> None:
    """JSON records (a list of dicts): ``"nil"`` among numbers is null without
    accept_strings; other text is a type reject with the hint; the number -999 is no
    marker even when ``'-999'`` is one."""
    c = compiled("- {name: x, type: float64, null_values: [nil, '-999']}")
    r = validate([{"x": 1.5}, {"x": "nil"}, {"x": "2.5"}, {"x": -999}, {"x": "-999"}], c)
    assert column(r) == [1.5, None, -999.0, None]
    assert messages(r) == [f"field x violates constraint type: got '2.5', expected float64 {HINT}"]


def test_text_without_accept_strings_gets_one_hint_from_arrow_and_from_dicts() -> None:
    c = compiled("- {name: x, type: int32}\n- {name: t, type: 'timestamp(s, UTC)'}")
    arrow = validate(pa.table({"x": ["12", None], "t": pa.array([0, 0], pa.timestamp("s", "UTC"))}), c)
    dicts = validate([{"x": "12", "t": "1970-01-01T00:00:00Z"}, {"x": None, "t": "1970-01-01T00:00:00Z"}], c)
    want = [f"field x violates constraint type: got '12', expected int32 {HINT}"]
    assert messages(arrow) == want and messages(dicts) == want
    from features.validation.convert import TEXT_HINT  # the loader's refusal uses the same text

    assert f" {HINT}" == TEXT_HINT
    # a value refused for another reason gets no hint
    other = validate([{"x": 1.5, "t": "1970-01-01T00:00:00Z"}], c)
    assert messages(other) == ["field x violates constraint type: got 1.5, expected int32"]


@pytest.mark.parametrize("columnar", [False, True], ids=["per-record", "columnar"])
def test_stream_records_read_markers_as_nulls_on_both_paths(columnar: bool) -> None:
    c = compiled("""\
        - {name: id, type: string, constraints: {required: true}}
        - {name: at, type: 'timestamp(ms, UTC)', constraints: {required: true}}
        - {name: glucose, type: float64, null_values: [nil, NA]}
        - {name: note, type: string, null_values: [nil], store: hot}
        - {name: level, type: 'decimal(6,2)', accept_strings: true, null_values: [nil]}
    """, name="cgm", head="entity: id\nevent_time: at\n")
    records = [
        {"id": "p1", "at": "2024-01-01T00:00:00Z", "glucose": 5.5, "note": "ok", "level": "1.50"},
        {"id": "p2", "at": "2024-01-01T00:05:00Z", "glucose": "nil", "note": "nil", "level": "nil"},
        {"id": "p3", "at": "2024-01-01T00:10:00Z", "glucose": "NA", "note": "nil", "level": "2.25"},
        {"id": "p4", "at": "2024-01-01T00:15:00Z", "glucose": "6.1", "note": "x", "level": "nil"},
    ]
    values: list[bytes | None] = [json.dumps(r).encode() for r in records]
    offsets = np.arange(len(values), dtype=np.int64)
    uris = record_uris(pa.array(["t"] * len(values)), pa.array([0] * len(values), pa.int32()),
                       pa.array(offsets))
    ctx = RunContext(c.name, c.schema.version_str, c.fingerprint, "run", NOW)
    decoder = ColumnarDecoder(c.schema, max_bytes=1 << 20) if columnar else None
    part = prepare_records(values, uris, offsets, c, None, ctx, NOW, decoder=decoder, columnar_min=1)
    rows = part.prepared.rows
    assert rows.column("id").to_pylist() == ["p1", "p2", "p3"]
    assert rows.column("glucose").to_pylist() == [5.5, None, None]
    assert rows.column("note").to_pylist() == ["ok", None, None]
    assert [None if v is None else str(v) for v in rows.column("level").to_pylist()] == ["1.50", None, "2.25"]
    errs = json.loads(part.prepared.rejects.column("errors")[0].as_py())
    assert [e["message"] for e in errs] == [
        f"field glucose violates constraint type: got '6.1', expected float64 {HINT}"]


def test_the_gx_suite_prepares_a_string_fields_markers_like_the_validator() -> None:
    c = compiled("- {name: code, type: string, null_values: [nil], constraints: {pattern: '^[A-Z]{2}$'}}")
    raw = pa.table({"code": ["AB", "nil", "xyz"]})
    r = validate(raw, c)
    assert r.rejects.column("rule").to_pylist() == ["code.pattern"]
    assert run_suite(c, raw)["code.pattern"] == 1  # the marker is a null, not a pattern failure


# --------------------------------------------------------------------------- files: one verdict


def _pandas_csv_parquet(tmp_path: Path) -> Path:
    """What a user gets from ``pd.read_csv(...).to_parquet(...)`` on an export that writes
    ``nil`` for a missing value: the column is text, numbers and all."""
    csv = tmp_path / "cgm.csv"
    csv.write_text("patient,glucose\np1,22.59\np1,nil\np2,7.1\np2,\n")
    frame = pd.read_csv(csv)
    path = tmp_path / "cgm.parquet"
    frame.to_parquet(path)
    assert pq.read_schema(path).field("glucose").type == pa.string()
    return path


def test_validate_refuses_a_text_column_with_the_loaders_message_and_hint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _pandas_csv_parquet(tmp_path)
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "cgm.yaml").write_text("name: cgm\nversion: 1.0.0\nfields:\n"
                                      "  - {name: patient, type: string}\n"
                                      "  - {name: glucose, type: float64}\n")
    code = cli_main(["validate", "--schema", "cgm", "--schemas-dir", str(schemas), str(path)])
    captured = capsys.readouterr()
    assert code == 2, captured.out
    c = compile_schema(parse_schema((schemas / "cgm.yaml").read_text(), "cgm.yaml"))
    with pytest.raises(SourceError) as info:
        ParquetSource([path], c)
    loader = str(info.value)
    tail = loader.split(": refusing to load", 1)[1]
    assert tail == (" with schema 'cgm': column 'glucose' has type string, incompatible with float64 "
                    f"{HINT}")
    assert captured.err.strip() == f"features validate: error: {path}: refusing to load{tail}"
    assert captured.out == ""
    # declared as the export writes it, the same file is valid: nil is null, the rest parsed
    (schemas / "cgm.yaml").write_text(
        "name: cgm\nversion: 1.0.0\nfields:\n  - {name: patient, type: string}\n"
        "  - {name: glucose, type: float64, accept_strings: true, null_values: [nil]}\n")
    code = cli_main(["validate", "--json", "--schema", "cgm", "--schemas-dir", str(schemas), str(path)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and (doc["input_rows"], doc["valid_rows"]) == (4, 4)


# --------------------------------------------------------------------------- docs


def test_the_docs_describe_every_field_key_and_the_null_values_change() -> None:
    schema_doc = (ROOT / "docs" / "schema.md").read_text()
    fields_table = schema_doc.split("## Fields", 1)[1].split("\n\n", 2)[1]
    documented = {line.split("`")[1] for line in fields_table.splitlines() if line.startswith("| `")}
    assert set(_FIELD_KEYS) <= documented, set(_FIELD_KEYS) - documented
    assert "### Null markers (`null_values`)" in schema_doc
    from features.schema.diff import ChangeKind

    evolution = (ROOT / "docs" / "evolution.md").read_text()
    assert f"| `{ChangeKind.NULL_VALUES.value}` |" in evolution
