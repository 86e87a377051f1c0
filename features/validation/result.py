"""The outcome of validating one batch: valid rows, reject rows and counts.

Rejects are data, not exceptions: one reject row per (input row, failed rule), in the
fixed columns of :data:`~features.compile.rejects.REJECT_SCHEMA`. Callers who prefer an exception call
:meth:`ValidationResult.raise_if_rejected`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import pyarrow as pa
import pyarrow.compute as pc

from features.compile.rejects import REJECT_SCHEMA, ReasonCode, empty_rejects
from features.errors import RowsRejected

# REJECT_SCHEMA, ReasonCode and empty_rejects live in features.compile.rejects (below the
# kernels, which make rejects too); this module's public names keep them.


@dataclass(frozen=True)
class ValidationCounts:
    """How many rows went in, came out valid, and were rejected.

    ``rejected_rows`` counts distinct input rows with at least one reject;
    ``by_rule`` counts reject rows per rule id (a row failing two rules counts in
    both), only rules that rejected something appear. Invariant:
    ``valid_rows + rejected_rows == input_rows``.
    """

    input_rows: int
    valid_rows: int
    rejected_rows: int
    by_rule: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def reject_count(self) -> int:
        """Number of reject rows (>= ``rejected_rows``)."""
        return sum(self.by_rule.values())


@dataclass(frozen=True, eq=False)
class ValidationResult:
    """Valid rows, reject rows and counts for one validated batch.

    - ``valid``: the rows that passed every rule, converted to the declared Arrow
      schema (exactly ``compiled.arrow_schema``), in input order.
    - ``valid_row_index``: int64, for each valid row its 0-based row in the input, so
      lineage (``file://path#row``, Kafka offsets) can follow the row.
    - ``rejects``: a table in :data:`~features.compile.rejects.REJECT_SCHEMA`, sorted by input
      row then rule order.
    - ``input_rows``: the number of rows validated.
    """

    valid: pa.RecordBatch
    rejects: pa.Table
    valid_row_index: pa.Int64Array
    input_rows: int

    def __post_init__(self) -> None:
        if self.valid.num_rows != len(self.valid_row_index):
            raise ValueError("valid_row_index must have one entry per valid row")
        if self.valid.num_rows > self.input_rows or (
            self.rejects.num_rows == 0 and self.valid.num_rows != self.input_rows
        ):
            raise ValueError(
                f"counts not conserved: {self.valid.num_rows} valid rows, "
                f"{self.rejects.num_rows} reject rows, {self.input_rows} input rows"
            )

    @property
    def rejected_rows(self) -> int:
        """Number of distinct input rows with at least one reject: every input row is
        either valid or rejected (the validator guarantees that each row missing from
        ``valid`` has at least one reject row)."""
        return int(self.input_rows - self.valid.num_rows)

    @cached_property
    def counts(self) -> ValidationCounts:
        """Row counts and reject rows per rule id (see :class:`ValidationCounts`)."""
        by_rule: dict[str, int] = {}
        if self.rejects.num_rows:
            vc = pc.value_counts(self.rejects.column("rule").combine_chunks())
            pairs = {str(v["values"]): int(v["counts"]) for v in vc.to_pylist()}
            by_rule = dict(sorted(pairs.items()))
        return ValidationCounts(
            input_rows=self.input_rows,
            valid_rows=self.valid.num_rows,
            rejected_rows=self.rejected_rows,
            by_rule=MappingProxyType(by_rule),
        )

    @property
    def ok(self) -> bool:
        """True when no row was rejected."""
        return bool(self.rejects.num_rows == 0)

    def raise_if_rejected(self, *, examples: int = 3) -> None:
        """Raise :class:`~features.errors.RowsRejected` when any row was rejected.

        The message gives the count and the first ``examples`` reject messages;
        ``exc.rejected`` is the number of rejected rows. Does nothing otherwise.
        """
        if self.ok:
            return
        shown = self.rejects.column("message").slice(0, examples).to_pylist()
        more = self.rejects.num_rows - len(shown)
        lines = [f"{self.rejected_rows} of {self.input_rows} rows rejected:"]
        lines += [f"  {m}" for m in shown]
        if more > 0:
            lines.append(f"  ... and {more} more")
        raise RowsRejected("\n".join(lines), rejected=self.rejected_rows)


__all__ = ["REJECT_SCHEMA", "ReasonCode", "ValidationCounts", "ValidationResult", "empty_rejects"]
