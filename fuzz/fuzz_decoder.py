"""Fuzz the Kafka record path: bytes -> decode -> validate -> transform -> rejects, no store.

    .venv/bin/python fuzz/fuzz_decoder.py --inputs 100000

Each input is one Kafka record value. A micro-batch of 1..32 inputs runs through what
``features.stream.core.StreamProcessor.process`` does before it writes: ``decode``
(payload.max_bytes, UTF-8, JSON, object), ``process_batch`` (the validator and the
transform program), the decode rejects grouped like the validator's, the aggregation
inputs and the dead-letter messages. Pure functions: no Kafka, Redis or Postgres. Each
batch runs against both shipped stream schemas, ``schemas/clicks.yaml`` (16 KiB limit,
aggregations) and ``schemas/credit_applicant.yaml`` (64 KiB, transforms), and once more
through ``decode`` with a 64-byte limit. The promise checked:

- every record is exactly one row or one reject row, by its ``kafka://`` URI;
- a record over ``max_bytes`` is a decode reject that says so, whatever it holds;
- every reject has errors (JSON, each with a rule, a reason and a message) and a raw
  payload that PostgreSQL jsonb takes (JSON; no NUL character; UTF-8 encodable);
- rows have the schema's Arrow types;
- a dead-letter message is JSON and fits the producer's ``message.max.bytes``.

- the stream's columnar decode (``features.sources.columnar``) gives exactly the rows,
  rejects and counts of the per-record path.

Anything else (an exception, a hang, memory) is a crash.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzzkit
from fuzzkit import FuzzFailure, json_dumps_any

from features.aggregate.engine import AggSpec, compute, extract, finalize, raw_schema
from features.compile import CompiledSchema, compile_schema
from features.kernels import compile_transforms
from features.lineage import RunContext
from features.pipeline.prepare import group_rejects, prepare_records, process_batch, records_source_batch
from features.schema import load_schema
from features.sources.columnar import ColumnarDecoder
from features.sources.records import decode, payload_json, record_uris

SCHEMAS = ("clicks", "credit_applicant")
_NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
#: the second pass: a limit most records are over
_SMALL_LIMIT = 64

# --------------------------------------------------------------------------- value pools

VALUES: list[Any] = [
    0, -0.0, 1, -1, 2**31, 2**31 - 1, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**38,
    10**38 - 1, -(10**38), 10**100, 1.5, 0.01, 99999999.99, 1e308, 5e-324, float("nan"), float("inf"),
    float("-inf"), "", " ", "\x00", "a\x00b", "\ud800", "\udfff\ud800", "\U0001f600", "é", "\u2028", "1",
    "1.5", " 12 ", "1e5", "1E+2", "-0", "0x10", "NaN", "Infinity", "true", "null", "12.345", "0.001",
    "99999999999999999999.99", "2024-01-01T00:00:00Z", "2024-01-01T00:00:00", "2024-01-01T00:00:00+05:30",
    "2024-01-01 00:00:00Z", "2024-02-30T00:00:00Z", "0000-01-01T00:00:00Z", "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999Z", "2024-01-01T23:59:60Z", "2024-01-01T00:00:00.123456789Z",
    "2024-01-01T00:00:00-24:00", "2024-01-01", "1700000000000", "u123", "u" + "9" * 10, "u" + "9" * 11,
    "APP-000000000001", "APP-00000000000", "view", "click", "purchase", "VIEW", "employed", "retired",
    "x" * 70, "x" * 5000, True, False, None, [], {}, [1, 2], {"a": 1}, {"$date": 0}, [[[[[]]]]],
]
#: field names of both schemas, and keys that are not fields
KEYS = [
    "event_id", "user_id", "item_id", "event_type", "event_time", "dwell_ms", "price", "session_id",
    "application_id", "submitted_at", "income_monthly", "employment_duration_months", "employment_status",
    "age", "existing_debt", "credit_score", "requested_amount", "region", "customer_since", "", "\x00",
    "_source", "__proto__", "EVENT_ID", "event_id ", "\ud800", "x" * 300, "_payload",
]
TOKENS: list[bytes] = [t.encode("utf-8", "surrogatepass") for t in [
    "NaN", "-NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999", "-0", "00", "01", "1.", ".5", "0x1F",
    "+1", "1e5", "9" * 4300, "9" * 4301, "1" + "0" * 40, '"\\u0000"', '"\\ud800"', '"\\udc00\\ud800"',
    '"\\uDFFF"', '"\\u00e9"', '"\\x41"', '"\\q"', "true", "false", "null", "True", "None", "undefined", "[",
    "]", "{", "}", ",", ":", '"', "'", "\\", "//", "/*", "*/", '"a":1,', '"event_id":', '{"a":', "[" * 100,
    "{}", "[]", "\ufeff", "\u2028", "\x7f", "\t", "\r\n", '"' + "x" * 200 + '"',
]]


def _valid_value(rng: random.Random, key: str) -> Any:
    """A value that passes ``key``'s rules in its schema (most of the time)."""
    table: dict[str, list[Any]] = {
        "event_id": ["e1", "e" * 64, f"e{rng.randrange(10**9)}"], "user_id": ["u1", "u1234567890"],
        "item_id": ["i1", "item-9"], "event_type": ["view", "click", "add_to_cart", "purchase"],
        "event_time": ["2024-01-01T00:00:00Z", "2026-11-29T11:59:59.999Z", 1_700_000_000_000],
        "dwell_ms": [0, 1500, 3600000, None], "price": [0, "12.50", 99.99, None, "0.01"],
        "session_id": ["s1", "", None],
        "application_id": ["APP-000000000001", "APP-123456789012"],
        "submitted_at": ["2024-01-01T00:00:00Z", "2026-11-29T12:00:00.000001+00:00"],
        "income_monthly": ["0.01", 2500, "99999999.99", 1234.5],
        "employment_duration_months": [0, 1200, None],
        "employment_status": ["employed", "self_employed", "unemployed", "retired", "student", None],
        "age": [18, 120, 45], "existing_debt": [None, 0, "1500.00"], "credit_score": [300, 850, None, 700],
        "requested_amount": [100, "10000000", 5000.5], "region": ["EU", "x" * 32, None],
        "customer_since": ["2020-01-01", None, "2026-11-29"],
    }
    return rng.choice(table.get(key, VALUES))


