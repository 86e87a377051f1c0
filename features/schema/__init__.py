"""YAML -> Schema: the schema model and its parser.

``parse_schema(text)`` / ``load_schema(path)`` / ``load_schemas(dir)`` read schema
files and raise :class:`features.errors.SchemaErrors` listing every problem with its
file, line and key path. ``Schema`` is the immutable result (see ``model.py``).

The parser (and PyYAML) load on first use, so code that only needs the model (the
kernels on a GPU machine without PyYAML) imports nothing more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from features.schema.model import Schema

if TYPE_CHECKING:
    from features.schema.parse import load_schema, load_schemas, parse_schema

__all__ = ["Schema", "load_schema", "load_schemas", "parse_schema"]


def __getattr__(name: str) -> Any:
    if name in ("load_schema", "load_schemas", "parse_schema"):
        from features.schema import parse

        return getattr(parse, name)
    raise AttributeError(f"module 'features.schema' has no attribute {name!r}")
