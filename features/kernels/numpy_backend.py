"""The NumPy program: every feature's steps run chunk by chunk, in place, in cache.

This is the CPU twin of the fused CuPy kernel (``cupy_backend``). It does the same
float64 operations in the same order, so both give bit-identical results:

- rows are processed in chunks of ``chunk_rows`` (32 768 by default: a dozen 256 KiB
  scratch buffers stay in L2/L3 cache, and the per-call overhead of NumPy is paid
  once per 32k rows), and every step of every feature runs on a chunk before the next
  chunk is touched, the way one GPU thread runs all steps of one row;
- each step is one or a few NumPy ufunc calls with ``out=`` into preallocated scratch
  buffers: no temporaries, no full-array passes per op;
- nulls and invalid results are tracked in an int8 status per row and feature
  (``ops.OK``, ``ops.NULL``, ``ops.INVALID_BASE + step``); values of rows that are not
  OK are arbitrary and never reach an output.

``log1p`` is not NumPy's: libm and CUDA's ``log1p`` may differ in the last bit, and a
one-ulp difference can move a value across a bucket boundary or a rounding tie. Both
backends use :func:`log1p` below (fdlibm's algorithm, written with +, -, *, / and
``frexp`` only, each correctly rounded in IEEE 754, and no fused multiply-add), which
is within one ulp of the true value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from features.kernels.columns import SlotValues
from features.kernels.ops import (
    INT_BOUNDS,
    INVALID_BASE,
    NULL,
    OK,
    Bucketize,
    Cast,
    Clip,
    Combine,
    FeaturePlan,
    FillNull,
    KernelOp,
    Log1p,
    MinMax,
    ProgramPlan,
    Ratio,
    TimeSince,
    ZScore,
)
from features.schema.model import TypeKind

F64 = npt.NDArray[np.float64]
DEFAULT_CHUNK_ROWS: Final = 32_768
#: At most this many boundaries are compared one by one; more use a binary search.
UNROLLED_BOUNDARIES: Final = 32

# fdlibm log1p constants (k*LN2_HI is exact for |k| < 2**20).
LN2_HI: Final = float.fromhex("0x1.62e42fee00000p-1")
LN2_LO: Final = float.fromhex("0x1.a39ef35793c76p-33")
LP: Final = (
    float.fromhex("0x1.5555555555593p-1"),
    float.fromhex("0x1.999999997fa04p-2"),
    float.fromhex("0x1.2492494229359p-2"),
    float.fromhex("0x1.c71c51d8e78afp-3"),
    float.fromhex("0x1.7466496cb03dep-3"),
    float.fromhex("0x1.39a09d078c69fp-3"),
    float.fromhex("0x1.2f112df3e5244p-3"),
)
SQRT_HALF: Final = float.fromhex("0x1.6a09e667f3bcdp-1")
SMALL_LO: Final = -0.2928932188134524  # -(1 - sqrt(2) / 2): below SMALL_HI and above this, f = x
SMALL_HI: Final = 0.41421356237309503  # sqrt(2) - 1
TWO53: Final = 2.0**53
NUMPY_DTYPES: Final[dict[TypeKind, type[np.generic]]] = {
    TypeKind.INT8: np.int8,
    TypeKind.INT16: np.int16,
    TypeKind.INT32: np.int32,
    TypeKind.INT64: np.int64,
    TypeKind.FLOAT32: np.float32,
    TypeKind.FLOAT64: np.float64,
    TypeKind.BOOL: np.bool_,
}


def log1p(x: F64, xp: Any = np) -> F64:
    """ln(1 + x) for x > -1, within one ulp; the reference form of the portable log1p.

    The same expression, operation for operation, is the CUDA ``fl_log1p`` of the
    generated kernel and the chunked in-place version used by the NumPy program.
    Results for x <= -1 are meaningless (the callers mark those rows invalid).
    ``xp`` is the array module (``numpy``, or ``cupy`` for the unfused GPU benchmark).
    """
    with np.errstate(all="ignore"):
        u = 1.0 + x
        c = (x - (u - 1.0)) / u                      # the rounding error of 1 + x, relative
        big = x >= TWO53
        u = xp.where(big, x, u)
        c = xp.where(big, 0.0, c)
        m, e = xp.frexp(u)
        low = m < SQRT_HALF
        m = xp.where(low, m + m, m)
        k = (e - low).astype(xp.float64)
        f = m - 1.0
        small = (x > SMALL_LO) & (x < SMALL_HI)
        f = xp.where(small, x, f)
        k = xp.where(small, 0.0, k)
        c = xp.where(small, 0.0, c)
        hfsq = (0.5 * f) * f
        s = f / (2.0 + f)
        z = s * s
        r = z * (LP[0] + z * (LP[1] + z * (LP[2] + z * (LP[3] + z * (LP[4] + z * (LP[5] + z * LP[6]))))))
        out: F64 = k * LN2_HI - ((hfsq - (s * (hfsq + r) + (k * LN2_LO + c))) - f)
    return out


@dataclass(frozen=True)
class KernelOutput:
    """What a backend returns for the kernel features of a plan (``plan.kernel``).

    ``values[j]``: the output of kernel feature ``j`` in its declared NumPy dtype,
    arbitrary where the status is not OK. ``status``: int8, shape (kernel features,
    rows): ``OK``, ``NULL`` or ``INVALID_BASE + step``.
    """

    values: list[npt.NDArray[np.generic]]
    status: npt.NDArray[np.int8]


class _Scratch:
    """Preallocated chunk buffers (one set per run)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.x, self.r, self.d, self.u, self.c, self.f, self.k, self.s, self.z, self.t = (
            np.empty(rows) for _ in range(10)
        )
        self.e = np.empty(rows, dtype=np.int32)
        self.b, self.b2 = np.empty(rows, dtype=np.bool_), np.empty(rows, dtype=np.bool_)
        self.f32 = np.empty(rows, dtype=np.float32)