def generate_record(rng: random.Random) -> bytes:
    """A record for one of the schemas: mostly valid values, some hostile ones, some keys
    missing or unknown; or, one time in six, any JSON value at all."""
    if rng.random() < 1 / 6:
        return json_dumps_any(rng.choice(VALUES), rng)
    fields = KEYS[:8] if rng.random() < 0.5 else KEYS[8:19]
    obj: dict[str, Any] = {}
    bad = rng.random() < 0.6
    for key in fields:
        if rng.random() < 0.05:
            continue
        hostile = bad and rng.random() < 0.25
        obj[key] = copy.deepcopy(rng.choice(VALUES)) if hostile else _valid_value(rng, key)
    if rng.random() < 0.2:
        obj[rng.choice(KEYS)] = copy.deepcopy(rng.choice(VALUES))
    return json_dumps_any(obj, rng)


def _mutate_tree(obj: Any, rng: random.Random, depth: int = 0) -> Any:
    if not isinstance(obj, dict | list) or not obj or rng.random() < 0.1 or depth > 20:
        return copy.deepcopy(rng.choice(VALUES))
    if isinstance(obj, list):
        i = rng.randrange(len(obj))
        obj[i] = _mutate_tree(obj[i], rng, depth + 1)
        return obj
    key = rng.choice(list(obj))
    op = rng.random()
    if op < 0.55:
        obj[key] = _mutate_tree(obj[key], rng, depth + 1) if rng.random() < 0.3 else copy.deepcopy(
            rng.choice(VALUES))
    elif op < 0.7:
        del obj[key]
    elif op < 0.85:
        obj[rng.choice(KEYS)] = obj.pop(key)
    elif op < 0.95:
        obj[rng.choice(KEYS)] = copy.deepcopy(rng.choice(VALUES))
    else:
        obj[key] = [obj[key]] * rng.randint(1, 3) if rng.random() < 0.5 else {"v": obj[key]}
    return obj


