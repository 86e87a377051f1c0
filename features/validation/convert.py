"""Exact conversion of input columns to their declared Arrow types (the ``type`` rule).

A value converts only when the declared type holds it exactly; anything else is a
``type`` reject, never a cast. The rules, per declared type (``docs/types.md``):

- **int8..int64**: integers of any width/signedness when in range; floats when finite,
  integral and in range (``12.0`` ok, ``12.5`` and ``NaN`` rejected); decimals when
  integral and in range. Bools are rejected.
- **float32/float64**: floats; ``±inf`` is rejected (not a number); NaN converts (the
  ``nan`` rule rejects it). float64 -> float32 only when the value is exactly
  representable in float32 (``0.5`` ok, ``0.1`` rejected): no silent narrowing.
  Integers only when exactly representable (``2**53 + 1`` into float64 is rejected).
  Decimals convert to the *nearest* float (a decimal literal has no exact binary
  value; this is what writing the literal in code means); an overflow to ±inf is
  rejected.
- **decimal(p,s)**: decimals and integers when the value fits ``p`` digits with ``s``
  after the point without rounding (``12.505`` into ``decimal(18,2)`` rejected, ``12.5``
  rescaled to ``12.50``); floats by their shortest round-trip text (``repr``: float64
  ``0.1`` is ``0.1``; float32 uses its own shortest text), which must then fit.
- **bool**: bools. **string/enum**: strings (``large_string`` and dictionary-encoded
  strings are decoded); anything else is rejected, numbers are never stringified.
- **date**: date32; date64 and naive timestamps only at midnight; zoned timestamps are
  rejected (their date depends on a zone).
- **timestamp(u)**: naive timestamps and dates, and zoned timestamps converted to UTC
  (a naive field holds UTC wall-clock times: naive = UTC); **timestamp(u, TZ)**: zoned
  timestamps (converted to ``TZ``: the instant is kept). Naive input where a zone is
  required is rejected (nothing says which zone it is in). A unit change that would
  truncate (``ns`` with sub-microsecond digits into ``us``) or overflow is rejected.
- **strings** into bool/number/date/timestamp fields only with ``accept_strings``:
  ``true``/``false``; decimal literals ``[+-]digits[.digits][e[+-]digits]`` with the
  exactness rules of a decimal value (no spaces, no ``inf``/``nan``, no ``_``);
  ``YYYY-MM-DD``; ``YYYY-MM-DD[T ]HH:MM:SS[.fraction][Z|±HH:MM]`` (a zone offset is
  required for zoned fields; for naive ones it is optional, and text with an offset is
  converted to UTC).
- **list(T, n)** / **list(T, max=n)**: lists whose length fits and whose every element
  converts to T by these rules (:mod:`features.validation.lists`).
- **Python values** (decoded JSON): ints (any size: beyond int64 they take the decimal
  path, beyond 38 digits they are rejected), floats, strings, bools, None,
  ``Decimal``, ``date``/``datetime``; other objects (dicts, lists) are rejected.

Nulls stay null. String input is first compared with the field's ``null_values``
(exact, case-sensitive text: ``nil``, ``NA``, ``""``): a marker is null, whatever the
type and ``accept_strings``; with ``empty_as_null``, ``""`` is null too. A string
refused only because the field does not ``accept_strings`` carries the hint
:data:`TEXT_HINT`, the one the Parquet loader's check gives for a text column.
Nothing here raises for bad data; a bad value is reported in :class:`Converted`.

Why one module of this size: one converter per Arrow type family for Parquet columns,
JSON values and Python objects alike; the rules for each type (null markers, text,
bounds of the type) sit beside the others so every input form is read the same way.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.schema.model import NUMERIC_KINDS, Field, TypeKind
from features.validation import isotime, lists
from features.validation.converted import Converted
from features.validation.masks import valid_mask

BoolMask = npt.NDArray[np.bool_]
Index = npt.NDArray[np.int64]

_EMPTY_INDEX: Index = np.zeros(0, dtype=np.int64)
_NO_TEXT = pa.array([], pa.string())

#: What a string refused by a non-string field without ``accept_strings`` is told, in a
#: ``type`` reject (after ``expected <type>``) and in the Parquet loader's refusal of a
#: text column (``features.sources.parquet``): one hint wherever text meets a number.
TEXT_HINT = " (set accept_strings: true to parse text)"

#: Inclusive value range of each integer type.
INT_RANGES: dict[TypeKind, tuple[int, int]] = {
    TypeKind.INT8: (-(2**7), 2**7 - 1),
    TypeKind.INT16: (-(2**15), 2**15 - 1),
    TypeKind.INT32: (-(2**31), 2**31 - 1),
    TypeKind.INT64: (-(2**63), 2**63 - 1),
}
_UNITS_PER_SECOND = isotime.UNITS_PER_SECOND
_SECONDS_PER_DAY = 86_400
_INT64_MAX = 2**63 - 1

_DECIMAL_LITERAL = (
    r"^(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?(?:[eE](?P<exp>[+-]?[0-9]{1,6}))?$"
)
_FLOAT_LITERAL = r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
_TIMESTAMP_LITERAL = (
    r"^(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})[T ](?P<time>[0-9]{2}:[0-9]{2}:[0-9]{2})"
    r"(?:\.(?P<frac>[0-9]{1,9}))?(?P<zone>Z|[+-][0-9]{2}:?[0-9]{2})?$"
)


# --------------------------------------------------------------------------- rendering


def render(arr: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Render values as text: ``(plain, shown)`` string arrays, one entry per value.

    plain: strings as they are, decimals at their scale (``0.00``), floats as ``repr``
    (float32 by its own shortest text), NaN as ``NaN``, bools ``true``/``false``,
    dates ``2024-01-31``, timestamps ``2024-01-31 10:00:00.000000`` (zoned: in UTC with
    ``Z``), null as null. shown: the same, but strings quoted with ``repr`` and null
    as ``null``. Meant for the few rejected values, not whole columns.
    """
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        plain = arr.cast(pa.string())
        return plain, pa.array(["null" if v is None else repr(v) for v in arr.to_pylist()], pa.string())
    if pa.types.is_floating(t):
        np_vals = arr.to_numpy(zero_copy_only=False)
        valid = _valid(arr)
        texts = [_float_text(v) if ok else None for v, ok in zip(np_vals, valid, strict=True)]
        plain = pa.array(texts, pa.string())
    elif pa.types.is_boolean(t):
        plain = pa.array([None if v is None else ("true" if v else "false") for v in arr.to_pylist()],
                         pa.string())
    elif (
        pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
    ):
        plain = pc.cast(arr, pa.string())
    elif pa.types.is_null(t):
        plain = pa.nulls(len(arr), pa.string())
    elif lists.is_list_type(t):
        return lists.render_lists(arr, render)
    else:
        plain = pa.array([None if v is None else str(v) for v in arr.to_pylist()], pa.string())
    return plain, pc.fill_null(plain, "null")


