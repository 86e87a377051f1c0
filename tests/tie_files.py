"""Two Parquet files of applicants with exact copies and distinct events at one instant
(issue 48), for the tests of what ``features validate``, the report and a load count."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from features.ops.examples import applicants


def _with(rows: pa.Table, column: str, values: list[object]) -> pa.Table:
    i = rows.schema.get_field_index(column)
    return rows.set_column(i, column, pa.array(values, rows.schema.field(column).type))


def tie_files(tmp_path: Path) -> tuple[Path, Path]:
    """200 distinct applicants; then 10 exact copies of some, 5 other versions of 5 others
    (same id and submitted_at, another income: ties), an exact copy of two of those versions
    and 3 copies made invalid (age 5): 220 rows, split over two files (125 + 95)."""
    base = applicants(200, seed=48, invalid_share=0.0)
    copies = base.slice(0, 10)
    other = base.slice(10, 5)
    income = [v + Decimal("0.01") for v in other.column("income_monthly").to_pylist()]
    other = _with(other, "income_monthly", income)
    invalid = _with(base.slice(20, 3), "age", [5, 5, 5])
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.concat_tables([base.slice(0, 120), copies.slice(0, 4), other.slice(0, 1)]), first)
    pq.write_table(pa.concat_tables([base.slice(120), copies.slice(4), other, other.slice(3, 1), invalid]),
                   second)
    return first, second
