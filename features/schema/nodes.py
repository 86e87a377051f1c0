"""Reading a composed YAML node tree with places attached.

``NodeReader`` holds the helpers every part of the schema parser uses: check that a
node is a mapping with known keys (reporting unknown, duplicate and missing keys), a
list, a string, a bool, an int or an exact number, convert a constraint value
exactly to a field's type, and read a column name, a ``store`` or a duration. Each
helper records a :class:`SchemaError` with the node's 1-based line and the key path,
and returns None (or ``INVALID``) instead of raising, so one pass collects every
problem in a file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Context, Decimal, InvalidOperation
from typing import Any, Final, cast

from yaml import YAMLError
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from features.errors import SchemaError
from features.schema.model import FLOAT_KINDS, INTEGER_KINDS, FieldType, ScalarValue, StoreTarget, TypeKind
from features.schema.syntax import MAX_DURATION_S, duration_seconds, identifier_problem, suggest

_T: Final = "tag:yaml.org,2002:"
STR: Final = _T + "str"
INT: Final = _T + "int"
FLOAT: Final = _T + "float"
BOOL: Final = _T + "bool"
NULL: Final = _T + "null"
TIMESTAMP: Final = _T + "timestamp"
_SCALAR_TAGS: Final = frozenset({STR, INT, FLOAT, BOOL, NULL, TIMESTAMP})

_INT_RANGES: Final = {
    TypeKind.INT8: (-(2**7), 2**7 - 1),
    TypeKind.INT16: (-(2**15), 2**15 - 1),
    TypeKind.INT32: (-(2**31), 2**31 - 1),
    TypeKind.INT64: (-(2**63), 2**63 - 1),
}
_FLOAT32_MAX: Final = 3.4028234663852886e38
#: a YAML int spelled in decimal (YAML 1.1 also reads 0o17, 017, 0x1F, 0b101, 1:30)
_DECIMAL_INT_RE: Final = re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$")
#: "did you mean" hints per file (see NodeReader.suggest)
_MAX_HINTS: Final = 50
#: an exact context wide enough for any decimal(38, s) value.
_EXACT: Final = Context(prec=100)


def line_of(node: Node | None) -> int | None:
    """The node's 1-based line, or None without a node."""
    return None if node is None else node.start_mark.line + 1


def join_path(base: str, key: str | int) -> str:
    """``fields`` + 2 -> ``fields[2]``; ``fields[2]`` + ``type`` -> ``fields[2].type``."""
    if isinstance(key, int):
        return f"{base}[{key}]"
    return f"{base}.{key}" if base else key


def is_null(node: Node | None) -> bool:
    """True for a YAML null (``~``, ``null`` or an empty value)."""
    return isinstance(node, ScalarNode) and node.tag == NULL


class DocumentProblem(Exception):
    """What :func:`check_document` found, and the node it is at."""

    def __init__(self, node: Node, reason: str) -> None:
        super().__init__(reason)
        self.node = node
        self.reason = reason


def check_document(root: Node, limit: int) -> None:
    """Check the composed document as a whole; raise :class:`DocumentProblem` for:

    - an alias inside the node it refers to (a recursive document);
    - aliases that expand the document past ``limit`` (its nodes plus its scalars'
      characters, each alias counted as a copy of what it refers to): the "billion
      laughs" bomb, where a few lines stand for millions of nodes the parser would walk;
    - a string that UTF-8 cannot encode (a lone surrogate from a ``"\\ud800"`` escape):
      no store, hash or Arrow array could take it.

    Without aliases the expanded size is about the text's length. Recursion follows the
    nesting (chains of aliases included); RecursionError is the caller's to report.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise DocumentProblem(node, "an alias refers to a node that contains it (a recursive document)")
        if isinstance(node, ScalarNode):
            value = str(node.value)
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise DocumentProblem(node, f"the string holds {value[exc.start]!r}, a lone surrogate "
                                            "that UTF-8 cannot encode") from None
            total = 1 + len(value)
        else:
            open_nodes.add(key)
            pairs = isinstance(node, MappingNode)
            children: list[Node] = [n for pair in node.value for n in pair] if pairs else list(node.value)
            total = 1
            for child in children:
                total += size(child)
                if total > limit:
                    raise DocumentProblem(node, f"the document is too large with its aliases written out "
                                                f"(over {limit:,} nodes and characters): use fewer aliases")
            open_nodes.discard(key)
        sizes[key] = total
        return total

    size(root)


def describe(node: Node) -> str:
    """How an error message names what it found: ``a list``, ``string 'x'``, ``int 5``."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == NULL:
        return "null"
    if node.tag == STR:
        return f"string {node.value!r}"
    return f"{str(node.tag).rsplit(':', 1)[-1]} {node.value}"


