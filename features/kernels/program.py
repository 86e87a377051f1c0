"""Schema -> TransformProgram: run a schema's derived features over validated batches.

``compile_transforms(schema, device=...)`` builds the plan (``ops.plan_program``) and
picks the backend (``device.resolve_device``); ``program.run(valid_batch)`` returns a
:class:`TransformResult` with the feature columns in their declared dtypes and the
rows a ``reject`` policy refused, as reject rows in the validator's fixed columns.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features.compile import CompiledSchema
from features.compile.arrow import arrow_type
from features.compile.rejects import REJECT_SCHEMA
from features.compile.rules import ReasonCode
from features.errors import DeviceUnavailable
from features.kernels.columns import SlotValues, one_hot_values, prepare_slots
from features.kernels.cupy_backend import CupyBackend, KernelSource, generate_source
from features.kernels.device import resolve_device
from features.kernels.numpy_backend import (
    DEFAULT_CHUNK_ROWS,
    NUMPY_DTYPES,
    KernelOutput,
    NumpyBackend,
    values_entering,
)
from features.kernels.ops import (
    INVALID_BASE,
    OK,
    Combine,
    FeaturePlan,
    ProgramPlan,
    Ratio,
    invalid_message,
    plan_program,
)
from features.schema.model import FieldType, Schema

# annotations only: the kernels run where only NumPy, PyArrow and CuPy are installed
# (bench/gpu_check.sh), and features.config imports psycopg
if TYPE_CHECKING:
    from features.config import Device, Settings

log = logging.getLogger("features.kernels")


def arrow_dtype(dtype: FieldType) -> pa.DataType:
    """The Arrow type of a feature's declared dtype (int*, float*, bool)."""
    return arrow_type(dtype)


class Backend(Protocol):
    device: str

    def run(self, slots: list[SlotValues], rows: int) -> KernelOutput: ...


@dataclass(frozen=True, eq=False)
class TransformResult:
    """The features of one batch, and the rows a transform rejected.

    - ``features``: one column per output (one_hot: one per enum value), in declared
      order and dtype (:attr:`TransformProgram.output_schema`), for the rows *not*
      rejected, in input order. Null where the input was null (and not filled) or a
      step was invalid under ``on_invalid: null``. Never NaN or ±inf.
    - ``rejects``: :data:`REJECT_SCHEMA` rows (``reason`` ``transform``, ``rule``
      ``<feature>.transform``), sorted by input row then feature order; one per
      (row, feature) whose ``on_invalid: reject`` step failed.
    - ``kept_row_index``: for each row of ``features`` its 0-based row in the input.
    - Invariant: ``features.num_rows + rejected_rows == input_rows``.
    """

    features: pa.RecordBatch
    rejects: pa.Table
    kept_row_index: pa.Int64Array
    input_rows: int

    @cached_property
    def rejected_rows(self) -> int:
        """Number of distinct input rows with at least one reject."""
        return self.input_rows - int(self.features.num_rows)


class TransformProgram:
    """A schema's derived features, compiled for one device. Build with
    :func:`compile_transforms`; run with :meth:`run`.

    A GPU program keeps device buffers between batches: do not call ``run`` on one
    instance from two threads at once.
    """

    def __init__(self, plan: ProgramPlan, backend: Backend) -> None:
        self.plan = plan
        self.backend = backend
        self._row_numbers = np.arange(0, dtype=np.int64)  # grown on demand, shared read-only

    def _all_rows(self, rows: int) -> npt.NDArray[np.int64]:
        """``arange(rows)`` without allocating one per batch (the common no-reject case)."""
        if len(self._row_numbers) < rows:
            numbers = np.arange(rows, dtype=np.int64)
            numbers.flags.writeable = False
            self._row_numbers = numbers
        return self._row_numbers[:rows]

    @property
    def device(self) -> str:
        """``cpu`` or ``gpu``: where the kernel features run."""
        return self.backend.device

    @cached_property
    def output_schema(self) -> pa.Schema:
        """The Arrow schema of ``TransformResult.features`` (all columns nullable)."""
        return pa.schema([pa.field(c.name, arrow_dtype(c.dtype)) for c in self.plan.columns])

    @cached_property
    def kernel_source(self) -> KernelSource:
        """The generated CuPy kernel (available on any device, for inspection)."""
        return generate_source(self.plan)

    def run(
        self, batch: pa.RecordBatch, *, reference_time: dt.datetime | dt.date | None = None,
    ) -> TransformResult:
        """Compute every feature of the schema over ``batch`` (the validator's ``valid``).

        ``reference_time`` is the "now" of ``time_since`` when the schema declares no
        ``event_time`` (naive = UTC); with an event_time, each row's event time is the
        reference and ``reference_time`` is ignored. Raises SourceError when a column
        the features read is absent or of a type they cannot read, and ValueError when
        ``reference_time`` is needed but not given. Bad values never raise: they become
        nulls or reject rows, per feature (``on_invalid``).
        """
        rows = batch.num_rows
        slots = prepare_slots(self.plan, batch, reference_time)
        out = self._kernel_output(slots, rows)
        rejected: npt.NDArray[np.bool_] | None = None
        failing: list[tuple[FeaturePlan, npt.NDArray[np.int8]]] = []
        for j, fidx in enumerate(self.plan.kernel):
            fp = self.plan.features[fidx]
            if fp.feature.on_invalid == "reject":
                bad = out.status[j] >= INVALID_BASE
                if bad.any():
                    rejected = bad if rejected is None else rejected | bad
                    failing.append((fp, out.status[j]))
        kept = self._all_rows(rows) if rejected is None else np.flatnonzero(~rejected)
        arrays = self._columns(batch, out, None if rejected is None else kept)
        features = pa.RecordBatch.from_arrays(arrays, schema=self.output_schema)
        rejects = _rejects(failing, slots) if failing else REJECT_SCHEMA.empty_table()
        return TransformResult(features, rejects, pa.array(kept, pa.int64()), rows)

    def _kernel_output(self, slots: list[SlotValues], rows: int) -> KernelOutput:
        if rows and self.plan.kernel:
            return self.backend.run(slots, rows)
        values: list[npt.NDArray[np.generic]] = [
            np.empty(rows, dtype=NUMPY_DTYPES[self.plan.features[i].dtype.kind]) for i in self.plan.kernel
        ]
        return KernelOutput(values, np.zeros((len(self.plan.kernel), rows), dtype=np.int8))

    def _columns(
        self, batch: pa.RecordBatch, out: KernelOutput, kept: npt.NDArray[np.int64] | None,
    ) -> list[pa.Array]:
        arrays: list[pa.Array] = []
        position = {fidx: j for j, fidx in enumerate(self.plan.kernel)}
        for fidx, fp in enumerate(self.plan.features):
            arrow_type = arrow_dtype(fp.dtype)
            if fp.one_hot is not None:
                dtype = np.dtype(NUMPY_DTYPES[fp.dtype.kind])
                columns, null = one_hot_values(fp.one_hot, batch, dtype)
            else:
                j = position[fidx]
                columns, null = [out.values[j]], out.status[j] != OK
            if kept is not None:
                columns = [c[kept] for c in columns]
                null = None if null is None else null[kept]
            mask = null if null is not None and null.any() else None
            arrays.extend(pa.array(c, type=arrow_type, mask=mask) for c in columns)
        return arrays


