"""Kafka record decoding: every record becomes a row or a field-level decode reject."""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from features.compile import compile_schema
from features.lineage import RunContext
from features.pipeline.prepare import prepare_records
from features.schema import parse_schema
from features.sources.columnar import ColumnarDecoder
from features.sources.records import decode, payload_json, record_uris
from features.validation.values import is_json_values, json_values

KNOWN = frozenset({"id", "x"})


def _objects(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The decoded objects a batch of :func:`decode` holds (a key absent: not in the dict)."""
    rows: list[dict[str, Any]] = [{} for _ in range(batch.num_rows)]
    for i, name in enumerate(batch.schema.names):
        col = batch.column(i)
        if is_json_values(batch.schema.field(i)):
            values, absent = json_values(col)
            gone = set(absent.tolist())
        else:
            values, gone = col.to_pylist(), set()
        for r, v in enumerate(values):
            if r not in gone:
                rows[r][name] = v
    return rows


def test_each_kind_of_bad_record_is_a_decode_reject_with_its_reason() -> None:
    values: list[bytes | None] = [
        b'{"id": "a", "x": 1}',
        None,
        b"x" * 101,
        b"\xff\xfe",
        b'{"id": ',
        b"[" * 50 + b"]" * 50,          # fine JSON, but a list
        b"null",
        b'"just a string"',
        b'{"id": "b", "x": NaN, "extra": true}',
        b"{}",
    ]
    d = decode(values, max_bytes=100, known=KNOWN)
    assert d.index.tolist() == [0, 8, 9]
    rows = _objects(d.batch)
    assert rows[0] == {"id": "a", "x": 1} and rows[2] == {}
    assert math.isnan(rows[1]["x"])  # NaN token: read, so the field's nan rule rejects it
    assert d.unknown_fields == {"extra": 1}
    messages = dict(zip(d.rejects.column("row").to_pylist(), d.rejects.column("message").to_pylist(),
                        strict=True))
    assert set(messages) == {1, 2, 3, 4, 5, 6, 7}
    assert "tombstone" in messages[1]
    assert "101 bytes, over the schema's payload.max_bytes 100" in messages[2]
    assert "not UTF-8" in messages[3]
    assert "not valid JSON" in messages[4]
    assert "a JSON array, expected an object" in messages[5]
    assert "a JSON null, expected an object" in messages[6]
    assert "a JSON string, expected an object" in messages[7]
    assert set(d.rejects.column("rule").to_pylist()) == {"_payload.decode"}
    assert set(d.rejects.column("field").to_pylist()) == {"_payload"}


def test_deep_nesting_is_rejected_not_a_crash() -> None:
    deep = b'{"a": ' * 5000 + b"1" + b"}" * 5000
    d = decode([deep], max_bytes=1 << 20, known=KNOWN)
    assert d.batch.num_rows == 0 and d.failed.tolist() == [0]
    assert "nested too deeply" in d.rejects.column("message")[0].as_py()


def test_numbers_beyond_the_int_digit_limit_are_rejected_not_a_crash() -> None:
    d = decode([b'{"x": ' + b"9" * 5000 + b"}"], max_bytes=1 << 20, known=KNOWN)
    assert d.batch.num_rows == 0 and "not valid JSON" in d.rejects.column("message")[0].as_py()


def test_payload_json_is_always_valid_json_for_jsonb() -> None:
    for value, key in [(b"plain text", "_payload"), (b"nul \x00 inside", "_payload"),
                       (b"\xff\xfe", "_payload_base64"), (None, "_payload")]:
        obj = json.loads(payload_json(value))
        assert list(obj) == [key]
        assert "\x00" not in payload_json(value)


def test_record_uris() -> None:
    uris = record_uris(pa.array(["t", "t"]), pa.array([0, 1], pa.int32()), pa.array([5, 7], pa.int64()))
    assert uris.to_pylist() == ["kafka://t/0/5", "kafka://t/1/7"]


@pytest.mark.parametrize("columnar", [False, True], ids=["per-record", "columnar"])
def test_a_record_without_a_required_key_says_the_key_is_missing(columnar: bool) -> None:
    """The stream's (and the HTTP ingest's) reject for a JSON record that lacks a required
    field's key names a missing key (it said ``got no column, expected a column ...``),
    on both decode paths; a key sent as null is a not_null reject."""
    compiled = compile_schema(parse_schema(
        "name: s\nversion: 1.0.0\nentity: id\nevent_time: t\nfields:\n"
        "  - {name: id, type: string, constraints: {required: true}}\n"
        "  - {name: t, type: 'timestamp(us, UTC)', constraints: {required: true}}\n"
        "  - {name: x, type: int32, constraints: {required: true}}\n"))
    values: list[bytes | None] = [
        b'{"id": "a", "t": "2026-01-01T00:00:00Z", "x": 1}',
        b'{"id": "b", "t": "2026-01-01T00:00:00Z"}',
        b'{"id": "c", "t": "2026-01-01T00:00:00Z", "x": null}',
    ]
    now = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    offsets = np.arange(len(values), dtype=np.int64)
    uris = record_uris(pa.array(["t"] * len(values)), pa.array([0] * len(values), pa.int32()),
                       pa.array(offsets))
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "run", now)
    decoder = ColumnarDecoder(compiled.schema, max_bytes=1 << 20) if columnar else None
    part = prepare_records(values, uris, offsets, compiled, None, ctx, now, decoder=decoder, columnar_min=1)
    rejects = part.prepared.rejects
    errors = {o: json.loads(e) for o, e in zip(rejects.column("row_index").to_pylist(),
                                                rejects.column("errors").to_pylist(), strict=True)}
    assert {o: [(e["rule"], e["message"]) for e in errs] for o, errs in errors.items()} == {
        1: [("x.missing", "field x violates constraint missing: got no key, expected a key x")],
        2: [("x.not_null", "field x violates constraint not_null: got null, expected a value")],
    }
