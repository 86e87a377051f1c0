"""``features report``: data-quality reports as ``report.json`` + one ``report.html``.

Three inputs, all read in batches with bounded memory:

- Parquet files (:func:`parquet_report`) and the schema's cold table in Postgres
  (:func:`table_report`): every batch is checked by the compiled validator (the
  report's counts of rows rejected by rule, the "one truth") and by the generated
  Great Expectations suite (per-expectation results summed over batches, shown next
  to the validator's counts), and per-field statistics are gathered (nulls, NaN,
  min, max, distinct values). See :mod:`features.report.core`.
- The ``<schema>__rejects`` table (:func:`rejects_report`): reject rows grouped by
  the field and rule of their errors, optionally since an ingestion time.

With a reference (``--reference-parquet`` / ``--reference-table``) the data's fields
are compared with it: KS and PSI for numeric fields, PSI and total variation
distance for categorical ones, in bounded memory (see :mod:`features.report.drift`).

:func:`write_report` writes both files; the page is self-contained and escapes
every value.
"""

from __future__ import annotations

from features.report.build import parquet_report, rejects_report, table_report, write_report

__all__ = ["parquet_report", "rejects_report", "table_report", "write_report"]
