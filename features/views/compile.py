"""View -> CompiledView: the Arrow schemas, the request validator and the request-time
program of one view.

- ``request_schema``: the keys then the request fields, in their declared Arrow types
  (the ``valid`` batch of a validation-only schema built from them, whose compiled
  rules :meth:`CompiledView.check_request` runs: the loader's validator, its messages);
- ``fetched``: every fetched column, source by source in feature order, in the type the
  stores hold it in (``features.compile.layout.declared_type``), nullable;
- ``derived``: the request-time features, declared dtypes, in declared order;
- ``output_schema``: the three, in that order.

The request-time features run on the kernel machinery (``features.kernels``): a
synthetic Schema whose fields are the request keys and fields plus the fetched columns
(their declared types), and whose features are the view's, compiled with
``compile_transforms``. A feature that reads another one runs in a later *level* (one
program per level, in topological order: the parser refused cycles). ``time_since``
measures up to the request field ``request_time`` (the synthetic schema's event time).

The fingerprint is the sha256 of the canonical JSON of the View (descriptions, paths
and lines excluded), as for schemas (``features.compile.fingerprint``).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final

import numpy as np
import pyarrow as pa

from features.compile import CompiledSchema, compile_schema
from features.compile.arrow import METADATA_TYPE, arrow_type
from features.compile.fingerprint import FINGERPRINT_FORMAT, canonical_value
from features.compile.layout import declared_type
from features.compile.rejects import REJECT_SCHEMA
from features.config import Device
from features.errors import CompileError, RowsRejected
from features.kernels import compile_transforms
from features.kernels.ops import plan_program
from features.schema.model import Feature, Field, Schema
from features.validation import ValidationResult, validate
from features.views.model import REQUEST_TIME, View, ViewSource, feature_dependencies, fetched_fields

__all__ = ["CompiledView", "compile_view", "view_fingerprint"]

#: metadata key of the output schema naming the view (and its version)
METADATA_VIEW: Final = b"featureline.view"
METADATA_VIEW_VERSION: Final = b"featureline.view_version"


def view_fingerprint(view: View) -> str:
    """Hex sha256 of the view's canonical JSON (descriptions, path, lines excluded)."""
    doc = {"fingerprint_format": FINGERPRINT_FORMAT, "view": canonical_value(view)}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _levels(features: tuple[Feature, ...]) -> list[list[Feature]]:
    """The request-time features grouped so that each reads only earlier groups."""
    names = {f.name for f in features}
    level: dict[str, int] = {}

    def depth(f: Feature, seen: frozenset[str]) -> int:
        if f.name in level:
            return level[f.name]
        deps = [d for d in feature_dependencies(f) & names if d not in seen]
        by_name = {g.name: g for g in features}
        level[f.name] = 1 + max((depth(by_name[d], seen | {f.name}) for d in deps), default=-1)
        return level[f.name]

    for f in features:
        depth(f, frozenset())
    out: list[list[Feature]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for f in features:
        out[level[f.name]].append(f)
    return out


@dataclass(frozen=True, eq=False)
class CompiledView:
    """The compiled artefacts of one view. Build with :func:`compile_view`."""

    view: View
    fingerprint: str
    sources: tuple[ViewSource, ...]
    request_schema: pa.Schema
    fetched: pa.Schema
    derived: pa.Schema
    #: the validation-only schema of the keys and request fields (check_request)
    request_validation: CompiledSchema
    #: the synthetic schemas of the request-time features, one per level
    levels: tuple[Schema, ...]
    device: Device = "auto"
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: a GPU program keeps device buffers between batches: one derive at a time there
    _run_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def version_str(self) -> str:
        return self.view.version_str

    @property
    def keys(self) -> tuple[str, ...]:
        return self.view.key_names

    @property
    def request_fields(self) -> tuple[str, ...]:
        return self.view.request_field_names

    @cached_property
    def _origin(self) -> dict[str, tuple[str, str]]:
        return {s.column(f): (s.alias, f) for s in self.sources for f in s.features}

    @cached_property
    def output_schema(self) -> pa.Schema:
        fields = [*self.request_schema, *self.fetched, *self.derived]
        return pa.schema(fields, metadata={METADATA_VIEW: self.name.encode(),
                                           METADATA_VIEW_VERSION: self.version_str.encode()})

    @cached_property
    def programs(self) -> tuple[Any, ...]:
        """The TransformPrograms of the levels, compiled on first use (for ``device``)."""
        with self._lock:
            return tuple(compile_transforms(s, device=self.device) for s in self.levels)

    def check_request(
        self, rows: pa.Table | pa.RecordBatch | list[dict[str, Any]],
    ) -> tuple[pa.Table, ValidationResult]:
        """Validate request rows (keys and request fields; extra columns ignored) with the
        loader's validator: (the valid rows in ``request_schema`` types, the result with
        its field-level rejects, e.g. ``field amount violates constraint min: ...``)."""
        result = validate(rows, self.request_validation)
        return pa.Table.from_batches([result.valid], schema=self.request_schema), result

    def derive_checked(self, table: pa.Table) -> tuple[pa.Table, pa.Table]:
        """``table`` (request_schema + fetched columns; nulls where a source found nothing)
        with the derived columns appended, and the rejects of rows a feature with
        ``on_invalid: reject`` refused (REJECT_SCHEMA; ``row`` is the row in ``table``);
        the rejected rows are left out of the first table. Never NaN or inf. Thread-safe
        (on a GPU the calls take turns: its program reuses device buffers)."""
        programs = self.programs
        if any(p.device == "gpu" for p in programs):
            with self._run_lock:
                return self._derive(programs, table)
        return self._derive(programs, table)

    def _derive(self, programs: tuple[Any, ...], table: pa.Table) -> tuple[pa.Table, pa.Table]:
        rows = np.arange(table.num_rows, dtype=np.int64)
        rejects: list[pa.Table] = []
        current = table
        for program in programs:
            batch = pa.record_batch([c.combine_chunks() for c in current.columns], schema=current.schema)
            result = program.run(batch)
            if result.rejects.num_rows:
                original = pa.array(rows[result.rejects.column("row").to_numpy()], pa.int64())
                rejects.append(result.rejects.set_column(0, "row", original))
                kept = result.kept_row_index.to_numpy()
                rows = rows[kept]
                current = current.take(pa.array(kept))
            for name in result.features.schema.names:
                column = result.features.column(name)
                current = current.append_column(result.features.schema.field(name), column)
        current = current.select([*table.schema.names, *self.derived.names])  # the declared order
        if not rejects:
            return current, REJECT_SCHEMA.empty_table()
        all_rejects = pa.concat_tables(rejects)
        order = np.argsort(all_rejects.column("row").to_numpy(), kind="stable")
        return current, all_rejects.take(pa.array(order))

    def derive(self, table: pa.Table) -> pa.Table:
        """:meth:`derive_checked` without rejects: raises RowsRejected when a feature with
        ``on_invalid: reject`` refused a row (the message names the first few)."""
        out, rejects = self.derive_checked(table)
        if rejects.num_rows:
            rejected = len(set(rejects.column("row").to_pylist()))
            shown = rejects.column("message").slice(0, 3).to_pylist()
            raise RowsRejected(f"view {self.name}: {rejected} of {table.num_rows} rows rejected: "
                               + "; ".join(shown), rejected=rejected)
        return out

    def artefact(self) -> dict[str, Any]:
        """The checked-in description of the view (``views/compiled/<name>.json``)."""
        def column(f: pa.Field, origin: str, declared: str) -> dict[str, Any]:
            return {"name": f.name, "arrow": str(f.type), "type": declared, "nullable": f.nullable,
                    "origin": origin}

        declared = {f.name: str(f.type) for f in (*self.view.keys, *self.view.request_fields)}
        out = [column(f, "key" if f.name in self.keys else "request", declared[f.name])
               for f in self.request_schema]
        for f in self.fetched:
            alias, feature = self._origin[f.name]
            out.append(column(f, f"{alias}.{feature}", (f.metadata or {})[METADATA_TYPE].decode()))
        dtypes = {f.name: str(f.dtype) for f in self.view.features}
        for f in self.derived:
            base = f.name if f.name in dtypes else f.name.rsplit("__", 1)[0]
            out.append(column(f, "derived", dtypes[base]))
        return {
            "meta": {"featureline": {"generated_by": "features compile", "kind": "view"}},
            "name": self.name,
            "version": self.version_str,
            "fingerprint": self.fingerprint,
            "keys": list(self.keys),
            "request_fields": list(self.request_fields),
            "sources": [
                {"schema": s.schema, "alias": s.alias, "entity": s.entity, "key": s.key,
                 "features": list(s.features), "columns": list(s.columns), "prefix": s.prefix,
                 "max_age_seconds": s.max_age_seconds}
                for s in self.sources
            ],
            "output_schema": out,
        }


def compile_view(
    view: View, schemas: Mapping[str, CompiledSchema], *, device: Device = "auto",
) -> CompiledView:
    """Compile ``view`` against the compiled schemas it reads. Pure but for ``device``
    (where the request-time features run, ``Settings.device``; compiled on first use).
    Raises CompileError for a source schema missing from ``schemas`` or a type or
    program that cannot be built."""
    for s in view.sources:
        if s.schema not in schemas:
            raise CompileError(f"view {view.name}: source schema {s.schema!r} is not among the compiled "
                               "schemas",
                               schema_name=s.schema)
    request = Schema(name=view.name, version=view.version, fields=(*view.keys, *view.request_fields))
    request_validation = compile_schema(request)
    request_schema = request_validation.arrow_schema
    fetched_cols: list[pa.Field] = []
    base_fields: list[Field] = [*view.keys, *view.request_fields]
    for s in view.sources:
        compiled = schemas[s.schema]
        for f, ff in zip(s.features, fetched_fields(s, compiled.schema), strict=True):
            fetched_cols.append(pa.field(s.column(f), declared_type(compiled, f), nullable=True,
                                         metadata={METADATA_TYPE: str(ff.type).encode()}))
            base_fields.append(ff)
    levels: list[Schema] = []
    uses_time = any(step.op == "time_since" for f in view.features for step in f.steps)
    columns: dict[str, tuple[str, ...]] = {}
    for group in _levels(view.features):
        level = Schema(name=view.name, version=view.version, fields=tuple(base_fields), features=tuple(group),
                       event_time=REQUEST_TIME if uses_time else None)
        levels.append(level)
        for feature in group:
            columns[feature.name] = level.feature_columns(feature)
            base_fields.extend(Field(col, feature.dtype) for col in columns[feature.name])
    derived_cols = [pa.field(col, arrow_type(f.dtype)) for f in view.features for col in columns[f.name]]

    for level in levels:
        plan_program(level)  # CompileError now, not at the first request
    return CompiledView(
        view=view, fingerprint=view_fingerprint(view), sources=view.sources,
        request_schema=request_schema, fetched=pa.schema(fetched_cols), derived=pa.schema(derived_cols),
        request_validation=request_validation, levels=tuple(levels), device=device,
    )
