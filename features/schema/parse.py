"""YAML -> Schema: read a schema file, check it, and report every problem with its place.

The YAML is composed into a node tree (``yaml.compose`` with the safe loader) and
walked by hand, so every value keeps its 1-based line and its original text. That
gives two things a plain ``yaml.safe_load`` cannot: errors that point at
``file:line`` and a key path such as ``fields[2].constraints.min``, and exact numbers
(a decimal bound ``0.01`` becomes ``Decimal("0.01")`` from the text, never via float).

Every problem in a file is collected, the checks between parts (a field's type for an
aggregation, a reference to a field) included: a part with an error is left out of the
parts it feeds and every other one is still checked (``docs/schema.md`` lists what waits
for a part's own error to be fixed). The parser raises one
:class:`~features.errors.SchemaErrors` listing them all (sorted by line), so a user
fixes a file in one go. A YAML syntax error stops at once with a single
:class:`~features.errors.SchemaError` at the line PyYAML reports.

Hostile files end as a SchemaError too, in bounded time and memory: a text over
``MAX_SCHEMA_CHARS`` is refused before parsing, and so are flow collections (``[``,
``{``) nested deeper than ``_MAX_FLOW_DEPTH``, nesting deeper than Python's recursion
allows, aliases that expand the document past twice that size (the
"billion laughs"), recursive aliases and strings holding lone surrogates. Tags are
never constructed (``yaml.compose``: ``!!python/object`` is only an unsupported tag).

Value conversion (what lands in :class:`~features.schema.model.Constraints`):

===================  ==============================================================
field type           ``min`` / ``max`` / ``default``
===================  ==============================================================
int8 .. int64        ``int`` (must be integral and inside the type's range)
float32 / float64    ``float`` (finite; float32 bounds inside +-3.4028235e38)
decimal(p,s)         ``Decimal`` from the scalar's text, quantized to scale ``s``
                     (at most ``s`` decimal places, at most ``p - s`` integer digits)
date                 ISO string ``YYYY-MM-DD``
timestamp(u)         ISO string, naive (an offset is refused)
timestamp(u, TZ)     ISO string in UTC (``...+00:00``); the value must carry an offset
string / enum        ``str`` (``default`` only)
bool                 ``bool`` (``default`` only; bool has no order)
===================  ==============================================================

Nothing here touches Postgres or Redis, nor Arrow but for RE2 (``pyarrow.compute``): a
pattern must compile in RE2, and a string default is matched with it, as the validator
matches values (linear time: no pattern can hang the parser).

Why one module of this size: one :class:`SchemaParser` walks the YAML node tree, keeping
each node's line for its errors, and the checks between parts (aggregation inputs,
feature sources, evolution rules) need the whole parsed document and its collected
errors at hand.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, Protocol, TypeVar, cast

import yaml
from yaml.nodes import Node, ScalarNode

from features.errors import SchemaError, SchemaErrors
from features.schema.aggregations import AggregationReader
from features.schema.model import (
    INTEGER_KINDS,
    STATIC_EVENT_TIME,
    Constraints,
    EvolutionRule,
    Feature,
    Field,
    FieldType,
    HotStore,
    OnInvalid,
    Payload,
    ScalarValue,
    Schema,
    StoreTarget,
    TypeKind,
)
from features.schema.nodes import (
    NULL,
    STR,
    DocumentProblem,
    Invalid,
    YamlMap,
    check_document,
    describe,
    is_null,
    join_path,
    line_of,
    order_key,
)
from features.schema.quality import QualityReader
from features.schema.steps import StepReader
from features.schema.syntax import (
    MAX_DURATION_S,
    MAX_SCHEMA_NAME,
    full_match,
    identifier_problem,
    parse_type,
    regex_problem,
    reserved_name_problem,
)

__all__ = [
    "MAX_SCHEMA_CHARS", "SchemaParser", "compose_document", "load_each", "load_schema", "load_schemas",
    "parse_schema", "read_text", "yaml_files",
]

#: The largest schema text parsed, in characters. A real schema is a few KiB; PyYAML is
#: pure Python (about 20 us per token), so this bounds a parse to seconds and its
#: memory to some hundred MB, whatever the file holds.
MAX_SCHEMA_CHARS: Final = 256 * 1024
#: PyYAML's scanner keeps one possible simple key per open flow collection and checks
#: them all at every token: ``[[[[...`` costs O(text x depth). Schemas nest two or three.
_MAX_FLOW_DEPTH: Final = 100
#: payload.max_bytes at most 256 MiB: the dead-letter producer needs twice that plus
#: 64 KiB under librdkafka's message.max.bytes cap of 1e9.
_MAX_PAYLOAD_BYTES: Final = 256 * 1024 * 1024

_TOP_KEYS: Final = (
    "name", "version", "description", "entity", "event_time", "hot", "payload", "fields",
    "features", "aggregations", "evolution_rules", "quality",
)
_FIELD_KEYS: Final = ("name", "type", "description", "store", "accept_strings", "values", "constraints",
                       "source", "null_values")
_CONSTRAINT_KEYS: Final = (
    "required", "nullable", "min", "max", "pattern", "min_length", "max_length", "default",
    "empty_as_null",
)
#: ``source`` is taken only to refuse it with a reason (it belongs on input fields)
_FEATURE_KEYS: Final = ("name", "from", "steps", "dtype", "store", "on_invalid", "description", "source")
_RULE_KEYS: Final = ("field", "breaking_change", "description")

_SEMVER_RE: Final = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")


# --------------------------------------------------------------------------- public API


def parse_schema(text: str, path: str | None = None) -> Schema:
    """Parse and check one schema from YAML ``text``.

    ``path`` is used in error messages and, when the YAML has no ``name:``, its file
    stem names a validation-only schema. Returns an immutable :class:`Schema`.

    Raises :class:`SchemaError` for a YAML syntax error or an empty file, and
    :class:`SchemaErrors` (a SchemaError whose ``errors`` lists one SchemaError per
    problem, each with ``path``, ``line``, ``key_path`` and ``reason``) for every
    other problem. Never returns a partially checked schema.
    """
    schema, _ = _parse(text, path)
    return schema


def load_schema(path: str | Path) -> Schema:
    """Read and parse the schema file at ``path`` (UTF-8). Raises like :func:`parse_schema`,
    and SchemaError when the file cannot be read."""
    return _parse(read_text(Path(path)), str(path))[0]


def load_schemas(paths_or_dir: str | Path | Iterable[str | Path]) -> dict[str, Schema]:
    """Load every schema: a directory (its ``*.yaml``/``*.yml`` files, sorted), one file, or
    an iterable of files and directories. Returns ``{schema name: Schema}`` in file order.

    Problems in all files are collected and raised together as one SchemaErrors; two
    files declaring the same schema name is such a problem (reported on the second).
    """
    if isinstance(paths_or_dir, (str, Path)):
        paths_or_dir = [paths_or_dir]
    files: list[Path] = []
    for item in paths_or_dir:
        files.extend(yaml_files(Path(item)))
    return load_each(files, lambda text, path: _parse(text, path), "schema")


class _Named(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def path(self) -> str | None: ...


_N = TypeVar("_N", bound=_Named)


def yaml_files(path: Path) -> list[Path]:
    """A folder's ``*.yaml``/``*.yml`` files, sorted; a file path as it is."""
    if path.is_dir():
        return sorted(q for q in path.iterdir() if q.suffix in (".yaml", ".yml") and q.is_file())
    return [path]


