"""The fused CuPy kernel: one generated ``cupy.RawKernel`` per schema.

Source generation is pure Python (no CuPy needed), so ``features kernels
--show-source`` works on any machine. One GPU thread computes every kernel feature of
one row, all steps in registers: one read of the packed inputs, one write of the
packed outputs, one pass over device memory.

Memory layout (row-major, ``N`` = rows in the batch)::

    inp   float64[slots * N]       slot s of row i at inp[s * N + i]; NaN = null
    outp  float64[2 * K * N]       value of kernel feature j at outp[j * N + i]
                                   status of feature j at outp[(K + j) * N + i]

Per batch: the host packs every slot into one pinned buffer, uploads it in one copy,
launches the kernel once, and downloads the outputs in one copy. Device and pinned
buffers are kept and reused (grown to the largest batch seen), so steady-state
batches allocate nothing.

Exactness: constants are written as hexadecimal float literals (exact; C++17, hence
``--std=c++17``; a non-finite one as its bit pattern), the kernel is compiled with
``--fmad=false`` (no fused multiply-add contraction), ``log1p`` is the portable
``fl_log1p`` (``numpy_backend.log1p``), and the float32 cast is ``fl_to_float32``,
integer arithmetic on the bits: the kernel holds no single-precision instruction, so
the ``-ftz=true`` that CuPy appends to every compile (flush float32 subnormals to zero)
changes nothing. ``tests/unit/test_kernels_nvrtc.py`` compiles the translation unit with
NVRTC (no GPU needed), checks the PTX has no ``.f32`` instruction, and runs the same
source compiled by g++ against the NumPy program.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from features.kernels.columns import SlotValues
from features.kernels.numpy_backend import (
    LN2_HI,
    LN2_LO,
    LP,
    NUMPY_DTYPES,
    SMALL_HI,
    SMALL_LO,
    SQRT_HALF,
    TWO53,
    UNROLLED_BOUNDARIES,
    KernelOutput,
    load_slot,
)
from features.kernels.nvrtc import CUPY_APPENDS
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
    HashSlot,
    KernelOp,
    Log1p,
    MinMax,
    ProgramPlan,
    Ratio,
    Slot,
    TimeSince,
    TimeSlot,
    ZScore,
    op_name,
)
from features.schema.model import TypeKind

#: threads per block of the launch (one thread per row)
THREADS: Final = 256
#: NVRTC options. C++17 for hexadecimal float literals (CuPy would otherwise pick C++11
#: or C++14); no contraction of a * b + c into an fma, which rounds once instead of twice.
NVRTC_OPTIONS: Final = ("--std=c++17", "--fmad=false")


def c_double(value: float) -> str:
    """An exact C++ expression for ``value``: a hexadecimal float literal, parenthesised;
    a non-finite value (a ``minmax`` span that overflows) as its bit pattern, which NVRTC
    and a host compiler both take (``inf`` and ``nan`` are not C++ tokens)."""
    v = float(value)
    if math.isfinite(v):
        return f"({v.hex()})"
    bits = struct.unpack("<q", struct.pack("<d", v))[0]
    return f"__longlong_as_double({bits}LL)"


def c_comment(text: str) -> str:
    """``text`` safe inside ``/* ... */``: printable ASCII only, no comment end."""
    safe = "".join(ch if 32 <= ord(ch) < 127 else f"\\u{ord(ch):04x}" for ch in text)
    return safe.replace("*/", "* /").replace("/*", "/ *")


def _log1p_source() -> str:
    lp = [c_double(v) for v in LP]
    poly = f"{lp[5]} + z * {lp[6]}"
    for coeff in reversed(lp[:5]):
        poly = f"{coeff} + z * ({poly})"
    return f"""\
/* ln(1 + x) for x > -1: fdlibm's log1p with +, -, *, / and frexp only (each correctly
   rounded), so it equals features.kernels.numpy_backend.log1p bit for bit. */
