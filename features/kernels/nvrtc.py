"""NVIDIA's runtime compiler (NVRTC) through ctypes: CUDA C++ -> PTX with no GPU and no driver.

CuPy compiles the fused kernel with NVRTC when it first launches it, on a machine with a
GPU. This module compiles the same translation unit with the same options on any
machine, from the ``nvidia-cuda-nvrtc-cu12`` wheel (the ``dev`` extra), so that a
generated kernel that would not compile is found by ``make test``, not on a lent GPU.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

#: what CuPy adds to every NVRTC compile (``cupy/cuda/compiler.py``, ``_compile_with_cache_cuda``:
#: ``options += ('-ftz=true',)``, after the caller's options)
CUPY_APPENDS = ("-ftz=true",)


class NvrtcUnavailable(RuntimeError):
    """No NVRTC library: install the ``nvidia-cuda-nvrtc-cu12`` wheel (``dev`` extra)."""


@dataclass(frozen=True)
class Compiled:
    ptx: str
    log: str   # NVRTC's log: warnings (and errors, when ``ok`` is false)
    ok: bool


def library_path() -> Path:
    """The NVRTC shared library of the ``nvidia-cuda-nvrtc-cu12`` wheel (or ``$FEATURES_NVRTC``)."""
    if (env := os.environ.get("FEATURES_NVRTC")):
        return Path(env)
    try:
        # NVRTC's wheel is optional (the dev extra); its absence is reported below
        import nvidia.cuda_nvrtc as pkg
    except ImportError as exc:
        raise NvrtcUnavailable("NVRTC is not installed: pip install nvidia-cuda-nvrtc-cu12 "
                               "(part of the dev extra)") from exc
    for base in pkg.__path__:
        lib = Path(base) / "lib" / "libnvrtc.so.12"
        if lib.exists():
            return lib
    raise NvrtcUnavailable(f"no libnvrtc.so.12 under {list(pkg.__path__)}")


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library_path()))
    size = ctypes.POINTER(ctypes.c_size_t)
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p,
                                       ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.nvrtcGetProgramLogSize.argtypes = [ctypes.c_void_p, size]
    lib.nvrtcGetProgramLog.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcGetPTXSize.argtypes = [ctypes.c_void_p, size]
    lib.nvrtcGetPTX.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _lib().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def compile_ptx(source: str, options: Sequence[str], *, name: str = "kernel.cu") -> Compiled:
    """Compile ``source`` with ``options`` (add ``--gpu-architecture=compute_XX``); never
    raises for a compile error (``ok`` is false and ``log`` says why)."""
    lib = _lib()
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    if rc != 0:
        raise RuntimeError(f"nvrtcCreateProgram: {lib.nvrtcGetErrorString(rc).decode()}")
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        rc = lib.nvrtcCompileProgram(prog, len(options), opts)
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace").strip()
        if rc != 0:
            return Compiled("", log or lib.nvrtcGetErrorString(rc).decode(), False)
        lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
        ptx = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetPTX(prog, ptx)
        return Compiled(ptx.value.decode(), log, True)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


__all__ = ["CUPY_APPENDS", "Compiled", "NvrtcUnavailable", "compile_ptx", "library_path", "version"]