def load_each(
    files: Iterable[Path], parse: Callable[[str, str], tuple[_N, int | None]], what: str,
) -> dict[str, _N]:
    """Read and ``parse`` (text, path) -> (item, line of its name) every file: ``{name:
    item}`` in file order. Problems in all files are raised together as one SchemaErrors;
    two files declaring one name is such a problem (reported on the second). The schema
    and view loaders share it."""
    out: dict[str, _N] = {}
    errors: list[SchemaError] = []
    for file in files:
        try:
            item, name_line = parse(read_text(file), str(file))
        except SchemaErrors as exc:
            errors.extend(exc.errors)
            continue
        except SchemaError as exc:
            errors.append(exc)
            continue
        if item.name in out:
            first = out[item.name].path
            errors.append(SchemaError(
                f"duplicate {what} name '{item.name}' (also declared in {first})",
                path=str(file), line=name_line, key_path="name",
            ))
            continue
        out[item.name] = item
    if errors:
        raise SchemaErrors(errors)
    return out


# --------------------------------------------------------------------------- plumbing


def read_text(path: Path) -> str:
    """The UTF-8 text of a schema (or view) file, at most ``MAX_SCHEMA_CHARS`` read;
    SchemaError when it cannot be read or is longer."""
    try:
        with path.open(encoding="utf-8") as f:
            text = f.read(MAX_SCHEMA_CHARS + 1)  # never more, whatever the file (or device) holds
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaError(f"cannot read the schema file: {exc}", path=str(path)) from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise SchemaError(f"the schema file is over the limit of {MAX_SCHEMA_CHARS:,} characters",
                          path=str(path))
    return text


