"""The sketch aggregations: ``approx_count_distinct`` (HyperLogLog registers) and
``approx_percentile`` (a log-bucketed histogram in the DDSketch style). Both values are
functions of the *multiset* of a window's contributing values only: never of their
order, of the cut into loads or micro-batches, or of the machine (integer arithmetic and
single IEEE 754 operations only; no ``log``, no randomness). ``docs/aggregations.md``
("Sketches") states the definitions for users; this module is the one implementation:
the engine (``features.aggregate.engine.window_raw``: every event's window, so the
backfill, the stream and ``historical(..., windows="request_time")``) and the mergeable
states a tile would keep (``hll_state``/``percentile_state``, merged by register maximum
and by bucket count sums).

**approx_count_distinct** (``precision: p``, 4..18, default 12; ``m = 2^p`` registers).

- Hash: ``h = mix(word + 0x9e3779b97f4a7c15)`` (SplitMix64 with the word as its state;
  ``mix`` the SplitMix64 finaliser of ``features.kernels.digest``), where ``word`` is the
  value's canonical 64-bit word of the content digest (``features.kernels.digest.
  value_words``: an integer its two's complement, a float its IEEE bits with ``-0.0`` as
  ``0.0``, a string FNV-1a 64 of its UTF-8 bytes, ...). So ``int32`` 7 and ``int64`` 7
  count as one value. NaN is refused (``ValueError``).
- Register ``j = h >> (64 - p)``; ``rho = min(clz64(h << p) + 1, 63 - p)`` (the cap is
  reached with probability ``2^-(62-p)`` per value). A window's register ``M[j]`` is the
  largest rho of its values in register j (0: none): registers merge by maximum.
- The registers reduce to two exact integers (the raw parts): ``nz`` (registers above 0)
  and ``w = sum over them of 2^(63 - p - M[j])`` (below 2^62); a third, ``d``, is the
  number of distinct hashes in the window.
- **Exact while small** (as DataSketches' list/set modes, HyperLogLog++'s sparse one): a
  window with ``d <= 2^p / 8`` distinct hashes (512 at p = 12; its state is at most that
  many 8-byte hashes, no more than the registers' bytes) is stored ``d``: exact but for
  64-bit hash collisions. Beyond, the registers' estimate:
- Estimate (Ertl 2017, "New cardinality estimation algorithms for HyperLogLog sketches",
  the *improved raw estimator*; no empirical bias tables, no thresholds): with ``x = (m -
  nz) / m``, ``sigma(x) = x + sum_k>=1 x^(2^k) 2^(k-1)`` (iterated until the sum stops
  changing, as in the paper), ``E = m^2 / (2 ln 2) / (m sigma(x) + w 2^-(63-p))``; stored
  ``rint(E)`` (half to even) as a bigint, 0 for a window without values. Relative
  standard error ``1.04 / sqrt(m)`` (1.625% at p = 12).

**approx_percentile** (``q``: one or more quantiles in [0, 1]; ``relative_accuracy: a``,
0.001..0.25, default 0.01). ``B = ceil((1 - a) / (2a))`` buckets per power of two (50 at
a = 0.01):

- a value ``x`` (a float64: an integer converted, a decimal ``unscaled / 10^scale``, each
  one rounding; NaN and ±inf refused) with ``|x| = (1 + f / 2^52) 2^e`` (its IEEE
  exponent and fraction bits; subnormals normalised) falls in bucket ``k = e B +
  floor(f B / 2^52)`` (exact integer arithmetic), on the side of its sign; 0 in a bucket
  of its own. The bucket of ``k`` spans ``[(1 + j/B) 2^e, (1 + (j+1)/B) 2^e)`` with ``e =
  floor(k / B)``, ``j = k - e B``. Its key (an int64 that orders buckets as their values)
  is ``sign(x) (k + 2^32)``, 0 for zero. Buckets merge by adding counts.
- The value for ``q`` is the bucket value of the element of 0-based rank ``r = floor(q
  (n - 1))`` (double precision) of the ``n`` contributing values in ascending order
  (numpy's ``quantile(..., method="lower")``): ``sign 2^e 2(B + j)(B + j + 1) / (B (2B +
  2j + 1))`` (the bucket's harmonic mean; clamped to ±DBL_MAX in the top buckets), 0 for
  zero; null when ``n = 0``.
- Guarantee: buckets are monotone in ``x``, so the rank-r bucket holds the exact order
  statistic ``x_(r)``, and ``|value - x_(r)| <= |x_(r)| / (2B + 2j + 1) <= a |x_(r)|`` (plus
  one rounding of the division, 2^-53 relative).

Cost per event, vectorised over all events (no loop over rows): HyperLogLog O(n log n)
whatever the windows' lengths (each value is its register's maximum for one contiguous
run of windows: "previous greater" and "next greater-or-equal" per rho level, then
difference arrays); the percentile O(n log V) (V distinct buckets): a k-th smallest
query per window and quantile on a wavelet matrix of the bucket ranks.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.kernels.digest import mix, value_words
from features.schema.aggregations import (  # the bounds the schema checks
    ACCURACY_DEFAULT,
    ACCURACY_MAX,
    ACCURACY_MIN,
    PRECISION_DEFAULT,
    PRECISION_MAX,
    PRECISION_MIN,
)

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
F64 = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]

#: the fixed hash seed (added to each value's word before the SplitMix64 finaliser)
HASH_SEED: Final = 0x9E3779B97F4A7C15
#: bucket keys: sign * (k + KEY_OFFSET), so that keys order as bucket values do
KEY_OFFSET: Final = 2**32
_DBL_MAX: Final = float(np.finfo(np.float64).max)
_FRACTION_BITS: Final = 52
_FRACTION_MASK: Final = (1 << 52) - 1


# --------------------------------------------------------------------------- hashing


def hash64(values: pa.Array | pa.ChunkedArray) -> U64:
    """The documented 64-bit hash of every value (nulls: a hash of their own; mask them)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_floating(values.type) and bool(pc.any(pc.fill_null(pc.is_nan(values), False)).as_py()):
        raise ValueError("approx_count_distinct: a NaN value cannot be counted (NaN is not a value)")
    out: U64 = mix(value_words(values) + np.uint64(HASH_SEED))
    return out


