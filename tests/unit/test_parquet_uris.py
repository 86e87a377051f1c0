"""Parquet sources named by URI (``pyarrow.fs``): the same files, units and lineage as by path."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from features.errors import SourceError
from features.ops.examples import applicant_schema, applicants
from features.sources.parquet import ParquetSource, expand_paths


def test_file_uris_give_the_same_units_and_lineage_as_paths(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    for i, name in enumerate(("a.parquet", "sub/b.parquet")):
        pq.write_table(applicants(300, seed=i), tmp_path / name, row_group_size=100)
    (tmp_path / "notes.txt").write_text("not parquet")
    compiled = applicant_schema()
    by_path = ParquetSource([tmp_path], compiled, batch_rows=64)
    by_uri = ParquetSource([tmp_path.as_uri() + "/"], compiled, batch_rows=64)
    assert [f.uri for f in by_uri.files] == [f.uri for f in by_path.files]
    assert [f.path for f in by_uri.files] == [(tmp_path / "a.parquet").as_uri(),
                                              (tmp_path / "sub" / "b.parquet").as_uri()]
    left, right = list(by_path.batches()), list(by_uri.batches())
    assert [b.lineage.unit for b in left] == [b.lineage.unit for b in right]
    assert [b.lineage.row_uris().to_pylist() for b in left] == \
        [b.lineage.row_uris().to_pylist() for b in right]
    assert all(b.batch.equals(c.batch) for b, c in zip(left, right, strict=True))
    one = (tmp_path / "a.parquet").as_uri()
    assert expand_paths([one, str(tmp_path / "a.parquet")]) == sorted([one, str(tmp_path / "a.parquet")])


def test_a_uri_with_nothing_there_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"no Parquet file found at: file://"):
        expand_paths([(tmp_path / "missing").as_uri()])
    with pytest.raises(SourceError, match=r"cannot list it through pyarrow\.fs"):
        expand_paths(["nosuchscheme://bucket/x.parquet"])