def _to_float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (``value`` is within float32's range)."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


class _Loader(yaml.SafeLoader):
    """The safe loader, refusing flow collections nested deeper than ``_MAX_FLOW_DEPTH``."""

    def fetch_flow_collection_start(self, TokenClass: type) -> None:
        if self.flow_level >= _MAX_FLOW_DEPTH:
            raise yaml.scanner.ScannerError(
                None, None, f"flow collections ([...], {{...}}) nested deeper than {_MAX_FLOW_DEPTH}",
                self.get_mark())
        super().fetch_flow_collection_start(TokenClass)


def compose_document(text: str, path: str | None, what: str = "schema") -> Node | None:
    """``text`` composed into a YAML node tree (None for an empty document), with the
    limits of the module docstring; raises SchemaError for what cannot be composed. The
    view parser (``features.views.parse``) composes its files with it too."""
    if len(text) > MAX_SCHEMA_CHARS:
        raise SchemaError(f"the {what} is {len(text):,} characters, over the limit of {MAX_SCHEMA_CHARS:,}",
                          path=path)
    try:
        root = yaml.compose(text, Loader=_Loader)
        if root is not None:
            check_document(root, 2 * MAX_SCHEMA_CHARS)
    except DocumentProblem as exc:
        raise SchemaError(exc.reason, path=path, line=line_of(exc.node)) from None
    except RecursionError:
        raise SchemaError("the document is nested too deeply (lists, mappings or aliases)",
                          path=path) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "syntax error"
        raise SchemaError(
            f"invalid YAML: {problem}", path=path, line=None if mark is None else mark.line + 1,
        ) from None
    except yaml.YAMLError as exc:
        raise SchemaError(f"invalid YAML: {exc}", path=path) from None
    except ValueError as exc:  # PyYAML lets chr() fail on an escape such as "\U00110000"
        raise SchemaError(f"invalid YAML: {exc}", path=path) from None
    return root


def _parse(text: str, path: str | None) -> tuple[Schema, int | None]:
    root = compose_document(text, path)
    if root is None:
        raise SchemaError("the file is empty: a schema needs at least version and fields", path=path)
    parser = SchemaParser(path)
    schema = parser.parse(root)
    if schema is None:
        assert parser.errors, "the parser returns None only after recording an error"
        errors = sorted(parser.errors, key=lambda e: (e.line is None, e.line or 0))
        raise SchemaErrors(errors)
    return dataclasses.replace(schema, text=text), parser.name_line


class SchemaParser(StepReader, AggregationReader, QualityReader):
    """Walks one composed schema document; ``errors`` collects every problem."""

    def __init__(self, path: str | None) -> None:
        super().__init__(path)
        #: the line of ``name:`` (for duplicate-name errors across files)
        self.name_line: int | None = None
        #: fields whose ``constraints`` is not a mapping (their nullability is unknown)
        self.constraints_unknown: set[str] = set()

    def parse(self, root: Node) -> Schema | None:
        """The Schema, or None when any problem was recorded in ``errors``."""
        top = self.mapping(root, "", _TOP_KEYS, ("version", "fields"), "a schema")
        if top is None:
            return None
        version = self.parse_version(top)
        description = self.optional_string(top, "description") or ""
        entity = self.optional_string(top, "entity")
        event_time = self.optional_string(top, "event_time")
        # ``event_time: none``: a static table (one row per entity, newest load wins)
        static = event_time == STATIC_EVENT_TIME
        if static:
            event_time = None
        loadable = top.present("entity") and top.present("event_time")
        for key, other in (("entity", "event_time"), ("event_time", "entity")):
            if top.present(key) and not top.present(other):
                self.error(
                    top.get(key), key,
                    f"{key} needs {other} too: a loadable schema has both, a validation-only one neither",
                )
        name = self.parse_name(top, loadable)
        hot = self.parse_hot(top)
        payload = self.parse_payload(top)
        fields = self.parse_fields(top, loadable)
        if fields is not None:
            self.check_keys(top, fields, entity, event_time)
        features = self.parse_features(top, fields, loadable, event_time)
        aggregations = self.parse_aggregations(top, fields, loadable, features)
        if static and (agg_node := top.get("aggregations")) is not None and not is_null(agg_node):
            self.error(agg_node, "aggregations",
                       "aggregations need an event time: a static schema (event_time: none) holds one "
                       "row per entity and no history to aggregate over windows; give the schema an "
                       "event_time field, or move the aggregations to a schema of events")
        rules = self.parse_rules(top)
        quality = self.parse_quality(top, fields, features)
        if self.errors or None in (name, version, fields, features, rules):
            return None
        assert name is not None and version is not None and fields is not None
        assert features is not None and rules is not None
        return Schema(
            name=name, version=version, fields=tuple(f for f, _ in fields),
            entity=entity, event_time=event_time, features=features, hot=hot, payload=payload,
            evolution_rules=rules, aggregations=aggregations, description=description, path=self.path,
            static=static, quality=quality,
        )

    def parse_version(self, top: YamlMap) -> tuple[int, int, int] | None:
        node = top.get("version")
        if node is None:
            return None
        s = self.scalar(node, "version", "a version such as 1.0.0")
        if s is None:
            return None
        match = _SEMVER_RE.match(str(s.value)) if s.tag != NULL else None
        if match is None:
            self.error(s, "version", f"version '{s.value}' is not semver MAJOR.MINOR.PATCH (e.g. 1.0.0)")
            return None
        if max(len(part) for part in match.groups()) > 18:  # int() of thousands of digits is refused
            self.error(s, "version", f"version '{s.value}': each part has at most 18 digits")
            return None
        return int(match[1]), int(match[2]), int(match[3])

    def parse_name(self, top: YamlMap, loadable: bool) -> str | None:
        node = top.get("name")
        if node is None:
            if loadable:
                self.error(top.node, "name", "a loadable schema (entity, event_time) needs an explicit name")
                return None
            if self.path is None:
                self.error(top.node, "name", "missing required key 'name' (there is no file name to use)")
                return None
            name = Path(self.path).stem
            source = f"the file name '{name}'"
        else:
            self.name_line = line_of(node)
            parsed = self.string(node, "name")
            if parsed is None:
                return None
            name = parsed
            source = f"schema name '{name}'"
        problem = identifier_problem(name)
        if problem is None and len(name) > MAX_SCHEMA_NAME:
            problem = (f"it is too long ({len(name)} characters, at most {MAX_SCHEMA_NAME} to leave room "
                       "for __rejects)")
        if problem is None:
            problem = reserved_name_problem(name)
        if problem is not None:
            hint = "" if node is not None else "; add name:"
            self.error(node if node is not None else top.node, "name", f"invalid {source}: {problem}{hint}")
            return None
        return name

    def parse_hot(self, top: YamlMap) -> HotStore:
        node = top.get("hot")
        if node is None or is_null(node):
            return HotStore()
        m = self.mapping(node, "hot", ("ttl", "refresh_after"), (), "hot store settings")
        if m is None:
            return HotStore()
        ttl = self.hot_duration(m, "ttl", "a TTL")
        refresh = self.hot_duration(m, "refresh_after", "a refresh age")
        if refresh is not None and (ttl is None or refresh >= ttl):
            node = m.get("refresh_after")
            assert node is not None
            self.error(node, m.at("refresh_after"),
                       f"refresh_after ({refresh} s) must be shorter than hot.ttl "
                       f"({'none' if ttl is None else f'{ttl} s'}): it is the age at which a hot value "
                       "is served stale while the SDK refreshes it, before the TTL removes it")
            refresh = None
        return HotStore(ttl_seconds=ttl, refresh_after_seconds=refresh)

    def hot_duration(self, m: YamlMap, key: str, what: str) -> int | None:
        """``hot.<key>``: a duration in seconds (> 0, at most 100 years), None when absent."""
        node = m.get(key)
        if node is None:
            return None
        kp = m.at(key)
        s = self.scalar(node, kp, what)
        if s is None or is_null(s):
            return None
        seconds = self.seconds(s)
        if seconds is None:
            self.error(s, kp, f"{key} {describe(s)} is not a duration: use seconds (86400) "
                              "or a duration such as 7d, 12h, 30m, 45s, 1d12h")
            return None
        if seconds <= 0:
            self.error(s, kp, f"{key} must be > 0 seconds, got {s.value}")
            return None
        if seconds > MAX_DURATION_S:
            self.error(s, kp, f"{key} must be at most {MAX_DURATION_S} seconds (100 years), got {s.value}")
            return None
        return seconds

    def parse_payload(self, top: YamlMap) -> Payload:
        node = top.get("payload")
        if node is None or is_null(node):
            return Payload()
        m = self.mapping(node, "payload", ("format", "max_bytes"), (), "payload settings")
        if m is None:
            return Payload()
        max_bytes = Payload().max_bytes
        if (fmt_node := m.get("format")) is not None:
            fmt = self.string(fmt_node, m.at("format"))
            if fmt is not None and fmt != "json":
                self.error(fmt_node, m.at("format"), f"payload format '{fmt}' is not supported (only json)")
        if (mb_node := m.get("max_bytes")) is not None:
            value = self.integer(mb_node, m.at("max_bytes"), "max_bytes", 1, _MAX_PAYLOAD_BYTES)
            if value is not None:
                max_bytes = value
        return Payload(format="json", max_bytes=max_bytes)

    # ---- fields

    def parse_fields(self, top: YamlMap, loadable: bool) -> list[tuple[Field, Node]] | None:
        """The fields that parsed, None when the section itself is missing or not a list.

        A field with an error is left out and its name (as written) goes to
        ``unparsed_fields``, as does a name declared twice; the other fields are returned,
        so that references to them are checked in the same pass. A schema is built only
        when ``errors`` stays empty."""
        node = top.get("fields")
        if node is None:
            return None
        items = self.nonempty_sequence(node, "fields", "the list of fields",
                                       "fields must list at least one field")
        if items is None:
            return None
        out: list[tuple[Field, Node]] = []
        sources: list[tuple[Node | None, str]] = []
        seen: dict[str, int | None] = {}
        for i, item in enumerate(items):
            parsed = self.parse_field(item, join_path("fields", i), loadable)
            if parsed is None:
                if (declared := self.declared_name(item)) is not None:
                    self.unparsed_fields.add(declared)
                continue
            field, name_node, source_node = parsed
            if field.name in seen:
                self.error(name_node, join_path(join_path("fields", i), "name"),
                           f"duplicate field name '{field.name}' (first at line {seen[field.name]})")
                self.unparsed_fields.add(field.name)  # which of the two a reference means is unknown
                continue
            seen[field.name] = line_of(name_node)
            out.append((field, name_node))
            sources.append((source_node, join_path(join_path("fields", i), "source")))
        self.check_sources(out, sources)
        return [(f, n) for f, n in out if f.name not in self.unparsed_fields]

    def check_sources(self, fields: list[tuple[Field, Node]], sources: list[tuple[Node | None, str]]) -> bool:
        """Each input name feeds one field: no two fields read the same ``source``, and a
        ``source`` naming another field is allowed only when that field is read from a
        source of its own (two fields may swap names). ``sources``: each field's
        ``source`` node and key path. False after recording a problem."""
        by_name = {f.name: f for f, _ in fields}
        readers: dict[str, Field] = {}
        ok = True
        for (f, _), (node, kp) in zip(fields, sources, strict=True):
            if f.source is None or f.source == f.name:
                continue
            other, first = by_name.get(f.source), readers.get(f.source)
            if other is not None and other.source in (None, other.name):
                self.error(node, kp, f"source '{f.source}' of field '{f.name}' is the name of field "
                                     f"'{other.name}', which reads its own column '{other.name}': give "
                                     f"'{other.name}' a source too (two fields may swap names) or read "
                                     "another column")
                ok = False
            elif first is not None:
                self.error(node, kp, f"field '{f.name}' reads source '{f.source}', as field '{first.name}' "
                                     f"does (line {first.line}): each input column feeds one field")
                ok = False
            else:
                readers[f.source] = f
        return ok

    def parse_field(self, node: Node, kp: str, loadable: bool) -> tuple[Field, Node, Node | None] | None:
        """(field, its name node, its source node) or None after recording a problem."""
        m = self.mapping(node, kp, _FIELD_KEYS, ("name", "type"), "a field")
        if m is None:
            return None
        name = self.parse_identifier(m, "field")
        ftype: FieldType | None = None
        if (type_node := m.get("type")) is not None:
            text = self.string(type_node, m.at("type"), "a type name")
            if text is not None:
                ftype, reason = parse_type(text)
                if reason is not None:
                    self.error(type_node, m.at("type"), reason)
        values = self.parse_values(m, ftype)
        accept_strings = False
        if (as_node := m.get("accept_strings")) is not None:
            flag = self.boolean(as_node, m.at("accept_strings"))
            accept_strings = bool(flag)
            if flag and ftype is not None and ftype.kind is TypeKind.LIST:
                self.error(as_node, m.at("accept_strings"),
                           f"accept_strings does not apply to {ftype} fields")
            if flag and ftype is not None and ftype.kind in (TypeKind.STRING, TypeKind.ENUM):
                self.error(as_node, m.at("accept_strings"),
                           f"accept_strings applies to non-string fields, this one is {ftype}")
        constraints = Constraints()
        if (c_node := m.get("constraints")) is not None and not is_null(c_node):
            parsed = self.parse_constraints(c_node, m.at("constraints"), ftype, values)
            constraints = parsed if parsed is not None else constraints
            if parsed is None and name is not None:
                self.constraints_unknown.add(name)
        store: frozenset[StoreTarget] = frozenset({"cold"}) if loadable else frozenset()
        if (store_node := m.get("store")) is not None:
            parsed_store = self.parse_store(store_node, m.at("store"), allow_none=True)
            if parsed_store is not None:
                store = parsed_store
                if store and not loadable:
                    self.error(store_node, m.at("store"),
                               f"field '{name}' is stored ({', '.join(sorted(store))}) but the schema is "
                               "validation-only: add entity and event_time to make it loadable")
        source = None
        if (source_node := m.get("source")) is not None:
            source = self.string(source_node, m.at("source"), "the input column name (a string)")
            if source == "":
                self.error(source_node, m.at("source"), "source must name the input column: it is empty")
                source = None
        null_values = self.parse_null_values(m, values, constraints)
        description = self.optional_string(m, "description") or ""
        if name is None or ftype is None or values is None:
            return None
        field = Field(
            name=name, type=ftype, constraints=constraints, values=values, store=store,
            accept_strings=accept_strings, source=source, description=description, line=line_of(node),
            null_values=null_values,
        )
        name_node = m.get("name")
        assert name_node is not None
        return field, name_node, source_node

    def parse_null_values(self, m: YamlMap, values: tuple[str, ...] | None,
                          constraints: Constraints) -> tuple[str, ...]:
        """``null_values``: a list of unique strings, the input's texts for null (sorted;
        ``()`` when absent, null or ``[]``). Refused: another node than a list, an entry
        that is not a string (quoting hinted), a duplicate, an enum value (it could
        never be read as that value) and a marker equal to the field's ``default`` (the
        default would be read back as null), the way ``default: ''`` contradicts
        ``empty_as_null``."""
        node = m.get("null_values")
        if node is None or is_null(node):
            return ()
        kp = m.at("null_values")
        if isinstance(node, ScalarNode) and node.tag == STR:
            self.error(node, kp, f"expected a list of null markers, got string {node.value!r} "
                                 f"(write a list: [{node.value!r}])")
            return ()
        items = self.sequence(node, kp, 'null markers, e.g. [nil, NA, ""]')
        if items is None:
            return ()
        out: dict[str, None] = {}
        for i, item in enumerate(items):
            at = join_path(kp, i)
            if is_null(item):
                text = str(item.value) or "null"
                self.error(item, at, f"expected a null marker (a string), got null (quote it: '{text}'; "
                                     "'' is the empty string)")
                continue
            marker = self.string(item, at, "a null marker (a string)")
            if marker is None:
                continue
            if marker in out:
                self.error(item, at, f"duplicate null marker {marker!r}")
            elif values and marker in values:
                self.error(item, at, f"null marker {marker!r} is one of the enum values: it would never "
                                     "be read as that value")
            elif constraints.has_default and constraints.default == marker:
                self.error(item, at, f"null marker {marker!r} is the default: the default would be read "
                                     "as null")
            out[marker] = None
        return tuple(sorted(out))

    def parse_values(self, m: YamlMap, ftype: FieldType | None) -> tuple[str, ...] | None:
        node = m.get("values")
        is_enum = ftype is not None and ftype.kind is TypeKind.ENUM
        if node is None:
            if is_enum:
                self.error(m.node, m.at("values"), "an enum field needs values: [a, b, ...]")
                return None
            return ()
        if ftype is not None and not is_enum:
            self.error(node, m.at("values"), f"values applies only to enum fields, this one is {ftype}")
            return None
        items = self.sequence(node, m.at("values"), "enum values")
        if items is None:
            return None
        if not items:
            self.error(node, m.at("values"), "enum values must not be empty")
            return None
        out: dict[str, None] = {}  # ordered, and a set for the duplicate check
        ok = True
        for i, item in enumerate(items):
            kp = join_path(m.at("values"), i)
            value = self.string(item, kp, "an enum value (a string)")
            if value is None:
                ok = False
            elif value == "":
                self.error(item, kp, "enum values must not be empty strings")
                ok = False
            elif value in out:
                self.error(item, kp, f"duplicate enum value '{value}'")
                ok = False
            else:
                out[value] = None
        return tuple(out) if ok else None

    # ---- constraints

    def parse_constraints(
        self, node: Node, kp: str, ftype: FieldType | None, values: tuple[str, ...] | None,
    ) -> Constraints | None:
        m = self.mapping(node, kp, _CONSTRAINT_KEYS, (), "constraints")
        if m is None:
            return None
        if ftype is not None and ftype.kind is TypeKind.LIST:
            for key in ("min", "max", "pattern", "min_length", "max_length", "default", "empty_as_null"):
                if (n := m.get(key)) is not None:
                    self.error(n, m.at(key), f"{key} does not apply to {ftype} fields (a list field "
                                             "takes required and nullable; its length and elements are in "
                                             "its type)")
                    return None
        flags: dict[str, bool] = {}
        for key in ("required", "nullable", "empty_as_null"):
            if (n := m.get(key)) is not None:
                flag = self.boolean(n, m.at(key))
                if flag is not None:
                    flags[key] = flag
        required = flags.get("required", False)
        if required and flags.get("nullable") is True:
            self.error(m.get("nullable"), m.at("nullable"), "nullable: true contradicts required: true")
        nullable = flags.get("nullable", not required) and not required
        kind = None if ftype is None else ftype.kind
        is_text = kind in (TypeKind.STRING, TypeKind.ENUM)
        if flags.get("empty_as_null") and kind is not None and not is_text:
            self.error(m.get("empty_as_null"), m.at("empty_as_null"),
                       f"empty_as_null applies to string and enum fields, this one is {ftype}")

        bounds: dict[str, ScalarValue] = {}
        for key in ("min", "max"):
            if (n := m.get(key)) is None or ftype is None:
                continue
            if kind in (TypeKind.BOOL, TypeKind.ENUM, TypeKind.STRING):
                extra = "; use min_length/max_length" if kind is TypeKind.STRING else ""
                self.error(n, m.at(key), f"{key} does not apply to {ftype} fields: they have no order{extra}")
                continue
            value = self.typed_value(n, m.at(key), ftype, key)
            if not isinstance(value, Invalid):
                bounds[key] = value
        if "min" in bounds and "max" in bounds and order_key(bounds["min"]) > order_key(bounds["max"]):
            self.error(m.get("min"), m.at("min"), f"min {bounds['min']} is greater than max {bounds['max']}")

        pattern = self.parse_pattern(m, ftype)
        lengths: dict[str, int] = {}
        for key in ("min_length", "max_length"):
            if (n := m.get(key)) is None:
                continue
            if kind is not None and kind is not TypeKind.STRING:
                self.error(n, m.at(key), f"{key} applies to string fields, this one is {ftype}")
                continue
            value = self.integer(n, m.at(key), key, 0)
            if value is not None:
                lengths[key] = value
        lo_len, hi_len = lengths.get("min_length"), lengths.get("max_length")
        if lo_len is not None and hi_len is not None and lo_len > hi_len:
            self.error(m.get("min_length"), m.at("min_length"),
                       f"min_length {lo_len} is greater than max_length {hi_len}")

        default: ScalarValue = None
        has_default = False
        if (n := m.get("default")) is not None:
            has_default = True
            if is_null(n):
                if not nullable:
                    why = "required: true" if required else "nullable: false"
                    self.error(n, m.at("default"), f"default: null contradicts {why}")
            elif required:
                self.error(n, m.at("default"),
                           "default contradicts required: true (a required column must be given; "
                           "a default fills it in)")
            elif ftype is not None:
                value = self.typed_value(n, m.at("default"), ftype, "default")
                # values convert to float32 exactly or are rejected; so must the default
                # (typed_value checked that it is in float32's range)
                if ftype.kind is TypeKind.FLOAT32 and isinstance(value, float) \
                        and (nearest := _to_float32(value)) != value:
                    self.error(n, m.at("default"), f"default {n.value} is not exactly representable in "
                                                   f"float32 (the nearest is {nearest!r})")
                elif not isinstance(value, Invalid):
                    default = value
                    self.check_default(n, m.at("default"), value, bounds, pattern, lengths, values)
        if default == "" and flags.get("empty_as_null"):
            self.error(m.get("default"), m.at("default"),
                       "default '' contradicts empty_as_null: true (an empty string is read as null)")
        return Constraints(
            required=required, nullable=nullable, min=bounds.get("min"), max=bounds.get("max"),
            pattern=pattern, min_length=lengths.get("min_length"), max_length=lengths.get("max_length"),
            default=default, has_default=has_default, empty_as_null=flags.get("empty_as_null", False),
        )

    def parse_pattern(self, m: YamlMap, ftype: FieldType | None) -> str | None:
        node = m.get("pattern")
        if node is None:
            return None
        kp = m.at("pattern")
        if ftype is not None and ftype.kind is not TypeKind.STRING:
            self.error(node, kp, f"pattern applies to string fields, this one is {ftype}")
            return None
        pattern = self.string(node, kp, "a regex")
        if pattern is None:
            return None
        problem = regex_problem(pattern)
        if problem is not None:
            self.error(node, kp, f"pattern {pattern!r}: {problem}")
            return None
        return pattern

    def check_default(
        self, node: Node, kp: str, value: ScalarValue, bounds: dict[str, ScalarValue],
        pattern: str | None, lengths: dict[str, int], values: tuple[str, ...] | None,
    ) -> None:
        """The default must pass the field's own rules (it is filled in before they run)."""
        if "min" in bounds and order_key(value) < order_key(bounds["min"]):
            self.error(node, kp, f"default {value} violates min: expected >= {bounds['min']}")
        if "max" in bounds and order_key(value) > order_key(bounds["max"]):
            self.error(node, kp, f"default {value} violates max: expected <= {bounds['max']}")
        if not isinstance(value, str):
            return
        if pattern is not None and not full_match(pattern, value):
            self.error(node, kp, f"default {value!r} violates pattern: expected a full match of {pattern}")
        lo_len, hi_len = lengths.get("min_length"), lengths.get("max_length")
        if lo_len is not None and len(value) < lo_len:
            self.error(node, kp, f"default {value!r} violates min_length: expected >= {lo_len}")
        if hi_len is not None and len(value) > hi_len:
            self.error(node, kp, f"default {value!r} violates max_length: expected <= {hi_len}")
        if values and value not in values:
            self.error(node, kp, f"default {value!r} violates enum: expected one of {', '.join(values)}")

    # ---- entity / event time

    def check_keys(
        self, top: YamlMap, fields: list[tuple[Field, Node]], entity: str | None, event_time: str | None,
    ) -> None:
        by_name = {f.name: f for f, _ in fields}
        for key, name in (("entity", entity), ("event_time", event_time)):
            node = top.get(key)
            if name is None or node is None:
                continue
            field = by_name.get(name)
            if field is None:
                if name not in self.unparsed_fields:
                    hint = self.suggest(name, by_name)
                    self.error(node, key, f"{key} '{name}' is not a field of this schema{hint}")
                continue
            kind = field.type.kind
            if key == "entity" and kind is not TypeKind.STRING and kind not in INTEGER_KINDS:
                self.error(node, key, f"entity field '{name}' has type {field.type}; "
                                      "an entity must be a string or integer field")
            if key == "event_time" and kind not in (TypeKind.TIMESTAMP, TypeKind.DATE):
                self.error(node, key, f"event_time field '{name}' has type {field.type}; "
                                      "it must be a timestamp or date field")
            if field.constraints.nullable and name not in self.constraints_unknown:
                self.error(node, key, f"{key} field '{name}' is nullable; mark it required: true "
                                      "(or nullable: false): it is part of the primary key")

    # ---- features

    def parse_features(
        self, top: YamlMap, fields: list[tuple[Field, Node]] | None, loadable: bool, event_time: str | None,
    ) -> tuple[Feature, ...] | None:
        node = top.get("features")
        if node is None or is_null(node):
            return ()
        items = self.sequence(node, "features", "the list of features")
        if items is None:
            return None
        if items and not loadable:
            # the features are still checked: adding entity and event_time should not reveal more
            self.error(node, "features", "features need a loadable schema: add entity and event_time "
                                         "(a validation-only schema stores nothing)")
        by_name = None if fields is None else {f.name: f for f, _ in fields}
        out: list[Feature] = []
        seen: dict[str, int | None] = {}
        for i, item in enumerate(items):
            feature = self.parse_feature(item, join_path("features", i), by_name, event_time)
            if feature is None:
                continue
            if feature.name in seen:
                self.error(item, join_path(join_path("features", i), "name"),
                           f"duplicate feature name '{feature.name}' (first at line {seen[feature.name]})")
                continue
            seen[feature.name] = feature.line
            out.append(feature)
        # those that parsed (the aggregations' name clashes are checked against them); the
        # schema is built only when no error was recorded
        return tuple(out)

    def parse_feature(
        self, node: Node, kp: str, fields: dict[str, Field] | None, event_time: str | None,
    ) -> Feature | None:
        m = self.mapping(node, kp, _FEATURE_KEYS, ("name", "from", "steps", "dtype", "store"), "a feature")
        if m is None:
            return None
        name = self.parse_identifier(m, "feature")
        if (src_node := m.get("source")) is not None:
            self.error(src_node, m.at("source"),
                       "source applies to input fields (the input column a field is read from); a "
                       "derived feature is computed, not read: name its field with from:, and put source "
                       "on that field")
            name = None
        if name is not None and fields is not None and name in fields:
            self.error(m.get("name"), m.at("name"),
                       f"feature name '{name}' clashes with the field '{name}' (one column each)")
            name = None
        source: Field | None = None
        source_name = None
        if (from_node := m.get("from")) is not None:
            source_name = self.string(from_node, m.at("from"), "a field name")
            if source_name is not None and fields is not None:
                source = fields.get(source_name)
                if source is None and source_name not in self.unparsed_fields:
                    hint = self.suggest(source_name, fields)
                    self.error(from_node, m.at("from"),
                               f"from '{source_name}' is not a field of this schema{hint}")
                elif source is not None and source.type.kind is TypeKind.LIST:
                    self.error(from_node, m.at("from"),
                               f"from '{source_name}' is a {source.type} field: a derived feature reads "
                               "one value per row, not a list")
        dtype: FieldType | None = None
        if (dtype_node := m.get("dtype")) is not None:
            dtype = self.parse_dtype(dtype_node, m.at("dtype"))
        store = None
        if (store_node := m.get("store")) is not None:
            store = self.parse_store(store_node, m.at("store"), allow_none=False)
        on_invalid: OnInvalid | None = "null"
        if (oi_node := m.get("on_invalid")) is not None:
            on_invalid = self.parse_on_invalid(oi_node, m.at("on_invalid"))
        steps = None
        if (steps_node := m.get("steps")) is not None:
            steps = self.parse_steps(steps_node, m.at("steps"), source, fields, event_time)
        description = self.optional_string(m, "description") or ""
        if None in (name, source, dtype, store, on_invalid, steps):
            return None
        assert name is not None and source_name is not None and dtype is not None
        assert store is not None and on_invalid is not None and steps is not None
        return Feature(
            name=name, source=source_name, steps=steps, dtype=dtype, store=store,
            on_invalid=on_invalid, description=description, line=line_of(node),
        )

    def parse_on_invalid(self, node: Node, kp: str) -> OnInvalid | None:
        if is_null(node):
            return "null"  # YAML reads `on_invalid: null` as null, not the string
        value = self.string(node, kp, "null or reject")
        if value is None:
            return None
        if value in ("null", "reject"):
            return cast(OnInvalid, value)
        self.error(node, kp, f"on_invalid must be null or reject, got '{value}'")
        return None

    # ---- evolution rules

    def parse_rules(self, top: YamlMap) -> tuple[EvolutionRule, ...] | None:
        node = top.get("evolution_rules")
        if node is None or is_null(node):
            return ()
        items = self.sequence(node, "evolution_rules", "the list of evolution rules")
        if items is None:
            return None
        out: list[EvolutionRule] = []
        seen: set[str] = set()
        ok = True
        for i, item in enumerate(items):
            kp = join_path("evolution_rules", i)
            m = self.mapping(item, kp, _RULE_KEYS, ("field", "breaking_change"), "an evolution rule")
            if m is None:
                ok = False
                continue
            # The field may not (yet, or any more) be in this schema: rules describe changes.
            field = None if (n := m.get("field")) is None else self.string(n, m.at("field"), "a field name")
            breaking = None if (n := m.get("breaking_change")) is None else self.boolean(
                n, m.at("breaking_change"))
            description = self.optional_string(m, "description") or ""
            if field is not None and field in seen:
                self.error(m.get("field"), m.at("field"), f"duplicate evolution rule for field '{field}'")
                ok = False
                continue
            if field is None or breaking is None:
                ok = False
                continue
            seen.add(field)
            out.append(EvolutionRule(field=field, breaking_change=breaking, description=description))
        return tuple(out) if ok else None