def load_slot(out: F64, slot: SlotValues, start: int, stop: int) -> None:
    """Rows [start, stop) of ``slot`` as float64 into ``out``, NaN where null."""
    np.copyto(out, slot.values[start:stop], casting="unsafe")
    if slot.null is not None:
        np.copyto(out, np.nan, where=slot.null[start:stop])


def _mark(st: npt.NDArray[np.int8], bad: npt.NDArray[np.bool_], ok: npt.NDArray[np.bool_], code: int) -> None:
    """Set status ``code`` where ``bad`` and the row is still OK (``bad`` is clobbered)."""
    if bad.any():
        np.equal(st, OK, out=ok)
        np.logical_and(bad, ok, out=bad)
        np.copyto(st, code, where=bad)


def _log1p_inplace(x: F64, sc: _Scratch, m: int) -> None:
    """:func:`log1p` of ``x`` into ``x``, with scratch buffers instead of temporaries."""
    u, c, f, k, s, z, t, r = (a[:m] for a in (sc.u, sc.c, sc.f, sc.k, sc.s, sc.z, sc.t, sc.r))
    e, b = sc.e[:m], sc.b[:m]
    np.add(x, 1.0, out=u)
    np.subtract(u, 1.0, out=c)
    np.subtract(x, c, out=c)
    np.divide(c, u, out=c)
    np.greater_equal(x, TWO53, out=b)
    if b.any():
        np.copyto(u, x, where=b)
        np.copyto(c, 0.0, where=b)
    np.frexp(u, out=(f, e))                       # f: mantissa in [0.5, 1)
    np.less(f, SQRT_HALF, out=b)
    np.copyto(k, e)
    np.subtract(k, b, out=k)
    np.add(f, f, out=t)
    np.copyto(f, t, where=b)
    np.subtract(f, 1.0, out=f)
    np.greater(x, SMALL_LO, out=b)
    np.less(x, SMALL_HI, out=sc.b2[:m])
    np.logical_and(b, sc.b2[:m], out=b)
    np.copyto(f, x, where=b)
    np.copyto(k, 0.0, where=b)
    np.copyto(c, 0.0, where=b)
    hfsq = u                                      # u is free from here on
    np.multiply(f, 0.5, out=hfsq)
    np.multiply(hfsq, f, out=hfsq)
    np.add(f, 2.0, out=s)
    np.divide(f, s, out=s)
    np.multiply(s, s, out=z)
    np.multiply(z, LP[6], out=r)
    for coeff in LP[5::-1]:
        np.add(r, coeff, out=r)
        np.multiply(z, r, out=r)
    np.add(hfsq, r, out=r)                        # hfsq + R
    np.multiply(s, r, out=r)                      # s * (hfsq + R)
    np.multiply(k, LN2_LO, out=t)
    np.add(t, c, out=t)                           # k * LN2_LO + c
    np.add(r, t, out=r)
    np.subtract(hfsq, r, out=r)
    np.subtract(r, f, out=r)
    np.multiply(k, LN2_HI, out=x)
    np.subtract(x, r, out=x)


