"""Decoded JSON objects as one Arrow batch (``features.validation.values``): the validator
gives for it exactly what it gives for the objects themselves (a list of dicts)."""

from __future__ import annotations

import json
import math
from typing import Any

import pyarrow as pa

from features.compile import compile_schema
from features.schema import parse_schema
from features.validation import validate
from features.validation.values import is_json_values, json_values, objects_batch

SCHEMA = compile_schema(parse_schema(
    "name: s\nversion: 1.0.0\nentity: id\nevent_time: t\nfields:\n"
    "  - {name: id, type: string, constraints: {required: true}}\n"
    "  - {name: t, type: 'timestamp(us, UTC)', constraints: {required: true}}\n"
    "  - {name: n, type: int32, constraints: {min: 0}}\n"
    "  - {name: f, type: float64, constraints: {default: 1.5}}\n"
    "  - {name: d, type: 'decimal(10, 2)', accept_strings: true}\n"
    "  - {name: b, type: bool}\n"
    "  - {name: v, type: 'list(float32, 3)'}\n"))
KEYS = ["id", "t", "n", "f", "d", "b", "v"]

ROWS: list[dict[str, Any]] = [
    {"id": "a", "t": "2026-01-01T00:00:00Z", "n": 1, "f": 0.5, "d": "12.50", "b": True, "v": [1, 2, 3]},
    {"id": "b", "t": "2026-01-01T00:00:01Z", "n": "7", "f": 2, "d": 3, "b": 1, "v": [1, "x", 3]},
    {"id": 5, "t": 17, "n": 2**70, "f": float("nan"), "d": 10**40, "b": None, "v": {"a": 1}},
    {"t": "2026-01-01T00:00:02Z", "n": -1, "f": None, "b": False, "v": [1.5, 2.5]},
    {"id": None, "t": "2026-01-01", "n": [1], "f": {"x": [1, 2]}, "d": "1e400", "b": "true", "v": None},
    {},
]


def _same(got: Any, want: Any) -> bool:
    return json.dumps(got, default=str, sort_keys=True) == json.dumps(want, default=str, sort_keys=True)


def test_a_batch_of_objects_validates_as_the_objects_do() -> None:
    batch = objects_batch(ROWS, KEYS)
    want = validate(ROWS, SCHEMA)
    got = validate(batch, SCHEMA, json_text=True)
    assert got.rejects.num_rows > 10  # every kind of field-level verdict, none a batch failure
    assert _same(got.rejects.to_pylist(), want.rejects.to_pylist())
    assert got.valid_row_index.to_pylist() == want.valid_row_index.to_pylist()
    assert _same(got.valid.to_pylist(), want.valid.to_pylist())
    messages = got.rejects.column("message").to_pylist()
    assert any("got no key, expected a key id" in m for m in messages)
    assert any("got 'x'" in m or "element 1" in m for m in messages)


def test_columns_are_typed_when_one_kind_and_json_text_otherwise() -> None:
    rows: list[dict[str, Any]] = [{"a": 1, "b": 1, "c": 1, "d": None}, {"a": 2, "b": "x", "d": None}]
    batch = objects_batch(rows, ["a", "b", "c", "d", "e"])
    assert batch.num_rows == 2 and batch.schema.names == ["a", "b", "c", "d"]  # no row holds e
    assert batch.schema.field("a").type == pa.int64() and not is_json_values(batch.schema.field("a"))
    assert batch.schema.field("d").type == pa.null()
    for name, want, gone in [("b", [1, "x"], []), ("c", [1, None], [1])]:
        field = batch.schema.field(name)
        assert is_json_values(field)
        values, absent = json_values(batch.column(name))
        assert values == want and absent.tolist() == gone


def test_json_texts_read_back_exactly() -> None:
    odd = [2**200, -0.0, float("inf"), "\ud800", [1, [2, {"k": None}]], 0.1]
    batch = objects_batch([{"x": v} for v in odd] + [{"x": "s"}], ["x"])
    values, absent = json_values(batch.column("x"))
    assert len(absent) == 0 and values[0] == 2**200 and math.copysign(1, values[1]) == -1
    assert values[2:] == [*odd[2:], "s"]


def test_rows_without_any_key_keep_their_count() -> None:
    batch = objects_batch([{}, {"other": 1}], KEYS)
    assert batch.num_rows == 2 and batch.num_columns == 0
    result = validate(batch, SCHEMA, json_text=True)
    assert result.rejected_rows == 2
    assert _same(result.rejects.to_pylist(), validate([{}, {"other": 1}], SCHEMA).rejects.to_pylist())
