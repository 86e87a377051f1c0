"""YAML -> Schema: the schema model and its parser.

``parse_schema(text)`` / ``load_schema(path)`` / ``load_schemas(dir)`` read schema
files and raise :class:`features.errors.SchemaErrors` listing every problem with its
file, line and key path. ``Schema`` is the immutable result (see ``model.py``).
"""

from __future__ import annotations

from features.schema.model import Schema
from features.schema.parse import load_schema, load_schemas, parse_schema

__all__ = ["Schema", "load_schema", "load_schemas", "parse_schema"]