def _float_text(v: Any) -> str:
    if np.isnan(v):
        return "NaN"
    if isinstance(v, np.float64):
        return repr(float(v))
    return str(v)  # numpy's shortest text for float16/float32: 0.1, not 0.10000000149


# --------------------------------------------------------------------------- helpers


_valid = valid_mask


def _np(arr: pa.Array, fill: Any) -> npt.NDArray[Any]:
    """Values as numpy with nulls replaced by ``fill`` (numeric/temporal arrays)."""
    if pa.types.is_timestamp(arr.type) or pa.types.is_date64(arr.type):
        arr = arr.view(pa.int64())
    elif pa.types.is_date32(arr.type):
        arr = arr.view(pa.int32())
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar(fill, arr.type))
    return np.asarray(arr.to_numpy(zero_copy_only=False))


def _null_where(arr: pa.Array, ok: BoolMask) -> pa.Array:
    """``arr`` with the rows where ``ok`` is False set to null."""
    if ok.all():
        return arr
    return pc.if_else(pa.array(ok), arr, pa.scalar(None, arr.type))


def _finish(raw: pa.Array, values: pa.Array, ok: BoolMask) -> Converted:
    """Package a conversion: rows valid in ``raw`` but not ``ok`` are failures."""
    valid = _valid(raw)
    bad = valid & ~ok
    if not bad.any():
        return Converted(values, _EMPTY_INDEX, _NO_TEXT, _NO_TEXT)
    rows = np.flatnonzero(bad).astype(np.int64)
    values = _null_where(values, ~bad)
    plain, shown = render(raw.take(pa.array(rows)))
    return Converted(values, rows, plain, shown)


def _from_numpy(values: npt.NDArray[Any], ok: BoolMask, target: pa.DataType) -> pa.Array:
    """Build an array of ``target`` from numpy storage values; null where not ``ok``."""
    mask = None if ok.all() else ~ok
    if pa.types.is_timestamp(target) or pa.types.is_date(target):
        storage = pa.int64() if pa.types.is_timestamp(target) or pa.types.is_date64(target) else pa.int32()
        return pa.array(values, type=storage, mask=mask).view(target)
    return pa.array(values, type=target, mask=mask)


def _all_fail(raw: pa.Array, target: pa.DataType, note: str = "", hint: str = "") -> Converted:
    c = _finish(raw, pa.nulls(len(raw), target), np.zeros(len(raw), dtype=np.bool_))
    shown = pc.binary_join_element_wise(c.fail_shown, note, "") if note else c.fail_shown
    hints = _constant_text(len(c.fail_rows), hint) if hint and c.failed else None
    return Converted(c.values, c.fail_rows, c.fail_values, shown, hints)


def _constant_text(n: int, text: str) -> pa.Array:
    return pc.fill_null(pa.nulls(n, pa.string()), text)


def _hints(c: Converted) -> pa.Array:
    """``c``'s hints, one per failure (null where none)."""
    return c.fail_hints if c.fail_hints is not None else pa.nulls(len(c.fail_rows), pa.string())