_PARSED: dict[bytes, Any] = {}
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def mutate_record(data: bytes, rng: random.Random) -> bytes | None:
    """Load the seed as JSON (cached), change one to three values or keys, dump it again
    (random spacing and escapes); or swap a number token for a hostile one, or repeat a key."""
    if data not in _PARSED:
        try:
            _PARSED[data] = json.loads(data)
        except (ValueError, RecursionError):
            _PARSED[data] = None
    if _PARSED[data] is None:
        return None
    r = rng.random()
    if r < 0.15:
        numbers = list(_NUMBER.finditer(data))
        if numbers:
            m = rng.choice(numbers)
            return data[:m.start()] + rng.choice(TOKENS[:20]) + data[m.end():]
    if r < 0.22 and data.startswith(b"{"):
        key = json.dumps(rng.choice(KEYS)).encode("utf-8", "surrogatepass")
        return b"{" + key + b":" + json_dumps_any(rng.choice(VALUES), rng) + b"," + data[1:]
    try:
        doc = json.loads(data)  # a fresh copy (deepcopy recurses; seeds nest deeply)
        for _ in range(rng.randint(1, 3)):
            doc = _mutate_tree(doc, rng)
        return json_dumps_any(doc, rng)
    except (ValueError, RecursionError):
        return None


def generate_huge(rng: random.Random) -> bytes:
    """Records around and far over the limits: 50 MB, just over/under 16 KiB and 64 KiB,
    deep nesting, long numbers, wide objects, long strings."""
    kind = rng.randrange(10)
    if kind == 0:
        return b'{"event_id": "' + b"x" * (50 * 2**20) + b'"}'
    if kind in (1, 2):
        limit = rng.choice((16384, 65536))
        body = b'{"event_id": "' + b"x" * limit
        return (body[: limit - 2 + (kind == 1)] + b'"}')[: limit + (kind == 1)]
    if kind == 3:
        n = rng.choice((900, 1100, 100_000))
        return b'{"a": ' + b"[" * n + b"]" * n + b"}"
    if kind == 4:
        return b'{"dwell_ms": ' + b"9" * rng.choice((4300, 4301, 15000)) + b"}"
    if kind == 5:
        return json.dumps({f"k{i}": i for i in range(rng.choice((1000, 5000)))}).encode()
    if kind == 6:
        return json.dumps({"region": "\u00e9" * rng.choice((5000, 30000))}, ensure_ascii=False).encode()
    if kind == 7:
        return json.dumps({"price": [1] * 20000}).encode()
    if kind == 8:
        return b'{"session_id": "' + b"\\u0000" * 2700 + b'"}'
    return b'{"event_id": "' + b"\\u0001" * 2700 + b'", "user_id": "' + b"\\u0001" * 2700 + b'"}'


# --------------------------------------------------------------------------- the target


def _walk_strings(obj: Any) -> Any:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _walk_strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk_strings(v)


def _check_jsonb(text: str, what: str) -> Any:
    """``text`` must be JSON that PostgreSQL jsonb stores: no NUL, UTF-8 encodable."""
    try:
        text.encode("utf-8")
        obj = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (UnicodeEncodeError, ValueError) as exc:
        raise FuzzFailure(f"{what} is not JSON that jsonb takes: {exc}: {text[:200]!r}") from exc
    for s in _walk_strings(obj):
        if "\x00" in s:
            raise FuzzFailure(f"{what} holds a NUL character (jsonb refuses \\u0000): {text[:200]!r}")
    return obj


_DECODE_KIND = re.compile(r"record (?:value is |value holds |has )(not UTF-8|not valid JSON|not usable JSON|"
                          r"a JSON \w+|[\d,]+ bytes|a lone surrogate|no value)")


