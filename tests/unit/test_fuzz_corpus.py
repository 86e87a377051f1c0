"""Hostile input, in CI: every fuzz corpus file and a few thousand generated inputs go
through the schema parser and the Kafka record path without a crash (fuzz/README.md).

The long runs (100,000 inputs per target) are ``fuzz/fuzz_schema.py`` and
``fuzz/fuzz_decoder.py``; this replays what they start from and what they found, and
runs their mutators and Hypothesis strategies for a short, seeded while.
"""

from __future__ import annotations

import json
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "fuzz"
sys.path.insert(0, str(FUZZ))

import fuzz_decoder  # noqa: E402
import fuzz_schema  # noqa: E402
import fuzzkit  # noqa: E402

from features.sources.records import TRUNCATED_PREFIX_BYTES, decode, payload_json  # noqa: E402

SCHEMA_CORPUS = FUZZ / "corpus" / "schema"
DECODER_CORPUS = FUZZ / "corpus" / "decoder"
_HYPOTHESIS = settings(max_examples=80, derandomize=True, deadline=None, database=None,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def schema_target() -> Iterator[fuzz_schema.SchemaTarget]:
    target = fuzz_schema.SchemaTarget()
    yield target
    target.close()


@pytest.fixture(scope="module")
def decoder_target() -> fuzz_decoder.DecoderTarget:
    return fuzz_decoder.DecoderTarget()


def _files(corpus: Path) -> list[tuple[str, list[bytes]]]:
    return fuzzkit.read_corpus(corpus)


def _params(corpus: Path) -> list[Any]:
    return [pytest.param(name, group, id=name) for name, group in _files(corpus)]


def test_the_corpora_are_small_and_complete() -> None:
    size = sum(p.stat().st_size for p in (FUZZ / "corpus").rglob("*") if p.is_file())
    assert size < 1_000_000
    names = {name for name, _ in _files(SCHEMA_CORPUS)}
    shipped = {f"shipped/{p.name}" for p in (ROOT / "schemas").glob("*.yaml")}
    bad = {f"bad/{p.name}" for p in (ROOT / "tests" / "unit" / "bad_schemas").glob("*.yaml")}
    assert shipped | bad <= names, "copy new schemas and bad_schemas into fuzz/corpus/schema"
    assert len(_files(DECODER_CORPUS)) >= 30


@pytest.mark.parametrize(("name", "group"), _params(SCHEMA_CORPUS))
def test_schema_corpus_file(schema_target: fuzz_schema.SchemaTarget, name: str, group: list[bytes]) -> None:
    outcomes = fuzzkit.run_group(schema_target, group)  # raises Crashed on a crash
    if name.startswith("shipped/"):
        assert outcomes == {"schema ok, compiled and validated": 1}
    elif name.startswith("bad/"):
        assert len(outcomes) == 1 and next(iter(outcomes)).startswith("schema error")


@pytest.mark.parametrize(("name", "group"), _params(DECODER_CORPUS))
def test_decoder_corpus_file(decoder_target: fuzz_decoder.DecoderTarget, name: str,
                             group: list[bytes]) -> None:
    outcomes = fuzzkit.run_group(decoder_target, group)
    records = len(group) * 2  # both schemas (and maybe a tombstone, counted as a decode reject)
    assert sum(n for k, n in outcomes.items() if k.endswith(": row")) <= records
    if name.endswith("_valid.json"):
        assert outcomes[f"{name.split('_')[0].replace('credit', 'credit_applicant')}: row"] == 1


def test_generated_schemas_do_not_crash(schema_target: fuzz_schema.SchemaTarget) -> None:
    outcomes = fuzzkit.quick_run(schema_target, SCHEMA_CORPUS, inputs=600, seed=20261129, huge=False)
    assert sum(outcomes.values()) >= 600
    assert outcomes["schema ok, compiled and validated"] > 0  # the generator reaches the compiler


def test_generated_records_do_not_crash(decoder_target: fuzz_decoder.DecoderTarget) -> None:
    outcomes = fuzzkit.quick_run(decoder_target, DECODER_CORPUS, inputs=2000, seed=20261129, huge=False)
    assert outcomes["clicks: row"] > 0 and outcomes["credit_applicant: row"] > 0
    assert any("_payload.decode" in k for k in outcomes)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
_field_names = st.sampled_from(fuzz_decoder.KEYS)


@_HYPOTHESIS
@given(st.lists(st.dictionaries(_field_names, _json, max_size=12) | _json, min_size=1, max_size=8),
       st.booleans())
def test_any_json_records(decoder_target: fuzz_decoder.DecoderTarget, records: list[Any],
                          ascii_: bool) -> None:
    group = [json.dumps(r, ensure_ascii=ascii_).encode("utf-8", "surrogatepass") for r in records]
    fuzzkit.run_group(decoder_target, group)


@_HYPOTHESIS
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=8))
def test_any_bytes_as_records(decoder_target: fuzz_decoder.DecoderTarget, group: list[bytes]) -> None:
    fuzzkit.run_group(decoder_target, group)


_yaml_bits = st.text(alphabet=st.sampled_from(list("ab01.-_ :[]{},'\"\n\t#&*!%|>?@`\\\x00\ufeff\u2028é")),
                     max_size=120)


@_HYPOTHESIS
@given(_yaml_bits, st.sampled_from(["", "version: 1.0.0\n", "version: 1.0.0\nfields:\n  - "]))
def test_any_yaml_text(schema_target: fuzz_schema.SchemaTarget, text: str, head: str) -> None:
    fuzzkit.run_group(schema_target, [(head + text).encode("utf-8", "surrogatepass")])


def test_a_50_mb_record_is_refused_unparsed_and_kept_as_a_prefix() -> None:
    record = b'{"event_id": "' + b"x" * (50 * 2**20) + b'"}'
    tracemalloc.start()
    try:
        d = decode([record], max_bytes=16384, known=frozenset({"event_id"}))
        raw = payload_json(record, 16384)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert d.batch.num_rows == 0
    assert "over the schema's payload.max_bytes 16,384" in d.rejects.column("message")[0].as_py()
    assert peak < 1_000_000  # neither decoded nor copied: far below the record's 50 MB
    kept = json.loads(raw)
    assert kept["_payload_bytes"] == len(record) and len(raw) < 2 * TRUNCATED_PREFIX_BYTES


def test_lone_surrogates_and_nested_nan_are_rejects_not_crashes(
        decoder_target: fuzz_decoder.DecoderTarget) -> None:
    d = decode([b'{"event_id": "\\ud800"}', b'{"event_id": "\\ud83d\\ude00"}'], max_bytes=1024,
               known=frozenset({"event_id"}))
    assert d.index.tolist() == [1]  # a surrogate pair (an emoji) is fine
    assert "lone surrogate" in d.rejects.column("message")[0].as_py()
    outcomes = fuzzkit.run_group(decoder_target, [b'{"event_id": "e", "price": [NaN, {"x": -Infinity}]}'])
    assert outcomes["clicks: reject price.type"] == 1
