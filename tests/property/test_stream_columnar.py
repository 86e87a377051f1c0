"""The stream's two decode paths agree on any micro-batch of Kafka record values.

``prepare_records(..., decoder=ColumnarDecoder(...))`` reads what it can with Arrow's
JSON reader (``features/sources/columnar.py``) and hands the rest to the per-record path;
``prepare_records(..., decoder=None)`` is the per-record path alone (``json.loads`` per
record, ``features/sources/records.py``). The promise: for any input both give the same
rows, the same rejects (same order, same raw payload and errors JSON), the same
reject-rule and unknown-field counts, and every record read is one row or one reject.

Micro-batches mix valid records of both shipped stream schemas
(``features.ops.examples.applicant_events``, ``click_records``) with hostile ones: the
fuzz corpus (``fuzz/corpus/decoder``), the fuzz target's generator and mutators and
its ``VALUES``/``KEYS``/``TOKENS`` pools (``fuzz/fuzz_decoder.py``, ``fuzz/fuzzkit.py``),
and records edited here token by token (NaN/Inf tokens, big and negative-zero numbers,
strings in numeric fields, surrogate escapes, nesting, duplicate and unknown keys,
absent vs null fields, odd whitespace, several objects in one value, invalid UTF-8,
sizes around ``payload.max_bytes``). Each batch runs against both schemas and through
three decoders: a fresh one, one shared by every example (it keeps the read types it
learnt from earlier batches) and one primed so that every field that can switch its
read type has switched.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "fuzz"
sys.path.insert(0, str(FUZZ))

import fuzz_decoder  # noqa: E402
import fuzzkit  # noqa: E402

from features.compile import CompiledSchema, compile_schema  # noqa: E402
from features.config import resolve_settings  # noqa: E402
from features.kernels import transform_program  # noqa: E402
from features.lineage import RunContext  # noqa: E402
from features.ops.examples import UNDECODABLE, applicant_events, click_history, click_records  # noqa: E402
from features.pipeline.prepare import PreparedRecords, prepare_records  # noqa: E402
from features.schema import load_schema  # noqa: E402
from features.schema.model import INTEGER_KINDS, TypeKind  # noqa: E402
from features.sources.columnar import ColumnarDecoder  # noqa: E402
from features.sources.records import record_uris  # noqa: E402

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SCHEMAS = ("credit_applicant", "clicks")
_HYPOTHESIS = settings(max_examples=150, derandomize=True, deadline=None, database=None,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_HYPOTHESIS_MORE = settings(_HYPOTHESIS, max_examples=200)

# --------------------------------------------------------------------------- the two schemas


@dataclass
class Stream:
    """One shipped stream schema, its transform program and its long-lived decoders."""

    compiled: CompiledSchema
    program: Any
    #: one decoder for every example: it keeps the read types it learnt
    shared: ColumnarDecoder = field(init=False)
    #: every field that can switch its read type has switched
    primed: ColumnarDecoder = field(init=False)

    def __post_init__(self) -> None:
        self.shared = self.decoder()
        self.primed = _primed(self.decoder(), self.compiled)

    def decoder(self) -> ColumnarDecoder:
        return ColumnarDecoder(self.compiled.schema, max_bytes=self.compiled.schema.payload.max_bytes)


def _stream(name: str) -> Stream:
    compiled = compile_schema(load_schema(ROOT / "schemas" / f"{name}.yaml"))
    return Stream(compiled, transform_program(compiled, resolve_settings(root=ROOT, device="cpu")))


def _primed(decoder: ColumnarDecoder, compiled: CompiledSchema) -> ColumnarDecoder:
    """``decoder`` after a micro-batch whose first record holds a fraction in an integer
    field (integer fields are then read as float64) and a number in each decimal field
    that takes strings (read as text until then): read types a long-running stream learns."""
    fields = compiled.schema.fields
    ints = [f.name for f in fields if f.type.kind in INTEGER_KINDS]
    texts = [f.name for f in fields if f.type.kind is TypeKind.DECIMAL and f.accept_strings]
    first: dict[str, Any] = {name: 12.5 for name in texts}
    first.update({name: 2.5 for name in ints[:1]})
    decoder.decode([json.dumps(first).encode(), b'{"a": 1}'])
    read = decoder.read_schema()
    for name in ints + texts:
        assert read.field(name).type == pa.float64(), f"priming {name} failed: {read}"
    return decoder


STREAMS = {name: _stream(name) for name in SCHEMAS}

# --------------------------------------------------------------------------- running both paths


def _prepare(stream: Stream, values: Sequence[bytes | None],
             decoder: ColumnarDecoder | None) -> PreparedRecords:
    n = len(values)
    offsets = np.arange(1000, 1000 + n, dtype=np.int64)
    uris = record_uris(pa.array(["t"] * n), pa.array([3] * n, pa.int32()), pa.array(offsets))
    compiled = stream.compiled
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "run", NOW)
    # columnar_min=1: the columnar path for every batch size (the default keeps small
    # batches on the per-record path, whose results these tests hold equal)
    return prepare_records(values, uris, offsets, compiled, stream.program, ctx, NOW, decoder=decoder,
                           columnar_min=1)


def _first_difference(a: pa.Table, b: pa.Table) -> str:
    """Where two rows or rejects tables (columnar ``a``, per-record ``b``) first differ."""
    if a.schema != b.schema:
        return f"columnar schema {a.schema}, per-record schema {b.schema}"
    if a.num_rows != b.num_rows:
        sa, sb = set(a.column("_source").to_pylist()), set(b.column("_source").to_pylist())
        return (f"columnar {a.num_rows} rows, per-record {b.num_rows}; only columnar: {sorted(sa - sb)}, "
                f"only per-record: {sorted(sb - sa)}")
    for i, (x, y) in enumerate(zip(a.to_pylist(), b.to_pylist(), strict=True)):
        if x != y:
            keys = [k for k in x if x[k] != y[k]]
            return f"row {i}: " + "; ".join(f"{k}: columnar {x[k]!r}, per-record {y[k]!r}" for k in keys)
    return "the tables differ in chunking or metadata only"


def _assert_same(fast: PreparedRecords, slow: PreparedRecords, values: Sequence[bytes | None],
                 label: str) -> None:
    """The columnar result equals the per-record one, and both account for every record."""
    a, b = fast.prepared, slow.prepared
    where = f"{label}; batch={list(values)!r}"[:6000]
    n = len(values)
    for path, p in (("columnar", a), ("per-record", b)):
        assert p.rejected_rows == p.rejects.num_rows, f"{path}: rejected_rows != rejects ({where})"
        assert n == p.rows.num_rows + p.rejected_rows, (
            f"{path}: read {n} != {p.rows.num_rows} rows + {p.rejected_rows} rejected ({where})")
        sources = p.rows.column("_source").to_pylist() + p.rejects.column("_source").to_pylist()
        assert len(set(sources)) == n, f"{path}: a record lost or counted twice ({where})"
    assert a.rows.equals(b.rows), f"rows differ: {_first_difference(a.rows, b.rows)} ({where})"
    assert a.rejects.equals(b.rejects), f"rejects differ: {_first_difference(a.rejects, b.rejects)} ({where})"
    assert a.rejected_rows == b.rejected_rows, where
    assert a.reject_rules == b.reject_rules, f"reject_rules {a.reject_rules} != {b.reject_rules} ({where})"
    assert fast.unknown_fields == slow.unknown_fields, (
        f"unknown_fields {fast.unknown_fields} != {slow.unknown_fields} ({where})")
    assert fast.decode_rejects == slow.decode_rejects, where
    assert a.index is not None and b.index is not None
    assert np.array_equal(a.index, b.index), f"row positions {a.index} != {b.index} ({where})"
    assert set(a.examples) == set(b.examples) == set(a.reject_rules), where


def check_batch(values: Sequence[bytes | None], *, schemas: Sequence[str] = SCHEMAS) -> dict[str, int]:
    """Both paths on ``values`` for each schema, the columnar one with a fresh, the shared
    and the primed decoder; returns per schema how many records the fresh decoder read
    columnar (the fast path's share)."""
    fast_records = {}
    for name in schemas:
        stream = STREAMS[name]
        slow = _prepare(stream, values, None)
        assert slow.slow == len(values)
        for label, decoder in (("fresh", stream.decoder()), ("shared", stream.shared),
                               ("primed", stream.primed)):
            context = f"{name}, {label} decoder, read types before {decoder.read_schema().types}"
            try:
                fast = _prepare(stream, values, decoder)
            except Exception as exc:
                exc.add_note(f"columnar path raised: {context}; batch={list(values)!r}"[:6000])
                raise
            _assert_same(fast, slow, values, context)
            if label == "fresh":
                fast_records[name] = len(values) - fast.slow
    return fast_records


# --------------------------------------------------------------------------- records

APPLICANT_RECORDS: list[bytes] = [
    v for v in applicant_events(240, seed=11, undecodable_every=0) if v is not None]
CLEAN_APPLICANT_RECORDS: list[bytes] = [
    v for v in applicant_events(400, seed=5, undecodable_every=0, duplicate_share=0.0, invalid_share=0.0)
    if v is not None]
CLICK_RECORDS: list[bytes] = [v for _, v in click_records(click_history(240, seed=11, users=30))]
DECODER_CORPUS = fuzzkit.read_corpus(FUZZ / "corpus" / "decoder")
CORPUS: list[bytes] = [v for _, group in DECODER_CORPUS for v in group]

FIELDS = sorted({f.name for s in STREAMS.values() for f in s.compiled.schema.fields})
APPLICANT = json.loads(APPLICANT_RECORDS[0])
CLICK = json.loads(CLICK_RECORDS[0])


def _j(value: Any, ascii_: bool = True) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_, allow_nan=True).encode("utf-8", "surrogatepass")