class DecoderTarget:
    name = "decoder"
    group_sizes = (1, 32)
    tokens = TOKENS
    timeout_s = 10.0
    weights = (0.40, 0.12, 0.14, 0.03, 0.30, 0.01)

    def __init__(self) -> None:
        root = Path(__file__).resolve().parents[1] / "schemas"
        self.compiled: dict[str, CompiledSchema] = {}
        self.programs: dict[str, Any] = {}
        self.specs: dict[str, AggSpec | None] = {}
        for name in SCHEMAS:
            schema = load_schema(root / f"{name}.yaml")
            self.compiled[name] = compile_schema(schema)
            self.programs[name] = compile_transforms(schema, device="cpu") if schema.features else None
            self.specs[name] = AggSpec.of(schema)
        #: one columnar decoder per schema, kept across inputs (it learns read types)
        self.decoders = {name: ColumnarDecoder(c.schema, max_bytes=c.schema.payload.max_bytes)
                         for name, c in self.compiled.items()}

    def run(self, group: Sequence[bytes]) -> Counter[str]:
        values: list[bytes | None] = list(group)
        if hashlib.sha256(b"".join(group)).digest()[0] % 8 == 0:
            values.append(None)  # a tombstone in one batch of eight
        out: Counter[str] = Counter()
        for name in SCHEMAS:
            out.update(self.check(name, values))
        self.check_limit(values)
        return out

    def check_limit(self, values: Sequence[bytes | None]) -> None:
        """With a tiny max_bytes, every longer record is a reject that names the limit."""
        dec = decode(values, max_bytes=_SMALL_LIMIT, known=frozenset({"event_id"}))
        messages = dict(zip(dec.rejects.column("row").to_pylist(), dec.rejects.column("message").to_pylist(),
                            strict=True))
        for i, v in enumerate(values):
            refused = "over the schema's payload.max_bytes" in messages.get(i, "")
            if v is not None and len(v) > _SMALL_LIMIT and not refused:
                raise FuzzFailure(f"a {len(v)}-byte record passed max_bytes {_SMALL_LIMIT}")

    def check(self, name: str, values: list[bytes | None]) -> Counter[str]:
        compiled, program = self.compiled[name], self.programs[name]
        schema = compiled.schema
        max_bytes = schema.payload.max_bytes
        n = len(values)
        topics = pa.array(["fuzz"] * n)
        partitions = pa.array([0] * n, pa.int32())
        uris = record_uris(topics, partitions, pa.array(range(n), pa.int64()))
        ctx = RunContext(schema.name, schema.version_str, compiled.fingerprint, "fuzz", _NOW)
        dec = decode(values, max_bytes=max_bytes, known=frozenset(f.name for f in schema.fields))
        sb = records_source_batch(dec.batch, values, dec.index, uris, max_bytes)
        prepared = process_batch(sb, compiled, program, ctx, _NOW)
        decode_rejects = group_rejects(dec.rejects,
                                       lambda idx: [payload_json(values[int(i)], max_bytes) for i in idx],
                                       lambda idx: uris.take(idx), ctx)
        rejects = pa.concat_tables([decode_rejects, prepared.rejects])
        # every record: one row or one reject
        stored = prepared.rows.column("_source").to_pylist()
        rejected = rejects.column("_source").to_pylist()
        if sorted(stored + rejected) != sorted(uris.to_pylist()):
            raise FuzzFailure(f"{name}: {len(stored)} rows + {len(rejected)} rejects for {n} records "
                              "(a record lost or counted twice)")
        for field in schema.fields:
            want = compiled.arrow_schema.field(field.name).type
            got = prepared.rows.schema.field(field.name).type
            if got != want:
                raise FuzzFailure(f"{name}: column {field.name} is {got}, the schema says {want}")
        fuzzkit.check_rows_readable(prepared.rows)
        out: Counter[str] = Counter({f"{name}: row": len(stored)})
        messages = dict(zip(dec.rejects.column("row").to_pylist(), dec.rejects.column("message").to_pylist(),
                            strict=True))
        for i, v in enumerate(values):
            if v is not None and len(v) > max_bytes and "payload.max_bytes" not in messages.get(i, ""):
                raise FuzzFailure(f"{name}: a {len(v):,}-byte record passed max_bytes {max_bytes:,}")
        for message in messages.values():
            m = _DECODE_KIND.match(message)
            kind = m[1] if m else message[:40]
            if kind[0].isdigit():
                kind = "over payload.max_bytes"
            out[f"{name}: reject _payload.decode ({kind})"] += 1
        limit = max(2 * max_bytes + 65_536, 1_048_576)  # the dead-letter producer's message.max.bytes
        head = json.dumps({"schema": schema.name, "schema_version": schema.version_str,
                           "schema_fingerprint": compiled.fingerprint, "run_id": "fuzz"})[1:-1]
        for src, raw, errs in zip(rejected, rejects.column("raw").to_pylist(),
                                  rejects.column("errors").to_pylist(), strict=True):
            entries = _check_jsonb(errs, f"{name}: errors of {src}")
            if not isinstance(entries, list) or not entries:
                raise FuzzFailure(f"{name}: a reject without errors: {errs[:200]!r}")
            for e in entries:
                if not (e.get("rule") and e.get("reason") and e.get("message")):
                    raise FuzzFailure(f"{name}: an error without a rule, reason or message: {e}")
                if e["rule"] != "_payload.decode":
                    out[f"{name}: reject {e['rule']}"] += 1
            _check_jsonb(raw, f"{name}: raw of {src}")
            message = f'{{"source": {json.dumps(src)}, {head}, "errors": {errs}, "raw": {raw}}}'
            size = len(message.encode("utf-8"))
            if size > limit:
                raise FuzzFailure(f"{name}: a dead-letter message of {size:,} bytes is over the producer's "
                                  f"message.max.bytes {limit:,}")
            json.loads(message)
        self.check_columnar(name, values, uris)
        spec = self.specs[name]
        if spec is not None and prepared.rows.num_rows:
            # the aggregation engine takes whatever the validator let through
            inputs = extract(spec, prepared.rows)
            result = compute(spec, inputs)
            values = finalize(spec, pa.table(result.raw, schema=raw_schema(spec)))
            if len(result.accepted) + len(result.duplicate) != len(inputs) or any(
                    len(v) != len(result.accepted) for v in values.values()):
                raise FuzzFailure(f"{name}: the aggregation engine lost or invented events")
        return out

    def check_columnar(self, name: str, values: list[bytes | None], uris: pa.Array) -> None:
        """The stream's columnar decode (a decoder kept across inputs, as a running job keeps
        it) gives exactly what the per-record path gives (``prepare_records``)."""
        compiled, program = self.compiled[name], self.programs[name]
        schema = compiled.schema
        ctx = RunContext(schema.name, schema.version_str, compiled.fingerprint, "fuzz", _NOW)
        offsets = np.arange(len(values), dtype=np.int64)
        decoder = self.decoders[name]
        fast = prepare_records(values, uris, offsets, compiled, program, ctx, _NOW, decoder=decoder)
        slow = prepare_records(values, uris, offsets, compiled, program, ctx, _NOW, decoder=None)
        for what, a, b in (("rows", fast.prepared.rows, slow.prepared.rows),
                           ("rejects", fast.prepared.rejects, slow.prepared.rejects)):
            if not a.equals(b):
                raise FuzzFailure(f"{name}: the columnar decode's {what} differ from the per-record path's")
        same_counts = fast.prepared.reject_rules == slow.prepared.reject_rules
        if fast.unknown_fields != slow.unknown_fields or not same_counts:
            raise FuzzFailure(f"{name}: the columnar decode's counts differ from the per-record path's")

    def mutate_structured(self, data: bytes, rng: random.Random) -> bytes | None:
        return mutate_record(data, rng)

    def generate(self, rng: random.Random) -> bytes:
        return generate_record(rng)

    def generate_huge(self, rng: random.Random) -> bytes:
        return generate_huge(rng)


if __name__ == "__main__":
    sys.exit(fuzzkit.main(DecoderTarget, "decoder"))
