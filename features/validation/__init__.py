"""Validation: run a compiled schema's rules over a batch.

``validate(data, compiled)`` returns a :class:`ValidationResult` with the valid rows
(in the declared Arrow schema), the reject rows (:data:`REJECT_SCHEMA`) and counts.
Bad rows are data, never exceptions; see :mod:`features.validation.validator`.
"""

from __future__ import annotations

from features.compile.rejects import REJECT_SCHEMA, ReasonCode
from features.validation.result import ValidationCounts, ValidationResult
from features.validation.validator import validate

__all__ = ["REJECT_SCHEMA", "ReasonCode", "ValidationCounts", "ValidationResult", "validate"]