def _null_rows(slot: SlotValues, start: int, stop: int) -> npt.NDArray[np.bool_] | None:
    """The null mask of rows [start, stop) of ``slot``, or None when none is null."""
    if slot.null is None:
        return None
    chunk = slot.null[start:stop]
    return chunk if chunk.any() else None


def apply_op(
    op: KernelOp, x: F64, st: npt.NDArray[np.int8], sc: _Scratch, m: int,
    slots: Sequence[SlotValues], start: int, maybe_null: bool,
) -> bool:
    """Apply one kernel op, in place, to chunk ``x`` (rows [start, start + m)).

    Values of rows whose status is not OK are arbitrary and never read. ``maybe_null``
    says whether a row of the chunk may be NULL (False lets fill_null skip its work);
    returns the same for after the op.
    """
    b, ok = sc.b[:m], sc.b2[:m]
    if isinstance(op, FillNull):
        if maybe_null:
            np.equal(st, NULL, out=b)
            np.copyto(x, op.value, where=b)
            np.copyto(st, OK, where=b)
        return False
    elif isinstance(op, Clip):
        if op.lo is not None:
            np.less(x, op.lo, out=b)
            np.copyto(x, op.lo, where=b)
        if op.hi is not None:
            np.greater(x, op.hi, out=b)
            np.copyto(x, op.hi, where=b)
    elif isinstance(op, Log1p):
        np.less_equal(x, -1.0, out=b)
        _mark(st, b, ok, INVALID_BASE + op.step)
        _log1p_inplace(x, sc, m)
    elif isinstance(op, (ZScore, MinMax)):
        shift, scale = (op.mean, op.std) if isinstance(op, ZScore) else (op.lo, op.span)
        np.subtract(x, shift, out=x)
        np.divide(x, scale, out=x)
        np.isfinite(x, out=b)
        np.logical_not(b, out=b)
        _mark(st, b, ok, INVALID_BASE + op.step)
    elif isinstance(op, Bucketize):
        if len(op.boundaries) <= UNROLLED_BOUNDARIES:
            count = sc.t[:m]
            count.fill(0.0)
            for bound in op.boundaries:
                np.greater_equal(x, bound, out=b)
                np.add(count, b, out=count)
            np.copyto(x, count)
        else:
            np.copyto(x, np.searchsorted(np.asarray(op.boundaries), x, side="right"))
    elif isinstance(op, Ratio):
        d = sc.d[:m]
        den = slots[op.slot]
        np.copyto(d, den.values[start:start + m], casting="unsafe")
        null = _null_rows(den, start, start + m)
        if null is not None:                      # a null denominator gives null
            np.copyto(b, null)
            _mark(st, b, ok, NULL)
            maybe_null = True
        np.divide(x, d, out=x)
        np.equal(d, 0.0, out=b)
        if op.on_zero is None:
            maybe_null = maybe_null or bool(b.any())
            _mark(st, b, ok, NULL)
        else:
            np.copyto(x, op.on_zero, where=b)
        np.isfinite(x, out=b)
        np.logical_not(b, out=b)
        _mark(st, b, ok, INVALID_BASE + op.step)
    elif isinstance(op, Combine):
        d = sc.d[:m]
        other = slots[op.slot]
        np.copyto(d, other.values[start:start + m], casting="unsafe")
        null = _null_rows(other, start, start + m)
        if null is not None:                      # a null operand gives null (or on_null)
            np.copyto(b, null)
            _mark(st, b, ok, NULL)
            maybe_null = True
        (np.subtract if op.op == "difference" else np.multiply)(x, d, out=x)
        np.isfinite(x, out=b)
        np.logical_not(b, out=b)
        _mark(st, b, ok, INVALID_BASE + op.step)
        if op.on_null is not None:
            if maybe_null:
                np.equal(st, NULL, out=b)
                np.copyto(x, op.on_null, where=b)
                np.copyto(st, OK, where=b)
            maybe_null = False
    elif isinstance(op, TimeSince):
        np.divide(x, op.divisor, out=x)
    elif isinstance(op, Cast):
        _cast(op, x, st, sc, m)
    return maybe_null


