"""YAML -> View: read a view file, check it against the schemas, report every problem.

The view parser is the schema parser's machinery (``features.schema.parse``): the same
YAML composition and limits, the same field syntax for request fields (types,
constraints, ``null_values``...) and the same step syntax for request-time features
(``features.schema.steps``), so a problem reads as it would in a schema file::

    views/x.yaml:12: sources[1].features[0]: schema 'merchant' has no feature 'risk'
        (did you mean 'risk_score'?)

Every problem of a file is collected and raised as one SchemaErrors, sorted by line.
Refused, each at its line and key path: an unknown schema or feature, a validation-only
schema, a feature stored in the hot store only (historical reads need the cold copy),
a request key whose type is not the joined entity's, a ``join`` naming an unknown
request key or a column that is not the schema's entity, two output columns with one
name (keys, request fields, fetched columns, derived features), two sources with one
alias, a cycle among the request-time features, and ``time_since`` without the
``request_time`` request field it measures up to (docs/views.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from yaml.nodes import MappingNode, Node, ScalarNode

from features.errors import SchemaError, SchemaErrors
from features.schema.model import (
    FLOAT_KINDS,
    INTEGER_KINDS,
    Feature,
    Field,
    FieldType,
    OnInvalid,
    Schema,
    TypeKind,
)
from features.schema.nodes import YamlMap, describe, is_null, join_path, line_of
from features.schema.parse import SchemaParser, compose_document, load_each, yaml_files
from features.schema.syntax import MAX_DURATION_S, identifier_problem, parse_type
from features.views.model import (
    REQUEST_TIME,
    View,
    ViewSource,
    feature_dependencies,
    is_entity_type,
    key_field,
    stored_columns,
)

__all__ = ["load_views", "parse_view"]

_TOP_KEYS: Final = ("name", "version", "description", "request", "sources", "features")
_REQUEST_KEYS: Final = ("keys", "fields")
_SOURCE_KEYS: Final = ("schema", "features", "join", "max_age", "prefix", "alias")
_FEATURE_KEYS: Final = ("name", "from", "steps", "dtype", "on_invalid", "description")
_DTYPE_KINDS: Final = INTEGER_KINDS | FLOAT_KINDS | {TypeKind.BOOL}


def parse_view(text: str, path: str | None, schemas: Mapping[str, Schema]) -> View:
    """Parse and check one view from YAML ``text`` against ``schemas`` (name -> Schema).

    Raises SchemaError for a YAML syntax error or an empty file, and SchemaErrors
    listing every other problem (each with ``path``, ``line``, ``key_path``, ``reason``).
    """
    return _parse(text, path, schemas)[0]


def _parse(text: str, path: str | None, schemas: Mapping[str, Schema]) -> tuple[View, int | None]:
    root = compose_document(text, path, "view")
    if root is None:
        raise SchemaError("the file is empty: a view needs at least name, version, request and sources",
                          path=path)
    parser = ViewParser(path, schemas)
    view = parser.parse_view(root)
    if view is None or parser.errors:
        assert parser.errors, "the parser returns None only after recording an error"
        raise SchemaErrors(sorted(parser.errors, key=lambda e: (e.line is None, e.line or 0)))
    return dataclasses.replace(view, text=text), parser.name_line


def load_views(path_or_dir: str | Path, schemas: Mapping[str, Schema]) -> dict[str, View]:
    """Every view in a folder (its ``*.yaml``/``*.yml`` files, sorted; a missing folder
    gives ``{}``) or one file: ``{view name: View}``. Problems of all files are raised
    together as one SchemaErrors; two files with one view name is such a problem."""
    p = Path(path_or_dir)
    if not p.exists():
        return {}
    return load_each(yaml_files(p), lambda text, path: _parse(text, path, schemas), "view")


class ViewParser(SchemaParser):
    """Walks one composed view document against the schemas; ``errors`` collects every problem."""

    SCOPE = "of this view (a request key or field, a fetched column or a request-time feature)"

    def __init__(self, path: str | None, schemas: Mapping[str, Schema]) -> None:
        super().__init__(path)
        self.schemas = schemas
        #: output column -> what declared it (for the one-name-one-column check)
        self.columns: dict[str, str] = {}

    def claim(self, name: str, node: Node | None, kp: str, what: str) -> bool:
        """Record output column ``name`` for ``what``; False (an error recorded) when taken."""
        first = self.columns.get(name)
        if first is not None:
            self.error(node, kp, f"output column '{name}' ({what}) is also {first}: each output column "
                                 "has one name (use prefix: or alias: on a source)")
            return False
        self.columns[name] = what
        return True

    def parse_view(self, root: Node) -> View | None:
        top = self.mapping(root, "", _TOP_KEYS, ("name", "version", "request", "sources"), "a view")
        if top is None:
            return None
        name = self.parse_view_name(top)
        version = self.parse_version(top)
        description = self.optional_string(top, "description") or ""
        keys, fields = self.parse_request(top)
        sources = self.parse_sources(top, keys)
        features = self.parse_derived(top, keys, fields, sources)
        if self.errors or None in (name, version, sources, features):
            return None
        assert name is not None and version is not None and sources is not None and features is not None
        return View(name=name, version=version, keys=tuple(keys.values()),
                    request_fields=tuple(fields.values()),
                    sources=tuple(s for s, _ in sources), features=features, description=description,
                    path=self.path)

    def parse_view_name(self, top: YamlMap) -> str | None:
        node = top.get("name")
        if node is None:
            return None
        self.name_line = line_of(node)
        name = self.string(node, "name", "a view name")
        if name is None:
            return None
        problem = identifier_problem(name, reserved_ok=True)
        if problem is not None:
            self.error(node, "name", f"invalid view name '{name}': {problem}")
            return None
        return name

    # ---- request

    def parse_request(self, top: YamlMap) -> tuple[dict[str, Field], dict[str, Field]]:
        """(keys, request fields) that parsed, by name; problems recorded."""
        keys: dict[str, Field] = {}
        fields: dict[str, Field] = {}
        node = top.get("request")
        if node is None:
            return keys, fields
        m = self.mapping(node, "request", _REQUEST_KEYS, ("keys",), "the request")
        if m is None:
            return keys, fields
        if (keys_node := m.get("keys")) is not None:
            if not isinstance(keys_node, MappingNode):
                self.error(keys_node, m.at("keys"), f"expected request keys (a mapping of key: type), got "
                                                    f"{describe(keys_node)}")
            elif not keys_node.value:
                self.error(keys_node, m.at("keys"), "request.keys must name at least one key")
            else:
                for knode, tnode in keys_node.value:
                    f = self.parse_key(knode, tnode, m.at("keys"))
                    if f is not None and f.name in keys:
                        self.error(knode, join_path(m.at("keys"), f.name),
                                   f"duplicate request key '{f.name}'")
                    elif f is not None and self.claim(f.name, knode, join_path(m.at("keys"), f.name),
                                                      "a request key"):
                        keys[f.name] = f
        if (fields_node := m.get("fields")) is not None and not is_null(fields_node):
            items = self.sequence(fields_node, m.at("fields"), "the list of request fields")
            for i, item in enumerate(items or ()):
                kp = join_path(m.at("fields"), i)
                parsed = self.parse_field(self.without_store(item, kp), kp, False)
                if parsed is None:
                    if (declared := self.declared_name(item)) is not None:
                        self.unparsed_fields.add(declared)
                    continue
                field, name_node, _ = parsed
                if field.name == REQUEST_TIME and (field.type.kind not in (TypeKind.TIMESTAMP, TypeKind.DATE)
                                                   or not field.constraints.not_null):
                    self.error(item, kp, f"request field '{REQUEST_TIME}' is the time time_since measures up "
                                         f"to: it must be a required timestamp or date, got {field.type}"
                                         f"{'' if field.constraints.not_null else ' (nullable)'}")
                    continue
                if self.claim(field.name, name_node, join_path(kp, "name"), "a request field"):
                    fields[field.name] = field
        return keys, fields

    def without_store(self, item: Node, kp: str) -> Node:
        """``item`` without a ``store`` key (recorded as an error: a request field is an
        input of one request, never stored); the rest of the field is still checked."""
        if not isinstance(item, MappingNode):
            return item
        kept = []
        for knode, vnode in item.value:
            if isinstance(knode, ScalarNode) and knode.value == "store":
                self.error(knode, join_path(kp, "store"), "a request field is not stored (it is an input of "
                                                          "one request): remove store")
            else:
                kept.append((knode, vnode))
        if len(kept) == len(item.value):
            return item
        return MappingNode(item.tag, kept, item.start_mark, item.end_mark, item.flow_style)

    def parse_key(self, knode: Node, tnode: Node, base: str) -> Field | None:
        if not isinstance(knode, ScalarNode):
            self.error(knode, base, f"keys must be plain names, got {describe(knode)}")
            return None
        name = str(knode.value)
        kp = join_path(base, name)
        problem = identifier_problem(name, reserved_ok=True)
        if problem is not None:
            self.error(knode, kp, f"invalid request key name '{name}': {problem}")
            return None
        text = self.string(tnode, kp, "a type name")
        if text is None:
            return None
        ftype, reason = parse_type(text)
        if reason is not None or ftype is None:
            self.error(tnode, kp, reason or f"unknown type '{text}'")
            return None
        if not is_entity_type(ftype):
            self.error(tnode, kp, f"request key '{name}' has type {ftype}; a key is a string or integer "
                                  "(the type of the entities it joins)")
            return None
        return key_field(name, ftype, line_of(knode))

    # ---- sources

    def parse_sources(
        self, top: YamlMap, keys: dict[str, Field],
    ) -> list[tuple[ViewSource, Schema]] | None:
        node = top.get("sources")
        if node is None:
            return None
        items = self.nonempty_sequence(node, "sources", "the list of sources",
                                       "sources must list at least one schema to read")
        if items is None:
            return None
        out: list[tuple[ViewSource, Schema]] = []
        aliases: dict[str, int | None] = {}
        for i, item in enumerate(items):
            parsed = self.parse_source(item, join_path("sources", i), keys, aliases)
            if parsed is not None:
                out.append(parsed)
        return out

    def parse_source(
        self, node: Node, kp: str, keys: dict[str, Field], aliases: dict[str, int | None],
    ) -> tuple[ViewSource, Schema] | None:
        m = self.mapping(node, kp, _SOURCE_KEYS, ("schema", "features", "join"), "a source")
        if m is None:
            return None
        schema = self.source_schema(m)
        alias = prefix = None
        if (alias_node := m.get("alias")) is not None:
            alias = self.string(alias_node, m.at("alias"), "an alias")
            if alias is not None and (problem := identifier_problem(alias, reserved_ok=True)) is not None:
                self.error(alias_node, m.at("alias"), f"invalid alias '{alias}': {problem}")
                alias = None
        if (prefix_node := m.get("prefix")) is not None:
            prefix = self.string(prefix_node, m.at("prefix"), "a column prefix")
        schema_name = self.optional_string(m, "schema")
        if alias is None and alias_node is None:
            alias = schema_name
        if prefix is None and prefix_node is None:
            prefix = f"{alias}__" if alias_node is not None and alias is not None else ""
        if alias is not None:
            if alias in aliases:
                at = m.at("alias" if alias_node is not None else "schema")
                self.error(alias_node or m.get("schema"), at,
                           f"duplicate source alias '{alias}' (first at line {aliases[alias]}): give each "
                           "source of one schema its own alias:")
                alias = None
            else:
                aliases[alias] = line_of(node)
        max_age = self.parse_max_age(m)
        if schema is not None and schema.static and max_age not in (None, False):
            self.error(m.get("max_age"), m.at("max_age"),
                       f"schema '{schema.name}' is static (event_time: none): its one row per entity "
                       "has no event time for max_age to measure; leave max_age out")
            max_age = False
        entity_key = self.parse_join(m, schema, keys)
        features = self.source_features(m, schema, prefix)
        if None in (schema, alias, prefix, entity_key, features) or max_age is False:
            # the columns it would fetch are not checked where a feature reads them: this
            # source's own errors are reported instead
            listed = m.get("features")
            for item in listed.value if listed is not None and isinstance(listed.value, list) else ():
                if isinstance(item, ScalarNode):
                    self.unparsed_fields.add((prefix or "") + str(item.value))
            return None
        assert schema is not None and alias is not None and prefix is not None
        assert entity_key is not None and features is not None
        return ViewSource(
            schema=schema.name, alias=alias, features=features, entity=entity_key[0], key=entity_key[1],
            max_age_seconds=None if max_age is None or max_age is True else max_age, prefix=prefix,
            line=line_of(node),
        ), schema

    def source_schema(self, m: YamlMap) -> Schema | None:
        node = m.get("schema")
        if node is None:
            return None
        name = self.string(node, m.at("schema"), "a schema name")
        if name is None:
            return None
        schema = self.schemas.get(name)
        if schema is None:
            names = ", ".join(sorted(self.schemas)) or "none"
            known = self.suggest(name, self.schemas) or f" (known: {names})"
            self.error(node, m.at("schema"), f"unknown schema '{name}'{known}")
            return None
        if not schema.loadable:
            self.error(node, m.at("schema"), f"schema '{name}' is validation-only (no entity, event_time): "
                                             "it stores nothing a view could read")
            return None
        return schema

    def parse_max_age(self, m: YamlMap) -> int | bool | None:
        """Seconds, None when absent; False after recording a problem."""
        node = m.get("max_age")
        if node is None or is_null(node):
            return None
        s = self.scalar(node, m.at("max_age"), "a duration")
        if s is None:
            return False
        seconds = self.seconds(s)
        if seconds is None:
            self.error(s, m.at("max_age"), f"max_age {describe(s)} is not a duration: use seconds (86400) "
                                           "or a duration such as 7d, 12h, 30m, 45s, 1d12h")
            return False
        if not 0 < seconds <= MAX_DURATION_S:
            self.error(s, m.at("max_age"), f"max_age must be > 0 and at most {MAX_DURATION_S} seconds, "
                                           f"got {s.value}")
            return False
        return seconds

    def parse_join(self, m: YamlMap, schema: Schema | None, keys: dict[str, Field]) -> tuple[str, str] | None:
        node = m.get("join")
        if node is None:
            return None
        kp = m.at("join")
        if not isinstance(node, MappingNode) or len(node.value) != 1:
            got = describe(node) if not isinstance(node, MappingNode) else f"{len(node.value)} entries"
            self.error(node, kp, f"join must be one mapping entry {{<schema entity>: <request key>}}, got "
                                 f"{got}")
            return None
        enode, knode = node.value[0]
        entity = self.string(enode, kp, "the schema's entity column")
        key = self.string(knode, join_path(kp, str(enode.value)), "a request key")
        if entity is None or key is None:
            return None
        ok = True
        if schema is not None and entity != schema.entity:
            self.error(enode, join_path(kp, entity), f"join column '{entity}' is not the entity of schema "
                                                     f"'{schema.name}' (its entity is '{schema.entity}')")
            ok = False
        request_key = keys.get(key)
        if request_key is None:
            if key not in self.unparsed_fields:
                hint = self.suggest(key, keys) or f" (request.keys: {', '.join(keys) or 'none'})"
                self.error(knode, join_path(kp, entity), f"join names request key '{key}', which is not one "
                                                         f"of request.keys{hint}")
            ok = False
        elif ok and schema is not None and schema.entity is not None:
            etype = schema.field(schema.entity).type
            if etype != request_key.type:
                self.error(knode, join_path(kp, entity),
                           f"request key '{key}' is {request_key.type} but the entity '{schema.entity}' of "
                           f"schema '{schema.name}' is {etype}: the types must match")
                ok = False
        return (entity, key) if ok else None

    def source_features(
        self, m: YamlMap, schema: Schema | None, prefix: str | None,
    ) -> tuple[str, ...] | None:
        node = m.get("features")
        if node is None:
            return None
        kp = m.at("features")
        items = self.nonempty_sequence(node, kp, "the list of features to read",
                                       "features must list at least one stored feature of the schema")
        if items is None:
            return None
        stored = None if schema is None else stored_columns(schema)
        out: list[str] = []
        ok = True
        for i, item in enumerate(items):
            ikp = join_path(kp, i)
            name = self.string(item, ikp, "a feature name")
            if name is None or stored is None or schema is None:
                ok = False
                continue
            entry = stored.get(name)
            if entry is None:
                what = "feature" if name not in schema.field_names else "stored feature"
                why = "" if name not in schema.field_names else " (the field is validated, not stored)"
                self.error(item, ikp, f"schema '{schema.name}' has no {what} '{name}'{why}"
                                      f"{self.suggest(name, stored)}")
                ok = False
                continue
            if "cold" not in entry[1]:
                self.error(item, ikp, f"feature '{name}' of schema '{schema.name}' is stored in the hot "
                                      "store only: a view reads its features from the cold store too "
                                      "(historical reads), so add cold to its store")
                ok = False
                continue
            if name in out:
                self.error(item, ikp, f"feature '{name}' is listed twice")
                ok = False
                continue
            if prefix is not None:
                column = prefix + name
                problem = identifier_problem(column, reserved_ok=True)
                if problem is not None:
                    self.error(item, ikp, f"output column '{column}' (prefix + feature) is not a valid name: "
                                          f"{problem}")
                    ok = False
                    continue
                if not self.claim(column, item, ikp, f"feature '{name}' of source '{schema.name}'"):
                    ok = False
                    continue
            out.append(name)
        return tuple(out) if ok else None

    # ---- request-time features

    def parse_derived(
        self, top: YamlMap, keys: dict[str, Field], fields: dict[str, Field],
        sources: list[tuple[ViewSource, Schema]] | None,
    ) -> tuple[Feature, ...] | None:
        node = top.get("features")
        if node is None or is_null(node):
            return ()
        items = self.sequence(node, "features", "the list of request-time features")
        if items is None:
            return None
        # every column a step may read: keys, request fields, fetched columns, then the
        # request-time features themselves (by their declared dtype: they may chain)
        available: dict[str, Field] = {**keys, **fields}
        for source, schema in sources or ():
            stored = stored_columns(schema)
            for f in source.features:
                base = stored[f][0]
                available[source.column(f)] = Field(source.column(f), base.type, values=base.values)
        derived: dict[str, Field] = {}
        for item in items:
            peeked = _peek_feature(item)
            if peeked is None:
                if (declared := self.declared_name(item)) is not None:
                    self.unparsed_fields.add(declared)
                continue
            fname, dtype = peeked
            if fname not in available and fname not in derived:
                derived[fname] = Field(fname, dtype)
        scope = {**available, **derived}
        out: list[Feature] = []
        nodes: list[tuple[Feature, Node, str]] = []
        for i, item in enumerate(items):
            kp = join_path("features", i)
            feature = self.parse_view_feature(item, kp, scope, fields)
            if feature is None:
                continue
            if not self.claim(feature.name, item, join_path(kp, "name"), "a request-time feature"):
                continue
            out.append(feature)
            nodes.append((feature, item, kp))
        self.check_cycles(nodes, {f.name for f in out})
        return tuple(out)

    def parse_view_feature(
        self, node: Node, kp: str, scope: dict[str, Field], fields: dict[str, Field],
    ) -> Feature | None:
        m = self.mapping(node, kp, _FEATURE_KEYS, ("name", "from", "steps", "dtype"),
                         "a request-time feature")
        if m is None:
            return None
        name = self.parse_identifier(m, "feature")
        source: Field | None = None
        source_name = None
        if (from_node := m.get("from")) is not None:
            source_name = self.string(from_node, m.at("from"), "a column name")
            if source_name is not None:
                source = scope.get(source_name)
                if source is None and source_name not in self.unparsed_fields:
                    self.error(from_node, m.at("from"),
                               f"from '{source_name}' is not a column {self.SCOPE}"
                               f"{self.suggest(source_name, scope)}")
        dtype: FieldType | None = None
        if (dtype_node := m.get("dtype")) is not None:
            dtype = self.parse_dtype(dtype_node, m.at("dtype"))
        on_invalid: OnInvalid | None = "null"
        if (oi_node := m.get("on_invalid")) is not None:
            on_invalid = self.parse_on_invalid(oi_node, m.at("on_invalid"))
        steps = None
        if (steps_node := m.get("steps")) is not None:
            reference = REQUEST_TIME if REQUEST_TIME in fields else None
            steps = self.parse_steps(steps_node, m.at("steps"), source, scope, reference)
            if steps is not None and reference is None and any(s.op == "time_since" for s in steps):
                self.error(steps_node, m.at("steps"),
                           f"time_since in a view measures up to the request field '{REQUEST_TIME}': "
                           "declare it in request.fields (a required timestamp)")
                steps = None
        description = self.optional_string(m, "description") or ""
        if None in (name, source, dtype, on_invalid, steps):
            return None
        assert name is not None and source_name is not None and dtype is not None
        assert on_invalid is not None and steps is not None
        return Feature(name=name, source=source_name, steps=steps, dtype=dtype, store=frozenset(),
                       on_invalid=on_invalid, description=description, line=line_of(node))

    def check_cycles(self, nodes: list[tuple[Feature, Node, str]], derived: set[str]) -> None:
        """A cycle among request-time features (``from:`` or a step's other column) is an
        error at each cycle's first feature, naming the cycle."""
        deps = {f.name: feature_dependencies(f) & derived for f, _, _ in nodes}
        where = {f.name: (n, kp) for f, n, kp in nodes}
        reported: set[frozenset[str]] = set()
        for start in deps:
            cycle = _find_cycle(start, deps)
            if cycle is None or frozenset(cycle) in reported:
                continue
            reported.add(frozenset(cycle))
            n, kp = where[cycle[0]]
            self.error(n, join_path(kp, "from"), "request-time features form a cycle: "
                                                 f"{' -> '.join([*cycle, cycle[0]])}")


def _find_cycle(start: str, deps: Mapping[str, Iterable[str]]) -> list[str] | None:
    """The cycle through ``start`` (its names from ``start``, in order), or None."""
    path: list[str] = [start]
    seen: set[str] = set()

    def walk(name: str) -> list[str] | None:
        for dep in sorted(deps.get(name, ())):
            if dep == start:
                return list(path)
            if dep in seen or dep not in deps:
                continue
            seen.add(dep)
            path.append(dep)
            found = walk(dep)
            if found is not None:
                return found
            path.pop()
        return None

    return walk(start)


def _peek_feature(node: Node) -> tuple[str, FieldType] | None:
    """A feature's name and declared dtype, read without recording anything (for
    references between request-time features); None when either does not parse."""
    if not isinstance(node, MappingNode):
        return None
    values = {str(k.value): v for k, v in node.value if isinstance(k, ScalarNode)}
    name, dtype = values.get("name"), values.get("dtype")
    if not isinstance(name, ScalarNode) or not isinstance(dtype, ScalarNode):
        return None
    ftype, reason = parse_type(str(dtype.value))
    if reason is not None or ftype is None or ftype.kind not in _DTYPE_KINDS:
        return None  # its own error is reported; a reference to it is not checked
    return str(name.value), ftype
