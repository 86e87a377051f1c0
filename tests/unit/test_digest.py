"""The content digest (features.kernels.digest) against a row-by-row reference written
from its documented definition, and the properties the stores rely on."""

from __future__ import annotations

import datetime as dt
import random
import struct
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from features.kernels.digest import content_digests, digests
from features.ops.examples import applicant_schema, applicants

MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _fnv(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def _word(value: Any, t: pa.DataType) -> int:
    """One value's word, from the module docstring's definition."""
    if value is None:
        return 0x6E756C6C00000000
    if pa.types.is_string(t):
        return _fnv(value.encode())
    if pa.types.is_boolean(t):
        return int(value)
    if pa.types.is_integer(t):
        return int(value) & MASK
    if pa.types.is_floating(t):
        return int(struct.unpack(">Q", struct.pack(">d", float(value) + 0.0))[0])
    if pa.types.is_decimal(t):
        unscaled = int(value.scaleb(t.scale))
        raw = unscaled & ((1 << 128) - 1)
        return _mix(raw & MASK) ^ _mix(((raw >> 64) + 1) & MASK)
    if pa.types.is_date32(t):
        return int((value - dt.date(1970, 1, 1)).days) & MASK
    if pa.types.is_timestamp(t):
        assert t.unit == "us"
        delta = value - dt.datetime(1970, 1, 1, tzinfo=value.tzinfo)
        return int(delta // dt.timedelta(microseconds=1)) & MASK
    if pa.types.is_list(t):
        total = 0
        for i, v in enumerate(value):
            total = (total + _mix((_word(v, t.value_type) + (i + 1) * 0x9E3779B97F4A7C15) & MASK)) & MASK
        return _mix(total ^ len(value))
    raise AssertionError(t)


def _reference(rows: pa.Table, defaults: dict[str, Any]) -> list[str]:
    names = sorted(rows.column_names, key=lambda n: n.encode())
    out = []
    for row in rows.to_pylist():
        h = 0
        for name in names:
            v = row[name]
            if v is None or (name in defaults and v == defaults[name]):
                continue
            h = _mix(h ^ _fnv(name.encode()) ^ _word(v, rows.schema.field(name).type))
        out.append(f"{h:016x}")
    return out


def _table(n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)

    def maybe(v: Any) -> Any:
        return None if rng.random() < 0.2 else v

    return pa.table({
        "s": pa.array([maybe(rng.choice(["", "a", "é", "ab" * rng.randint(0, 9)])) for _ in range(n)]),
        "i": pa.array([maybe(rng.randint(-2**40, 2**40)) for _ in range(n)], pa.int64()),
        "k": pa.array([maybe(rng.randint(-5, 5)) for _ in range(n)], pa.int16()),
        "b": pa.array([maybe(rng.random() < 0.5) for _ in range(n)]),
        "f": pa.array([maybe(rng.choice([0.0, -0.0, 1.5, -2.25e300, 1e-310])) for _ in range(n)]),
        "d": pa.array([maybe(Decimal(rng.randint(-10**20, 10**20)).scaleb(-2)) for _ in range(n)],
                      pa.decimal128(24, 2)),
        "day": pa.array([maybe(dt.date(1960, 1, 1) + dt.timedelta(days=rng.randint(0, 30000)))
                         for _ in range(n)]),
        "at": pa.array([maybe(dt.datetime(1969, 12, 31, tzinfo=dt.UTC) + dt.timedelta(
            microseconds=rng.randint(0, 10**15))) for _ in range(n)], pa.timestamp("us", "UTC")),
        "xs": pa.array([maybe([rng.choice([1.0, 2.0, None]) for _ in range(rng.randint(0, 4))])
                        for _ in range(n)], pa.list_(pa.float64())),
    })


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_digest_matches_a_row_by_row_reference_of_its_definition(seed: int) -> None:
    rows = _table(300, seed)
    defaults = {"k": 0, "s": "a"}
    got = content_digests({n: rows.column(n) for n in rows.column_names}, rows.num_rows, defaults)
    assert got.to_pylist() == _reference(rows, defaults)


def test_the_digest_does_not_depend_on_chunks_slices_or_column_order() -> None:
    rows = _table(200, 7)
    whole = content_digests({n: rows.column(n) for n in rows.column_names}, rows.num_rows).to_pylist()
    chunked = pa.concat_tables([rows.slice(0, 33), rows.slice(33, 100), rows.slice(133)])
    assert content_digests({n: chunked.column(n) for n in reversed(rows.column_names)},
                           rows.num_rows).to_pylist() == whole
    part = rows.slice(50, 60)
    assert content_digests({n: part.column(n) for n in rows.column_names}, 60).to_pylist() == whole[50:110]


def test_exact_copies_share_a_digest_and_any_difference_changes_it() -> None:
    compiled = applicant_schema()
    rows = applicants(500, seed=3, invalid_share=0.0)
    d = digests(rows, compiled.schema).to_pylist()
    assert len(set(d)) == len(d)  # 500 different applicants
    again = digests(pa.concat_tables([rows.slice(250), rows.slice(0, 250)]), compiled.schema).to_pylist()
    assert again == d[250:] + d[:250]
    income = rows.column("income_monthly").to_pylist()
    changed = rows.set_column(rows.schema.get_field_index("income_monthly"), "income_monthly",
                              pa.array([v + Decimal("0.01") for v in income], rows.schema.field(
                                  "income_monthly").type))
    assert all(a != b for a, b in zip(d, digests(changed, compiled.schema).to_pylist(), strict=True))


def test_swapping_values_between_fields_or_list_positions_changes_the_digest() -> None:
    a = {"x": pa.array([1, 2], pa.int64()), "y": pa.array([2, 1], pa.int64())}
    d = content_digests(a, 2).to_pylist()
    assert d[0] != d[1]
    lists = pa.array([[1.0, 2.0], [2.0, 1.0], [1.0, 2.0, None], []], pa.list_(pa.float64()))
    assert len(set(content_digests({"l": lists}, 4).to_pylist())) == 4


def test_a_null_or_default_value_adds_nothing_so_a_field_added_later_changes_no_digest() -> None:
    old = {"x": pa.array([1, 2, 3], pa.int64())}
    new = {**old, "added": pa.array([None, None, 0], pa.int32())}
    assert content_digests(new, 3, {"added": 0}).to_pylist() == content_digests(old, 3).to_pylist()
    assert content_digests(new, 3).to_pylist()[2] != content_digests(old, 3).to_pylist()[2]


def test_hex_digits_sort_as_the_numbers() -> None:
    rows = _table(400, 11)
    text = content_digests({n: rows.column(n) for n in rows.column_names}, rows.num_rows).to_pylist()
    assert all(len(t) == 16 and t == t.lower() for t in text)
    assert sorted(text) == [f"{v:016x}" for v in sorted(int(t, 16) for t in text)]
    assert np.all(np.array([int(t, 16) for t in text], dtype=object) >= 0)
