"""featureline: validated, traceable features from Kafka and Parquet into Redis and Postgres.

Public names only; every other module is an implementation detail.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from features.errors import (
    CompileError,
    ConfigError,
    FeaturesError,
    RowsRejected,
    SchemaError,
    SinkError,
    SinkUnavailable,
    SourceError,
)

if TYPE_CHECKING:
    from features.compile import CompiledSchema, compile_schema
    from features.schema import Schema, load_schema, parse_schema
    from features.sdk import FeatureStore
    from features.validation import ValidationResult, validate

__version__ = "0.1.0"

# Public names that need pyarrow/pyyaml load on first use, so `import features` stays light.
_LAZY = {
    "Schema": "features.schema", "load_schema": "features.schema", "parse_schema": "features.schema",
    "CompiledSchema": "features.compile", "compile_schema": "features.compile",
    "ValidationResult": "features.validation", "validate": "features.validation",
    "FeatureStore": "features.sdk",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'features' has no attribute {name!r}")


__all__ = [
    "CompileError",
    "CompiledSchema",
    "ConfigError",
    "FeatureStore",
    "FeaturesError",
    "RowsRejected",
    "Schema",
    "SchemaError",
    "SinkError",
    "SinkUnavailable",
    "SourceError",
    "ValidationResult",
    "__version__",
    "compile_schema",
    "load_schema",
    "parse_schema",
    "validate",
]
