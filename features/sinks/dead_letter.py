"""Dead letters: the dead-letter topic's messages for rejected records, rendered once for
the stream job (``features.stream.core.StreamProcessor``) and the HTTP ingest service
(``features.serve.ingest``), each fitted to the size the topic accepts.

A dead letter is a JSON object ``{"source", "schema", "schema_version",
"schema_fingerprint", "run_id", "errors": [...], "raw": {...}}`` keyed by the record's
source URI (:func:`dead_letter_messages`); one too large for the topic is cut down
(:func:`_fitted`). What the broker accepts is asked of it by
:func:`features.stream.kafka.dead_letter_limit` (Kafka's admin client lives above the sinks).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pyarrow as pa

from features.compile import CompiledSchema

#: The broker's default ``max.message.bytes`` of a topic (Kafka's ``message.max.bytes``):
#: what a topic created without configs accepts, and the assumption when the broker
#: does not say.
BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


def producer_max_bytes(max_bytes: int) -> int:
    """The ``message.max.bytes`` of a producer of records up to ``max_bytes`` (a schema's
    ``payload.max_bytes``) and of their dead letters (the raw record escaped, its errors):
    twice that plus 64 KiB, at least librdkafka's default."""
    return max(2 * max_bytes + 65_536, 1_048_576)


def dead_letter_messages(rejects: pa.Table, compiled: CompiledSchema, run_id: str, *,
                         max_message_bytes: int = BROKER_DEFAULT_MAX_MESSAGE_BYTES
                         ) -> list[tuple[bytes, bytes]]:
    """The dead-letter topic's (key, value) per reject row: the key is the record's source
    URI, the value a JSON object ``{"source", "schema", "schema_version",
    "schema_fingerprint", "run_id", "errors": [...], "raw": {...}}`` (``errors`` and
    ``raw`` as the rejects table holds them). The stream job and the HTTP ingest service
    (``features.serve``) send the same messages. A loop over rejects only.

    Every message fits a record of ``max_message_bytes`` (the dead-letter topic's
    ``max.message.bytes``, capped by the producer's ``message.max.bytes``; default: the
    broker's default): one that would not is cut down by :func:`_fitted` (``"truncated":
    true``, ``raw`` only a prefix of its text, with the full record's size and sha256), so
    the broker never refuses a dead letter for its size. The rejects table keeps the full
    ``raw`` whatever its size. ValueError when ``max_message_bytes`` is too small for even a
    cut-down message (:data:`DEAD_LETTER_MIN_BYTES`)."""
    if max_message_bytes < DEAD_LETTER_MIN_BYTES:
        raise ValueError(f"max_message_bytes {max_message_bytes} is under {DEAD_LETTER_MIN_BYTES}")
    meta = {"schema": compiled.name, "schema_version": compiled.schema.version_str,
            "schema_fingerprint": compiled.fingerprint, "run_id": run_id}
    head = json.dumps(meta)[1:-1]
    out = []
    for src, raw, errs in zip(rejects.column("_source").to_pylist(), rejects.column("raw").to_pylist(),
                              rejects.column("errors").to_pylist(), strict=True):
        key = src.encode()
        value = f'{{"source": {json.dumps(src)}, {head}, "errors": {errs}, "raw": {raw}}}'.encode()
        budget = max_message_bytes - len(key) - RECORD_OVERHEAD_BYTES
        if len(value) > budget:
            value = _fitted(src, head, errs, raw, len(value), budget)
        out.append((key, value))
    return out


#: Bytes of a one-record Kafka record batch besides its key and value (61 of batch header,
#: the record's varints and attributes), with room to spare.
RECORD_OVERHEAD_BYTES = 1024
#: The smallest ``max_message_bytes`` :func:`dead_letter_messages` accepts: room for a
#: cut-down message with a few errors (a topic's limit is 1 MiB unless someone lowered it).
DEAD_LETTER_MIN_BYTES = 16_384
#: Characters kept of each text in the errors of a cut-down dead letter (a value, a message).
_ERROR_TEXT_CHARS = 1024


def canonical_json(obj: Any) -> str:
    """``obj`` as canonical JSON text (sorted keys, no spaces, UTF-8 characters as they
    are): what a cut-down dead letter's ``raw_sha256`` and ``raw_bytes`` measure, so the
    digest of a rejects-table row's ``raw`` (read back from jsonb, any key order) matches."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _fitted(src: str, head: str, errs: str, raw: str | None, full: int, budget: int) -> bytes:
    """A dead letter cut down to at most ``budget`` bytes: the same fields, ``errors`` with
    each text cut to a prefix (fewer errors only if that is not enough), ``raw`` as
    ``{"_raw_prefix": <the start of its JSON text>}``, plus ``"truncated": true``,
    ``full_bytes`` (the whole message's size), ``raw_bytes`` and ``raw_sha256`` (of
    :func:`canonical_json` of the raw record, as the rejects table holds it)."""
    raw_obj = json.loads(raw) if raw is not None else None
    canonical = canonical_json(raw_obj).encode()
    mark = (f'"truncated": true, "full_bytes": {full}, "raw_bytes": {len(canonical)}, '
            f'"raw_sha256": "{hashlib.sha256(canonical).hexdigest()}"')
    errors = json.loads(errs)
    chars = _ERROR_TEXT_CHARS
    while True:
        cut = [{k: _cut_text(v, chars) for k, v in e.items()} if isinstance(e, dict) else e for e in errors]
        listed = json.dumps(cut, ensure_ascii=False)
        start = (f'{{"source": {json.dumps(src)}, {head}, "errors": {listed}, {mark}, '
                 f'"raw": {{"_raw_prefix": ').encode()
        room = budget - len(start) - 2  # the closing braces
        if room >= 2:  # an empty prefix ("") at least
            return start + _json_prefix(raw or "", room).encode() + b"}}"
        if chars:
            chars //= 4
        elif errors:  # even empty texts do not fit: keep the first half of the errors
            errors = errors[: len(errors) // 2]
        else:  # unreachable with DEAD_LETTER_MIN_BYTES: sources and schema names are short
            raise ValueError(f"a dead letter for {src[:200]!r} cannot fit in {budget} bytes")


def _cut_text(value: Any, chars: int) -> Any:
    """A string longer than ``chars`` cut to its first ``chars`` characters (+ "…"); other
    values as they are."""
    return value[:chars] + "\u2026" if isinstance(value, str) and len(value) > chars else value


def _json_prefix(text: str, room: int) -> str:
    """The JSON string literal of a prefix of ``text`` whose UTF-8 encoding is at most
    ``room`` bytes (``room`` >= 2), as long as a few passes find."""
    k = min(len(text), room)
    while True:
        literal = json.dumps(text[:k], ensure_ascii=False)
        size = len(literal.encode())
        if size <= room:
            return literal
        k = min(k - 1, k * room // size)  # escapes and multi-byte characters: shrink in proportion