def _merged_hints(parts: Sequence[Converted], take: pa.Array | None = None) -> pa.Array | None:
    """The hints of ``parts``' failures, concatenated in order (then ``take`` applied);
    None when none of them has one."""
    if all(c.fail_hints is None for c in parts):
        return None
    hints = pa.concat_arrays([_hints(c) for c in parts])
    return hints if take is None else hints.take(take)


def null_markers(raw: pa.Array, field: Field) -> pa.Array:
    """``raw`` (string) with the field's ``null_values`` markers, and ``""`` with
    ``empty_as_null``, set to null: one ``is_in`` over the column, no copy when none is
    there."""
    markers = field.null_values
    if field.constraints.empty_as_null and "" not in markers:
        markers = (*markers, "")
    if not markers:
        return raw
    hit = pc.is_in(raw, value_set=pa.array(markers, pa.string()))
    if not pc.any(hit).as_py():
        return raw
    return pc.if_else(hit, pa.scalar(None, pa.string()), raw)


# --------------------------------------------------------------------------- entry points


def convert(
    raw: pa.Array, field: Field, target: pa.DataType, *, accept_strings: bool | None = None
) -> Converted:
    """Convert one Arrow column to ``target`` (the field's Arrow type) exactly.

    ``accept_strings`` overrides the field's flag (defaults and bounds are parsed
    from text). ``empty_as_null`` of the field applies to string input. Dates and
    timestamps must fall in the years 0001..9999 (UTC for zoned ones), what PostgreSQL
    reads and Python represents. Never raises for bad values; they are reported in
    the result.
    """
    c = _convert(raw, field, target, accept_strings=accept_strings)
    if pa.types.is_timestamp(target) or pa.types.is_date32(target):
        return _within_years(raw, c, target)
    return c


#: 0001-01-01 and 9999-12-31 as days since the epoch
_FIRST_DAY, _LAST_DAY = -719_162, 2_932_896


def _within_years(raw: pa.Array, c: Converted, target: pa.DataType) -> Converted:
    """``c`` with the values before 0001-01-01 or after 9999-12-31 turned into failures
    (``0000-01-01`` parses, and an Arrow timestamp can hold year 20000)."""
    if pa.types.is_date32(target):
        lo, hi = _FIRST_DAY, _LAST_DAY
    else:
        per_second = _UNITS_PER_SECOND[target.unit]
        lo = _FIRST_DAY * _SECONDS_PER_DAY * per_second
        hi = (_LAST_DAY + 1) * _SECONDS_PER_DAY * per_second - 1
    v = _np(c.values, 0)
    out = _valid(c.values) & ((v < lo) | (v > hi))
    if not out.any():
        return c
    rows = np.flatnonzero(out).astype(np.int64)
    plain, shown = render(raw.take(pa.array(rows)))
    shown = pc.binary_join_element_wise(shown, " (outside the years 0001..9999)", "")
    all_rows = np.concatenate([c.fail_rows, rows])
    order = pa.array(np.argsort(all_rows, kind="stable"))
    extra = Converted(c.values, rows, plain, shown)
    return Converted(_null_where(c.values, ~out), all_rows[order.to_numpy()],
                     pa.concat_arrays([c.fail_values, plain]).take(order),
                     pa.concat_arrays([c.fail_shown, shown]).take(order), _merged_hints([c, extra], order))


def _convert(
    raw: pa.Array, field: Field, target: pa.DataType, *, accept_strings: bool | None = None
) -> Converted:
    if accept_strings is None:
        accept_strings = field.accept_strings
    t = raw.type
    if pa.types.is_null(t):
        return Converted(pa.nulls(len(raw), target), _EMPTY_INDEX, _NO_TEXT, _NO_TEXT)
    if pa.types.is_dictionary(t):
        raw = raw.dictionary_decode()
        t = raw.type
    if pa.types.is_large_string(t) or str(t) == "string_view":
        raw = raw.cast(pa.string())
        t = raw.type
    if pa.types.is_string(t):
        raw = null_markers(raw, field)
    kind = field.type.kind
    if kind is TypeKind.LIST:
        return lists.to_list(raw, field, target, convert, render)
    if t == target:
        if kind in (TypeKind.FLOAT32, TypeKind.FLOAT64):
            return _finish(raw, raw, ~_np(pc.is_inf(raw), False))
        if pa.types.is_string(t):
            # A NUL character is valid UTF-8 but no Postgres text can hold it: a type reject.
            nul = pc.match_substring(raw, "\x00")
            if pc.any(nul).as_py():
                return _finish(raw, raw, ~_np(nul, False))
        return Converted(raw, _EMPTY_INDEX, _NO_TEXT, _NO_TEXT)
    if pa.types.is_string(t) and kind not in (TypeKind.STRING, TypeKind.ENUM):
        if not accept_strings:
            return _all_fail(raw, target, hint=TEXT_HINT)
        return _from_strings(raw, field, target)
    if kind in INT_RANGES:
        return _to_int(raw, target, *INT_RANGES[kind])
    if kind in (TypeKind.FLOAT32, TypeKind.FLOAT64):
        return _to_float(raw, target)
    if kind is TypeKind.DECIMAL:
        return _to_decimal(raw, target)
    if kind is TypeKind.DATE:
        return _to_date(raw, target)
    if kind is TypeKind.TIMESTAMP:
        return _to_timestamp(raw, target)
    return _all_fail(raw, target)  # string/enum/bool from another type


