"""Kafka records -> rows for the validator, and a reject for every record that is not one.

A record becomes a row when its value is at most ``payload.max_bytes`` bytes, is UTF-8,
parses as JSON (``json.loads``, C speed; ``NaN``/``Infinity`` tokens are read as floats
so the field rules reject them with a field-level error) and is a JSON object. Every
other record is a ``decode`` reject on the pseudo-field ``_payload``; nothing is dropped.
Fields the schema does not know are ignored (counted in ``unknown_fields``).

Lineage of a record: ``kafka://<topic>/<partition>/<offset>``.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.compile.rules import ReasonCode
from features.validate.result import REJECT_SCHEMA

PAYLOAD_FIELD = "_payload"


def record_uris(topics: pa.Array, partitions: pa.Array, offsets: pa.Array) -> pa.Array:
    """``kafka://topic/partition/offset`` per record (Arrow kernels, no loop)."""
    return pc.binary_join_element_wise(
        "kafka://", pc.cast(topics, pa.string()), "/", pc.cast(partitions, pa.string()), "/",
        pc.cast(offsets, pa.string()), "")


@dataclass
class Decoded:
    """``rows``: the decoded JSON objects; ``index``: their record positions;
    ``rejects``: validator-shaped rejects (``row`` = record position) for the others;
    ``raw``: per record, its payload as a JSON text for the rejects table."""

    rows: list[dict[str, Any]]
    index: npt.NDArray[np.int64]
    rejects: pa.Table
    failed: npt.NDArray[np.int64]
    unknown_fields: Counter[str] = field(default_factory=Counter)


def payload_json(value: bytes | None) -> str:
    """A record's payload as JSON text that jsonb accepts: ``{"_payload": "<text>"}``, or
    ``{"_payload_base64": "..."}`` when it is not UTF-8, ``{"_payload": null}`` when absent."""
    if value is None:
        return '{"_payload": null}'
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return json.dumps({"_payload_base64": base64.b64encode(value).decode("ascii")})
    return json.dumps({"_payload": text.replace("\x00", "\\u0000")}, ensure_ascii=False)


def _json_kind(obj: Any) -> str:
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "boolean"
    if isinstance(obj, int | float):
        return "number"
    return {"list": "array", "str": "string"}.get(type(obj).__name__, type(obj).__name__)


def decode(values: Sequence[bytes | None], *, max_bytes: int, known: frozenset[str]) -> Decoded:
    """Decode record values (see the module docstring). One ``json.loads`` per record."""
    rows: list[dict[str, Any]] = []
    index: list[int] = []
    bad_rows: list[int] = []
    messages: list[str] = []
    unknown: Counter[str] = Counter()
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
                if isinstance(obj, dict):
                    rows.append(obj)
                    index.append(i)
                    extra = obj.keys() - known
                    if extra:
                        unknown.update(extra)
                    continue
                problem = f"record value is a JSON {_json_kind(obj)}, expected an object"
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
    return Decoded(rows, np.asarray(index, dtype=np.int64), rejects, np.asarray(bad_rows, dtype=np.int64),
                   unknown)
