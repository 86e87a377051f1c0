"""ISO 8601 dates and timestamps in the common fixed layouts, read with NumPy on the bytes.

``features.validation.convert`` reads date/timestamp text with a regular expression, Arrow's
``strptime`` and a ``strftime`` round trip (about 2.5 µs per value for a zoned
timestamp). Text from JSON and CSV is nearly always one layout, such as
``2024-05-01T12:00:00.123456+00:00``. For those values this module does the same
reading as byte arithmetic over a (rows x width) matrix: digits, separators, calendar
checks (proleptic Gregorian, as ``strptime`` with the round trip), zone offset and the
fraction's exactness for the target unit.

It only ever **accepts**: a value it cannot read, or reads as invalid, is left to the
general path (``handled`` False), which decides it and words its message, so results
and messages are those of the general path alone. Years 0001..9999 only (year 0000 goes
to the general path, whose range check words the message).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features.validation.masks import _string_buffers, valid_mask

BoolMask = npt.NDArray[np.bool_]
I64 = npt.NDArray[np.int64]

#: time units of Arrow timestamps, per second (``features.validation.convert`` uses it too)
UNITS_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_ZERO = ord("0")
_MONTH_DAYS = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


def _matrix(offsets: npt.NDArray[np.int32], data: npt.NDArray[np.uint8], rows: I64, width: int
            ) -> npt.NDArray[np.int64]:
    starts = offsets[rows].astype(np.int64)
    return data[starts[:, None] + np.arange(width)].astype(np.int64)


def _digits(m: npt.NDArray[np.int64], start: int, count: int) -> tuple[I64, BoolMask]:
    part = m[:, start:start + count] - _ZERO
    ok = ((part >= 0) & (part <= 9)).all(axis=1)
    value = np.zeros(len(m), dtype=np.int64)
    for j in range(count):
        value = value * 10 + part[:, j]
    return value, ok


def _days(year: I64, month: I64, day: I64) -> tuple[I64, BoolMask]:
    """Days since 1970-01-01 (proleptic Gregorian) and whether the date exists."""
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    month_ok = (month >= 1) & (month <= 12)
    last = _MONTH_DAYS[np.where(month_ok, month, 1)] + ((month == 2) & leap)
    ok = month_ok & (day >= 1) & (day <= last) & (year >= 1)
    # days_from_civil (H. Hinnant)
    y = year - (month <= 2)
    era = np.floor_divide(y, 400)
    yoe = y - era * 400
    mp = (month + 9) % 12
    doy = (153 * mp + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468, ok


def _by_width(arr: pa.Array) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.uint8], dict[int, I64]] | None:
    bufs = _string_buffers(arr)
    if bufs is None:
        return None
    offsets, data = bufs
    valid = valid_mask(arr)
    lengths = np.diff(offsets)
    widths: dict[int, I64] = {}
    for width in np.unique(lengths[valid]).tolist():
        widths[int(width)] = np.flatnonzero(valid & (lengths == width)).astype(np.int64)
    return offsets, data, widths


def parse_dates(arr: pa.Array) -> tuple[npt.NDArray[np.int32], BoolMask] | None:
    """``YYYY-MM-DD`` text -> (days since the epoch, handled); None when ``arr`` is not a
    plain string array. Null values are not handled."""
    found = _by_width(arr)
    if found is None:
        return None
    offsets, data, widths = found
    days = np.zeros(len(arr), dtype=np.int32)
    handled = np.zeros(len(arr), dtype=np.bool_)
    rows = widths.get(10)
    if rows is not None and len(rows):
        m = _matrix(offsets, data, rows, 10)
        year, ok_y = _digits(m, 0, 4)
        month, ok_m = _digits(m, 5, 2)
        day, ok_d = _digits(m, 8, 2)
        d, ok = _days(year, month, day)
        ok &= ok_y & ok_m & ok_d & (m[:, 4] == ord("-")) & (m[:, 7] == ord("-"))
        days[rows[ok]] = d[ok]
        handled[rows[ok]] = True
    return days, handled


def parse_timestamps(arr: pa.Array, unit: str, zoned: bool) -> tuple[I64, BoolMask] | None:
    """``YYYY-MM-DD[T ]HH:MM:SS[.f{1,9}][Z|±HH:MM|±HHMM]`` text -> (values in ``unit``
    since the epoch, text with an offset converted to UTC; handled). A zone is required
    when ``zoned`` (text without one is left to the general path) and optional otherwise
    (a naive field holds UTC wall-clock times). None when ``arr`` is not a plain string
    array."""
    found = _by_width(arr)
    if found is None:
        return None
    offsets, data, widths = found
    per_second = UNITS_PER_SECOND[unit]
    ns_per_unit = 1_000_000_000 // per_second
    values = np.zeros(len(arr), dtype=np.int64)
    handled = np.zeros(len(arr), dtype=np.bool_)
    for width, rows in widths.items():
        if width < 19 or width > 35:
            continue
        m = _matrix(offsets, data, rows, width)
        year, ok = _digits(m, 0, 4)
        for start, count in ((5, 2), (8, 2), (11, 2), (14, 2), (17, 2)):
            _, digit_ok = _digits(m, start, count)
            ok &= digit_ok
        ok &= (m[:, 4] == ord("-")) & (m[:, 7] == ord("-"))
        ok &= (m[:, 10] == ord("T")) | (m[:, 10] == ord(" "))
        ok &= (m[:, 13] == ord(":")) & (m[:, 16] == ord(":"))
        month, _ = _digits(m, 5, 2)
        day, _ = _digits(m, 8, 2)
        hour, _ = _digits(m, 11, 2)
        minute, _ = _digits(m, 14, 2)
        second, _ = _digits(m, 17, 2)
        days, date_ok = _days(year, month, day)
        ok &= date_ok & (hour <= 23) & (minute <= 59) & (second <= 59)
        # the rest: [.digits][zone]; one layout per width, read from its first row
        rest = m[0, 19:]
        frac_len = 0
        if len(rest) and rest[0] == ord("."):
            frac_len = 1
            while frac_len < len(rest) and _ZERO <= rest[frac_len] <= _ZERO + 9:
                frac_len += 1
            frac_len -= 1  # digits after the point
            if not 1 <= frac_len <= 9:
                continue
            ok &= m[:, 19] == ord(".")
        zone_at = 19 + (frac_len + 1 if frac_len else 0)
        zone_len = width - zone_at
        frac_ns = np.zeros(len(rows), dtype=np.int64)
        if frac_len:
            frac, frac_ok = _digits(m, 20, frac_len)
            ok &= frac_ok
            frac_ns = frac * 10 ** (9 - frac_len)
        offset = np.zeros(len(rows), dtype=np.int64)
        if zone_len == 0:
            has_zone = False
        elif zone_len == 1:
            has_zone = True
            ok &= m[:, zone_at] == ord("Z")
        elif zone_len in (5, 6):
            has_zone = True
            sign = np.where(m[:, zone_at] == ord("-"), -1, 1)
            ok &= (m[:, zone_at] == ord("+")) | (m[:, zone_at] == ord("-"))
            hh, hh_ok = _digits(m, zone_at + 1, 2)
            mm_at = zone_at + (4 if zone_len == 6 else 3)
            if zone_len == 6:
                ok &= m[:, zone_at + 3] == ord(":")
            mm, mm_ok = _digits(m, mm_at, 2)
            ok &= hh_ok & mm_ok & (hh < 24) & (mm < 60)
            offset = sign * (hh * 3600 + mm * 60)
        else:
            continue
        if zoned and not has_zone:
            continue
        ok &= frac_ns % ns_per_unit == 0
        secs = days * 86_400 + hour * 3600 + minute * 60 + second
        out = (secs - offset) * per_second + frac_ns // ns_per_unit
        values[rows[ok]] = out[ok]
        handled[rows[ok]] = True
    return values, handled


__all__ = ["parse_dates", "parse_timestamps"]