# --------------------------------------------------------------------------- integers


def _to_int(raw: pa.Array, target: pa.DataType, lo: int, hi: int) -> Converted:
    t = raw.type
    n = len(raw)
    np_target = target.to_pandas_dtype()
    if pa.types.is_integer(t):
        v = _np(raw, 0)
        info = np.iinfo(v.dtype)
        ok = np.ones(n, dtype=np.bool_)
        if info.min < lo:
            ok &= v >= lo
        if info.max > hi:
            ok &= v <= hi
        out = np.where(ok, v, 0).astype(np_target)
        return _finish(raw, _from_numpy(out, ok & _valid(raw), target), ok)
    if pa.types.is_floating(t):
        f = np.asarray(_np(raw, 0.0), dtype=np.float64)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(f) & (np.trunc(f) == f) & (f >= float(lo)) & (f < float(hi + 1))
        out = np.where(ok, f, 0.0).astype(np_target)
        return _finish(raw, _from_numpy(out, ok & _valid(raw), target), ok)
    if pa.types.is_decimal(t):
        return _decimal_to_int(raw, target, lo, hi)
    return _all_fail(raw, target)


def _decimal_to_int(raw: pa.Array, target: pa.DataType, lo: int, hi: int) -> Converted:
    t = raw.type
    whole_type = pa.decimal256(76, 0) if pa.types.is_decimal256(t) else pa.decimal128(38, 0)
    if t.scale > 0:
        ok = _np(pc.equal(pc.round(raw, 0, round_mode="towards_zero"), raw), False)
        whole = pc.cast(_null_where(raw, ok), whole_type)
    else:
        ok = np.ones(len(raw), dtype=np.bool_)
        whole = pc.cast(raw, whole_type)
    ok &= _np(pc.greater_equal(whole, pa.scalar(Decimal(lo), whole_type)), False)
    ok &= _np(pc.less_equal(whole, pa.scalar(Decimal(hi), whole_type)), False)
    values = pc.cast(_null_where(whole, ok), target)
    return _finish(raw, values, ok)


# --------------------------------------------------------------------------- floats


def _to_float(raw: pa.Array, target: pa.DataType) -> Converted:
    t = raw.type
    to32 = target == pa.float32()
    np_target = np.float32 if to32 else np.float64
    if pa.types.is_floating(t):
        v = np.asarray(raw.to_numpy(zero_copy_only=False), dtype=np.float64)  # widening is exact
        with np.errstate(over="ignore", invalid="ignore"):
            out = v.astype(np_target)
            ok = np.isnan(v) | (np.isfinite(v) & (out.astype(np.float64) == v))
        return _finish(raw, _from_numpy(out, ok & _valid(raw), target), ok)
    if pa.types.is_integer(t):
        iv = _np(raw, 0)
        out = iv.astype(np_target)
        wide = out.astype(np.float64)
        limit = 2.0**64 if np.iinfo(iv.dtype).min == 0 else 2.0**63
        with np.errstate(invalid="ignore"):
            in_range = (wide >= -(2.0**63)) & (wide < limit)
            back = np.where(in_range, wide, 0.0).astype(iv.dtype)
        ok = in_range & (back == iv)
        return _finish(raw, _from_numpy(out, ok & _valid(raw), target), ok)
    if pa.types.is_decimal(t):
        # Arrow's decimal -> float cast is not correctly rounded; its string -> float
        # parse is, and decimal -> string is exact.
        out_arr = pc.cast(pc.cast(raw, pa.string()), target)
        return _finish(raw, out_arr, ~_np(pc.is_inf(out_arr), False))
    return _all_fail(raw, target)


# --------------------------------------------------------------------------- decimals