def clz64(x: U64) -> I64:
    """Leading zero bits of each 64-bit value (64 for 0): a 6-step binary search."""
    n = np.zeros(len(x), dtype=np.int64)
    x = x.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        top_zero = (x >> np.uint64(64 - shift)) == 0
        n += np.where(top_zero, shift, 0)
        x = np.where(top_zero, x << np.uint64(shift), x)
    n += x == 0
    return n


def registers(h: U64, p: int) -> tuple[I64, I64]:
    """(register, rho) of each hash: its top ``p`` bits, and the leading zeros of the rest
    plus one, capped at ``63 - p``."""
    reg = (h >> np.uint64(64 - p)).astype(np.int64)
    rho = np.minimum(clz64(h << np.uint64(p)) + 1, 63 - p)
    return reg, rho


def _sigma(x: F64) -> F64:
    """Ertl's sigma(x) = x + sum_k>=1 x^(2^k) 2^(k-1) for 0 <= x < 1, element-wise; each
    element iterates until its sum stops changing (the paper's loop), so it does not
    depend on the other elements."""
    z = x.copy()
    y = np.ones_like(x)
    xx = x.copy()
    done = x == 0
    while not bool(done.all()):
        xx = xx * xx
        z_new = z + xx * y
        y = y + y
        done = done | (z_new == z)
        z = np.where(done, z, z_new)
    return z


def sparse_max(p: int) -> int:
    """The most distinct hashes a window counts exactly: ``2^p / 8``."""
    return (1 << p) // 8


def hll_estimate(d: I64, nz: I64, w: I64, p: int) -> I64:
    """The stored value from the raw parts (see the module docstring): ``d`` where ``d <=
    2^p / 8``, else the registers' estimate from ``nz`` and ``w``."""
    return np.where(d <= sparse_max(p), d, register_estimate(nz, w, p))


def register_estimate(nz: I64, w: I64, p: int) -> I64:
    """Ertl's improved raw estimate from the registers' raw parts ``nz``, ``w``."""
    m = 1 << p
    empty = nz == 0
    x = np.where(empty, 0.0, (m - nz).astype(np.float64) / np.float64(m))
    denom = np.float64(m) * _sigma(x) + w.astype(np.float64) * np.float64(2.0 ** -(63 - p))
    with np.errstate(divide="ignore"):
        est = np.float64(m * m / (2.0 * math.log(2.0))) / np.where(empty, 1.0, denom)
    out: I64 = np.where(empty, 0, np.rint(est)).astype(np.int64)
    return out


def relative_standard_error(p: int) -> float:
    """The documented relative standard error of the estimate: ``1.04 / sqrt(2^p)``."""
    return 1.04 / math.sqrt(1 << p)


