"""The rule program: one ordered list of rules per schema, the single source of truth.

The validator executes these rules; the Postgres DDL and the Great Expectations
suite are translations of the same list. A rule's ``id`` (``field.kind``) is shared
by all three, so counts can be compared rule by rule.

Rule kinds (= reject reason codes):

=============  ==============================================================
missing        a required column is absent from the input
type           a value does not convert exactly to the declared type
not_null       null (or empty string with ``empty_as_null``) where not allowed
nan            NaN in a float field, or an element of a list of floats (never valid)
min / max      inclusive bounds
pattern        the whole string must match the regex
enum           value not among the declared enum values
min_length     string shorter than allowed (characters)
max_length     string longer than allowed (characters)
=============  ==============================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from features.schema.model import Field, ScalarValue, Schema, field_checks


class ReasonCode(StrEnum):
    """Why a row was rejected; one value per rule kind (plus stage-level reasons)."""

    MISSING = "missing"
    TYPE = "type"
    NOT_NULL = "not_null"
    NAN = "nan"
    MIN = "min"
    MAX = "max"
    PATTERN = "pattern"
    ENUM = "enum"
    MIN_LENGTH = "min_length"
    MAX_LENGTH = "max_length"
    # Raised outside the rule program (decoding, transforms, stream lateness):
    DECODE = "decode"
    TRANSFORM = "transform"


@dataclass(frozen=True)
class Rule:
    """One check on one field. ``value`` is the rule's parameter (bound, regex, enum
    values), None for parameterless rules."""

    field: str
    kind: ReasonCode
    value: ScalarValue | tuple[str, ...] = None

    @property
    def id(self) -> str:
        return f"{self.field}.{self.kind.value}"


def field_rules(f: Field) -> list[Rule]:
    """The rules of one field, in evaluation order (type before value checks): the
    checks of :func:`features.schema.model.field_checks`."""
    return [Rule(f.name, ReasonCode(kind), value) for kind, value in field_checks(f)]


def compile_rules(schema: Schema) -> tuple[Rule, ...]:
    """Every rule of ``schema``, fields in declared order. Deterministic."""
    return tuple(r for f in schema.fields for r in field_rules(f))
