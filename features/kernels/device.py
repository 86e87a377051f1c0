"""Where the kernels run: ``FEATURES_DEVICE`` = ``auto`` | ``cpu`` | ``gpu``.

- ``cpu``: the NumPy program, always available.
- ``gpu``: the fused CuPy kernel; raises :class:`~features.errors.DeviceUnavailable`
  (naming the reason) when CuPy does not import or sees no CUDA device.
- ``auto``: the GPU when CuPy imports and a device is present, else the CPU.

CuPy is imported only here, and only when a GPU may be used.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from features.errors import DeviceUnavailable

# annotations only: the kernels run where only NumPy, PyArrow and CuPy are installed
# (bench/gpu_check.sh), and features.config imports psycopg
if TYPE_CHECKING:
    from features.config import Device

Backend = Literal["cpu", "gpu"]


def find_gpu() -> tuple[ModuleType | None, str]:
    """(the ``cupy`` module, "") when a CUDA GPU is usable, else (None, the reason)."""
    try:
        cupy = importlib.import_module("cupy")
    except ImportError as exc:
        return None, (f"cupy is not importable ({exc}); install the GPU extra: "
                      'pip install "featureline[gpu]"')
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    # CUDA driver/runtime errors (no driver, no device) share no importable base class.
    except Exception as exc:
        return None, f"cupy cannot reach a CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return None, "cupy found no CUDA device"
    return cupy, ""


def resolve_device(requested: Device) -> tuple[Backend, ModuleType | None]:
    """The backend for ``requested`` and, for ``gpu``, the cupy module.

    Raises DeviceUnavailable when ``gpu`` is requested and no GPU is usable; raises
    ValueError for a value outside auto/cpu/gpu (settings validate it earlier).
    """
    if requested == "cpu":
        return "cpu", None
    if requested not in ("auto", "gpu"):
        raise ValueError(f"device must be auto, cpu or gpu, got {requested!r}")
    cupy, why = find_gpu()
    if cupy is not None:
        return "gpu", cupy
    if requested == "gpu":
        raise DeviceUnavailable(
            f"device gpu was requested (FEATURES_DEVICE=gpu) but no GPU is usable: {why}; "
            "use FEATURES_DEVICE=auto or cpu to run on the CPU"
        )
    return "cpu", None


__all__ = ["Backend", "find_gpu", "resolve_device"]
