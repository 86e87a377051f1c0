"""The fixed-layout ISO reader (``features.validation.isotime``) gives exactly what the
general path (regular expression + ``strptime`` + round trip) gives: same values, same
failures, same messages, for random text near the layouts it reads."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from features.schema.model import Constraints, Field, FieldType, TypeKind
from features.validation.convert import _parse_dates, _parse_timestamps, convert

_DIGITS = "0123456789"


def _two(lo: int, hi: int) -> st.SearchStrategy[str]:
    return st.integers(lo, hi).map(lambda v: f"{v:02d}")


@st.composite
def iso_text(draw: st.DrawFn) -> str:
    """Mostly well-formed text, with the edges the checks are about (leap days, 23:59:59,
    year 0000/0001/9999, zones, 1..10 fraction digits) and random corruptions."""
    year = draw(st.sampled_from([0, 1, 999, 1000, 1582, 1900, 1969, 1970, 2000, 2023, 2024, 9999])
                | st.integers(0, 9999))
    text = (f"{year:04d}-{draw(_two(0, 13))}-{draw(_two(0, 32))}"
            f"{draw(st.sampled_from(['T', ' ', 't', '_']))}"
            f"{draw(_two(0, 25))}:{draw(_two(0, 61))}:{draw(_two(0, 61))}")
    frac = draw(st.integers(0, 10))
    if frac:
        text += "." + draw(st.text(_DIGITS, min_size=frac, max_size=frac))
    text += draw(st.sampled_from(["", "Z", "+00:00", "-05:30", "+0530", "+24:00", "+05:60", "z", "+5:30",
                                  "-00:00"]))
    if draw(st.integers(0, 9)) == 0:  # a corruption somewhere
        i = draw(st.integers(0, len(text) - 1))
        text = text[:i] + draw(st.sampled_from(list("x:-. 9+"))) + text[i + 1:]
    return text


def _field(kind: TypeKind, unit: str | None = None, tz: str | None = None) -> Field:
    return Field(name="t", type=FieldType(kind, unit=unit, tz=tz), constraints=Constraints(),
                 accept_strings=True)


def _same(fast: object, general: object) -> None:
    assert fast.values.equals(general.values)  # type: ignore[attr-defined]
    assert fast.fail_rows.tolist() == general.fail_rows.tolist()  # type: ignore[attr-defined]
    assert fast.fail_shown.equals(general.fail_shown)  # type: ignore[attr-defined]
    assert fast.fail_values.equals(general.fail_values)  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(iso_text(), st.none()), min_size=1, max_size=40),
       st.sampled_from([("s", None), ("ms", None), ("us", None), ("us", "UTC"), ("ns", "UTC"),
                        ("ms", "Europe/Paris")]))
def test_timestamps_fast_equals_general(texts: list[str | None], unit_tz: tuple[str, str | None]) -> None:
    unit, tz = unit_tz
    raw = pa.array(texts, pa.string())
    target = pa.timestamp(unit, tz)
    fast = convert(raw, _field(TypeKind.TIMESTAMP, unit, tz), target)
    general = _parse_timestamps(raw, target)
    from features.validation.convert import _within_years
    _same(fast, _within_years(raw, general, target))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(iso_text().map(lambda t: t[:10]), iso_text().map(lambda t: t[:11]), st.none()),
                min_size=1, max_size=40))
def test_dates_fast_equals_general(texts: list[str | None]) -> None:
    raw = pa.array(texts, pa.string())
    target = pa.date32()
    fast = convert(raw, _field(TypeKind.DATE), target)
    from features.validation.convert import _within_years
    _same(fast, _within_years(raw, _parse_dates(raw, target), target))


def test_the_fast_path_reads_the_usual_layouts() -> None:
    from features.validation import isotime

    raw = pa.array(["2024-02-29T23:59:59.123456+00:00", "2023-10-10 11:51:17Z",
                    "1970-01-01T00:00:00.5-01:30"])
    values, handled = isotime.parse_timestamps(raw, "us", True)  # type: ignore[misc]
    assert handled.tolist() == [True, True, True]
    assert values.tolist() == [1709251199123456, 1696938677000000, 5400500000]
    days, ok = isotime.parse_dates(pa.array(["2024-02-29", "2023-02-29", None]))  # type: ignore[misc]
    assert ok.tolist() == [True, False, False] and days[0] == 19782
