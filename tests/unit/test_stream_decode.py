"""Kafka record decoding: every record becomes a row or a field-level decode reject."""

from __future__ import annotations

import json
import math

import pyarrow as pa

from features.stream.decode import decode, payload_json, record_uris

KNOWN = frozenset({"id", "x"})


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
    assert d.rows[0] == {"id": "a", "x": 1} and d.rows[2] == {}
    assert math.isnan(d.rows[1]["x"])  # NaN token: read, so the field's nan rule rejects it
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
    assert d.rows == [] and d.failed.tolist() == [0]
    assert "nested too deeply" in d.rejects.column("message")[0].as_py()


def test_numbers_beyond_the_int_digit_limit_are_rejected_not_a_crash() -> None:
    d = decode([b'{"x": ' + b"9" * 5000 + b"}"], max_bytes=1 << 20, known=KNOWN)
    assert d.rows == [] and "not valid JSON" in d.rejects.column("message")[0].as_py()


def test_payload_json_is_always_valid_json_for_jsonb() -> None:
    for value, key in [(b"plain text", "_payload"), (b"nul \x00 inside", "_payload"),
                       (b"\xff\xfe", "_payload_base64"), (None, "_payload")]:
        obj = json.loads(payload_json(value))
        assert list(obj) == [key]
        assert "\x00" not in payload_json(value)


def test_record_uris() -> None:
    uris = record_uris(pa.array(["t", "t"]), pa.array([0, 1], pa.int32()), pa.array([5, 7], pa.int64()))
    assert uris.to_pylist() == ["kafka://t/0/5", "kafka://t/1/7"]