def hll_windows(codes: I64, h: U64, mask: Mask, lo: I64, p: int) -> tuple[I64, I64]:
    """Register raw parts (nz, w) for every window ``[lo[i], i]`` of events sorted by
    (entity ``codes``, time), ``h`` their hashes (:func:`hash64`); ``lo`` never decreases
    and stays within the entity. (``d``, the distinct hashes, is the engine's exact
    distinct count of ``h``.)

    Event ``j`` (contributing) is *the* maximum of its register in window ``i`` (the
    newest of the largest rho there) exactly when ``lo[i] <= j <= i``, no event of its
    (entity, register) in ``(j, i]`` has rho >= rho[j] and none in ``[lo[i], j)`` has rho >
    rho[j]. As ``lo`` never decreases those ``i`` are one run: from ``max(j, first i with
    lo[i] > P)`` to ``min(Q - 1, last i with lo[i] <= j)``, P the previous greater and Q
    the next greater-or-equal event of its group. Adding ``(1, 2^(63-p-rho))`` over each
    run (difference arrays) gives (nz, w). O(n log n)."""
    n = len(codes)
    nz = np.zeros(n + 1, dtype=np.int64)
    ww = np.zeros(n + 1, dtype=np.int64)
    m = np.flatnonzero(mask)
    if len(m) == 0:
        return nz[:n], ww[:n]
    reg, rho = registers(h[m], p)
    group = codes[m] * (1 << p) + reg
    order = np.argsort(group, kind="stable")      # by group, then position (m ascends)
    sg, sp, sr = group[order], m[order], rho[order]
    prev_pos = np.full(len(sp), -1, dtype=np.int64)
    next_pos = np.full(len(sp), n, dtype=np.int64)
    for v in np.unique(sr):
        sub = np.flatnonzero(sr >= v)
        rs, gs = sr[sub], sg[sub]
        query = rs == v
        idx = np.arange(len(sub))
        pm = np.maximum.accumulate(np.where(rs > v, idx, -1))
        pmc = np.maximum(pm, 0)
        has_prev = (pm >= 0) & (gs[pmc] == gs)
        q = sub[query]
        prev_pos[q] = np.where(has_prev, sp[sub[pmc]], -1)[query]
        # the next event of the group with rho >= v is the next one of ``sub``
        nxt = np.minimum(idx + 1, len(sub) - 1)
        has_next = (idx + 1 < len(sub)) & (gs[nxt] == gs)
        next_pos[q] = np.where(has_next, sp[sub[nxt]], n)[query]
    a = np.maximum(sp, np.searchsorted(lo, prev_pos, side="right"))
    b = np.minimum(next_pos - 1, np.searchsorted(lo, sp, side="right") - 1)
    run = a <= b
    a, b = a[run], b[run] + 1
    weight = np.left_shift(np.int64(1), (63 - p - sr[run]).astype(np.int64))
    nz += np.bincount(a, minlength=n + 1) - np.bincount(b, minlength=n + 1)
    # the weights' difference array, exactly: two 31-bit halves summed as doubles (at one
    # index at most one run per register starts or ends: sums below 2^31 * 2^18 < 2^53),
    # then joined as integers
    for shift, part in ((31, weight >> 31), (0, weight & 0x7FFFFFFF)):
        add = np.bincount(a, weights=part, minlength=n + 1) - np.bincount(b, weights=part, minlength=n + 1)
        ww += add.astype(np.int64) << shift
    return np.cumsum(nz[:n]), np.cumsum(ww[:n])


#: a tile's HyperLogLog state: its distinct hashes (sorted; None once more than
#: ``2^p / 8``) and its ``2^p`` one-byte registers
HllState = tuple[U64 | None, npt.NDArray[np.uint8]]


