"""A few rows the validator would accept as they are, told apart in Python without it.

A scoring service sends one to a few request rows per call, and the validator's fixed
cost per call (Arrow arrays per column, its kernels, the rejects table: about 0.3-0.5 ms)
is more than the rest of a feature view's read. :func:`sure_rows` looks at plain Python
values and answers only when it is sure: every value is of a kind and within rules simple
enough to check exactly here (the types below, ``required``/``nullable``, ``min``/``max``,
string lengths), and every one passes. Then it returns the values the validator would
give. Anything else (a value of another Python type, a rule it does not check, any value
that fails) gives None, and the caller runs the validator, which decides and words every
error: a refusal is never decided here. ``tests/property/test_sure_rows.py`` holds the two
equal on random values (whatever ``sure_rows`` accepts, the validator accepts with the same
values).

Checked here: ``string`` (no pattern, no ``empty_as_null`` for an empty string, no null
markers; no NUL; encodable), ``bool``, ``int8``..``int64`` (Python ``int``), ``float64``
(finite Python ``float``), ``decimal(p,s)`` (a finite ``Decimal`` or an ``int``, exact at
the scale), ``timestamp(us, UTC)`` (a zoned ``datetime``, no bounds).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from features.schema.model import INTEGER_KINDS, Field, TypeKind

#: the inclusive range of each integer kind
_RANGE = {TypeKind.INT8: (-(2**7), 2**7 - 1), TypeKind.INT16: (-(2**15), 2**15 - 1),
          TypeKind.INT32: (-(2**31), 2**31 - 1), TypeKind.INT64: (-(2**63), 2**63 - 1)}
_UNSURE = object()
Check = Callable[[Any], Any]


def checker(field: Field) -> Check | None:
    """The check of one field's values: a function returning the value the validator
    gives for it, or ``_UNSURE``; None when this module checks no value of the field."""
    c, t = field.constraints, field.type
    if c.has_default or c.pattern is not None or field.null_values:
        return None
    lo, hi = c.min, c.max
    not_null = c.not_null

    def null() -> Any:
        return _UNSURE if not_null else None

    if t.kind is TypeKind.STRING:
        if lo is not None or hi is not None:
            return None
        min_len, max_len, empty_null = c.min_length, c.max_length, c.empty_as_null

        def string(v: Any) -> Any:
            if v is None:
                return null()
            if type(v) is not str or "\x00" in v or (empty_null and v == ""):
                return _UNSURE
            if (min_len is not None and len(v) < min_len) or (max_len is not None and len(v) > max_len):
                return _UNSURE
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return _UNSURE
            return v

        return string
    if c.min_length is not None or c.max_length is not None:
        return None
    if t.kind is TypeKind.BOOL:
        return lambda v: null() if v is None else v if type(v) is bool else _UNSURE
    if t.kind in INTEGER_KINDS:
        tlo, thi = _RANGE[t.kind]
        ilo = tlo if lo is None else max(tlo, int(lo))
        ihi = thi if hi is None else min(thi, int(hi))

        def integer(v: Any) -> Any:
            if v is None:
                return null()
            return v if type(v) is int and ilo <= v <= ihi else _UNSURE

        return integer
    if t.kind is TypeKind.FLOAT64:
        flo = -math.inf if lo is None else float(lo)
        fhi = math.inf if hi is None else float(hi)

        def double(v: Any) -> Any:
            if v is None:
                return null()
            return v if type(v) is float and math.isfinite(v) and flo <= v <= fhi else _UNSURE

        return double
    if t.kind is TypeKind.DECIMAL:
        assert t.precision is not None and t.scale is not None
        quantum = Decimal(1).scaleb(-t.scale)
        precision = t.precision
        dlo = None if lo is None else Decimal(str(lo))
        dhi = None if hi is None else Decimal(str(hi))

        def decimal(v: Any) -> Any:
            if v is None:
                return null()
            if type(v) is int:
                v = Decimal(v)
            elif type(v) is not Decimal or not v.is_finite():
                return _UNSURE
            try:
                q = v.quantize(quantum) if v.as_tuple().exponent != -t.scale else v  # type: ignore[operator]
            except ArithmeticError:  # more digits than the context holds
                return _UNSURE
            if q != v or len(q.as_tuple().digits) > precision:
                return _UNSURE
            if (dlo is not None and q < dlo) or (dhi is not None and q > dhi):
                return _UNSURE
            return q

        return decimal
    if t.kind is TypeKind.TIMESTAMP and t.unit == "us" and t.tz == "UTC" and lo is None and hi is None:
        def instant(v: Any) -> Any:
            if v is None:
                return null()
            if type(v) is not dt.datetime or v.tzinfo is None or v.utcoffset() is None:
                return _UNSURE
            return v.astimezone(dt.UTC)

        return instant
    return None


def checkers(fields: Sequence[Field]) -> list[tuple[str, Check]] | None:
    """One check per field, or None when some field has none (every call takes the validator)."""
    out = []
    for f in fields:
        check = checker(f)
        if check is None:
            return None
        out.append((f.input_name, check))
    return out


def sure_rows(checks: Sequence[tuple[str, Check]], names: Sequence[str],
              rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``rows`` (dicts of Python values, read by each field's input name) as the valid
    rows the validator would give (dicts by field ``names``), or None when any value is
    not surely valid (see the module docstring)."""
    out = []
    for row in rows:
        values = {}
        for (key, check), name in zip(checks, names, strict=True):
            v = check(row.get(key))
            if v is _UNSURE:
                return None
            values[name] = v
        out.append(values)
    return out


__all__ = ["checker", "checkers", "sure_rows"]
