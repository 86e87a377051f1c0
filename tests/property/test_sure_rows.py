"""``features.validation.sure.sure_rows`` never decides a refusal and never disagrees with
the validator: on random Python values (of the right and wrong kinds, at and past every
bound), whatever it accepts the validator accepts, with the same values."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from features.compile import compile_schema
from features.schema import parse_schema
from features.validation import validate
from features.validation.sure import checkers, sure_rows

SCHEMA = """\
name: req
version: 1.0.0
fields:
  - name: s
    type: string
    constraints: {required: true, max_length: 5}
  - name: i
    type: int16
    constraints: {min: -3, max: 300, nullable: true}
  - name: d
    type: decimal(6,2)
    constraints: {min: 0, max: 9999.99, required: true}
  - name: f
    type: float64
    constraints: {min: -1.5, max: 2.5, nullable: true}
  - name: b
    type: bool
    constraints: {nullable: false}
  - name: t
    type: timestamp(us, UTC)
    constraints: {nullable: true}
  - name: e
    type: string
    constraints: {nullable: true, empty_as_null: true}
"""
C = compile_schema(parse_schema(SCHEMA))
CHECKS = checkers(C.schema.fields)
NAMES = [f.name for f in C.schema.fields]

anything = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                     st.decimals(allow_nan=True, allow_infinity=True), st.text(max_size=7),
                     st.datetimes(timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=5))])),
                     st.datetimes())
#: values within every rule (and at the bounds)
valid = {
    "s": st.text(max_size=5).filter(lambda v: "\x00" not in v),
    "i": st.one_of(st.none(), st.integers(-3, 300)),
    "d": st.one_of(st.decimals(min_value=Decimal("0"), max_value=Decimal("9999.99"), places=2),
                   st.integers(0, 9999),
                   st.sampled_from([Decimal("0"), Decimal("9999.99"), Decimal("1E+2")])),
    "f": st.one_of(st.none(), st.floats(-1.5, 2.5)),
    "b": st.booleans(),
    "t": st.one_of(st.none(), st.datetimes(timezones=st.sampled_from(
        [dt.UTC, dt.timezone(dt.timedelta(hours=-7))]))),
    "e": st.one_of(st.none(), st.sampled_from(["x", "ok"]), st.text(min_size=1, max_size=3)),
}
#: values next to or past them, and of other kinds
near = {
    "s": st.one_of(st.text(min_size=6, max_size=7), anything),
    "i": st.one_of(st.sampled_from([-4, 301, True]), anything),
    "d": st.one_of(st.sampled_from([Decimal("-0.01"), Decimal("10000"), Decimal("0.001"), 1.5, -1]),
                   anything),
    "f": st.one_of(st.sampled_from([-1.6, 2.6, float("inf"), 1]), anything),
    "b": anything,
    "t": st.one_of(st.datetimes(), anything),
    "e": st.one_of(st.just(""), anything),
}


@st.composite
def row(draw: st.DrawFn) -> dict[str, Any]:
    """A valid row, or one with a field (or two) drawn from ``near``."""
    out = {k: draw(v) for k, v in valid.items()}
    for key in draw(st.lists(st.sampled_from(sorted(near)), max_size=2)):
        out[key] = draw(near[key])
    return out


@settings(max_examples=400, deadline=None)
@given(st.lists(row(), min_size=1, max_size=4))
def test_whatever_sure_rows_accepts_the_validator_accepts_alike(rows: list[dict[str, Any]]) -> None:
    assert CHECKS is not None
    sure = sure_rows(CHECKS, NAMES, rows)
    result = validate(rows, C)
    if sure is None:
        return
    assert result.rejects.num_rows == 0, (rows, result.rejects.to_pylist())
    assert result.valid.to_pylist() == sure


def test_it_says_yes_to_plain_valid_rows_and_leaves_the_rest() -> None:
    assert CHECKS is not None
    good = {"s": "ab", "i": 7, "d": Decimal("12.5"), "f": 1.0, "b": True,
            "t": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "e": "x"}
    assert sure_rows(CHECKS, NAMES, [good]) == [{**good, "d": Decimal("12.50")}]
    for bad in ({"s": "abcdef"}, {"i": 301}, {"d": Decimal("0.001")}, {"d": -1}, {"f": float("nan")},
                {"b": None}, {"t": dt.datetime(2026, 1, 1)}, {"e": ""}, {"d": 1.5}, {"s": None}):
        assert sure_rows(CHECKS, NAMES, [{**good, **bad}]) is None, bad
