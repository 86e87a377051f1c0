"""The rejects' schemas: the fixed columns of one reject row per (input row, failed rule),
shared by the validator (``features.validation``), the transform kernels
(``features.kernels``), the views' request checks and the stream's decode rejects; and the
rejects table's rows (:data:`REJECTED_ROWS_SCHEMA`), which the pipeline, the sinks and the
aggregations' late events make.

It sits in ``compile``, below every layer that makes rejects, beside the rules whose
:class:`~features.compile.rules.ReasonCode` fills its ``reason`` column: the kernels
produce rejects without importing the validator.
"""

from __future__ import annotations

import pyarrow as pa

from features.compile.rules import ReasonCode
from features.lineage import (
    INGESTED_AT,
    RUN_ID,
    SCHEMA_FINGERPRINT,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    SOURCE,
)

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


#: What a sink receives for the rejects of a unit (``WriteUnit.rejects``) and the rejects
#: table stores: one row per rejected input row, with its lineage. (:data:`REJECT_SCHEMA`
#: above is one row per failed rule.) Here, below the sinks and the aggregations, both of
#: which make these rows.
REJECTED_ROWS_SCHEMA = pa.schema([
    pa.field(SOURCE, pa.string(), nullable=False),
    pa.field("row_index", pa.int64()),
    pa.field("raw", pa.string()),        # JSON object of the input values
    pa.field("errors", pa.string()),     # JSON array of {field, rule, reason, message, value}
    pa.field("event_time", pa.timestamp("us", "UTC")),
    pa.field(SCHEMA_NAME, pa.string()),
    pa.field(SCHEMA_VERSION, pa.string()),
    pa.field(SCHEMA_FINGERPRINT, pa.string()),
    pa.field(RUN_ID, pa.string()),
    pa.field(INGESTED_AT, pa.timestamp("us", "UTC")),
])

def empty_rejects() -> pa.Table:
    """A rejects table with no rows (and :data:`REJECT_SCHEMA`)."""
    return REJECT_SCHEMA.empty_table()


__all__ = ["REJECTED_ROWS_SCHEMA", "REJECT_SCHEMA", "ReasonCode", "empty_rejects"]