#: numbers for integer and decimal fields, as JSON tokens
NUMBERS: list[bytes] = [t.encode() for t in [
    "0", "-0", "0.0", "-0.0", "2.0", "-2.0", "2.5", "1e2", "1E+2", "1.5e3", "35.0", "1200.0", "0.125",
    "0.005", "1.005", "2.675", "0.1", "0.30000000000000004", "99999999.99", "99999999.995", "99999999.994999",
    "1e16", "1e-3", "5e-324", "2.2250738585072014e-308", "1e308", "1.7976931348623157e308", "1e400",
    "-1e400", "1e-400", "-1e-400", "18", "120", "121", "17", "850", "851", "299", "300", "100", "99.99",
    "10000000", "10000000.01", "2147483647", "2147483648", "-2147483649", "32767", "32768",
    str(2**53 - 1), str(2**53), str(2**53 + 1), str(-(2**53) - 1), str(2**63 - 1), str(2**63),
    str(-(2**63)), str(-(2**63) - 1), str(2**64), str(10**30), str(-(10**30)), "1e30", "9007199254740993.0",
    "9007199254740993e0", "123456789012345678901234567890.5", "9" * 4300, "9" * 4301, "-" + "9" * 4301,
    "1" * 400 + ".5", "0.000000000000000000000000000001", "1e" + "9" * 30, "1" + "0" * 5000 + ".0",
    "0." + "0" * 5000 + "1",
]]
#: what json.loads reads as a float and Arrow reads its own way (or not at all)
NAN_TOKENS: list[bytes] = [t.encode() for t in [
    "NaN", "-NaN", "Infinity", "-Infinity", "Inf", "-Inf", "+Inf", "inf", "nan", "infinity", "[NaN]",
    "[1, -Infinity]", '{"v": Infinity}', "[Inf]", " NaN", "\tInfinity",
]]
#: JSON strings: escapes, surrogates, NUL, numbers and enum values as text, bad escapes
STRINGS: list[bytes] = [
    b'"\\ud800"', b'"\\udfff"', b'"a\\ud800b"', b'"\\udc00\\ud800"', b'"\\ud83d\\ude00"', b'"\\uD83D\\uDE00"',
    b'"\\ud83d"', '"\U0001f600"'.encode(), b'"\\u0000"', b'"a\\u0000b"', b'"\\\\ud800"', b'"\\/"',
    b'"\\"q\\""', b'"\\u00e9"', '"é"'.encode(), b'"\\t"', b'"\\n"', b'"\\u2028"', '"\u2028"'.encode(),
    b'"\\u0065mployed"', b'"employed"', b'"EMPLOYED"', b'"view"', b'"click"', b'"12.50"', b'" 12 "',
    b'"1e5"', b'"-0"', b'"0x10"', b'"NaN"', b'"Infinity"', b'"1,000.00"', b'""', b'" "', b'"u42"',
    b'"APP-000000000001"', b'"APP-00000000000"', b'"' + b"x" * 70 + b'"', b'"\x7f"', '"\ufeff"'.encode(),
    b'"\\q"', b'"\\x41"', b'"\\u12"', b'"a\tb"', b'"a\x01b"',
]
#: text for date and timestamp fields, and epoch numbers
TIMES: list[bytes] = [_j(t) for t in [
    "2024-05-01T12:00:00Z", "2024-05-01T12:00:00.123Z", "2024-01-01T00:00:00+05:30",
    "2024-01-01 00:00:00Z", "2024-01-01T00:00:00.123456789Z", "2024-01-01T00:00:00.1234567Z",
    "2024-02-30T00:00:00Z", "2024-06-30T23:59:60Z", "0000-01-01T00:00:00Z", "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59.999999-01:00", "2024-01-01", "20240101T000000Z",
    "2024-01-01T00:00Z", "2024-01-01t00:00:00z", "2024-01-01T00:00:00+0530", "2024-01-01T00:00:00",
    "2024-01-01T24:00:00Z", " 2024-01-01T00:00:00Z", "2024-1-1T00:00:00Z", "2024-01-01T00:00:00,5Z",
    "2020-01-01", "2020-1-1", "20200101", "2020-02-29", "2021-02-29", "9999-12-31", "+2020-01-01",
    "2020-01-01T00:00:00Z",
]] + [b"1714564800000", b"1714564800000.5", b"-1"]
#: objects and arrays, shallow and deep (around the columnar path's bracket limit, and
#: beyond json.loads' recursion limit)
NESTED: list[bytes] = [
    b"{}", b"[]", b'{"a":1}', b"[1,2]", b'[1,"a"]', b'{"a":{"b":[null]}}', b"[[[]]]", b"[null]",
    b'{"a":null}', b'{"a":1,"a":2}', b'{"":0}', b'{"$date":0}', b"[" * 200 + b"]" * 200,
    b"[" * 300 + b"]" * 300, b'{"a":' * 130 + b"1" + b"}" * 130, b"[" * 1100 + b"]" * 1100,
]
LITERALS: list[bytes] = [b"null", b"true", b"false", b"True", b"None", b"undefined", b"nul", b"tru"]
#: the fuzz target's pools: its hostile tokens, and its values in both spellings
FUZZ_VALUES: list[bytes] = sorted(set(fuzz_decoder.TOKENS) | {
    _j(v, a) for v in fuzz_decoder.VALUES for a in (True, False)})