def _rejects(failing: list[tuple[FeaturePlan, npt.NDArray[np.int8]]], slots: list[SlotValues]) -> pa.Table:
    """Reject rows for the invalid cells of ``reject`` features. Messages are formatted
    per rejected row (Python ``repr`` of the value): rejects are the rare, cold path."""
    rows_parts: list[npt.NDArray[np.int64]] = []
    fields: list[str] = []
    messages: list[str] = []
    values: list[str] = []
    for fp, status in failing:
        bad_rows = np.flatnonzero(status >= INVALID_BASE)
        codes = status[bad_rows]
        for code in np.unique(codes):
            rows = bad_rows[codes == code]
            step = int(code) - INVALID_BASE
            op = fp.op_at(step)
            got = [float(v) for v in values_entering(fp, slots, rows, step)]
            dens: list[float | None] = [None] * len(rows)
            if isinstance(op, Ratio | Combine):
                dens = [float(v) for v in slots[op.slot].values[rows].astype(np.float64)]
            rows_parts.append(rows)
            fields.extend([fp.name] * len(rows))
            messages.extend(invalid_message(fp, op, g, d) for g, d in zip(got, dens, strict=True))
            values.extend(repr(g) for g in got)
    row = np.concatenate(rows_parts)
    order = np.argsort(row, kind="stable")
    table = pa.table(
        {
            "row": pa.array(row, pa.int64()),
            "field": pa.array(fields, pa.string()),
            "rule": pa.array([f"{f}.transform" for f in fields], pa.string()),
            "reason": pa.array([ReasonCode.TRANSFORM.value] * len(fields), pa.string()),
            "message": pa.array(messages, pa.string()),
            "value": pa.array(values, pa.string()),
        },
        schema=REJECT_SCHEMA,
    )
    return table.take(pa.array(order))


def compile_transforms(
    schema: Schema, *, device: Device = "auto", chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> TransformProgram:
    """Compile the derived features of ``schema`` for ``device`` (Settings.device).

    ``auto`` runs on the GPU when CuPy imports, a CUDA device exists and the kernel
    compiles there (compiled here, once: a machine with a GPU but no working runtime
    compiler falls back to the CPU with one warning instead of failing mid-load), else on
    the CPU; ``gpu`` without all three raises DeviceUnavailable; ``chunk_rows`` tunes the
    NumPy program. Raises CompileError for features no backend can run
    (``ops.plan_program``).
    """
    plan = plan_program(schema)
    backend_name, cupy = resolve_device(device)
    if backend_name == "gpu":
        assert cupy is not None
        gpu = CupyBackend(plan, cupy)
        try:
            gpu.compile()  # now, not on the first batch of a long load
        except Exception as exc:  # CuPy's compile and driver errors share no base class
            why = (f"the GPU kernel of schema {schema.name} does not compile here "
                   f"({type(exc).__name__}: {exc})")
            if device == "gpu":
                raise DeviceUnavailable(f"device gpu was requested (FEATURES_DEVICE=gpu) but {why}; use "
                                        "FEATURES_DEVICE=auto or cpu to run on the CPU") from exc
            log.warning("FEATURES_DEVICE=auto: %s; the transforms run on the CPU (NumPy)", why)
            return TransformProgram(plan, NumpyBackend(plan, chunk_rows=chunk_rows))
        return TransformProgram(plan, gpu)
    return TransformProgram(plan, NumpyBackend(plan, chunk_rows=chunk_rows))


def transform_program(compiled: CompiledSchema, settings: Settings) -> TransformProgram | None:
    """The compiled transform program of the schema's derived features on the settings'
    device, or None for a schema without any."""
    if not compiled.schema.features:
        return None
    return compile_transforms(compiled.schema, device=settings.device)


__all__ = ["REJECT_SCHEMA", "TransformProgram", "TransformResult", "arrow_dtype", "compile_transforms",
           "transform_program"]
