"""Preprocessing as batch kernels: fused CuPy on a GPU, the same results with NumPy.

A schema's derived features (``features:``) compile into a :class:`TransformProgram`::

    program = compile_transforms(schema, device=settings.device)   # auto | cpu | gpu
    result = program.run(validation.valid)          # pa.RecordBatch in, TransformResult out
    result.features   # declared dtypes, never NaN/inf
    result.rejects    # rows refused by an ``on_invalid: reject`` feature

Modules: ``ops`` (semantics and the plan), ``columns`` (Arrow -> kernel inputs),
``hashing`` (FNV-1a 64), ``numpy_backend`` (chunked in-place NumPy program),
``cupy_backend`` (generated fused kernel), ``device`` (FEATURES_DEVICE), ``cli``
(``features kernels``). Imports only NumPy and PyArrow (CuPy when a GPU is used).
"""

from __future__ import annotations

from features.kernels.program import (
    REJECT_SCHEMA,
    TransformProgram,
    TransformResult,
    compile_transforms,
    transform_program,
)

__all__ = ["REJECT_SCHEMA", "TransformProgram", "TransformResult", "compile_transforms", "transform_program"]
