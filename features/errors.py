"""The one exception tree of featureline.

::

    FeaturesError
    ├── SchemaError         bad YAML: file, line, key path, reason
    ├── CompileError        valid YAML that cannot compile
    ├── ConfigError         missing or invalid setting; lists every place it looked
    ├── ServiceError        a local development service failed to install or start
    ├── SourceError
    ├── SinkError
    │   └── SinkUnavailable  also Transient: retrying is safe
    ├── RowsRejected        only from ValidationResult.raise_if_rejected()
    ├── GateBreached        a load breached a ``fail`` quality gate: nothing stored but its rejects
    ├── WorkerFailed        a worker process of a parallel load died (re-run to finish)
    └── DeviceUnavailable   GPU requested explicitly but absent

Errors carry their context as attributes, not only in the message. Row-level
problems are never exceptions: they are reject rows (see ``features.validation``).
"""

from __future__ import annotations

from collections.abc import Sequence


class FeaturesError(Exception):
    """Base of every error featureline raises on purpose."""


class Transient:
    """Marker mixin: the failed operation may be retried safely."""


class SchemaError(FeaturesError):
    """A schema file is wrong. ``path``/``line``/``key_path`` say where, ``reason`` why.

    ``line`` is 1-based, or None when the problem has no single place (an empty file).
    The message reads ``schemas/x.yaml:12: fields[2].type: unknown type 'int128'``.
    """

    def __init__(
        self, reason: str, *, path: str | None = None, line: int | None = None,
        key_path: str = "",
    ) -> None:
        self.reason = reason
        self.path = path
        self.line = line
        self.key_path = key_path
        where = path or "<schema>"
        if line is not None:
            where = f"{where}:{line}"
        prefix = f"{key_path}: " if key_path else ""
        super().__init__(f"{where}: {prefix}{reason}")


class SchemaErrors(SchemaError):
    """Several schema problems found in one file; ``errors`` lists each one.

    The message holds every error, one per line, so a user fixes them all at once.
    """

    def __init__(self, errors: Sequence[SchemaError]) -> None:
        first = errors[0]
        self.errors = list(errors)
        super().__init__(first.reason, path=first.path, line=first.line, key_path=first.key_path)
        self.args = ("\n".join(str(e) for e in self.errors),)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


class CompileError(FeaturesError):
    """A schema that parsed cannot be compiled (``schema_name``, ``field`` say where)."""

    def __init__(self, message: str, *, schema_name: str | None = None, field: str | None = None) -> None:
        self.schema_name = schema_name
        self.field = field
        super().__init__(message)


class ConfigError(FeaturesError):
    """A setting is missing or invalid. ``looked_in`` lists every place searched."""

    def __init__(self, message: str, *, key: str | None = None, looked_in: Sequence[str] = ()) -> None:
        self.key = key
        self.looked_in = list(looked_in)
        if self.looked_in:
            message = f"{message} (looked in: {', '.join(self.looked_in)})"
        super().__init__(message)


class ServiceError(FeaturesError):
    """A local development service (``features dev``) could not be installed or started."""

    def __init__(self, message: str, *, service: str, log: str | None = None) -> None:
        self.service = service
        self.log = log
        if log:
            message = f"{message} (log: {log})"
        super().__init__(message)


class SourceError(FeaturesError):
    """A source cannot be read (missing file, incompatible column, broker refused).
    ``path`` names the file or location when one is at fault, ``field`` the column."""

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None) -> None:
        self.path = path
        self.field = field
        super().__init__(message)


class SinkError(FeaturesError):
    """A sink refused or failed a write. ``store`` names it, ``address`` where it is."""

    def __init__(self, message: str, *, store: str, address: str | None = None) -> None:
        self.store = store
        self.address = address
        super().__init__(message)


class SinkUnavailable(SinkError, Transient):
    """A store cannot be reached; retrying later is safe."""


class RowsRejected(FeaturesError):
    """Raised only by ``ValidationResult.raise_if_rejected()``; ``rejected`` counts rows."""

    def __init__(self, message: str, *, rejected: int) -> None:
        self.rejected = rejected
        super().__init__(message)


class RequestRejected(RowsRejected):
    """Request rows a feature view refused (``FeatureStore.online_view``, ``historical_view``,
    ``POST /v1/views/{name}/online``): its request keys or fields break the view's compiled
    rules, or a request-time feature declared ``on_invalid: reject`` has no valid value.
    ``errors``: every error, a dict each (``row``, ``field``, ``rule``, ``reason``,
    ``message``, ``value``: the validator's reject rows), all rows' errors at once."""

    def __init__(self, message: str, *, rejected: int, errors: list[dict[str, object]]) -> None:
        super().__init__(message, rejected=rejected)
        self.errors = errors


class GateBreached(FeaturesError):
    """A batch load breached a ``fail`` quality gate of its schema (docs/operations.md,
    "Quality gates"): it stored nothing in either store but its rejects (the evidence,
    ``rejects_stored`` of them, under ``run_id``), and committed no ledger unit, so the same
    files load once the data (or the gate) is fixed. Also the stream's breaker: the
    micro-batch that tripped it stored nothing but its rejects, and the job stops.
    ``gates``: the names of the breached ``fail`` gates; ``verdict``: the whole judgement
    (``features.pipeline.gates.GateVerdict``)."""

    def __init__(self, message: str, *, schema: str, run_id: str, gates: Sequence[str],
                 rejects_stored: int, verdict: object) -> None:
        super().__init__(message)
        self.schema = schema
        self.run_id = run_id
        self.gates = tuple(gates)
        self.rejects_stored = rejects_stored
        self.verdict = verdict


class WorkerFailed(FeaturesError):
    """A worker of ``features load --workers`` died without reporting (killed, out of
    memory). What it committed stays committed; re-running the same command finishes
    the load exactly (the ledger skips the committed units)."""

    def __init__(self, message: str, *, worker: int, workers: int) -> None:
        super().__init__(message)
        self.worker = worker
        self.workers = workers


class DeviceUnavailable(FeaturesError):
    """``FEATURES_DEVICE=gpu`` was asked for, but no usable GPU (CuPy + device) exists."""