def _to_decimal(raw: pa.Array, target: pa.DataType) -> Converted:
    t = raw.type
    p, s = target.precision, target.scale
    n = len(raw)
    if pa.types.is_decimal(t):
        ok = np.ones(n, dtype=np.bool_)
        if t.scale > s:
            ok &= _np(pc.equal(pc.round(raw, s, round_mode="towards_zero"), raw), False)
        limit_digits = p - s + 1 + t.scale  # digits of 10**(p-s) at the input's scale
        max_digits = 76 if pa.types.is_decimal256(t) else 38
        if limit_digits <= max_digits:
            wide = pa.decimal256(max_digits, t.scale) if max_digits == 76 else pa.decimal128(38, t.scale)
            limit = pa.scalar(Decimal(10) ** (p - s), wide)
            low = pa.scalar(-limit.as_py(), wide)
            ok &= _np(pc.less(raw, limit), False) & _np(pc.greater(raw, low), False)
        values = pc.cast(_null_where(raw, ok), target)
        return _finish(raw, values, ok)
    if pa.types.is_integer(t):
        v = _np(raw, 0)
        ok = np.ones(n, dtype=np.bool_)
        limit = 10 ** (p - s)
        info = np.iinfo(v.dtype)
        if info.max >= limit:
            ok &= v < limit
        if info.min <= -limit:
            ok &= v > -limit
        whole = pc.cast(_null_where(raw, ok), pa.decimal128(20, 0))
        return _finish(raw, pc.cast(whole, target), ok)
    if pa.types.is_floating(t):
        # A float's value as a decimal is its shortest round-trip text (Arrow's float
        # -> string is exactly that: repr for float64, the float32 shortest for float32).
        text = pc.cast(raw, pa.string())
        values, ok = parse_decimal_text(text, p, s)
        return _finish(raw, values, ok)
    return _all_fail(raw, target)


def parse_decimal_text(text: pa.Array, p: int, s: int) -> tuple[pa.Array, BoolMask]:
    """Parse decimal literals exactly into ``decimal128(p, s)``.

    Accepts ``[+-]digits[.digits][(e|E)[+-]digits]`` (at least one digit); returns the
    values (null where a literal is null, malformed or does not fit ``p``/``s`` without
    rounding) and the mask of rows that parsed (True for null input). Vectorised.
    """
    n = len(text)
    if p > s and len(text):
        # The common case first: every literal plain ``-digits[.digits]`` with at most p - s
        # integer and s fraction digits, which fits exactly; Arrow's own parser then gives
        # the same values in one pass (the general path below costs a regex extraction
        # and a dozen kernels per call).
        simple = pc.fill_null(pc.match_substring_regex(text, _simple_decimal(p, s)), True)
        if pc.all(simple).as_py():
            return pc.cast(text, pa.decimal128(p, s)), np.ones(n, dtype=np.bool_)
        # the others (a few, usually) take the general path on their own; the simple ones
        # are cast; the general path's values go back to their rows
        other = pc.invert(simple)
        fast = pc.cast(pc.if_else(simple, text, pa.scalar(None, text.type)), pa.decimal128(p, s))
        rest, rest_ok = _parse_decimal_general(text.filter(other), p, s)
        ok = np.ones(n, dtype=np.bool_)
        ok[np.flatnonzero(_np(other, False))] = rest_ok
        return pc.replace_with_mask(fast, other, rest), ok
    return _parse_decimal_general(text, p, s)


def _parse_decimal_general(text: pa.Array, p: int, s: int) -> tuple[pa.Array, BoolMask]:
    """:func:`parse_decimal_text` for any literal (a regex extraction and a dozen kernels)."""
    n = len(text)
    parts = pc.extract_regex(text, _DECIMAL_LITERAL)
    matched = _valid(parts)
    if not matched.any():
        return pa.nulls(n, pa.decimal128(p, s)), ~_valid(text)
    sign = parts.field("sign")
    frac = parts.field("frac")
    digits = pc.binary_join_element_wise(parts.field("int"), frac, "")
    exp_text = parts.field("exp")
    exp = pc.cast(pc.if_else(pc.equal(exp_text, ""), "0", pc.utf8_ltrim(exp_text, "+")), pa.int64())
    lead = pc.utf8_ltrim(digits, "0")
    sig = pc.utf8_rtrim(lead, "0")
    sig_len = _np(pc.utf8_length(sig), 0).astype(np.int64)
    trailing = _np(pc.utf8_length(lead), 0).astype(np.int64) - sig_len
    e = _np(exp, 0) - _np(pc.utf8_length(frac), 0).astype(np.int64) + trailing
    has_digit = _np(pc.utf8_length(digits), 0) > 0
    zero = sig_len == 0
    ok = matched & has_digit & (zero | ((e >= -s) & (sig_len + e <= p - s)))
    e = np.where(zero, 0, e)
    normal = pc.binary_join_element_wise(
        sign, pc.if_else(pa.array(zero), "0", sig), "e", pc.cast(pa.array(e), pa.string()), ""
    )
    values = pc.cast(_null_where(normal, ok), pa.decimal128(p, s))
    return values, ok | ~_valid(text)


@functools.lru_cache(maxsize=64)
def _simple_decimal(p: int, s: int) -> str:
    """The literals of ``decimal128(p, s)`` that fit without rounding in their plainest
    form: an optional minus, 1 to p - s integer digits, optionally a point and 1 to s
    fraction digits."""
    frac = rf"(\.[0-9]{{1,{s}}})?" if s > 0 else ""
    return rf"^-?[0-9]{{1,{p - s}}}{frac}$"


# --------------------------------------------------------------------------- dates, timestamps


