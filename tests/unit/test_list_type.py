"""The list field type (``list(float32, 384)``, ``list(int64, max=10)``): its grammar and
errors, the validator on Arrow and decoded-JSON input, the stream's two decode paths, the
GX suite's length expectation and the text encodings (Redis JSON, Postgres arrays)."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pytest

from features.compile import compile_schema
from features.compile.arrow import arrow_type
from features.compile.expectations import run_suite
from features.compile.listtext import JSON, POSTGRES, list_text, parse_list_text
from features.compile.postgres import pg_type
from features.errors import SchemaError
from features.lineage import RunContext
from features.pipeline.prepare import prepare_records
from features.schema import parse_schema
from features.schema.syntax import parse_type
from features.sources.columnar import ColumnarDecoder
from features.sources.records import record_uris
from features.validation import validate

SCHEMA = """\
name: s
version: 1.0.0
entity: id
event_time: t
fields:
  - {name: id, type: string, constraints: {required: true}}
  - {name: t, type: 'timestamp(us, UTC)', constraints: {required: true}}
  - {name: emb, type: 'list(float32, 3)'}
  - {name: tags, type: 'list(int16, max=2)'}
"""


@pytest.mark.parametrize(("text", "arrow", "pg"), [
    ("list(float32, 384)", pa.list_(pa.float32(), 384), "real[]"),
    ("list(float64,2)", pa.list_(pa.float64(), 2), "double precision[]"),
    ("list(int64, max=10)", pa.list_(pa.int64()), "bigint[]"),
    ("list(int8, max=1, nullable=true)", pa.list_(pa.int8()), "smallint[]"),
])
def test_list_types_map_to_arrow_and_postgres(text: str, arrow: pa.DataType, pg: str) -> None:
    ft, reason = parse_type(text)
    assert reason is None and ft is not None
    assert arrow_type(ft) == arrow and pg_type(ft) == pg
    assert parse_type(str(ft))[0] == ft  # str() is the canonical spelling


@pytest.mark.parametrize(("text", "words"), [
    ("list(string, 3)", "unknown list element type 'string'"),
    ("list(list(int8, 3), 4)", "nested lists are not supported"),
    ("list(decimal(18,2), 3)", "list elements must be one of"),
    ("list(float32, 0)", "list length 0 is out of range 1..65536"),
    ("list(float32, 65537)", "list length 65537 is out of range"),
    ("list(int64, max=0)", "list maximum length 0 is out of range"),
    ("list(float32)", "malformed list type"),
    ("list", "malformed list type"),
    ("list(float32, 3, sorted=true)", "the only option is nullable=true"),
    ("list(float32, x)", "malformed list length 'x'"),
])
def test_bad_list_types_are_refused_with_a_reason(text: str, words: str) -> None:
    ft, reason = parse_type(text)
    assert ft is None and reason is not None and words in reason, reason


def test_list_fields_refuse_scalar_constraints() -> None:
    bad = SCHEMA.replace("{name: emb, type: 'list(float32, 3)'}",
                         "{name: emb, type: 'list(float32, 3)', constraints: {min: 0}}")
    with pytest.raises(SchemaError, match="min does not apply to list"):
        parse_schema(bad)
    with pytest.raises(SchemaError, match=r":8: fields\[2\].type: unknown list element type 'str'"):
        parse_schema(SCHEMA.replace("list(float32, 3)", "list(str, 3)"))
    with pytest.raises(SchemaError, match="sum of field 'emb'"):
        parse_schema(SCHEMA + "aggregations:\n  features:\n"
                              "    - {name: s1, function: sum, of: emb, window: 1h}\n")


def test_validator_lists_from_arrow_and_json_agree() -> None:
    c = compile_schema(parse_schema(SCHEMA))
    emb = [[0.5, 1.0, 2.0], [0.1, 1.0, 2.0], [1.0, float("nan"), 2.0], [1.0, 2.0], [1.0, None, 2.0], None]
    tags = [[1, 2], [], [40000], [1, 2, 3], None, [1.5]]
    ids = [f"r{i}" for i in range(len(emb))]
    t = [dt.datetime(2024, 1, 1, tzinfo=dt.UTC)] * len(emb)
    table = pa.table({"id": ids, "t": t, "emb": pa.array(emb, pa.list_(pa.float64())),
                      "tags": pa.array([[float(x) for x in v] if v is not None else None for v in tags],
                                       pa.list_(pa.float64()))})
    records = [{"id": i, "t": "2024-01-01T00:00:00Z", "emb": e, "tags": g}
               for i, e, g in zip(ids, emb, tags, strict=True)]
    expected = [
        (1, "emb.type", "field emb violates constraint type: got [0.1, 1.0, 2.0] (element 0: 0.1), "
                        "expected list(float32, 3)"),
        (2, "emb.nan", "field emb violates constraint nan: got [1.0, NaN, 2.0] (a NaN element), "
                       "expected numbers"),
        (2, "tags.type", "field tags violates constraint type: got [40000.0] (element 0: 40000.0), "
                         "expected list(int16, max=2)"),
        (3, "emb.type", "field emb violates constraint type: got [1.0, 2.0] (length 2), "
                        "expected list(float32, 3)"),
        (3, "tags.type", "field tags violates constraint type: got [1.0, 2.0, 3.0] (length 3), "
                         "expected list(int16, max=2)"),
        (4, "emb.type", "field emb violates constraint type: got [1.0, null, 2.0] (a null element), "
                        "expected list(float32, 3)"),
        (5, "tags.type", "field tags violates constraint type: got [1.5] (element 0: 1.5), "
                         "expected list(int16, max=2)"),
    ]
    arrow = validate(table, c)
    got = list(zip(*(arrow.rejects.column(k).to_pylist() for k in ("row", "rule", "message")), strict=True))
    assert got == expected
    assert arrow.valid.column("emb").to_pylist() == [[0.5, 1.0, 2.0]]
    assert arrow.valid.column("tags").to_pylist() == [[1, 2]]
    assert arrow.valid.schema.field("emb").type == pa.list_(pa.float32(), 3)
    pylist = validate(records, c)
    got = [(r, rule) for r, rule in zip(pylist.rejects.column("row").to_pylist(),
                                         pylist.rejects.column("rule").to_pylist(), strict=True)]
    assert got == [(r, rule) for r, rule, _ in expected]
    assert pylist.valid.equals(arrow.valid)


@pytest.mark.parametrize("columnar", [False, True], ids=["per-record", "columnar"])
def test_stream_reads_json_arrays_on_both_paths(columnar: bool) -> None:
    c = compile_schema(parse_schema(SCHEMA))
    values: list[bytes | None] = [
        b'{"id": "a", "t": "2024-01-01T00:00:00Z", "emb": [0.5, 1, 2e0], "tags": [1, -2]}',
        b'{"id": "b", "t": "2024-01-01T00:00:00Z", "emb": [0.5, 1, -0], "tags": []}',
        b'{"id": "c", "t": "2024-01-01T00:00:00Z", "emb": [0.5, 1], "tags": [1]}',
        b'{"id": "d", "t": "2024-01-01T00:00:00Z", "emb": "0.5,1,2", "tags": [1.5]}',
        b'{"id": "e", "t": "2024-01-01T00:00:00Z", "emb": [9007199254740993, 1, 2]}',
        b'{"id": "f", "t": "2024-01-01T00:00:00Z", "emb": [1, 2, 3], "tags": [1, null]}',
    ]
    now = dt.datetime(2024, 1, 2, tzinfo=dt.UTC)
    offsets = np.arange(len(values), dtype=np.int64)
    uris = record_uris(pa.array(["t"] * len(values)), pa.array([0] * len(values), pa.int32()),
                       pa.array(offsets))
    ctx = RunContext(c.name, c.schema.version_str, c.fingerprint, "run", now)
    decoder = ColumnarDecoder(c.schema, max_bytes=1 << 20) if columnar else None
    part = prepare_records(values, uris, offsets, c, None, ctx, now, decoder=decoder, columnar_min=1)
    rows = part.prepared.rows
    assert rows.column("id").to_pylist() == ["a", "b"]
    assert rows.column("emb").to_pylist() == [[0.5, 1.0, 2.0], [0.5, 1.0, 0.0]]
    assert np.signbit(rows.column("emb").to_pylist()[1][2]) is np.False_  # the integer -0 is 0
    assert rows.column("tags").to_pylist() == [[1, -2], []]
    rejects = part.prepared.rejects
    errors = {o: [e["rule"] for e in json.loads(e)] for o, e in zip(
        rejects.column("row_index").to_pylist(), rejects.column("errors").to_pylist(), strict=True)}
    assert errors == {2: ["emb.type"], 3: ["emb.type", "tags.type"], 4: ["emb.type"], 5: ["tags.type"]}


def test_gx_suite_counts_list_lengths_like_the_validator() -> None:
    c = compile_schema(parse_schema(SCHEMA))
    table = pa.table({"id": ["a", "b", "c", "d"], "t": [dt.datetime(2024, 1, 1, tzinfo=dt.UTC)] * 4,
                      "emb": pa.array([[1, 2, 3]] * 4, pa.list_(pa.float32(), 3)),
                      "tags": pa.array([[1], [1, 2, 3], None, []], pa.list_(pa.int16()))})
    counts = run_suite(c, table)
    assert counts["tags.type"] == validate(table, c).counts.by_rule.get("tags.type") == 1
    assert counts["emb.type"] == 0


@pytest.mark.parametrize("spelling", [JSON, POSTGRES])
def test_list_text_round_trips_exactly(spelling: tuple[str, str, str]) -> None:
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    bits = bits[np.isfinite(bits)][:2400]
    arr = pa.FixedSizeListArray.from_arrays(pa.array(bits), 4)
    arr = pa.concat_arrays([arr, pa.array([None], arr.type)])
    back = parse_list_text(list_text(arr, spelling), arr.type, spelling)
    assert back.equals(arr)
    ints = pa.array([[2**63 - 1, -(2**63)], [], None, [0, None]], pa.list_(pa.int64()))
    text = list_text(ints, spelling)
    assert text.to_pylist()[:2] == [f"{spelling[0]}9223372036854775807,-9223372036854775808{spelling[1]}",
                                    spelling[0] + spelling[1]]
    assert parse_list_text(text, ints.type, spelling).equals(ints)
    with pytest.raises(pa.ArrowInvalid):
        parse_list_text(pa.array(["1,2"]), ints.type, spelling)


LAST_K = SCHEMA.replace("  - {name: tags, type: 'list(int16, max=2)'}\n",
                        "  - {name: x, type: float32, store: cold}\n"
                        "  - {name: s, type: string, store: cold}\n")


@pytest.mark.parametrize(("agg", "words"), [
    ("{name: a, function: last_k, of: x, window: 1h}", "last_k needs k: how many values it keeps (1..64)"),
    ("{name: a, function: last_k, of: x, k: 0, window: 1h}", "k (1..64)"),
    ("{name: a, function: last_k, of: x, k: 65, window: 1h}", "k (1..64)"),
    ("{name: a, function: last_k, of: x, k: 2.5, window: 1h}", "k (1..64)"),
    ("{name: a, function: last_k, of: s, k: 3, window: 1h}", "last_k needs an integer or float field"),
    ("{name: a, function: last_k, k: 3, window: 1h}", "last_k needs of"),
    ("{name: a, function: max, of: x, k: 3, window: 1h}", "k does not apply to function max"),
])
def test_last_k_declarations_are_checked(agg: str, words: str) -> None:
    with pytest.raises(SchemaError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_schema(LAST_K + f"aggregations:\n  features:\n    - {agg}\n")


def test_last_k_is_a_list_of_the_fields_type_everywhere() -> None:
    from features.aggregate.engine import AggSpec
    from features.compile.postgres import aggregation_pg_type
    from features.views.model import aggregation_type

    schema = parse_schema(LAST_K + "aggregations:\n  features:\n    - {name: a, function: last_k, of: x, "
                                   "k: 5, window: 1h, store: [hot, cold]}\n")
    assert schema.aggregations is not None
    agg = schema.aggregations.features[0]
    assert agg.k == 5
    spec = AggSpec.of(schema)
    assert spec is not None and spec.output_type(agg) == pa.list_(pa.float32())
    assert aggregation_pg_type(schema, agg) == "real[]"
    assert str(aggregation_type(schema, "a")) == "list(float32, max=5)"


def test_report_stats_of_a_list_field() -> None:
    from features.report.stats import FieldStats
    from features.schema.model import Field

    ft, _ = parse_type("list(float64, max=3)")
    assert ft is not None
    stats = FieldStats(Field("v", ft))
    stats.add(pa.array([[1.0, float("nan")], [-2.0, 5.0], [-2.0, 5.0], None, []], pa.list_(pa.float64())), 5)
    got = stats.as_json()
    assert (got["null_count"], got["nan_count"], got["min"], got["max"], got["distinct_count"]) == (
        1, 1, -2.0, 5.0, 3)


def test_a_derived_feature_cannot_read_a_list_field() -> None:
    with pytest.raises(SchemaError, match="from 'emb' is a list\\(float32, 3\\) field"):
        parse_schema(SCHEMA + "features:\n  - {name: f, from: emb, steps: [{hash_bucket: {n: 8}}], "
                              "dtype: int32, store: hot}\n")
