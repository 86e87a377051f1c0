"""featureline: validated, traceable features from Kafka and Parquet into Redis and Postgres.

Public names only; every other module is an implementation detail.
"""

from __future__ import annotations

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

__version__ = "0.1.0"

__all__ = [
    "CompileError",
    "ConfigError",
    "FeaturesError",
    "RowsRejected",
    "SchemaError",
    "SinkError",
    "SinkUnavailable",
    "SourceError",
    "__version__",
]