def _to_date(raw: pa.Array, target: pa.DataType) -> Converted:
    t = raw.type
    if pa.types.is_date64(t):
        raw_ts = raw.view(pa.int64()).view(pa.timestamp("ms"))
        return _timestamp_to_date(raw, raw_ts, target)
    if pa.types.is_timestamp(t):
        if t.tz is not None:
            return _all_fail(raw, target, f" (with time zone {t.tz})")
        return _timestamp_to_date(raw, raw, target)
    return _all_fail(raw, target)


def _timestamp_to_date(raw: pa.Array, ts: pa.Array, target: pa.DataType) -> Converted:
    per_day = _UNITS_PER_SECOND[ts.type.unit] * _SECONDS_PER_DAY
    v = _np(ts, 0)
    days = v // per_day
    ok = (v % per_day == 0) & (days >= -(2**31)) & (days < 2**31)
    out = np.where(ok, days, 0).astype(np.int32)
    return _finish(raw, _from_numpy(out, ok & _valid(raw), target), ok)


def _to_timestamp(raw: pa.Array, target: pa.DataType) -> Converted:
    t = raw.type
    if pa.types.is_date(t):
        if target.tz is not None:
            return _all_fail(raw, target, " (no time zone)")
        per_day = _SECONDS_PER_DAY * _UNITS_PER_SECOND[target.unit]
        if pa.types.is_date32(t):
            v = _np(raw, 0).astype(np.int64)
            ok = np.abs(v) <= _INT64_MAX // per_day
            out = np.where(ok, v, 0) * per_day
            return _finish(raw, _from_numpy(out, ok & _valid(raw), target), ok)
        return _rescale_timestamp(raw, raw.view(pa.int64()).view(pa.timestamp("ms")), target)
    if pa.types.is_timestamp(t):
        if target.tz is not None and t.tz is None:
            return _all_fail(raw, target, " (no time zone)")
        # Zoned values are UTC instants: into a naive field they are its UTC wall clock.
        return _rescale_timestamp(raw, raw, target)
    return _all_fail(raw, target)


def _rescale_timestamp(raw: pa.Array, ts: pa.Array, target: pa.DataType) -> Converted:
    """Change unit exactly (zoned values are UTC instants: only the label changes, or
    goes, for a naive ``target``)."""
    src = _UNITS_PER_SECOND[ts.type.unit]
    dst = _UNITS_PER_SECOND[target.unit]
    v = _np(ts, 0)
    if src > dst:
        factor = src // dst
        ok = v % factor == 0
        out = v // factor
    elif src < dst:
        factor = dst // src
        ok = np.abs(v) <= _INT64_MAX // factor
        out = np.where(ok, v, 0) * factor
    else:
        ok = np.ones(len(v), dtype=np.bool_)
        out = v
    return _finish(raw, _from_numpy(out, ok & _valid(raw), target), ok)


# --------------------------------------------------------------------------- strings


def _from_strings(raw: pa.Array, field: Field, target: pa.DataType) -> Converted:
    """Exact parsing of text into a non-string type (``accept_strings``)."""
    kind = field.type.kind
    if kind is TypeKind.BOOL:
        is_true = _np(pc.equal(raw, "true"), False)
        ok = is_true | _np(pc.equal(raw, "false"), False)
        return _finish(raw, _from_numpy(is_true, ok & _valid(raw), target), ok)
    if kind in INT_RANGES:
        whole, ok = parse_decimal_text(raw, 38, 0)
        c = _decimal_to_int(whole, target, *INT_RANGES[kind])
        return _finish(raw, c.values, ok & ~_fail_mask(c, len(raw)))
    if kind in (TypeKind.FLOAT32, TypeKind.FLOAT64):
        syntax = _np(pc.match_substring_regex(raw, _FLOAT_LITERAL), False)
        values = pc.cast(_null_where(raw, syntax), target)
        ok = syntax & ~_np(pc.is_inf(values), False)
        return _finish(raw, values, ok)
    if kind is TypeKind.DECIMAL:
        values, ok = parse_decimal_text(raw, target.precision, target.scale)
        return _finish(raw, values, ok)
    if kind is TypeKind.DATE:
        fast = isotime.parse_dates(raw)
        if fast is not None:
            return _fast_or_general(raw, target, fast[0], fast[1], _parse_dates)
        return _parse_dates(raw, target)
    if kind is TypeKind.TIMESTAMP:
        fast_ts = isotime.parse_timestamps(raw, target.unit, target.tz is not None)
        if fast_ts is not None:
            return _fast_or_general(raw, target, fast_ts[0], fast_ts[1], _parse_timestamps)
        return _parse_timestamps(raw, target)
    return _all_fail(raw, target)


