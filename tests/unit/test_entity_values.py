"""``features.compile.layout.entity_values`` on sliced arrays: pyarrow's ``if_else`` misreads a
sliced string array, so the ids are read from an unsliced copy (a frame sliced out of a
larger table, e.g. one chunk of ``features historical``, once matched the wrong ids)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from features.compile import compile_schema
from features.compile.layout import entity_values
from features.schema import load_schemas

ROOT = Path(__file__).resolve().parents[2]


def test_sliced_ids_read_as_their_own_values() -> None:
    merchant = compile_schema(load_schemas(ROOT / "docs" / "examples" / "fraud" / "schemas")["merchant"])
    full = pa.array(["x", "7", "007", None, "9", "-3", "99999999999999999999", "12"])
    for start in range(len(full)):
        part = full.slice(start)
        want = entity_values(merchant, pa.array(part.to_pylist(), pa.string())).to_pylist()
        assert entity_values(merchant, part).to_pylist() == want, start
        chunked = pa.chunked_array([full.slice(start, 2), full.slice(start + 2)])
        assert entity_values(merchant, chunked).to_pylist() == want, start
    assert entity_values(merchant, full.slice(1)).to_pylist() == [7, None, None, 9, -3, None, 12]
