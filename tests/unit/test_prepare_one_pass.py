"""``prepare_records`` is one prepare pass: the columnar and per-record decodes become one
batch in record order (``features.sources.micro_batch``), validated once. Each record's
outcome in a mixed micro-batch is the one it gets prepared alone."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from features.lineage import RunContext
from features.ops.examples import applicant_events, applicant_schema
from features.pipeline.prepare import PreparedRecords, prepare_records
from features.sources.columnar import ColumnarDecoder
from features.sources.micro_batch import decode_micro_batch
from features.validation.values import is_json_values

NOW = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)


def _corrupt(values: list[bytes | None]) -> list[bytes | None]:
    """Every 7th record broken one way: a key dropped, a wrong JSON kind, an integer
    beyond int64, a nested object, an array, an integral float (or a boolean)."""
    out: list[bytes | None] = []
    for i, v in enumerate(values):
        if v is None or i % 7 or not v.startswith(b"{"):
            out.append(v)
            continue
        obj = json.loads(v)
        key = sorted(obj)[(i // 7) % len(obj)]
        mode = (i // 7) % 6
        if mode == 0:
            del obj[key]
        elif mode == 1:
            obj[key] = 12345 if isinstance(obj[key], str) else "oops"
        elif mode == 2:
            obj[key] = 10**30
        elif mode == 3:
            obj[key] = {"nested": [1, 2, {"x": obj[key]}]}
        elif mode == 4:
            obj[key] = [1.5, None]
        else:
            obj[key] = 100.0 if type(obj[key]) is int else True
        out.append(json.dumps(obj).encode())
    return out


@pytest.fixture(scope="module")
def records() -> list[bytes | None]:
    return _corrupt(applicant_events(700))


def _prepare(values: list[bytes | None], start: int, decoder: ColumnarDecoder | None) -> PreparedRecords:
    compiled = applicant_schema()
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "one-pass", NOW)
    n = len(values)
    uris = pa.array([f"kafka://t/0/{start + i}" for i in range(n)], pa.string())
    offsets = np.arange(start, start + n, dtype=np.int64) * 2 + 5
    return prepare_records(values, uris, offsets, compiled, None, ctx, NOW, decoder=decoder, columnar_min=1)


def _outcomes(values: list[bytes | None], chunk: int, decoder: ColumnarDecoder | None
              ) -> tuple[dict[int, Any], dict[int, Any], int]:
    """Per record offset: its stored row, or its reject (raw, errors, structured entries)."""
    rows: dict[int, Any] = {}
    rejects: dict[int, Any] = {}
    slow = 0
    for s in range(0, len(values), chunk):
        part = _prepare(values[s:s + chunk], s, decoder)
        slow += part.slow
        p = part.prepared
        assert p.index is not None and p.index.tolist() == sorted(p.index.tolist())  # record order
        for i, row in zip(p.index.tolist(), p.rows.to_pylist(), strict=True):
            rows[(s + i) * 2 + 5] = row
        entries = part.entries.to_pylist()
        for g, reject in enumerate(p.rejects.to_pylist()):
            mine = [{k: e[k] for k in ("field", "rule", "reason", "message", "value")}
                    for e in entries if e["group"] == g]
            assert {e["row"] + s for e in entries if e["group"] == g} == {(reject["row_index"] - 5) // 2}
            rejects[reject["row_index"]] = (reject["_source"], reject["raw"], reject["errors"], mine)
    return rows, rejects, slow


def test_a_mixed_micro_batch_gives_each_record_what_it_gets_alone(records: list[bytes | None]) -> None:
    alone_rows, alone_rejects, _ = _outcomes(records, 1, None)
    assert len(alone_rows) + len(alone_rejects) == len(records)
    assert len(alone_rejects) > 50  # most corrupted records, and the generator's bad rows
    for chunk in (700, 97, 40):
        decoder = ColumnarDecoder(applicant_schema().schema, max_bytes=1 << 20)
        rows, rejects, slow = _outcomes(records, chunk, decoder)
        assert 0 < slow < len(records)  # both parts were in play
        assert rows == alone_rows
        assert rejects == alone_rejects


def test_the_micro_batch_equals_the_per_record_path_exactly(records: list[bytes | None]) -> None:
    per_record = _prepare(records, 0, None)
    for chunk in (700, 50):
        decoder = ColumnarDecoder(applicant_schema().schema, max_bytes=1 << 20)
        parts = [_prepare(records[s:s + chunk], s, decoder) for s in range(0, len(records), chunk)]
        rows = pa.concat_tables([p.prepared.rows for p in parts])
        assert rows.equals(per_record.prepared.rows)
        assert sum((p.prepared.reject_rules for p in parts), Counter()) == per_record.prepared.reject_rules
        decode_rejects = pa.concat_tables([p.prepared.rejects.slice(0, p.decode_rejects) for p in parts])
        others = pa.concat_tables([p.prepared.rejects.slice(p.decode_rejects) for p in parts])
        both = per_record.prepared.rejects
        assert decode_rejects.equals(both.slice(0, per_record.decode_rejects))
        assert others.equals(both.slice(per_record.decode_rejects))


def test_the_two_decodes_become_one_batch_in_record_order(records: list[bytes | None]) -> None:
    compiled = applicant_schema()
    decoder = ColumnarDecoder(compiled.schema, max_bytes=1 << 20)
    chunk = records[:97]
    dec = decode_micro_batch(chunk, compiled, decoder=decoder, columnar_min=1)
    assert 0 < dec.slow < len(chunk)
    assert dec.index.tolist() == sorted(dec.index.tolist())
    assert sorted([*dec.index.tolist(), *dec.failed.tolist()]) == list(range(len(chunk)))
    assert dec.batch.num_rows == len(dec.index)
    # a field whose kinds differ between the parts is one column of JSON texts
    texts = [f.name for f in dec.batch.schema if is_json_values(f)]
    assert texts
    for name in texts:
        column = dec.batch.column(name).to_pylist()
        for pos, text in zip(dec.index.tolist(), column, strict=True):
            obj = json.loads(chunk[pos] or b"{}")
            if text is None:
                assert name not in obj
            else:
                assert json.loads(text) == obj.get(name)