def hll_state(values: pa.Array | pa.ChunkedArray, p: int) -> HllState:
    """The state of the non-null ``values``."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    values = values.filter(values.is_valid())
    regs = np.zeros(1 << p, dtype=np.uint8)
    h = hash64(values) if len(values) else np.zeros(0, np.uint64)
    if len(h):
        reg, rho = registers(h, p)
        np.maximum.at(regs, reg, rho.astype(np.uint8))
    uniq = np.unique(h)
    return (uniq if len(uniq) <= sparse_max(p) else None), regs


def hll_merge(states: list[HllState], p: int) -> HllState:
    """States merge by register maximum and hash union (any order, any grouping: the same
    state)."""
    regs: npt.NDArray[np.uint8] = np.maximum.reduce([s[1] for s in states])
    hashes = [s[0] for s in states]
    if any(x is None for x in hashes):
        return None, regs
    uniq = np.unique(np.concatenate([x for x in hashes if x is not None]))
    return (uniq if len(uniq) <= sparse_max(p) else None), regs


def hll_state_estimate(state: HllState, p: int) -> int:
    """The stored value of a state: its distinct hashes while few, else the estimate from
    its registers alone."""
    hashes, regs = state
    if hashes is not None:
        return len(hashes)
    r = regs.astype(np.int64)
    nzr = r[r > 0]
    w = int(np.sum(np.left_shift(np.int64(1), 63 - p - nzr))) if len(nzr) else 0
    return int(register_estimate(np.array([len(nzr)], np.int64), np.array([w], np.int64), p)[0])


# --------------------------------------------------------------------------- percentile


def buckets_per_octave(a: float) -> int:
    """``B = ceil((1 - a) / (2a))``: the bucket count per power of two that keeps the
    relative error within ``a`` (``1 / (2B + 1) <= a``)."""
    b = math.ceil((1.0 - a) / (2.0 * a))
    while 1.0 / (2 * b + 1) > a:  # guard the float division above
        b += 1
    return b


def as_float64(values: npt.NDArray[Any], scale: int | None) -> F64:
    """Numeric values as float64: integers converted, a decimal's unscaled integer divided
    by ``10^scale`` (one correctly rounded division each)."""
    x = np.asarray(values)
    if x.dtype.kind == "f":
        return x.astype(np.float64)
    out = x.astype(np.int64).astype(np.float64)
    if scale:
        out = out / np.float64(10.0 ** scale)
    return out


def bucket_keys(x: F64, a: float) -> I64:
    """The bucket key of every value (see the module docstring); NaN/±inf refused."""
    if not bool(np.isfinite(x).all()):
        raise ValueError("approx_percentile: NaN and ±inf values cannot be bucketed")
    big = 1 << 64
    ax = np.abs(x)
    sub = (ax < np.finfo(np.float64).tiny) & (ax > 0)
    with np.errstate(over="ignore"):
        scaled = np.where(sub, ax * np.float64(float(big)), ax)   # exact: subnormals become normal
    bits = np.ascontiguousarray(scaled).view(np.int64)
    e = (bits >> _FRACTION_BITS) - 1023 - np.where(sub, 64, 0)
    f = bits & _FRACTION_MASK
    b = buckets_per_octave(a)
    k = e * b + ((f * b) >> _FRACTION_BITS)           # f * b < 2^52 * 2^10: exact in int64
    keys: I64 = np.where(x == 0, 0, np.where(x < 0, -(k + KEY_OFFSET), k + KEY_OFFSET))
    return keys


def bucket_values(keys: I64, a: float) -> F64:
    """The value of every bucket key: its bucket's harmonic mean, 0 for the zero bucket."""
    b = buckets_per_octave(a)
    k = np.abs(keys) - KEY_OFFSET
    e = np.floor_divide(k, b)
    j = k - e * b
    num = 2.0 * (b + j).astype(np.float64) * (b + j + 1).astype(np.float64)   # exact integers
    den = np.float64(b) * (2 * b + 2 * j + 1).astype(np.float64)
    with np.errstate(over="ignore"):  # the top buckets' mean may pass DBL_MAX: clamped (still closer)
        mag = np.minimum(np.ldexp(num / den, np.where(keys == 0, 0, e).astype(np.int32)), _DBL_MAX)
    out: F64 = np.where(keys == 0, 0.0, np.where(keys < 0, -mag, mag))
    return out


def rank_of(q: float, n: I64) -> I64:
    """The 0-based rank ``floor(q (n - 1))`` (double precision), 0 where n <= 1."""
    r: I64 = np.floor(np.float64(q) * np.maximum(n - 1, 0).astype(np.float64)).astype(np.int64)
    return r


def kth_smallest(ranks: I64, left: I64, right: I64, k: I64) -> I64:
    """``sorted(ranks[left[i]:right[i]])[k[i]]`` for every query (``0 <= k < right - left``;
    other queries get an arbitrary value): a wavelet matrix built level by level (one
    level's zero counts alive at a time), O((n + queries) log V)."""
    top = int(ranks.max()) if len(ranks) else 0
    bits = max(1, top.bit_length())
    cur = ranks
    lft, rgt, kk = left.copy(), right.copy(), k.copy()
    val = np.zeros(len(left), dtype=np.int64)
    zeros = np.zeros(len(cur) + 1, dtype=np.int64)
    for level in range(bits):
        bit = (cur >> (bits - 1 - level)) & 1
        zero = bit == 0
        np.cumsum(zero, out=zeros[1:])
        total = int(zeros[-1])
        zl, zr = zeros[lft], zeros[rgt]
        cz = zr - zl
        one = kk >= cz
        kk = np.where(one, kk - cz, kk)
        lft = np.where(one, total + (lft - zl), zl)
        rgt = np.where(one, total + (rgt - zr), zr)
        val = (val << 1) | one
        cur = np.concatenate([cur[zero], cur[~zero]])
    return val