#: keys: every field of both schemas, the fuzz target's keys, and some of our own
KEYS: list[bytes] = sorted(
    {_j(k) for k in FIELDS} | {_j(k, a) for k in fuzz_decoder.KEYS for a in (True, False)}
    | {b'"zz"', b'"extra"', b'"price)"', b'"dwell_ms)"', b'"a/b"', b'"Column(/x)"', b'"r\\u0065gion"',
       b'"event\\u005fid"', b'"\\ud800"', b'"\\u0000"', b'"submitted_at "', '"é"'.encode()})

_keys = st.sampled_from([_j(k) for k in FIELDS]) | st.sampled_from(KEYS)
_raw = st.one_of(st.sampled_from(NUMBERS), st.sampled_from(NAN_TOKENS), st.sampled_from(STRINGS),
                 st.sampled_from(TIMES), st.sampled_from(NESTED), st.sampled_from(LITERALS),
                 st.sampled_from(FUZZ_VALUES))

ITEM_SEPARATORS = [b",", b", ", b" , ", b",\t", b"\t,", b",\n", b"\r\n,", b", \r", b",\x0c", b",\x0b",
                   b"\xc2\xa0,"]
KEY_SEPARATORS = [b":", b": ", b" : ", b":\t", b"\t:", b":\n", b"\r:"]
PADS = [b"", b" ", b"\t", b"\n", b"\r\n", b" \t "]


