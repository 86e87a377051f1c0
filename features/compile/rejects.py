"""The rejects' schema: the fixed columns of one reject row per (input row, failed rule),
shared by the validator (``features.validation``), the transform kernels
(``features.kernels``), the views' request checks and the stream's decode rejects.

It sits in ``compile``, below every layer that makes rejects, beside the rules whose
:class:`~features.compile.rules.ReasonCode` fills its ``reason`` column: the kernels
produce rejects without importing the validator.
"""

from __future__ import annotations

import pyarrow as pa

from features.compile.rules import ReasonCode

#: The fixed columns of ``ValidationResult.rejects``:
#:
#: - ``row``: 0-based index of the offending row in the validated input;
#: - ``field``: the field name; ``rule``: the rule id (``income_monthly.min``);
#: - ``reason``: a :class:`ReasonCode` value (``min``);
#: - ``message``: ``field income_monthly violates constraint min: got 0.00, expected >= 0.01``;
#: - ``value``: the offending value as text (decimals at the field's scale, floats as
#:   ``repr``, NaN as ``NaN``, strings unquoted), null when the value was null or absent.
REJECT_SCHEMA = pa.schema(
    [
        pa.field("row", pa.int64(), nullable=False),
        pa.field("field", pa.string(), nullable=False),
        pa.field("rule", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("message", pa.string(), nullable=False),
        pa.field("value", pa.string(), nullable=True),
    ]
)


def empty_rejects() -> pa.Table:
    """A rejects table with no rows (and :data:`REJECT_SCHEMA`)."""
    return REJECT_SCHEMA.empty_table()


__all__ = ["REJECT_SCHEMA", "ReasonCode", "empty_rejects"]