def percentile_windows(x: F64, mask: Mask, lo: I64, qs: tuple[float, ...], a: float) -> pa.Array:
    """For every window ``[lo[i], i]``: a list of the bucket key of rank ``floor(q(n-1))``
    per quantile ``q`` (null when the window holds no value)."""
    n = len(x)
    m = np.flatnonzero(mask)
    cnt = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(mask, out=cnt[1:])
    left, right = cnt[lo], cnt[1:]
    size = right - left
    empty = size == 0
    nq = len(qs)
    keys = np.zeros((n, nq), dtype=np.int64)
    if len(m):
        uniq, inv = np.unique(bucket_keys(x[m], a), return_inverse=True)
        k = np.concatenate([np.where(empty, 0, rank_of(q, size)) for q in qs])
        found = kth_smallest(inv.astype(np.int64).reshape(-1), np.tile(left, nq), np.tile(right, nq), k)
        keys = uniq[np.minimum(found, len(uniq) - 1)].reshape(nq, n).T
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * nq)
    return pa.ListArray.from_arrays(offsets, pa.array(keys.reshape(-1), pa.int64()),
                                    mask=pa.array(empty))


def percentile_values(keys: pa.Array | pa.ChunkedArray, a: float, listed: bool) -> pa.Array:
    """Raw bucket-key lists -> the stored values: a float64 (one quantile, ``listed``
    False) or a list<float64> per row; null for an empty window."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not listed:
        first = pc.list_element(keys, 0)
        filled = np.asarray(pc.fill_null(first, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        vals = bucket_values(filled, a)
        return pa.array(vals, pa.float64(), mask=np.asarray(first.is_null(), dtype=np.bool_))
    flat = np.asarray(keys.flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
    lengths = np.asarray(pc.fill_null(pc.list_value_length(keys), 0).to_numpy(zero_copy_only=False), np.int32)
    offsets = np.zeros(len(keys) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(bucket_values(flat, a), pa.float64()),
                                    mask=pc.invert(keys.is_valid()))


def percentile_state(x: F64, a: float) -> tuple[I64, I64]:
    """A tile's state: the non-empty buckets' keys (ascending) and counts."""
    keys, counts = np.unique(bucket_keys(x, a), return_counts=True)
    return keys.astype(np.int64), counts.astype(np.int64)


def percentile_merge(states: list[tuple[I64, I64]]) -> tuple[I64, I64]:
    """States merge by adding the counts of equal keys (exact integers: any order)."""
    keys = np.concatenate([s[0] for s in states])
    counts = np.concatenate([s[1] for s in states])
    uniq, inv = np.unique(keys, return_inverse=True)
    total = np.zeros(len(uniq), dtype=np.int64)
    np.add.at(total, inv.reshape(-1), counts)
    return uniq.astype(np.int64), total


def percentile_state_values(state: tuple[I64, I64], qs: tuple[float, ...], a: float) -> list[float | None]:
    """The value per quantile of a state (None when it holds no value)."""
    keys, counts = state
    total = int(counts.sum())
    if total == 0:
        return [None for _ in qs]
    cum = np.cumsum(counts)
    out: list[float | None] = []
    for q in qs:
        r = int(rank_of(q, np.array([total], dtype=np.int64))[0])
        key = keys[int(np.searchsorted(cum, r, side="right"))]
        out.append(float(bucket_values(np.array([key], dtype=np.int64), a)[0]))
    return out


__all__ = ["ACCURACY_DEFAULT", "ACCURACY_MAX", "ACCURACY_MIN", "HASH_SEED", "KEY_OFFSET",
           "PRECISION_DEFAULT", "PRECISION_MAX", "PRECISION_MIN", "HllState", "as_float64",
           "bucket_keys", "bucket_values", "buckets_per_octave", "clz64", "hash64", "hll_estimate",
           "hll_merge", "hll_state", "hll_state_estimate", "hll_windows", "kth_smallest",
           "percentile_merge", "percentile_state", "percentile_state_values", "percentile_values",
           "percentile_windows", "rank_of", "register_estimate", "registers", "relative_standard_error",
           "sparse_max"]