def _pairs(value: bytes) -> list[tuple[bytes, bytes]]:
    return [(_j(k), _j(v)) for k, v in json.loads(value).items()]


def _spell(pairs: Sequence[tuple[bytes, bytes]], item: bytes = b", ", colon: bytes = b": ",
           left: bytes = b"", right: bytes = b"") -> bytes:
    return b"{" + left + item.join(k + colon + v for k, v in pairs) + right + b"}"


RECORD_PAIRS = [_pairs(v) for v in APPLICANT_RECORDS[:60] + CLICK_RECORDS[:60]]


@st.composite
def edited_records(draw: st.DrawFn) -> bytes:
    """A valid record with zero to four edits (a value replaced, nulled or dropped, a key
    repeated with another value, a key added), sometimes spelt with odd separators."""
    pairs = list(draw(st.sampled_from(RECORD_PAIRS)))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(("set", "set", "set", "null", "drop", "repeat", "add", "add")))
        if op == "add" or not pairs:
            pairs.insert(draw(st.integers(0, len(pairs))), (draw(_keys), draw(_raw)))
            continue
        i = draw(st.integers(0, len(pairs) - 1))
        if op == "set":
            pairs[i] = (pairs[i][0], draw(_raw))
        elif op == "null":
            pairs[i] = (pairs[i][0], b"null")
        elif op == "drop":
            del pairs[i]
        else:
            pairs.insert(draw(st.integers(0, len(pairs))), (pairs[i][0], draw(_raw | st.just(b"null"))))
    if draw(st.integers(0, 3)) == 0:
        return _spell(pairs, draw(st.sampled_from(ITEM_SEPARATORS)), draw(st.sampled_from(KEY_SEPARATORS)),
                      draw(st.sampled_from(PADS)), draw(st.sampled_from(PADS)))
    return _spell(pairs)


