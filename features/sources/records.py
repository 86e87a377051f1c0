"""Kafka records -> one Arrow batch of rows for the validator, and a reject for every
record that is not a row.

A record becomes a row when its value is at most ``payload.max_bytes`` bytes, is UTF-8,
parses as JSON (``json.loads``, C speed; ``NaN``/``Infinity`` tokens are read as floats
so the field rules reject them with a field-level error), is a JSON object and holds no
lone surrogate (a ``"\\ud800"`` escape: text UTF-8, Arrow and PostgreSQL cannot hold).
Every other record is a ``decode`` reject on the pseudo-field ``_payload``; nothing is
dropped. A record over the limit is refused by its length alone, before any decoding.
Keys the schema does not read are ignored; ``unknown_fields`` counts, per unknown key,
the records in which it holds a value (not null), in a :class:`TopCounter` (the
``UNKNOWN_FIELDS_TOP`` most frequent keys and an ``other`` count). The keys read (``known``) are the
fields' input names: a field's ``source:`` (``"Dep Delay"``), else its name, so with a
source the field's own name is an unknown key. The rows are one record batch with a
column per known key (:func:`features.validation.values.objects_batch`: each value keeps
its JSON kind, so a wrong type in one field of one record is that field's reject), named
by the record's keys; :func:`features.sources.names.as_fields` renames them.

Lineage of a record: ``kafka://<topic>/<partition>/<offset>``.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.compile.rejects import REJECT_SCHEMA
from features.compile.rules import ReasonCode
from features.validation.values import objects_batch

PAYLOAD_FIELD = "_payload"
#: how many unknown keys a summary names (the most frequent); the rest are counted in ``other``
UNKNOWN_FIELDS_TOP = 100


class TopCounter(Counter[str]):
    """A Counter of at most ``2 * top`` keys: when an update takes it past that, all but
    the ``top`` largest counts are moved into ``other`` (a key seen again later starts a
    new count). ``sum(self.values()) + self.other`` is always the total counted, so the
    memory is bounded however many distinct keys arrive. Updating with (or ``+=``)
    another TopCounter adds its ``other`` too; a copy or a pickle keeps ``top`` and
    ``other``."""

    def __init__(self, counts: Mapping[str, int] | None = None, /, *, top: int = UNKNOWN_FIELDS_TOP,
                 other: int = 0) -> None:
        self.top = top
        self.other = other
        super().__init__()
        if counts:
            self.update(counts)

    def update(self, other: Iterable[str] | Mapping[str, int] | None = None,  # type: ignore[override]
               /, **kwargs: int) -> None:
        super().update(other, **kwargs)
        if isinstance(other, TopCounter):
            self.other += other.other
        if len(self) > 2 * self.top:
            self._prune(self.top)

    def __iadd__(self, other: Mapping[str, int]) -> TopCounter:  # type: ignore[override,misc]
        self.update(other)
        return self

    def copy(self) -> TopCounter:
        return TopCounter(dict(self), top=self.top, other=self.other)

    def __reduce__(self) -> tuple[Any, ...]:
        return _top_counter, (dict(self), self.top, self.other)

    def _prune(self, keep: int) -> None:
        kept = dict(self.most_common(keep))
        self.other += sum(v for k, v in self.items() if k not in kept)
        self.clear()
        super().update(kept)

    def shown(self) -> tuple[dict[str, int], int]:
        """The ``top`` largest counts (largest first) and the count of everything else."""
        kept = dict(self.most_common(self.top))
        return kept, self.other + sum(self.values()) - sum(kept.values())


def _top_counter(counts: dict[str, int], top: int, other: int) -> TopCounter:
    """A :class:`TopCounter` again (what its pickle calls)."""
    return TopCounter(counts, top=top, other=other)


#: The Kafka header HTTP ingest writes on each record it produces (the same name as
#: ``features.serve.ingest.SOURCE_HEADER``): ``http://<request id>#<index>``.
SOURCE_HEADER = "featureline-source"
#: a header value the lineage keeps (serve's request id charset and length); any other
#: value (longer, other bytes, not UTF-8) is left out, so a producer cannot write junk
VIA_PATTERN = r"^http://[A-Za-z0-9._:-]{1,128}#[0-9]{1,10}$"
#: between a record's Kafka coordinates and the source its producer named
VIA = " via "


def record_uris(topics: pa.Array, partitions: pa.Array, offsets: pa.Array,
                via: pa.Array | None = None) -> pa.Array:
    """``kafka://topic/partition/offset`` per record (Arrow kernels, no loop); with
    ``via`` (per record, the ``featureline-source`` header's bytes, or null) a record whose
    header matches :data:`VIA_PATTERN` gets ``kafka://topic/partition/offset via
    http://<request id>#<index>``; the others keep the Kafka URI alone."""
    uris = pc.binary_join_element_wise(
        "kafka://", pc.cast(topics, pa.string()), "/", pc.cast(partitions, pa.string()), "/",
        pc.cast(offsets, pa.string()), "")
    if via is None or len(via) == 0:
        return uris
    via = pc.cast(via, pa.binary())
    ok = pc.fill_null(pc.match_substring_regex(via, VIA_PATTERN), False)
    if not pc.any(ok).as_py():
        return uris
    text = pc.cast(pc.if_else(ok, via, pa.scalar(b"", pa.binary())), pa.string())  # ASCII: matched
    return pc.if_else(ok, pc.binary_join_element_wise(uris, text, VIA), uris)


@dataclass
class Decoded:
    """``batch``: the decoded JSON objects, one row each (a column per known key,
    :func:`~features.validation.values.objects_batch`); ``index``: their record
    positions; ``rejects``: validator-shaped rejects (``row`` = record position) for the
    others; ``failed``: their record positions."""

    batch: pa.RecordBatch
    index: npt.NDArray[np.int64]
    rejects: pa.Table
    failed: npt.NDArray[np.int64]
    unknown_fields: TopCounter = field(default_factory=TopCounter)


#: what the rejects table and the dead-letter topic keep of a record over payload.max_bytes
TRUNCATED_PREFIX_BYTES = 1024


def payload_json(value: bytes | None, max_bytes: int | None = None) -> str:
    """A record's payload as JSON text that jsonb accepts: ``{"_payload": "<text>"}``, or
    ``{"_payload_base64": "..."}`` when it is not UTF-8 or when escaping would more than
    double it (control characters), ``{"_payload": null}`` when absent.

    A record over ``max_bytes`` keeps only its first ``TRUNCATED_PREFIX_BYTES`` bytes
    (``{"_payload_prefix_base64": "...", "_payload_bytes": n}``; the record itself stays
    in Kafka at its offset), so the size limit bounds the rejects table and the
    dead-letter messages too: at most about twice ``max_bytes``.
    """
    if value is None:
        return '{"_payload": null}'
    if max_bytes is not None and len(value) > max_bytes:
        prefix = base64.b64encode(value[:TRUNCATED_PREFIX_BYTES]).decode("ascii")
        return json.dumps({"_payload_prefix_base64": prefix, "_payload_bytes": len(value)})
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return json.dumps({"_payload_base64": base64.b64encode(value).decode("ascii")})
    out = json.dumps({"_payload": text.replace("\x00", "\\u0000")}, ensure_ascii=False)
    if len(out) > 2 * len(value) + 16:  # \u0001 is 6 bytes for 1: base64 is 4 for 3
        return json.dumps({"_payload_base64": base64.b64encode(value).decode("ascii")})
    return out


def _json_kind(obj: Any) -> str:
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "boolean"
    if isinstance(obj, int | float):
        return "number"
    return {"list": "array", "str": "string"}.get(type(obj).__name__, type(obj).__name__)


def _has_lone_surrogate(value: bytes, obj: dict[str, Any]) -> bool:
    """Whether a decoded object holds a lone surrogate. Only JSON escapes can make one
    (UTF-8 input cannot), so the object is re-encoded only when the text has a
    ``\\ud8..``-``\\udf..`` escape, which valid surrogate pairs (emoji) have too."""
    if b"\\ud" not in value and b"\\uD" not in value:
        return False
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def decode(values: Sequence[bytes | None], *, max_bytes: int, known: frozenset[str]) -> Decoded:
    """Decode record values (see the module docstring). One ``json.loads`` per record.
    ``known``: the JSON keys the schema reads (``Schema.input_names``)."""
    rows: list[dict[str, Any]] = []
    index: list[int] = []
    bad_rows: list[int] = []
    messages: list[str] = []
    unknown = TopCounter()
    for i, value in enumerate(values):
        problem = None
        if value is None:
            problem = "record has no value (a tombstone)"
        elif len(value) > max_bytes:
            problem = (f"record value is {len(value):,} bytes, over the schema's "
                       f"payload.max_bytes {max_bytes:,}")
        else:
            try:
                obj = json.loads(value.decode("utf-8"))
            except UnicodeDecodeError as exc:
                problem = f"record value is not UTF-8: {exc.reason} at byte {exc.start}"
            except RecursionError:
                problem = "record value is not usable JSON: nested too deeply"
            except ValueError as exc:  # JSONDecodeError, and ints beyond the digit limit
                problem = f"record value is not valid JSON: {exc}"
            else:
                if not isinstance(obj, dict):
                    problem = f"record value is a JSON {_json_kind(obj)}, expected an object"
                elif _has_lone_surrogate(value, obj):
                    problem = ("record value holds a lone surrogate escape (such as \\ud800), which "
                               "UTF-8 cannot encode")
                else:
                    rows.append(obj)
                    index.append(i)
                    extra = obj.keys() - known
                    if extra:
                        unknown.update(k for k in extra if obj[k] is not None)
                    continue
        bad_rows.append(i)
        messages.append(problem)
    n = len(bad_rows)
    rejects = pa.table({
        "row": pa.array(bad_rows, pa.int64()),
        "field": pa.array([PAYLOAD_FIELD] * n, pa.string()),
        "rule": pa.array([f"{PAYLOAD_FIELD}.{ReasonCode.DECODE.value}"] * n, pa.string()),
        "reason": pa.array([ReasonCode.DECODE.value] * n, pa.string()),
        "message": pa.array(messages, pa.string()),
        "value": pa.nulls(n, pa.string()),
    }, schema=REJECT_SCHEMA)
    return Decoded(objects_batch(rows, sorted(known)), np.asarray(index, dtype=np.int64), rejects,
                   np.asarray(bad_rows, dtype=np.int64), unknown)
