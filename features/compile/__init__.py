"""Schema -> CompiledSchema: every artefact the entry points use, from one schema.

``compile_schema(schema)`` is pure and deterministic: the same schema gives the same
fingerprint, Arrow schema, rules, DDL bytes and expectation suite.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.compile.arrow import arrow_schema
from features.compile.fingerprint import fingerprint, gates_fingerprint
from features.compile.postgres import render_ddl
from features.compile.rules import Rule, compile_rules
from features.compile.suite import render_aggregates_suite, render_suite
from features.errors import ConfigError
from features.schema.model import Gate, Schema
from features.schema.syntax import duration_text

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True, eq=False)
class CompiledSchema:
    """The compiled artefacts of one schema. Build with :func:`compile_schema`.

    Heavy artefacts (Arrow schema, DDL, GX suite) are computed on first use and cached.
    """

    schema: Schema
    fingerprint: str
    rules: tuple[Rule, ...]

    @property
    def name(self) -> str:
        return self.schema.name

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        """The declared Arrow schema of the input fields (the type of ``valid``)."""
        return arrow_schema(self.schema)

    @cached_property
    def gates_fingerprint(self) -> str | None:
        """sha256 of the ``quality:`` section (None without one): changes with a gate,
        while :attr:`fingerprint` (the data version) does not."""
        return gates_fingerprint(self.schema)

    @property
    def gates(self) -> tuple[Gate, ...]:
        """The schema's load gates (``quality:``), in file order; empty without any."""
        return () if self.schema.quality is None else self.schema.quality.gates

    @cached_property
    def ddl(self) -> str:
        """Postgres DDL (``sql/<name>.sql``); requires a loadable schema for tables."""
        return render_ddl(self)

    @cached_property
    def expectations(self) -> dict[str, Any]:
        """The Great Expectations 1.x suite (``expectations/<name>.json``) as a dict."""
        return render_suite(self)

    @cached_property
    def aggregates_expectations(self) -> dict[str, Any] | None:
        """The GX suite of the stored aggregates (``expectations/<name>__aggregates.json``)
        as a dict; None for a schema without aggregations."""
        return render_aggregates_suite(self)


def gates_text(schema: Schema) -> str | None:
    """The ``quality:`` section in one line (``features compile``, ``features describe``):
    ``max_reject_rate 0.05 (fail), max_rule_rate[income_monthly.max] 0.01 (warn), min_rows
    1000 (fail); max staleness 2h; owner risk-data``; None without the section."""
    q = schema.quality
    if q is None:
        return None
    parts = [", ".join(f"{g.name} {g.limit:g} ({g.on_breach})" for g in q.gates) or "no load gates"]
    if q.max_staleness_s is not None:
        parts.append(f"max staleness {duration_text(q.max_staleness_s)}")
    if q.window_records is not None or q.window_min_records is not None:
        # the stream's and HTTP ingest's sliding window, where the section sets it
        size, least = q.window_records or "default", q.window_min_records or "default"
        parts.append(f"window {size} records (min {least})")
    if q.owner:
        parts.append(f"owner {q.owner}")
    return "; ".join(parts)


def compile_schema(schema: Schema) -> CompiledSchema:
    """Compile ``schema``. Raises CompileError when an artefact cannot be built."""
    return CompiledSchema(schema=schema, fingerprint=fingerprint(schema), rules=compile_rules(schema))


def find_schema(name: str, schemas_dir: str | Path) -> CompiledSchema:
    """Compile the schema called ``name`` from ``schemas_dir`` (ConfigError when absent)."""
    # The YAML parser loads here, not with the package: features.compile is imported by the
    # kernels, which run where only NumPy, PyArrow and CuPy are installed (bench/gpu_check.sh).
    from features.schema import load_schemas

    schemas = load_schemas(Path(schemas_dir))
    if name not in schemas:
        known = ", ".join(sorted(schemas)) or "none"
        raise ConfigError(f"no schema named {name!r} in {schemas_dir} (known: {known})", key="schema",
                          looked_in=[str(schemas_dir)])
    return compile_schema(schemas[name])