__device__ double fl_log1p(double x) {{
    double u = 1.0 + x;
    double c = (x - (u - 1.0)) / u;
    if (x >= {c_double(TWO53)}) {{ u = x; c = 0.0; }}
    int e;
    double m = frexp(u, &e);
    double k = (double)e;
    if (m < {c_double(SQRT_HALF)}) {{ m = m + m; k = (double)(e - 1); }}
    double f = m - 1.0;
    if (x > {c_double(SMALL_LO)} && x < {c_double(SMALL_HI)}) {{ f = x; k = 0.0; c = 0.0; }}
    double hfsq = (f * 0.5) * f;
    double s = f / (f + 2.0);
    double z = s * s;
    double r = z * ({poly});
    return k * {c_double(LN2_HI)} - ((hfsq - (s * (hfsq + r) + (k * {c_double(LN2_LO)} + c))) - f);
}}
"""


_TO_FLOAT32 = """\
/* x rounded to float32 (to nearest, ties to even; subnormals kept; beyond FLT_MAX: inf),
   as a double, in integer arithmetic on the bits: no single-precision instruction, so
   CuPy's -ftz=true (which flushes float32 subnormals) cannot change it, and it equals
   NumPy's astype(float32) bit for bit. */
__device__ double fl_to_float32(double x) {
    unsigned long long b = (unsigned long long)__double_as_longlong(x);
    unsigned long long sign = b >> 63;
    int exp = (int)((b >> 52) & 0x7ff);
    if (exp == 0x7ff) return x;                                   /* inf, nan */
    unsigned long long sig = b & 0xfffffffffffffULL;
    int e;                                                        /* x = sig * 2^(e - 52) */
    if (exp == 0) { e = -1022; } else { sig |= 0x10000000000000ULL; e = exp - 1023; }
    if (sig == 0) return x;                                       /* +-0 */
    int drop = 29;                                                /* 53 - 24 significant bits */
    if (e < -126) drop += -126 - e;                               /* float32 subnormal */
    double r;
    if (drop > 54) {
        r = 0.0;                                                  /* below half the least subnormal */
    } else {
        unsigned long long q = sig >> drop;
        unsigned long long rem = sig & ((1ULL << drop) - 1ULL);
        unsigned long long half = 1ULL << (drop - 1);
        if (rem > half || (rem == half && (q & 1ULL))) q += 1ULL;
        r = ldexp((double)q, e - 52 + drop);                      /* exact: q < 2^25 */
        if (r > (0x1.fffffep+127)) r = __longlong_as_double(0x7ff0000000000000LL);
    }
    return sign ? -r : r;
}
"""

_UPPER_BOUND = """\
/* Number of b[j] <= x (b sorted, strictly increasing): C++ upper_bound. */
__device__ int fl_upper_bound(const double* b, int nb, double x) {
    int lo = 0, hi = nb;
    while (lo < hi) { int mid = (lo + hi) / 2; if (b[mid] <= x) lo = mid + 1; else hi = mid; }
    return lo;
}
"""


@dataclass(frozen=True)
class KernelSource:
    """The generated kernel: a complete CUDA C++ translation unit that
    ``cupy.RawKernel`` compiles as it is (and ``features.kernels.nvrtc`` without a GPU)."""

    name: str
    preamble: str
    operation: str
    options: tuple[str, ...] = NVRTC_OPTIONS

    def translation_unit(self) -> str:
        """The whole source: the preamble's device functions, then one ``__global__``
        function, one thread per row ``i``."""
        body = "".join(f"    {line}\n" if line else "\n" for line in self.operation.splitlines())
        return (
            f"{self.preamble}"
            f'extern "C" __global__ void {self.name}(const double* __restrict__ inp, const long long nrows,\n'
            f"        double* __restrict__ outp) {{\n"
            f"    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"    if (i >= nrows) return;\n"
            f"{body}"
            f"}}\n"
        )

    def render(self) -> str:
        """The source as compiled, with its options (``features kernels --show-source``)."""
        return (f"// cupy.RawKernel {self.name!r}; NVRTC options: {' '.join(self.options)} "
                f"(CuPy appends {' '.join(CUPY_APPENDS)})\n{self.translation_unit()}")


def _describe(op: KernelOp) -> str:
    name = op_name(op)
    if isinstance(op, FillNull):
        return f"{name} {op.value!r}"
    if isinstance(op, Clip):
        return f"{name} lo={op.lo!r} hi={op.hi!r}"
    if isinstance(op, ZScore):
        return f"{name} mean={op.mean!r} std={op.std!r}"
    if isinstance(op, MinMax):
        return f"{name} lo={op.lo!r} span={op.span!r}"
    if isinstance(op, Bucketize):
        return f"{name} {len(op.boundaries)} boundaries"
    if isinstance(op, Ratio):
        return f"{name} denominator=slot {op.slot} on_zero={op.on_zero!r}"
    if isinstance(op, Combine):
        return f"{name} other=slot {op.slot} on_null={op.on_null!r}"
    if isinstance(op, TimeSince):
        return f"{name} unit={op.unit}"
    if isinstance(op, Cast):
        return f"{name} {op.kind.value}{' (declared dtype)' if op.implicit else ''}"
    return name


def _describe_slot(slot: Slot) -> str:
    if isinstance(slot, HashSlot):
        fill = "" if slot.fill is None else f" after fill_null {slot.fill!r}"
        return f"hash_bucket({slot.field}, n={slot.n}){fill}, hashed on the host"
    if isinstance(slot, TimeSlot):
        ref = slot.reference_field or "reference_time"
        return f"{ref} - {slot.field} in microseconds, from the host"
    return slot.field


def _op_source(op: KernelOp, fidx: int, preamble: list[str]) -> str:
    """C for one op; ``x`` is the value, ``st`` the status (both locals)."""
    bad = INVALID_BASE + op.step
    if isinstance(op, FillNull):
        return f"if (st == {NULL}) {{ x = {c_double(op.value)}; st = {OK}; }}"
    if isinstance(op, Clip):
        parts = []
        if op.lo is not None:
            parts.append(f"if (x < {c_double(op.lo)}) x = {c_double(op.lo)};")
        if op.hi is not None:
            parts.append(f"if (x > {c_double(op.hi)}) x = {c_double(op.hi)};")
        return f"if (st == {OK}) {{ {' '.join(parts)} }}"
    if isinstance(op, Log1p):
        return f"if (st == {OK}) {{ if (x > -1.0) x = fl_log1p(x); else st = {bad}; }}"
    if isinstance(op, ZScore | MinMax):
        shift, scale = (op.mean, op.std) if isinstance(op, ZScore) else (op.lo, op.span)
        return (f"if (st == {OK}) {{ double r = (x - {c_double(shift)}) / {c_double(scale)}; "
                f"if (isfinite(r)) x = r; else st = {bad}; }}")
    if isinstance(op, Bucketize):
        if len(op.boundaries) <= UNROLLED_BOUNDARIES:
            terms = " + ".join(f"(x >= {c_double(b)})" for b in op.boundaries)
            return f"if (st == {OK}) {{ x = (double)({terms}); }}"
        table = f"fl_bounds_{fidx}_{op.step}"
        values = ", ".join(c_double(b) for b in op.boundaries)
        preamble.append(f"__device__ const double {table}[{len(op.boundaries)}] = {{{values}}};\n")
        return f"if (st == {OK}) {{ x = (double)fl_upper_bound({table}, {len(op.boundaries)}, x); }}"
    if isinstance(op, Ratio):
        zero = f"st = {NULL};" if op.on_zero is None else f"x = {c_double(op.on_zero)};"
        return (f"if (st == {OK}) {{ double d = inp[{op.slot} * N + i]; "
                f"if (isnan(d)) st = {NULL}; else if (d == 0.0) {{ {zero} }} "
                f"else {{ double r = x / d; if (isfinite(r)) x = r; else st = {bad}; }} }}")
    if isinstance(op, Combine):
        null = f"st = {NULL};" if op.on_null is None else f"{{ x = {c_double(op.on_null)}; st = {OK}; }}"
        sign = "-" if op.op == "difference" else "*"
        return (f"if (st == {OK} || st == {NULL}) {{ double d = inp[{op.slot} * N + i]; "
                f"if (st == {NULL} || isnan(d)) {null} "
                f"else {{ double r = x {sign} d; if (isfinite(r)) x = r; else st = {bad}; }} }}")
    if isinstance(op, TimeSince):
        return f"if (st == {OK}) {{ x = x / {c_double(op.divisor)}; }}"
    assert isinstance(op, Cast)
    if op.kind is TypeKind.FLOAT64:
        return "/* float64: nothing to do */"
    if op.exact:
        return "/* values are already integers in range: nothing to do */"
    if op.kind in INT_BOUNDS:
        lo, hi = INT_BOUNDS[op.kind]
        return (f"if (st == {OK}) {{ double r = rint(x) + 0.0; "
                f"if (r >= {c_double(lo)} && r < {c_double(hi)}) x = r; else st = {bad}; }}")
    if op.kind is TypeKind.FLOAT32:
        return f"if (st == {OK}) {{ double r = fl_to_float32(x); if (isfinite(r)) x = r; else st = {bad}; }}"
    if op.kind is TypeKind.BOOL:
        return f"if (st == {OK}) {{ x = (x != 0.0) ? 1.0 : 0.0; }}"
    raise AssertionError(f"unhandled cast to {op.kind}")


def kernel_name(plan: ProgramPlan) -> str:
    return "fl_transform_" + re.sub(r"[^A-Za-z0-9_]", "_", plan.schema_name)


def generate_source(plan: ProgramPlan) -> KernelSource:
    """The fused kernel of ``plan`` (deterministic: same plan, same text)."""
    preamble = [
        f"// featureline transform kernel for schema {c_comment(plan.schema_name)} "
        f"{c_comment(str(plan.schema_version))}.\n"
        "// Generated by features.kernels.cupy_backend; semantics in features/kernels/ops.py.\n",
        _log1p_source(),
    ]
    needs_search = False
    n_kernel = len(plan.kernel)
    body = ["const long long N = nrows;\n"]
    for j, fidx in enumerate(plan.kernel):
        fp: FeaturePlan = plan.features[fidx]
        assert fp.slot is not None
        body.append(f"{{ /* feature {j}: {c_comment(f'{fp.name} <- {fp.feature.source} ({fp.dtype})')} */\n")
        described = c_comment(_describe_slot(plan.slots[fp.slot]))
        body.append(f"    double x = inp[{fp.slot} * N + i];  /* {described} */\n")
        body.append(f"    int st = isnan(x) ? {NULL} : {OK};\n")
        for op in fp.ops:
            if isinstance(op, Bucketize) and len(op.boundaries) > UNROLLED_BOUNDARIES:
                needs_search = True
            body.append(f"    /* step {op.step}: {c_comment(_describe(op))} */\n")
            body.append(f"    {_op_source(op, fidx, preamble)}\n")
        body.append(f"    outp[{j} * N + i] = x;\n")
        body.append(f"    outp[{n_kernel + j} * N + i] = (double)st;\n")
        body.append("}\n")
    if needs_search:
        preamble.insert(2, _UPPER_BOUND)
    if any(isinstance(op, Cast) and op.kind is TypeKind.FLOAT32 and not op.exact
           for fidx in plan.kernel for op in plan.features[fidx].ops):
        preamble.insert(2, _TO_FLOAT32)
    return KernelSource(kernel_name(plan), "".join(preamble), "".join(body))


class CupyBackend:
    """Runs a plan's kernel features on the GPU with the generated fused kernel.

    Holds device and pinned host buffers between runs (grown to the largest batch),
    so one instance must not run two batches at once from different threads.
    """

    device = "gpu"

    def __init__(self, plan: ProgramPlan, cupy: ModuleType) -> None:
        self.plan = plan
        self.cp = cupy
        self.source = generate_source(plan)
        self._kernel: Any = None
        self._capacity = 0
        self._dev_in: Any = None
        self._dev_out: Any = None
        self._host_in: npt.NDArray[np.float64] = np.empty(0)
        self._host_out: npt.NDArray[np.float64] = np.empty(0)

    def compile(self) -> None:
        """Compile the kernel now (NVRTC, through CuPy): raises what CuPy raises when it
        cannot (no runtime compiler, a driver error); a no-op without kernel features."""
        if self.plan.kernel:
            kernel = self.kernel
            if hasattr(kernel, "compile"):
                kernel.compile()

    @property
    def kernel(self) -> Any:
        """The ``cupy.RawKernel`` of the generated translation unit (compiled by CuPy on
        first use, then cached)."""
        if self._kernel is None:
            src = self.source
            self._kernel = self.cp.RawKernel(src.translation_unit(), src.name, options=src.options)
        return self._kernel

    def _reserve(self, rows: int) -> None:
        if rows <= self._capacity:
            return
        # cupyx: CuPy, the optional gpu extra; only a GPU kernel's buffers need it
        import cupyx

        n_in = max(len(self.plan.slots), 1) * rows
        n_out = 2 * len(self.plan.kernel) * rows
        self._dev_in = self._dev_out = None  # free the old device buffers first
        self._dev_in = self.cp.empty(n_in, dtype=np.float64)
        self._dev_out = self.cp.empty(n_out, dtype=np.float64)
        self._host_in = cupyx.empty_pinned((n_in,), dtype=np.float64)
        self._host_out = cupyx.empty_pinned((n_out,), dtype=np.float64)
        self._capacity = rows

    def upload(self, slots: Sequence[SlotValues], rows: int) -> None:
        """Pack every slot into the pinned buffer and copy it to the device (one copy)."""
        self._reserve(rows)
        n_in = len(self.plan.slots) * rows
        packed = self._host_in[:n_in].reshape(len(self.plan.slots), rows)
        with np.errstate(all="ignore"):
            for s, slot in enumerate(slots):
                load_slot(packed[s], slot, 0, rows)
        self._dev_in[:n_in].set(self._host_in[:n_in])

    def launch(self, rows: int) -> None:
        """Run the fused kernel over ``rows`` rows of the uploaded inputs."""
        n_in = len(self.plan.slots) * rows
        n_out = 2 * len(self.plan.kernel) * rows
        blocks = (rows + THREADS - 1) // THREADS
        self.kernel((blocks,), (THREADS,), (self._dev_in[:n_in], np.int64(rows), self._dev_out[:n_out]))

    def download(self, rows: int) -> KernelOutput:
        """Copy the outputs back (one copy) and convert them to the declared dtypes."""
        k = len(self.plan.kernel)
        n_out = 2 * k * rows
        host = self._host_out[:n_out]
        self._dev_out[:n_out].get(out=host)
        packed = host.reshape(2 * k, rows)
        values: list[npt.NDArray[np.generic]] = []
        with np.errstate(all="ignore"):
            for j, fidx in enumerate(self.plan.kernel):
                dtype = NUMPY_DTYPES[self.plan.features[fidx].dtype.kind]
                values.append(packed[j].astype(dtype))  # always a copy: the buffer is reused
        status = packed[k:].astype(np.int8)
        return KernelOutput(values, status)

    def run(self, slots: Sequence[SlotValues], rows: int) -> KernelOutput:
        """All kernel features over ``rows`` rows: upload, one launch, download."""
        self.upload(slots, rows)
        self.launch(rows)
        return self.download(rows)


__all__ = ["CupyBackend", "KernelSource", "c_double", "generate_source"]