def _fast_or_general(raw: pa.Array, target: pa.DataType, values: npt.NDArray[Any], handled: BoolMask,
                     general: Callable[[pa.Array, pa.DataType], Converted]) -> Converted:
    """Values the fixed-layout reader (``features.validation.isotime``) accepted, and the
    general path's verdict on the rest (nulls included), as one :class:`Converted`."""
    valid = _valid(raw)
    if (handled | ~valid).all():
        return _finish(raw, _from_numpy(values, handled, target), np.ones(len(raw), dtype=np.bool_))
    rest = np.flatnonzero(~handled & valid).astype(np.int64)
    c = general(raw.take(pa.array(rest)), target)
    merged = np.asarray(values).copy()
    merged[rest] = _np(c.values, 0)
    ok_values = handled.copy()
    ok_values[rest] = _valid(c.values)
    return Converted(_from_numpy(merged.astype(values.dtype), ok_values, target), rest[c.fail_rows],
                     c.fail_values, c.fail_shown, c.fail_hints)


def _parse_dates(raw: pa.Array, target: pa.DataType) -> Converted:
    syntax = _np(pc.match_substring_regex(raw, r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"), False)
    ts = _strptime_exact(_null_where(raw, syntax), "%Y-%m-%d")
    ok = syntax & _valid(ts)
    days = (_np(ts, 0) // _SECONDS_PER_DAY).astype(np.int32)
    return _finish(raw, _from_numpy(days, ok & _valid(raw), target), ok)


def _strptime_exact(text: pa.Array, fmt: str) -> pa.Array:
    """``strptime`` to ``timestamp[s]``, null where the text is not a real date/time:
    Arrow's strptime rolls ``2023-02-29`` over to March 1st, so the result must print
    back as the same text."""
    ts = pc.strptime(text, format=fmt, unit="s", error_is_null=True)
    same = pc.equal(pc.strftime(ts, format=fmt), text)
    return pc.if_else(same, ts, pa.scalar(None, ts.type))


def _fail_mask(c: Converted, n: int) -> BoolMask:
    mask = np.zeros(n, dtype=np.bool_)
    mask[c.fail_rows] = True
    return mask


def _parse_timestamps(raw: pa.Array, target: pa.DataType) -> Converted:
    n = len(raw)
    parts = pc.extract_regex(raw, _TIMESTAMP_LITERAL)
    matched = _valid(parts)
    if not matched.any():
        return _all_fail(raw, target)
    text = pc.binary_join_element_wise(parts.field("date"), "T", parts.field("time"), "")
    secs_ts = _strptime_exact(text, "%Y-%m-%dT%H:%M:%S")
    ok = matched & _valid(secs_ts)
    secs = _np(secs_ts, 0)
    frac = pc.utf8_rpad(parts.field("frac"), 9, "0")
    frac_ns = _np(pc.cast(_null_where(frac, ok), pa.int64()), 0)
    zone = parts.field("zone")
    has_zone = _np(pc.not_equal(zone, ""), False)
    offset = np.zeros(n, dtype=np.int64)
    if has_zone.any():
        digits = pc.replace_substring(pc.replace_substring(zone, ":", ""), "Z", "+0000")
        sign = np.where(_np(pc.starts_with(digits, "-"), False), -1, 1)
        hh = _np(pc.cast(_null_where(pc.utf8_slice_codeunits(digits, 1, 3), has_zone), pa.int64()), 0)
        mm = _np(pc.cast(_null_where(pc.utf8_slice_codeunits(digits, 3, 5), has_zone), pa.int64()), 0)
        offset = sign * (hh * 3600 + mm * 60)
        ok &= (hh < 24) & (mm < 60)
    per_second = _UNITS_PER_SECOND[target.unit]
    ns_per_unit = 1_000_000_000 // per_second
    ok &= frac_ns % ns_per_unit == 0
    # a zoned field needs the offset; a naive one takes text with an offset as UTC
    zone_ok = has_zone if target.tz is not None else np.ones(n, dtype=np.bool_)
    out = (secs - offset) * per_second + frac_ns // ns_per_unit
    c = _finish(raw, _from_numpy(out, ok & zone_ok & _valid(raw), target), ok & zone_ok)
    if target.tz is None or not c.failed:
        return c
    note = (matched & ok & ~has_zone)[c.fail_rows]
    shown = pc.if_else(pa.array(note), pc.binary_join_element_wise(c.fail_shown, " (no time zone)", ""),
                       c.fail_shown)
    return Converted(c.values, c.fail_rows, c.fail_values, shown, c.fail_hints)


# --------------------------------------------------------------------------- Python values


class _Absent:
    """Marker for a key missing from a record (distinct from an explicit null)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Any = _Absent()

_INT64_MIN = -(2**63)


def _group_key(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        if _INT64_MIN <= v <= _INT64_MAX:
            return "int"
        return "bigint" if abs(v) < 10**38 else "other"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, Decimal):
        return "decimal"
    if isinstance(v, dt.datetime):
        return "datetime_tz" if v.tzinfo is not None else "datetime"
    if isinstance(v, dt.date):
        return "date"
    return "other"


_GROUP_TYPES: dict[str, pa.DataType | None] = {
    "null": pa.null(),
    "bool": pa.bool_(),
    "int": pa.int64(),
    "bigint": pa.decimal128(38, 0),
    "float": pa.float64(),
    "str": pa.string(),
    "datetime": pa.timestamp("us"),
    "datetime_tz": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
}


def _group_array(key: str, values: Sequence[Any]) -> pa.Array | None:
    """The Arrow array of one homogeneous group of Python values (None: unconvertible)."""
    if key == "bigint":
        return pa.array([Decimal(v) for v in values], pa.decimal128(38, 0))
    typ = _GROUP_TYPES.get(key)
    if typ is None:
        return None
    return pa.array(values, type=typ)


def _bigints_to_float(values: list[int], target: pa.DataType) -> Converted:
    """Ints beyond int64 into a float field: exact like any int (``2**70`` converts,
    ``2**70 + 1`` does not). Only these rare values take this per-value path."""
    np_type = np.float32 if target == pa.float32() else np.float64
    with np.errstate(over="ignore"):
        floats = np.array([np_type(float(v)) for v in values], dtype=np_type)
    ok = np.array([bool(np.isfinite(f)) and int(f) == v for f, v in zip(floats, values, strict=True)],
                  dtype=np.bool_)
    raw = pa.array([Decimal(v) for v in values], pa.decimal128(38, 0))
    return _finish(raw, _from_numpy(floats, ok, target), ok)


def _decimals(values: list[Decimal], field: Field, target: pa.DataType) -> Converted:
    """``Decimal`` objects into a numeric field, through their exact text (any exponent,
    no precision limit, ``NaN`` rejected), with the decimal-literal rules; into any other
    field they are rejected. Failures are shown unquoted, as the numbers they are."""
    text = pa.array([str(v) for v in values], pa.string())
    if field.type.kind not in NUMERIC_KINDS:
        c = _all_fail(text, target)
    else:
        c = _from_strings(text, field, target)
    return Converted(c.values, c.fail_rows, c.fail_values, c.fail_values, c.fail_hints)


def convert_pylist(
    values: Sequence[Any], field: Field, target: pa.DataType, *, accept_strings: bool | None = None
) -> Converted:
    """Convert Python values (decoded JSON: None, bool, int of any size, float, str,
    Decimal, date, datetime) to ``target`` with the same rules as Arrow input.

    Homogeneous columns take one Arrow conversion; mixed ones are split by Python type
    and each part converted separately, so no value is coerced through another type
    (``[2**60 + 1, 0.5]`` is not read as floats). Values that fit no Arrow type
    (dicts, lists, ints beyond 38 digits) are type failures.
    """
    if field.type.kind is TypeKind.LIST:
        return lists.to_list_pylist(values, field, target, convert_pylist)
    n = len(values)
    kinds = {type(v) for v in values}
    simple = {type(None), int, float, str, bool}
    if kinds <= simple and len(kinds - {type(None)}) <= 1:
        try:
            return convert(pa.array(values), field, target, accept_strings=accept_strings)
        except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError):
            pass  # ints beyond int64: fall through to the split below
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(values):
        groups.setdefault(_group_key(v), []).append(i)
    parts: list[pa.Array] = []
    order: list[Index] = []
    fail_rows: list[Index] = []
    fail_values: list[pa.Array] = []
    fail_shown: list[pa.Array] = []
    converted: list[Converted] = []
    for key, rows in groups.items():
        idx = np.asarray(rows, dtype=np.int64)
        sub = [values[i] for i in rows]
        arr = _group_array(key, sub)
        if key == "bigint" and pa.types.is_floating(target):
            c = _bigints_to_float(sub, target)
        elif key == "decimal":
            c = _decimals(sub, field, target)
        elif arr is None:
            c = Converted(
                pa.nulls(len(sub), target), np.arange(len(sub), dtype=np.int64),
                pa.array([str(v) for v in sub], pa.string()), pa.array([repr(v) for v in sub], pa.string()),
            )
        else:
            c = convert(arr, field, target, accept_strings=accept_strings)
        parts.append(c.values)
        order.append(idx)
        fail_rows.append(idx[c.fail_rows])
        fail_values.append(c.fail_values)
        fail_shown.append(c.fail_shown)
        converted.append(c)
    position = np.concatenate(order)
    inverse = np.empty(n, dtype=np.int64)
    inverse[position] = np.arange(n, dtype=np.int64)
    merged = pa.concat_arrays(parts).take(pa.array(inverse)) if parts else pa.nulls(0, target)
    rows_all = np.concatenate(fail_rows) if fail_rows else _EMPTY_INDEX
    sort = np.argsort(rows_all, kind="stable")
    take = pa.array(sort)
    return Converted(
        merged, rows_all[sort], pa.concat_arrays(fail_values).take(take),
        pa.concat_arrays(fail_shown).take(take), _merged_hints(converted, take),
    )


__all__ = ["ABSENT", "INT_RANGES", "TEXT_HINT", "Converted", "convert", "convert_pylist", "null_markers",
           "parse_decimal_text", "render"]
