"""The fingerprint: sha256 of the canonical JSON of a schema's semantics.

Two schemas with the same fingerprint validate, transform and store data the same
way. Descriptions, the file path and line numbers do not count (editing a comment
or moving a file changes nothing), nor a field's ``source`` (the input name it is read
from: it changes how input is read, not what is stored or how it is checked, so the
stored data, the hot hashes and the load ledger stay valid when a producer's column
name is mapped anew); everything else does, including the name and the
version, field order, enum value order and evolution rules. The ``quality:`` section
(the gates, the freshness SLA, the owner) does not count either: a gate decides whether a
load is stored, not what is stored, so raising a gate is no new data version (no
migration, the ledger and the stored rows stay valid); :func:`gates_fingerprint` is
the section's own sha256, shown beside the fingerprint. A field's
``null_values`` count (unlike ``source``, they decide which input rows are valid and
what is stored for them: a marker is stored as null or the default), as
``accept_strings`` and ``empty_as_null`` do.

The canonical JSON is deterministic across processes and platforms: sorted keys,
no whitespace, sets (``store``) as sorted lists, Decimals as their exact strings
(``"0.01"``), floats as ``repr``, enums as their values, ASCII-only output. A
``"fingerprint_format"`` key versions the encoding itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from decimal import Decimal
from enum import Enum
from typing import Any, Final

from features.schema.model import Aggregation, Field, Quality, Schema

__all__ = ["FINGERPRINT_FORMAT", "canonical_json", "canonical_value", "fingerprint", "gates_fingerprint"]

#: bump when the encoding below changes (every fingerprint changes with it).
FINGERPRINT_FORMAT: Final = 1
#: dataclass attributes that carry no semantics.
_IGNORED: Final = frozenset({"description", "path", "line", "text",
                             # how the SDK serves hot values, not how data is stored
                             "refresh_after_seconds"})
#: attributes ignored on one model class only (``Feature.source``, its input field, counts)
#: and ``Schema.quality``: the gates decide whether a load is stored, not what a stored row
#: is, so a changed gate is not a new data version (:func:`gates_fingerprint` is theirs)
_IGNORED_ON: Final[dict[type, frozenset[str]]] = {Field: frozenset({"source"}),
                                                  Schema: frozenset({"quality"})}
#: attributes added after format 1 shipped: left out while unset (None, or an empty
#: tuple for ``null_values``), so the fingerprints of schemas that do not use them stay
#: what they were.
_OMIT_WHEN_NONE: Final = frozenset({"aggregations", "items", "k"})
_OMIT_WHEN_EMPTY: Final = frozenset({"null_values"})
#: the same for flags added later, left out while False (``Schema.static``)
_OMIT_WHEN_FALSE: Final = frozenset({"static"})
#: the same, on one model class only (``FieldType.scale`` has always counted)
_OMIT_WHEN_NONE_ON: Final[dict[type, frozenset[str]]] = {
    Aggregation: frozenset({"scale", "precision", "q", "relative_accuracy"}),
    # unset: the window's defaults (a section without them keeps its gates fingerprint)
    Quality: frozenset({"window_records", "window_min_records"}),
}


def _unset(name: str, value: Any, owner: type | None = None) -> bool:
    """Whether attribute ``name`` of an ``owner`` holding ``value`` is left out of the canonical JSON."""
    if value is None and owner is not None and name in _OMIT_WHEN_NONE_ON.get(owner, frozenset()):
        return True
    return ((name in _OMIT_WHEN_NONE and value is None) or (name in _OMIT_WHEN_EMPTY and value == ())
            or (name in _OMIT_WHEN_FALSE and value is False))


def _canonical(value: Any) -> Any:
    """A JSON-ready picture of a model value; raises TypeError for a type it does not know."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        ignored = _IGNORED | _IGNORED_ON.get(type(value), frozenset())
        return {
            f.name: _canonical(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.name not in ignored and not _unset(f.name, getattr(value, f.name), type(value))
        }
    if isinstance(value, Enum):
        return _canonical(value.value)
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value  # json writes repr(); NaN/inf never reach a parsed schema
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (frozenset, set)):
        return sorted(_canonical(v) for v in value)
    if isinstance(value, (tuple, list)):
        return [_canonical(v) for v in value]
    raise TypeError(f"cannot fingerprint a {type(value).__name__}: {value!r}")


def canonical_value(value: Any) -> Any:
    """The JSON-ready picture of a model value (a dataclass of ``features.schema.model``
    or one built of them, such as a view), under the rules of the module docstring."""
    return _canonical(value)


def canonical_json(schema: Schema) -> str:
    """The canonical JSON text of ``schema``'s semantics (see the module docstring)."""
    doc = {"fingerprint_format": FINGERPRINT_FORMAT, "schema": _canonical(schema)}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def fingerprint(schema: Schema) -> str:
    """Hex sha256 (64 lowercase characters) of :func:`canonical_json`. Pure and deterministic."""
    return hashlib.sha256(canonical_json(schema).encode("ascii")).hexdigest()


def gates_fingerprint(schema: Schema) -> str | None:
    """Hex sha256 of the canonical JSON of ``schema``'s ``quality:`` section (its lines
    ignored), None without one: what changes when a gate changes, which the data
    version (:func:`fingerprint`) never does."""
    if schema.quality is None:
        return None
    doc = {"fingerprint_format": FINGERPRINT_FORMAT, "quality": _canonical(schema.quality)}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()
