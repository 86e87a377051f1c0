"""Exact moments for ``variance``/``stddev`` (and float fields' fixed point), vectorised.

A window's moments are three exact integers over the unscaled values ``x`` of its
events (integers; a decimal's unscaled integer; a float field's value in units of
``10^-scale``): ``n``, ``s = Σx`` and ``ss = Σx²``. ``n`` and ``s`` are int64 (``s`` is
bounded as a sum is); ``ss`` can reach 2^124, so it travels as two int64 parts,
``ss = ss_hi * 2^62 + ss_lo`` with ``0 <= ss_lo < 2^62``. Finalizing computes the
integer ``N = n * ss - s^2`` exactly (base-2^31 limbs in int64 arrays) and rounds it to
a double once, correctly (round half to even), so the variance is
``N / n^2 / 10^(2 * scale)`` (sample: ``N / (n * (n - 1)) / 10^(2 * scale)``), in double
precision, whatever the order of the events.

Nothing here loops over rows in Python: every function works on whole NumPy arrays
(a fixed number of limbs). The common case (squares and their window sums within
int64) takes a plain int64 path, the wide path is taken when a cheap bound says int64
could overflow.

:func:`state` and :func:`merge` are the mergeable state of a set of events (a tile of
request-time windows): a JSON-able ``[n, s, ss_hi, ss_lo]`` per tile, merged by exact
addition into the raw parts the engine's ``finalize`` reads (a float field's values go
through :func:`fixed_point` first). ``first`` has :func:`first_state` (``[time, value]``
of the oldest event) and :func:`merge_first` (the oldest of the states).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

_BITS = 31
_MASK = (1 << _BITS) - 1
#: ``ss = ss_hi * 2**SS_SHIFT + ss_lo``
SS_SHIFT = 62
#: a float value times 10^scale must round to an integer of magnitude below this
FIXED_LIMIT = 2**52
#: the raw parts of variance/stddev, in order
PARTS = ("n", "s", "ss_hi", "ss_lo")


# --------------------------------------------------------------------------- float -> fixed point


def fixed_point(v: F64, counted: npt.NDArray[np.bool_], scale: int, what: str) -> I64:
    """``v`` (float64) as integers in units of ``10^-scale``: each value's exact binary
    value times ``10^scale``, rounded half to even (0 where not ``counted``).

    The product ``p = fl(v * 10^scale)`` is rounded to an integer with ``rint`` and
    corrected with the product's exact error (Dekker's two-product: ``10^scale`` is an
    exact double), so a value such as ``5e-7`` (just below ``0.5e-6`` in binary) rounds
    as its exact value does, not as its rounded product. Raises OverflowError naming
    ``what`` for a non-finite value or one with ``|p| >= 2^52``."""
    c = float(10 ** scale)
    x = np.where(counted, v, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        p = x * c
    bad = ~np.isfinite(p) | (np.abs(p) >= FIXED_LIMIT)
    if bool(bad.any()):
        value = float(x[np.flatnonzero(bad)[0]])
        if not np.isfinite(value):
            raise OverflowError(f"{what}: value {value!r} is not a finite number (the validator rejects "
                                "NaN and ±inf)")
        fits = max(0, math.floor(math.log10(FIXED_LIMIT / abs(value)) - 1e-9)) if abs(value) >= 1 else 0
        raise OverflowError(
            f"{what}: value {value!r} does not fit scale {scale} (each value is kept as an integer "
            f"multiple of 10^-{scale}, below 2^52 in magnitude: |value| < {FIXED_LIMIT / c:.6g}); "
            f"declare a smaller scale on the aggregation (scale: {fits} keeps |value| < "
            f"{FIXED_LIMIT / 10 ** fits:.6g})")
    r = np.rint(p)
    d = p - r  # exact: |p| < 2^52
    tie = np.abs(d) == 0.5
    if bool(tie.any()):
        split = 134217729.0  # 2^27 + 1
        t = split * x
        xh = t - (t - x)
        xl = x - xh
        tc = split * c
        ch = tc - (tc - c)
        cl = c - ch
        err = xl * cl - (((p - xh * ch) - xl * ch) - xh * cl)  # x * c - p, exactly (two-product)
        r = r + np.where(tie & (d > 0) & (err > 0), 1.0, 0.0) - np.where(tie & (d < 0) & (err < 0), 1.0, 0.0)
    out: I64 = r.astype(np.int64)
    return out


# --------------------------------------------------------------------------- wide integers


def _square_limbs(a: I64) -> I64:
    """``a^2`` for ``0 <= a < 2^62`` as 4 base-2^31 limbs (shape (4, n), least significant first)."""
    h, lo = a >> _BITS, a & _MASK
    t0 = lo * lo
    t1 = 2 * h * lo + (t0 >> _BITS)
    t2 = h * h + (t1 >> _BITS)
    return np.stack([t0 & _MASK, t1 & _MASK, t2 & _MASK, t2 >> _BITS])


def _normalize(w: I64) -> I64:
    """Carry non-negative limbs (each below 2^62) so each is below 2^31 (the last keeps the rest)."""
    w = w.copy()
    for k in range(len(w) - 1):
        w[k + 1] += w[k] >> _BITS
        w[k] &= _MASK
    return w


def _limbs_of_ss(hi: I64, lo: I64) -> I64:
    return np.stack([lo & _MASK, lo >> _BITS, hi & _MASK, hi >> _BITS])


def window_squares(x: I64, lo: I64, max_count: int) -> tuple[I64, I64]:
    """``(ss_hi, ss_lo)`` of ``Σ x[j]^2`` over ``j in [lo[i], i]`` for every ``i``, exact.
    ``x`` holds 0 where an event does not count; the caller has checked that
    ``max|x| * max_count < 2^62`` (the sums' bound), so every window's ``ss < 2^124``."""
    n = len(x)
    pos = np.arange(n)
    a = np.abs(x)
    m = int(a.max()) if n else 0
    if m < 2**31 and m * m * max(max_count, 1) < 2**62:  # the common case: int64 prefix sums
        ps = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(a * a, out=ps[1:])  # wraps only past 2^63: window differences stay exact
        return np.zeros(n, dtype=np.int64), ps[pos + 1] - ps[lo]
    limbs = _square_limbs(a)
    ps = np.zeros((4, n + 1), dtype=np.int64)
    np.cumsum(limbs, axis=1, out=ps[:, 1:])  # each limb < 2^31 + 2: n < 2^31 events fit
    w = _normalize(ps[:, pos + 1] - ps[:, lo])
    return w[2] | (w[3] << _BITS), w[0] | (w[1] << _BITS)


def _bit_length(w: I64) -> I64:
    """Bits of each ``0 <= w < 2^62`` (0 for 0): the double's exponent, corrected where
    the conversion rounded up to the next power of two."""
    b = np.frexp(w.astype(np.float64))[1].astype(np.int64)
    over = (b > 0) & ((w >> np.maximum(b - 1, 0)) == 0)
    out: I64 = b - over
    return out


def _to_float(e: I64) -> F64:
    """Non-negative base-2^31 limbs (5, n), each below 2^31, as correctly rounded doubles.

    As three words ``V = w2 * 2^124 + w1 * 2^62 + w0``: the top 62 bits of ``V``, the bits
    below folded into the lowest one (round to odd: 9 bits beyond a double's 53), then
    one int64 -> double conversion (round half to even) and an exact power-of-two scaling."""
    w0 = e[0] | (e[1] << _BITS)
    w1 = e[2] | (e[3] << _BITS)
    w2 = e[4]
    # w2 == 0, w1 > 0: V = w1 * 2^62 + w0, top 62 bits at 2^b
    b = _bit_length(w1)
    m1 = (w1 << (62 - b)) | (w0 >> b)
    s1 = (w0 & ((np.int64(1) << b) - 1)) != 0
    # w2 > 0: top 62 bits at 2^(62 + c)
    c = _bit_length(w2)
    m2 = (w2 << (62 - c)) | (w1 >> c)
    s2 = ((w1 & ((np.int64(1) << c) - 1)) != 0) | (w0 != 0)
    top = w2 > 0
    m = np.where(top, m2 | s2, np.where(w1 > 0, m1 | s1, w0))
    shift = np.where(top, 62 + c, np.where(w1 > 0, b, 0))
    out: F64 = np.ldexp(m.astype(np.float64), shift)
    return out


def numerator(n: I64, s: I64, ss_hi: I64, ss_lo: I64) -> F64:
    """``n * ss - s^2`` (exact, ``>= 0``) rounded once to a double. Requires ``n < 2^31``,
    ``|s| < 2^62`` and ``ss < 2^124``."""
    a = np.abs(s)
    nmax = int(n.max()) if len(n) else 0
    if (not len(n) or (int(ss_hi.max()) == 0 and nmax * int(ss_lo.max()) < 2**62
                       and int(a.max()) < 2**31)):
        exact: F64 = (n * ss_lo - a * a).astype(np.float64)  # exact in int64
        return exact
    if nmax >= 2**31:
        raise OverflowError("a variance window of 2^31 or more events is not supported")
    prod = _normalize(np.concatenate([_limbs_of_ss(ss_hi, ss_lo) * n, np.zeros((1, len(n)), np.int64)]))
    sq = np.concatenate([_square_limbs(a), np.zeros((1, len(n)), np.int64)])
    d = prod - sq
    for k in range(len(d) - 1):  # borrow
        neg = d[k] < 0
        d[k] += np.where(neg, 1 << _BITS, 0)
        d[k + 1] -= neg
    return _to_float(d)


def variance(n: I64, s: I64, ss_hi: I64, ss_lo: I64, scale: int, *, sample: bool
             ) -> tuple[F64, npt.NDArray[np.bool_]]:
    """The variance of each window (population, or sample with ``n - 1``) in the
    field's units, and where it is null (no value; sample: fewer than 2)."""
    null = n < (2 if sample else 1)
    num = numerator(np.where(null, 1, n), np.where(null, 0, s), np.where(null, 0, ss_hi),
                    np.where(null, 0, ss_lo))
    nf = n.astype(np.float64)
    den = nf * (nf - 1.0) if sample else nf * nf
    with np.errstate(divide="ignore", invalid="ignore"):
        var = num / np.where(null, 1.0, den)
        if scale:
            var = var / np.float64(10 ** (2 * scale))
    result: F64 = np.where(null, 0.0, var)
    return result, null


# --------------------------------------------------------------------------- tile states


def state(values: Sequence[int] | npt.NDArray[Any]) -> list[int]:
    """The mergeable state of a set of unscaled int64 values: ``[n, s, ss_hi, ss_lo]``
    (JSON-able, each within int64)."""
    xs = [int(v) for v in np.asarray(values, dtype=np.int64).tolist()]
    ss = sum(v * v for v in xs)
    return [len(xs), sum(xs), ss >> SS_SHIFT, ss & ((1 << SS_SHIFT) - 1)]


def merge(states: Iterable[Sequence[int]]) -> dict[str, int]:
    """Merge tile states by exact addition: the raw parts ``{"n", "s", "ss_hi", "ss_lo"}``
    of the union of their events, as ``compute`` gives them (``finalize`` reads them).
    Raises OverflowError where ``s`` would not fit int64's exact range (``|s| >= 2^62``)."""
    n = s = ss = 0
    for st in states:
        n += int(st[0])
        s += int(st[1])
        ss += (int(st[2]) << SS_SHIFT) + int(st[3])
    if abs(s) >= 2**62:
        raise OverflowError("the merged sum does not fit 64-bit integers")
    return {"n": n, "s": s, "ss_hi": ss >> SS_SHIFT, "ss_lo": ss & ((1 << SS_SHIFT) - 1)}


def first_state(times_us: Sequence[int] | npt.NDArray[Any], values: Sequence[Any] | npt.NDArray[Any]
                ) -> list[Any] | None:
    """``first``'s mergeable state of a set of counted events: ``[time us, value]`` of the
    oldest (None: no event). Values as the engine carries them (unscaled int64 for a
    decimal, the float for a float field); one entity has one event per time."""
    if len(times_us) == 0:
        return None
    i = int(np.argmin(np.asarray(times_us, dtype=np.int64)))
    v = values[i]
    return [int(times_us[i]), v.item() if isinstance(v, np.generic) else v]


def merge_first(states: Iterable[Sequence[Any] | None]) -> dict[str, Any]:
    """Merge ``first`` states: the raw part ``{"v": value of the oldest}`` (None: no event)."""
    kept = [st for st in states if st is not None]
    return {"v": min(kept, key=lambda st: int(st[0]))[1] if kept else None}


__all__ = ["FIXED_LIMIT", "PARTS", "SS_SHIFT", "first_state", "fixed_point", "merge", "merge_first",
           "numerator", "state", "variance", "window_squares"]