def _padded(record: bytes, size: int) -> bytes:
    """``record`` (an object) with an unknown string field that makes it ``size`` bytes long."""
    head = record.rstrip()[:-1].rstrip()
    head += b'"pad": "' if head.endswith(b"{") else b', "pad": "'
    return head + b"p" * max(size - len(head) - 2, 0) + b'"}'


#: whole-value damage: spacing around and inside, several objects, truncation, other
#: encodings, comments, sizes around both schemas' payload.max_bytes
WHOLE: list[Callable[[bytes], bytes]] = [
    lambda r: b" " + r, lambda r: r + b" ", lambda r: b"\t" + r + b"\r\n", lambda r: r + b"\n",
    lambda r: r.replace(b", ", b",\n"), lambda r: r.replace(b": ", b":\r"),
    lambda r: r.replace(b", ", b",\t"), lambda r: r + b" " + r, lambda r: r + r, lambda r: r + b"{}",
    lambda r: b"{} " + r, lambda r: r + b"\t{}", lambda r: b"[" + r + b"]", lambda r: r[:-1],
    lambda r: r[: len(r) // 2], lambda r: r[:-1] + b",}", lambda r: r.replace(b'"', b"'"),
    lambda r: b"\xef\xbb\xbf" + r, lambda r: r + b"\x00", lambda r: r[:5] + b"\xff" + r[5:],
    lambda r: r[:-2] + b"\xed\xa0\x80" + r[-2:], lambda r: r[:-2] + b"\xc0\xaf" + r[-2:],
    lambda r: r[:-2] + b"\xc3" + r[-2:], lambda r: r.replace(b"{", b"{ /* c */ ", 1),
    lambda r: r.replace(b", ", b", // c\n", 1), lambda r: _padded(r, 16384), lambda r: _padded(r, 16385),
    lambda r: _padded(r, 65536), lambda r: _padded(r, 65537),
]
SPECIAL: list[bytes | None] = [None, b"", b" ", b"{}", b"{ }", b"null", b"[]", b"1", b'"x"', b"{}{}",
                               b"{} {}", b"\n", *UNDECODABLE]

#: what fuzzkit.Mutator needs of a target (the decoder target's pools and generators)
_MUTATION_TARGET = SimpleNamespace(weights=fuzz_decoder.DecoderTarget.weights, tokens=fuzz_decoder.TOKENS,
                                   generate=fuzz_decoder.generate_record,
                                   mutate_structured=fuzz_decoder.mutate_record,
                                   generate_huge=fuzz_decoder.generate_huge)
_SEEDS = fuzzkit.mutation_seeds(DECODER_CORPUS) + APPLICANT_RECORDS[:20]


def _fuzzed(rng: random.Random) -> bytes:
    """One input of the fuzz target's own generator and mutators (no huge inputs)."""
    kind = rng.randrange(3)
    out: bytes | None
    if kind == 0:
        out = fuzz_decoder.generate_record(rng)
    elif kind == 1:
        seed = rng.choice(_SEEDS)
        out = fuzz_decoder.mutate_record(seed, rng) or seed
    else:
        out = fuzzkit.Mutator(_SEEDS, rng, _MUTATION_TARGET, 16 * 1024, huge=False).next()
    assert isinstance(out, bytes)
    return out


_valid = st.sampled_from(APPLICANT_RECORDS) | st.sampled_from(CLICK_RECORDS)
_edited = edited_records()
records = st.one_of(
    _valid, _valid, _edited, _edited, _edited,
    st.sampled_from(CORPUS),
    st.builds(lambda r, damage: damage(r), _valid | _edited, st.sampled_from(WHOLE)),
    st.sampled_from(SPECIAL),
    st.randoms(use_true_random=False).map(_fuzzed),
)

# --------------------------------------------------------------------------- the properties


@pytest.mark.slow  # ~30 s: `make test`, not `make check`
@_HYPOTHESIS_MORE
@given(st.lists(records, min_size=1, max_size=24))
def test_columnar_and_per_record_paths_agree(values: list[bytes | None]) -> None:
    check_batch(values)


@pytest.mark.slow  # ~20 s
@_HYPOTHESIS
@given(st.lists(_valid | _edited, min_size=1, max_size=40))
def test_paths_agree_on_mostly_valid_batches(values: list[bytes | None]) -> None:
    """Batches the fast path takes mostly whole, so the edits meet Arrow's reads (and the
    read-type switches) rather than the byte checks before them."""
    check_batch(values)


# --------------------------------------------------------------------------- explicit cases


def test_the_fast_path_reads_clean_records() -> None:
    """Clean records all take the columnar path (slow == 0), so the agreement above is not
    everything quietly going per record."""
    stream = STREAMS["credit_applicant"]
    values = CLEAN_APPLICANT_RECORDS
    slow = _prepare(stream, values, None)
    decoder = stream.decoder()
    for label in ("fresh", "again"):  # the second time with the read types it learnt
        fast = _prepare(stream, values, decoder)
        assert fast.slow == 0, label
        assert fast.prepared.rows.num_rows == len(values) and fast.prepared.rejected_rows == 0
        _assert_same(fast, slow, values, f"clean applicants, {label} decoder")
    clicks = STREAMS["clicks"]
    clean_clicks = [v for v in CLICK_RECORDS if b'"bad-' not in v]
    fast = _prepare(clicks, clean_clicks, clicks.decoder())
    assert fast.slow == 0 and fast.prepared.rejected_rows == 0


def test_a_few_hostile_records_cost_only_themselves() -> None:
    """Records the byte checks or Arrow refuse go per record, alone: the rest of the batch
    stays columnar."""
    values: list[bytes | None] = list(CLEAN_APPLICANT_RECORDS[:200])
    hostile = [None, b"", b"\xff", APPLICANT_RECORDS[0][:-1], b"[]",
               _spell([*_pairs(CLEAN_APPLICANT_RECORDS[0]), (b'"region"', b"NaN")]),
               _spell([*_pairs(CLEAN_APPLICANT_RECORDS[1]), (b'"region"', b"1")]),
               _spell([*_pairs(CLEAN_APPLICANT_RECORDS[2]), (b'"region"', b'"a"'), (b'"region"', b'"b"')])]
    for i, bad in enumerate(hostile):
        values.insert(25 * i + 7, bad)
    fast = check_batch(values, schemas=["credit_applicant"])
    assert fast["credit_applicant"] == 200


def _with(base: dict[str, Any], key: str, token: bytes | None) -> bytes:
    """``base`` as JSON with ``key`` set to the raw ``token`` (None: the key left out)."""
    pairs = [(_j(k), _j(v)) for k, v in base.items() if k != key]
    if token is not None:
        pairs.append((_j(key), token))
    return _spell(pairs)


_SWEEP = NUMBERS + NAN_TOKENS + STRINGS + TIMES + NESTED + LITERALS + fuzz_decoder.TOKENS


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_field_with_every_nasty_value(name: str) -> None:
    """Every known field (and an unknown one) absent, null and holding each token of the
    pools above and of the fuzz target's tokens: once between valid records, once in a
    batch of such records only (in reverse, so other tokens come first and may switch
    read types)."""
    base = APPLICANT if name == "credit_applicant" else CLICK
    valid = (APPLICANT_RECORDS if name == "credit_applicant" else CLICK_RECORDS)[1:]
    for key in [*base, "zz_unknown"]:
        nasty = [_with(base, key, None), _with(base, key, b"null"), *(_with(base, key, t) for t in _SWEEP)]
        batch: list[bytes | None] = []
        for i, record in enumerate(nasty):
            batch += [record, valid[i % len(valid)]]
        check_batch(batch, schemas=[name])
        check_batch(nasty[::-1], schemas=[name])


def _click(extra: bytes = b"", base: bytes = (b'{"event_id":"e1","user_id":"u1","item_id":"i1",'
                                              b'"event_type":"view","event_time":"2024-05-01T12:00:00Z"')
           ) -> bytes:
    """A valid clicks record with ``extra`` (``,"key":value`` text) before its closing brace."""
    return base + extra + b"}"


CLICK_TEXT = _click()[:-1]
NASTY_CASES = {
    # json.loads refuses integers of more than 4,300 digits (sys.get_int_max_str_digits)
    "unknown-int-over-4300-digits": [_click(b',"zz":' + b"1" * 4301)],
    "nested-unknown-int-over-4300-digits": [_click(b',"zz":[-' + b"1" * 4301 + b"]")],
    "known-int-over-4300-digits": [_click(b',"dwell_ms":' + b"1" * 4301), _click(b',"price":' + b"1" * 4301)],
    # a field's read type switches in the middle of a micro-batch (first record: no price)
    "read-type-switch-mid-batch": [_click(), _click(b',"price":1.5'), _click(b',"price":2.5')],
    "unknown-1e400": [_click(b',"zz":1e400'), _click(b',"zz":-1e400')],
    "arrow-only-nan-tokens": [_click(b',"dwell_ms":Inf'), _click(b',"dwell_ms":-NaN'), _click(b',"zz":-Inf')],
    "nan-in-decimal": [_click(b',"price":NaN'), _click(b',"price":-Infinity')],
    "nested-nan-in-unknown": [_click(b',"zz":[NaN,{"x":Infinity}]')],
    "floats-in-int": [_click(b',"dwell_ms":' + t) for t in (b"2.0", b"-0", b"-0.0", b"1e-400", b"1e400",
                                                              b"1E3")],
    "big-ints": [_click(b',"' + k + b'":' + str(v).encode()) for k in (b"price", b"dwell_ms", b"zz")
                 for v in (2**53 + 1, 2**63, 10**30)],
    "price-number-first": [_click(b',"price":12.5'), _click(b',"price":9007199254740993'),
                           _click(b',"price":"12.50"'), _click(b',"price":-0')],
    "duplicate-keys": [_click(b',"event_id":"e2"'), _click(b',"zz":1,"zz":2'),
                       _click(b',"session_id":null,"session_id":"s"'), _click(b',"\\u0065vent_id":"e3"')],
    "surrogates": [_click(b',"session_id":"\\ud800"'), _click(b',"session_id":"\\ud83d\\ude00"'),
                   _click(b',"\\udfff":1'), _click(b',"session_id":"\\\\ud800"')],
    "nul": [_click(b',"session_id":"\\u0000"'), _click(b',"\\u0000":1')],
    "several-objects-in-one-value": [_click() + b" " + _click(), _click() + b"{}", _click() + b"\t{}"],
    "whitespace": [CLICK_TEXT.replace(b",", b",\n") + b"}", CLICK_TEXT.replace(b",", b",\t") + b"}",
                   CLICK_TEXT.replace(b",", b",\r") + b"}", b" " + _click(), _click() + b" ",
                   CLICK_TEXT.replace(b",", b",\x0c") + b"}"],
    "unknown-changing-kinds": [_click(b',"zz":' + t) for t in (b"null", b"1", b'"a"', b"[1]", b'{"a":1}',
                                                               b"{}", b"[]", b"null", b"1.5", b"true")],
    "required-absent-vs-null": [CLICK_TEXT.replace(b'"event_id":"e1",', b"") + b"}",
                                CLICK_TEXT.replace(b'"e1"', b"null") + b"}", _click(b',"dwell_ms":null')],
    "bytes-and-sizes": [None, b"", b"\xff" + _click(), _click(b',"x":"\xed\xa0\x80"'),
                        _click(b',"x":"\xc0\xaf"'), _click(b',"x":"\xf4\x90\x80\x80"'),
                        _click(b',"x":"\xe0\x80\x80"'), b'{"a":"\xc3', b'\xa9"}',
                        _padded(_click(), 16384), _padded(_click(), 16385)],
    "deep-nesting": [_click(b',"zz":' + b"[" * n + b"]" * n) for n in (255, 257, 2000)],
}


@pytest.mark.parametrize("values", [pytest.param(v, id=k) for k, v in NASTY_CASES.items()])
def test_nasty_cases(values: list[bytes | None]) -> None:
    """Each case as a batch, reversed, and each record before a valid one (clicks)."""
    check_batch(values)
    check_batch(values[::-1])
    for v in values:
        check_batch([v, _click()], schemas=["clicks"])


@pytest.mark.parametrize(("name", "group"), [pytest.param(n, g, id=n) for n, g in DECODER_CORPUS])
def test_decoder_corpus_file(name: str, group: list[bytes]) -> None:
    check_batch(group)
    check_batch([*APPLICANT_RECORDS[:3], *group, *CLICK_RECORDS[:3]])
