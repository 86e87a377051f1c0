"""The content digest stays bit-identical across rewrites of its kernels (issue 48).

``tests/data/digest_v1/`` holds 1,200 rows (nulls, empty, long and non-ASCII strings,
``large_string`` and dictionary strings, every number type, decimals up to precision 38,
dates, timestamps in two units, lists of floats, strings and ints) and their digests as
computed by the first implementation (commit ``fc9ebda``, before the vectorised string
hashing), made by ``make.py`` there. Rows stored with those digests must still be
recognised as exact copies on reload, so every later implementation must give the same
values, whatever the chunking, slicing or column order of its input. Never regenerate the
file with newer code: a difference here is a broken digest, not a stale fixture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from features.kernels.digest import content_digests
from features.kernels.hashing import _mostly_distinct, fnv1a64, fnv1a64_reference, hash_buckets

DATA = Path(__file__).resolve().parent.parent / "data" / "digest_v1"
GOLDEN: dict[str, Any] = json.loads((DATA / "digests.json").read_text())
SETS = sorted(GOLDEN["sets"])


def _rows() -> pa.Table:
    return pq.read_table(DATA / "rows.parquet")


@pytest.mark.parametrize("name", SETS)
def test_the_digest_equals_the_first_implementations_values(name: str) -> None:
    rows = _rows()
    fields = GOLDEN["sets"][name]["fields"]
    got = content_digests({f: rows.column(f) for f in fields}, rows.num_rows, GOLDEN["defaults"])
    assert got.to_pylist() == GOLDEN["sets"][name]["digests"]


@pytest.mark.parametrize("name", SETS)
def test_chunks_slices_and_big_batches_give_the_same_values(name: str) -> None:
    rows = _rows()
    fields = GOLDEN["sets"][name]["fields"]
    want = GOLDEN["sets"][name]["digests"]
    chunked = pa.concat_tables([rows.slice(0, 1), rows.slice(1, 399), rows.slice(400)])
    got = content_digests({f: chunked.column(f) for f in reversed(fields)}, rows.num_rows, GOLDEN["defaults"])
    assert got.to_pylist() == want
    part = rows.slice(333, 500)
    got = content_digests({f: part.column(f) for f in fields}, 500, GOLDEN["defaults"])
    assert got.to_pylist() == want[333:833]
    # many copies: the id-like path (rows hashed one by one) and blocks of rows
    many = pa.concat_tables([rows] * 20)
    got = content_digests({f: many.column(f) for f in fields}, many.num_rows, GOLDEN["defaults"])
    assert got.to_pylist() == want * 20


def test_string_hashes_equal_the_plain_loop_on_ids_categories_and_odd_text() -> None:
    rows = _rows()
    for column in ("id", "s", "cat", "big", "enc"):
        values = rows.column(column)
        text = pc.cast(values, pa.string()) if pa.types.is_dictionary(values.type) else values
        expected = [fnv1a64_reference(v or "") for v in text.to_pylist()]
        # 1,200 rows take the dictionary path, 24,000 (id-like ones) the row-by-row one
        assert [int(h) for h in fnv1a64(values)] == expected
        many = pa.concat_tables([rows.select([column])] * 20).column(0).combine_chunks()
        assert _mostly_distinct(many) is (column in ("id", "s", "big"))  # both paths are tried
        assert [int(h) for h in fnv1a64(many)] == expected * 20
        assert hash_buckets(many, 97).tolist() == [e % 97 for e in expected * 20]
