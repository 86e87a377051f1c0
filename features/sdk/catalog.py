"""The schemas and views a :class:`features.sdk.store.FeatureStore` serves
(:class:`Catalog`): the folders parsed once into an index of names (again when their
``stat`` changes), each schema and view compiled once, on first use, under one lock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from features.compile import CompiledSchema, compile_schema
from features.errors import ConfigError, SchemaError
from features.schema import load_schemas
from features.schema.syntax import suggest
from features.sdk.columns import UNKNOWN_SCHEMA
from features.views import compile_view, load_views

if TYPE_CHECKING:
    from features.schema import Schema

_T = TypeVar("_T")


class Catalog:
    """Schemas from ``schemas`` (a folder of YAML files, or one file) and views from
    ``views`` (a folder; absent: no views), by name."""

    def __init__(self, schemas: Path, views: Path) -> None:
        self.schemas_path = schemas
        self.views_path = views
        self._compiled: dict[str, CompiledSchema] = {}
        self._views: dict[str, Any] = {}
        #: the schemas and views folders, parsed once, again when their stat changes
        self._schema_folder = _Parsed()
        self._view_folder = _Parsed()
        self._lock = threading.Lock()

    def schema(self, name: str) -> CompiledSchema:
        """The compiled schema ``name`` (ConfigError naming the known ones when absent).
        An unknown name costs a ``stat`` of the folder, never a parse; a schema once
        compiled is kept."""
        return self._get("schema", self._compiled, name, self.schema_index, self.schemas_path,
                         lambda s: partial(compile_schema, s))

    def loadable(self, name: str) -> CompiledSchema:
        """:meth:`schema`, which must have stored features (an entity and an event time)."""
        c = self.schema(name)
        if not c.schema.loadable:
            raise ConfigError(f"schema {name!r} is validation-only (no entity/event_time): it has no "
                              "stored features", key="schema")
        return c

    def use(self, c: CompiledSchema) -> None:
        """Serve ``c`` under its name from now on, instead of the file in the folder."""
        self._compiled[c.name] = c

    def schema_label(self, name: str) -> str:
        """The metrics' ``schema`` label of a call: ``name`` when it is a schema compiled
        here, else :data:`UNKNOWN_SCHEMA` (a caller's unknown names never grow a registry)."""
        return name if name in self._compiled else UNKNOWN_SCHEMA

    def view_label(self, name: str) -> str:
        """:meth:`schema_label` of a view."""
        return name if name in self._views else UNKNOWN_SCHEMA

    def schema_index(self) -> dict[str, Schema]:
        """Every schema in the folder by name, parsed once and again only when the
        folder's (or the file's) ``stat`` changes: a file added, removed or renamed in it
        (an editor's save by rename too). A file edited in place is seen by a new store.
        A folder that does not parse raises its SchemaError each time, parsed once."""
        found: dict[str, Schema] = self._schema_folder.get(
            self.schemas_path, lambda: load_schemas(self.schemas_path), self._lock)
        return found

    def view(self, name: str) -> Any:
        """The compiled view ``name`` (a :class:`features.views.CompiledView`; ConfigError
        naming the known ones when absent), compiled once against the loadable schemas."""
        return self._get("view", self._views, name, self.view_defs, self.views_path, lambda v: partial(
            compile_view, v, {s.schema: self.loadable(s.schema) for s in v.sources}))

    def view_defs(self) -> dict[str, Any]:
        """Every view of the folder by name, parsed against :meth:`schema_index` (again when
        the folder's ``stat`` changes or the schemas were parsed again)."""
        schemas = self.schema_index()
        found: dict[str, Any] = self._view_folder.get(
            self.views_path, lambda: load_views(self.views_path, schemas) if self.views_path.exists() else {},
            self._lock, id(schemas))
        return found

    def _get(self, kind: str, made: dict[str, _T], name: str, defs: Callable[[], dict[str, Any]],
             where: Path, prepare: Callable[[Any], Callable[[], _T]]) -> _T:
        """``made[name]``; when absent, the definition ``defs()[name]`` (ConfigError naming
        the known ones when there is none) is prepared (``prepare(definition)``, outside the
        lock: it may compile other entries) and made under the lock, so concurrent first
        calls make it once."""
        got = made.get(name)
        if got is not None:
            return got
        known = defs()
        if name not in known:
            raise _unknown(kind, name, known, where)
        make = prepare(known[name])
        with self._lock:
            got = made.get(name)
            if got is None:
                got = made[name] = make()
        return got


class _Parsed:
    """What parsing a folder (or file) gave, kept until its ``stat`` signal changes (a
    file added, removed or renamed in it). A folder that does not parse raises its
    SchemaError each time, parsed once."""

    def __init__(self) -> None:
        self._held: tuple[tuple[Any, ...], Any] | None = None

    def get(self, path: Path, parse: Callable[[], Any], lock: threading.Lock, *extra: Any) -> Any:
        try:
            st = path.stat()
            signal: tuple[Any, ...] = (st.st_ino, st.st_mtime_ns, st.st_size, *extra)
        except OSError:
            signal = (None, *extra)  # the parse says what is wrong
        with lock:
            if self._held is None or self._held[0] != signal:
                try:
                    self._held = (signal, parse())
                except SchemaError as exc:
                    self._held = (signal, exc)
            found = self._held[1]
        if isinstance(found, SchemaError):
            raise found.with_traceback(None)
        return found


def _unknown(kind: str, name: str, known: dict[str, Any], where: Path) -> ConfigError:
    """No schema/view ``name`` in ``where``: the error naming the close and the known ones."""
    return ConfigError(f"no {kind} named {name!r}{suggest(name, known)} in {where} "
                       f"(known: {', '.join(sorted(known)) or 'none'})", key=kind, looked_in=[str(where)])


__all__ = ["Catalog"]
