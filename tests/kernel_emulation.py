"""The generated CUDA translation unit compiled for the CPU by g++ (C++17, no FMA
contraction, IEEE doubles), with a small shim for the CUDA built-ins it uses: the
emulated run of the fused kernel, compared bit for bit with the NumPy program.

Everything the kernel computes is double-precision (the float32 cast is integer
arithmetic on the bits, ``fl_to_float32``), which x86-64 does in IEEE binary64 with
round-to-nearest as the GPU does; ``-ftz`` (single precision only) has nothing to act on.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from features.kernels.cupy_backend import KernelSource

SHIM = """\
#include <math.h>
#include <string.h>
#define __device__
#define __global__
struct fl_dim3 { unsigned int x; };
static fl_dim3 threadIdx = {0}, blockIdx = {0}, blockDim = {1};
static inline long long __double_as_longlong(double x) { long long b; memcpy(&b, &x, 8); return b; }
static inline double __longlong_as_double(long long b) { double x; memcpy(&x, &b, 8); return x; }
"""

#: g++ flags: -ffp-contract=off mirrors --fmad=false; -fno-fast-math keeps IEEE semantics
GXX_FLAGS = ("-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-Wall",
             "-Werror", "-Wno-unused-variable", "-Wno-unused-function")


def gxx() -> str:
    found = shutil.which("g++") or shutil.which("c++")
    if found is None:
        raise AssertionError("no C++ compiler (g++): apt-get install g++ (the emulated kernel run needs it)")
    return found


def build(source: KernelSource | tuple[str, str], tmp: Path, extra: str = "") -> ctypes.CDLL:
    """The translation unit (a KernelSource, or (code, kernel name) as ``cupy.RawKernel``
    gets them) plus ``fl_run(inp, nrows, outp)`` looping the kernel over the rows."""
    code, name = (source.translation_unit(), source.name) if isinstance(source, KernelSource) else source
    code = "\n".join([
        SHIM, code, extra,
        'extern "C" void fl_run(const double* inp, long long nrows, double* outp) {',
        "    for (long long i = 0; i < nrows; ++i) {",
        f"        threadIdx.x = (unsigned int)i; {name}(inp, nrows, outp);",
        "    }",
        "}", "",
    ])
    tag = hashlib.sha256(code.encode()).hexdigest()[:16]
    cpp, lib = tmp / f"kernel_{tag}.cpp", tmp / f"kernel_{tag}.so"
    if not lib.exists():
        cpp.write_text(code)
        done = subprocess.run([gxx(), *GXX_FLAGS, "-o", str(lib), str(cpp), "-lm"], capture_output=True,
                              text=True)
        assert done.returncode == 0, f"g++ refused the generated source:\n{done.stderr[-4000:]}"
    return ctypes.CDLL(str(lib))


def run(lib: ctypes.CDLL, packed: npt.NDArray[np.float64], n_kernel: int) -> tuple[Any, Any]:
    """Run ``fl_run`` over ``packed`` (slots x rows); returns (values, status) per feature."""
    n = packed.shape[1] if packed.ndim == 2 else 0
    outp = np.full(2 * n_kernel * n, np.nan)
    ptr = ctypes.POINTER(ctypes.c_double)
    inp = np.ascontiguousarray(packed, dtype=np.float64)
    lib.fl_run(inp.ctypes.data_as(ptr), ctypes.c_longlong(n), outp.ctypes.data_as(ptr))
    out = outp.reshape(2 * n_kernel, n)
    return out[:n_kernel], out[n_kernel:].astype(np.int8)


__all__ = ["GXX_FLAGS", "SHIM", "build", "gxx", "run"]