@dataclass
class YamlMap:
    """A checked YAML mapping: its node, key path and ``key -> (key node, value node)``
    for the allowed keys that were given."""

    node: MappingNode
    path: str
    entries: dict[str, tuple[Node, Node]]

    def get(self, key: str) -> Node | None:
        entry = self.entries.get(key)
        return None if entry is None else entry[1]

    def present(self, key: str) -> bool:
        """True when the key is given with a non-null value."""
        node = self.get(key)
        return node is not None and not is_null(node)

    def at(self, key: str) -> str:
        return join_path(self.path, key)


class Invalid:
    """Marker: a value was wrong and its error recorded (None is a valid value)."""


INVALID: Final = Invalid()


class NodeReader:
    """Reads nodes of one YAML document; every problem is appended to ``errors``."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.errors: list[SchemaError] = []
        self._constructor = SafeConstructor()
        self._hints_left = _MAX_HINTS
        #: names declared by fields whose own declaration has an error (and names declared
        #: twice): a reference to one is not checked, as its type or store is unknown; the
        #: declaration's error is reported instead. Every other part is still checked.
        self.unparsed_fields: set[str] = set()

    def suggest(self, word: str, choices: Iterable[str]) -> str:
        """:func:`~features.schema.syntax.suggest`, for the first ``_MAX_HINTS`` problems of a
        file: each hint compares ``word`` with up to a thousand names (difflib), so a file
        of thousands of bad references would otherwise take minutes."""
        if self._hints_left <= 0:
            return ""
        self._hints_left -= 1
        return suggest(word, choices)

    @staticmethod
    def declared_name(node: Node) -> str | None:
        """The ``name:`` a mapping declares, as written (valid or not), else None: the name a
        part that did not parse is known by."""
        if isinstance(node, MappingNode):
            for knode, vnode in node.value:
                if isinstance(knode, ScalarNode) and knode.value == "name" and isinstance(vnode, ScalarNode):
                    return str(vnode.value)
        return None

    # ---- error and scalar helpers

    def error(self, node: Node | None, key_path: str, reason: str) -> None:
        self.errors.append(SchemaError(reason, path=self.path, line=line_of(node), key_path=key_path))

    def construct(self, node: ScalarNode) -> Any:
        """The scalar's Python value. Raises ValueError for an explicit tag its text does not
        fit (``!!int abc``, ``!!int ''``) and for ints past Python's digit limit."""
        try:
            return self._constructor.construct_object(node, deep=True)
        except (IndexError, KeyError, TypeError, AttributeError, YAMLError) as exc:
            # PyYAML's constructors index and look up the text without checking it first
            raise ValueError(f"{node.value!r} is not a valid {node.tag}") from exc

    @staticmethod
    def bool_value(node: ScalarNode) -> bool | None:
        """A ``!!bool`` scalar's value, or None when its text is no YAML 1.1 bool (an
        explicit ``!!bool maybe``)."""
        value: bool | None = SafeConstructor.bool_values.get(str(node.value).lower())
        return value

    def mapping(
        self, node: Node, kp: str, allowed: Sequence[str], required: Sequence[str], what: str,
    ) -> YamlMap | None:
        if not isinstance(node, MappingNode):
            self.error(node, kp, f"expected {what} (a mapping), got {describe(node)}")
            return None
        if node.tag != _T + "map":
            self.error(node, kp, f"unsupported YAML tag {node.tag}")
            return None
        entries: dict[str, tuple[Node, Node]] = {}
        known = frozenset(allowed)  # a where filter allows as many keys as it has
        for knode, vnode in node.value:
            if knode.tag == _T + "merge":
                self.error(knode, kp, "merge keys (<<) are not supported; write the keys out")
                continue
            if not isinstance(knode, ScalarNode):
                self.error(knode, kp, f"keys must be plain names, got {describe(knode)}")
                continue
            key = str(knode.value)
            if key in entries:
                first = line_of(entries[key][0])
                self.error(knode, join_path(kp, key), f"duplicate key '{key}' (first at line {first})")
                continue
            entries[key] = (knode, vnode)
            if key not in known:
                hint = self.suggest(key, allowed) or f"; expected one of: {', '.join(allowed)}"
                self.error(knode, join_path(kp, key), f"unknown key '{key}' in {what}{hint}")
        for key in required:
            if key not in entries:
                self.error(node, join_path(kp, key), f"missing required key '{key}' in {what}")
        return YamlMap(node, kp, {k: v for k, v in entries.items() if k in known})

    def sequence(self, node: Node, kp: str, what: str) -> list[Node] | None:
        if not isinstance(node, SequenceNode):
            self.error(node, kp, f"expected {what} (a list), got {describe(node)}")
            return None
        if node.tag != _T + "seq":
            self.error(node, kp, f"unsupported YAML tag {node.tag}")
            return None
        return list(node.value)

    def nonempty_sequence(self, node: Node, kp: str, what: str, empty: str) -> list[Node] | None:
        """:meth:`sequence`, with ``empty`` recorded (and None returned) for an empty list."""
        items = self.sequence(node, kp, what)
        if items is not None and not items:
            self.error(node, kp, empty)
            return None
        return items

    def scalar(self, node: Node, kp: str, what: str) -> ScalarNode | None:
        if not isinstance(node, ScalarNode):
            self.error(node, kp, f"expected {what}, got {describe(node)}")
            return None
        if node.tag not in _SCALAR_TAGS:
            self.error(node, kp, f"unsupported YAML tag {node.tag}")
            return None
        return node

    def string(self, node: Node, kp: str, what: str = "a string") -> str | None:
        s = self.scalar(node, kp, what)
        if s is None:
            return None
        if s.tag != STR:
            quote = f" (quote it: '{s.value}')" if s.tag in (BOOL, INT, FLOAT, TIMESTAMP) else ""
            self.error(s, kp, f"expected {what}, got {describe(s)}{quote}")
            return None
        return str(s.value)

    def optional_string(self, m: YamlMap, key: str) -> str | None:
        """The string under ``key`` of ``m``, None when the key is absent (or not a string)."""
        node = m.get(key)
        return None if node is None else self.string(node, m.at(key))

    def boolean(self, node: Node, kp: str) -> bool | None:
        s = self.scalar(node, kp, "true or false")
        if s is None:
            return None
        value = self.bool_value(s) if s.tag == BOOL else None
        if value is None:
            self.error(s, kp, f"expected true or false, got {describe(s)}")
            return None
        return value

    def integer(self, node: Node, kp: str, what: str, minimum: int, maximum: int = 2**63 - 1) -> int | None:
        """A YAML int written in decimal, ``minimum <= value <= maximum`` (bools and floats
        refused; the default maximum is int64's, what Arrow and PostgreSQL can hold)."""
        s = self.scalar(node, kp, what)
        if s is None:
            return None
        if s.tag != INT:
            self.error(s, kp, f"expected {what}, got {describe(s)}")
            return None
        value = self.number(s, kp, what)
        if value is None:
            return None
        if value < minimum:
            self.error(s, kp, f"{what} must be >= {minimum}, got {value}")
            return None
        if value > maximum:  # compared as a Decimal: int() of 1e999999999 would not end
            self.error(s, kp, f"{what} must be <= {maximum}, got {value}")
            return None
        return int(value)

    def number(self, node: Node, kp: str, what: str) -> Decimal | None:
        """An exact, finite number from the scalar's text (``1e10`` and ``0.01`` included).

        Only decimal spellings are numbers: YAML 1.1's octal (``010`` is 8), hex, binary
        and base-60 (``1:30``) forms are refused rather than silently converted.
        """
        s = self.scalar(node, kp, f"{what} (a number)")
        if s is None:
            return None
        text = str(s.value)
        if not (s.tag in (INT, FLOAT) or (s.tag == STR and s.style is None)):
            self.error(s, kp, f"{what} must be a number, got {describe(s)}")
            return None
        if s.tag == FLOAT and text.lower().lstrip("+-") in (".inf", ".nan"):
            self.error(s, kp, f"{what} must be a finite number, got {text}")
            return None
        if s.tag == INT and not _DECIMAL_INT_RE.match(text):
            try:
                read_as = f" (YAML 1.1 would read it as {self.construct(s)})"
            except ValueError:  # no int at all (!!int abc), or past Python's int digit limit
                read_as = ""
            self.error(s, kp, f"{what} {text} is not written in decimal{read_as}; write the number in "
                              "decimal")
            return None
        try:
            value = Decimal(text)
        except InvalidOperation:
            what_it_is = describe(s) if s.tag == STR else f"{text} (not a decimal number)"
            self.error(s, kp, f"{what} must be a number, got {what_it_is}")
            return None
        if not value.is_finite():
            self.error(s, kp, f"{what} must be a finite number, got {text}")
            return None
        return value

    def plain_number(self, node: Node, kp: str, what: str) -> int | float | None:
        """A step argument: int when written as a YAML int, else float; either way within
        float64's range (the transforms compute in floats: ``1e400`` would be inf)."""
        value = self.number(node, kp, what)
        if value is None:
            return None
        if math.isinf(float(value)):
            self.error(node, kp, f"{what} {node.value} is beyond the range of a float64")
            return None
        if node.tag == INT:
            return int(value)
        return float(value)

    # ---- typed values (constraints and defaults)

    def typed_value(self, node: Node, kp: str, ftype: FieldType, what: str) -> ScalarValue | Invalid:
        """``node`` converted exactly to a value of ``ftype`` (see the module docstring)."""
        kind = ftype.kind
        if kind in INTEGER_KINDS:
            d = self.number(node, kp, what)
            if d is None:
                return INVALID
            if d != d.to_integral_value():
                self.error(node, kp, f"{what} {node.value} is not an integer, {ftype} needs one")
                return INVALID
            lo, hi = _INT_RANGES[kind]
            if not lo <= d <= hi:  # compared as a Decimal: int() of 1e999999999 would not end
                shown = int(d) if d.adjusted() < 40 else node.value
                self.error(node, kp, f"{what} {shown} is not representable in {ftype} (range {lo}..{hi})")
                return INVALID
            return int(d)
        if kind is TypeKind.DECIMAL:
            d = self.number(node, kp, what)
            if d is None:
                return INVALID
            precision, scale = ftype.precision or 0, ftype.scale or 0
            places = _decimal_places(d)
            if places > scale:
                self.error(
                    node, kp, f"{what} {node.value} has {places} decimal places, {ftype} allows {scale}",
                )
                return INVALID
            digits = precision - scale
            # d.adjusted() is exact for any exponent; quantize only once d is known to fit
            # (it raises InvalidOperation past the context's precision, Overflow past Emax)
            if d != 0 and d.adjusted() >= digits:
                self.error(
                    node, kp, f"{what} {node.value} is not representable in {ftype} (at most {digits} "
                              "integer digits)",
                )
                return INVALID
            return _EXACT.quantize(d, Decimal((0, (1,), -scale)))
        if kind in FLOAT_KINDS:
            d = self.number(node, kp, what)
            if d is None:
                return INVALID
            f = float(d)
            if math.isinf(f) or (kind is TypeKind.FLOAT32 and abs(f) > _FLOAT32_MAX):
                self.error(node, kp, f"{what} {node.value} is not representable in {ftype}")
                return INVALID
            return f
        s = self.scalar(node, kp, what)
        if s is None:
            return INVALID
        if kind is TypeKind.BOOL:
            flag = self.bool_value(s) if s.tag == BOOL else None
            if flag is None:
                self.error(s, kp, f"{what} must be true or false for a bool field, got {describe(s)}")
                return INVALID
            return flag
        if kind in (TypeKind.STRING, TypeKind.ENUM):
            if s.tag != STR:
                self.error(s, kp, f"{what} must be a string for {ftype} fields, got {describe(s)} "
                                  f"(quote it: '{s.value}')")
                return INVALID
            return str(s.value)
        if s.tag not in (STR, TIMESTAMP):
            self.error(s, kp, f"{what} must be an ISO {kind.value}, got {describe(s)}")
            return INVALID
        text = str(s.value)
        if kind is TypeKind.DATE:
            try:
                return date.fromisoformat(text).isoformat()
            except ValueError:
                self.error(s, kp, f"{what} '{text}' is not an ISO date (YYYY-MM-DD)")
                return INVALID
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            self.error(s, kp, f"{what} '{text}' is not an ISO timestamp (e.g. 2024-01-31T12:00:00Z)")
            return INVALID
        if ftype.tz is not None and dt.tzinfo is None:
            self.error(s, kp, f"{what} '{text}' needs a UTC offset for {ftype} (e.g. 2024-01-31T12:00:00Z)")
            return INVALID
        if ftype.tz is None and dt.tzinfo is not None:
            self.error(s, kp, f"{what} '{text}' must not carry a UTC offset for naive {ftype}")
            return INVALID
        if (ftype.unit == "s" and dt.microsecond) or (ftype.unit == "ms" and dt.microsecond % 1000):
            self.error(s, kp, f"{what} '{text}' is not representable in {ftype} (finer than {ftype.unit})")
            return INVALID
        if dt.tzinfo is not None:
            dt = dt.astimezone(UTC)
        return dt.isoformat()

    # ---- names, stores and durations (fields, features, aggregations, the hot store)

    def parse_identifier(self, m: YamlMap, what: str) -> str | None:
        """``m``'s ``name``, a column name (a reserved word is fine: columns are always
        quoted); None when it is absent or invalid (the problem recorded)."""
        node = m.get("name")
        if node is None:
            return None
        name = self.string(node, m.at("name"), f"a {what} name")
        if name is None:
            return None
        problem = identifier_problem(name, reserved_ok=True)  # a column: always quoted
        if problem is not None:
            self.error(node, m.at("name"), f"invalid {what} name '{name}': {problem}")
            return None
        return name

    def parse_store(self, node: Node, kp: str, *, allow_none: bool) -> frozenset[StoreTarget] | None:
        """A ``store``: ``hot``, ``cold`` or a list of them; with ``allow_none`` also ``none``
        (the empty set). None after recording a problem."""
        choices = ("hot", "cold", "none") if allow_none else ("hot", "cold")
        expected = "hot, cold, none or a list of hot/cold" if allow_none else "hot, cold or [hot, cold]"
        if isinstance(node, ScalarNode) and node.tag == STR:
            items: list[Node] = [node]
            if allow_none and node.value == "none":
                return frozenset()
        elif isinstance(node, SequenceNode):
            items = list(node.value)
        else:
            self.error(node, kp, f"store must be {expected}, got {describe(node)}")
            return None
        out: set[StoreTarget] = set()
        for i, item in enumerate(items):
            ikp = kp if item is node else join_path(kp, i)
            value = self.string(item, ikp, "a store name")
            if value is None:
                return None
            if value == "none" and not allow_none:
                self.error(item, ikp, f"a feature must be stored: {expected}")
                return None
            if value not in ("hot", "cold"):
                hint = self.suggest(value, choices)
                self.error(item, ikp, f"unknown store '{value}'{hint} (expected {expected})")
                return None
            if value in out:
                self.error(item, ikp, f"duplicate store '{value}'")
                return None
            out.add(cast(StoreTarget, value))
        if not out and not allow_none:
            self.error(node, kp, f"a feature must be stored: {expected}")
            return None
        return frozenset(out)

    def duration(self, node: Node, kp: str, what: str, *, minimum: int) -> int | None:
        """A duration: seconds as an int, or text such as 7d, 12h, 30m, 45s, 1d12h."""
        s = self.scalar(node, kp, what)
        if s is None:
            return None
        seconds = self.seconds(s)
        if seconds is None:
            self.error(s, kp, f"{what} {describe(s)} is not a duration: use seconds (3600) "
                              "or a duration such as 7d, 12h, 30m, 45s, 1d12h")
            return None
        if seconds < minimum:
            self.error(s, kp, f"{what} must be >= {minimum} seconds, got {s.value}")
            return None
        if seconds > MAX_DURATION_S:
            self.error(s, kp, f"{what} must be at most {MAX_DURATION_S} seconds (100 years), got {s.value}")
            return None
        return seconds

    def seconds(self, s: ScalarNode) -> int | None:
        """A duration scalar in seconds: an int (any YAML 1.1 spelling) or text such as
        7d, 12h, 30m, 45s, 1d12h; None when it is neither. Too large to convert (past
        Python's int digit limit): ``MAX_DURATION_S + 1``."""
        if s.tag == INT:
            digits = str(s.value).replace("_", "").lstrip("+-").lstrip("0")
            if digits.isdigit() and len(digits) > 15:  # int() past 4300 digits raises
                return MAX_DURATION_S + 1
            try:
                return int(self.construct(s))  # also 0x10, 0o17, 1:30 (YAML 1.1 ints)
            except ValueError:  # an explicit !!int that is none
                return None
        return duration_seconds(str(s.value)) if s.tag == STR else None


def _decimal_places(d: Decimal) -> int:
    """Digits after the point once trailing zeros are dropped (``1.50`` -> 1, ``1E+3`` -> 0),
    for any exponent (``normalize`` would overflow the context past its Emin/Emax)."""
    _, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int), "only finite decimals come here"
    if not any(digits):
        return 0
    zeros = len(digits) - len("".join(map(str, digits)).rstrip("0"))
    return max(0, -(exponent + zeros))


def order_key(value: ScalarValue) -> Any:
    """A sort key for a converted bound: numbers as they are, ISO strings as dates/datetimes."""
    if isinstance(value, str):
        return datetime.fromisoformat(value) if "T" in value else date.fromisoformat(value)
    return value