def _cast(op: Cast, x: F64, st: npt.NDArray[np.int8], sc: _Scratch, m: int) -> None:
    b, ok = sc.b[:m], sc.b2[:m]
    if op.exact:
        return
    if op.kind in INT_BOUNDS:
        lo, hi = INT_BOUNDS[op.kind]
        np.rint(x, out=x)                         # round half to even
        np.add(x, 0.0, out=x)                     # -0.0 becomes 0.0: integers have one zero
        np.greater_equal(x, lo, out=b)
        np.less(x, hi, out=ok)
        np.logical_and(b, ok, out=b)
        np.logical_not(b, out=b)
        _mark(st, b, ok, INVALID_BASE + op.step)
    elif op.kind is TypeKind.FLOAT32:
        f32 = sc.f32[:m]
        np.copyto(f32, x, casting="same_kind")    # round to nearest even; overflow gives inf
        np.copyto(x, f32)
        np.isfinite(x, out=b)
        np.logical_not(b, out=b)
        _mark(st, b, ok, INVALID_BASE + op.step)
    elif op.kind is TypeKind.BOOL:
        np.not_equal(x, 0.0, out=b)
        np.copyto(x, b)


def eval_feature(
    fp: FeaturePlan, slots: Sequence[SlotValues], start: int, stop: int, sc: _Scratch,
    st: npt.NDArray[np.int8], *, stop_at: int | None = None,
) -> F64:
    """Run feature ``fp`` on rows [start, stop): fills ``st`` and returns the values
    (a scratch view). With ``stop_at``, stop before the op of that step and return the
    values entering it (reject messages)."""
    assert fp.slot is not None
    m = stop - start
    x = sc.x[:m]
    slot = slots[fp.slot]
    np.copyto(x, slot.values[start:stop], casting="unsafe")
    null = _null_rows(slot, start, stop)
    if null is None:
        st.fill(OK)
    else:
        np.copyto(st.view(np.bool_), null)        # status NULL (1) where null, else OK (0)
    maybe_null = null is not None
    for op in fp.ops:
        if op.step == stop_at:
            break
        maybe_null = apply_op(op, x, st, sc, m, slots, start, maybe_null)
    return x


class NumpyBackend:
    """Runs a :class:`ProgramPlan`'s kernel features with NumPy (see module docstring).

    Stateless between runs apart from its settings; safe to share across threads.
    """

    device = "cpu"

    def __init__(self, plan: ProgramPlan, *, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.plan = plan
        self.chunk_rows = chunk_rows

    def run(self, slots: Sequence[SlotValues], rows: int) -> KernelOutput:
        """All kernel features over ``rows`` rows of ``slots``."""
        feats = [self.plan.features[i] for i in self.plan.kernel]
        values = [np.empty(rows, dtype=NUMPY_DTYPES[fp.dtype.kind]) for fp in feats]
        status = np.empty((len(feats), rows), dtype=np.int8)
        sc = _Scratch(min(self.chunk_rows, max(rows, 1)))
        with np.errstate(all="ignore"):
            for start in range(0, rows, sc.rows):
                stop = min(rows, start + sc.rows)
                for j, fp in enumerate(feats):
                    x = eval_feature(fp, slots, start, stop, sc, status[j, start:stop])
                    np.copyto(values[j][start:stop], x, casting="unsafe")
        return KernelOutput(values, status)


def values_entering(
    fp: FeaturePlan, slots: Sequence[SlotValues], rows: npt.NDArray[np.int64], step: int,
) -> F64:
    """The float64 values entering step ``step`` of ``fp`` at ``rows`` (for messages).

    Recomputed with the NumPy program on just those rows: both backends agree bit for
    bit, so this is the value the failing op saw on either device.
    """
    sub = [s.take(rows) for s in slots]
    sc = _Scratch(max(len(rows), 1))
    st = np.empty(len(rows), dtype=np.int8)
    with np.errstate(all="ignore"):
        x = eval_feature(fp, sub, 0, len(rows), sc, st, stop_at=step)
    return x.copy()


__all__ = ["DEFAULT_CHUNK_ROWS", "NUMPY_DTYPES", "KernelOutput", "NumpyBackend", "log1p", "values_entering"]
