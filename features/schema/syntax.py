"""The small grammars inside schema values: names, type names, regexes and durations.

Pure functions, no YAML: each returns the parsed value or a reason string, and
``features.schema.parse`` attaches the file, line and key path. The regex check is
public because every engine that runs a schema pattern (the validator's RE2, the
PostgreSQL CHECK, the GX suite's Python ``re``) must agree on what it matches.
"""

from __future__ import annotations

import difflib
import itertools
import re
import warnings
from collections.abc import Iterable
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pyarrow as pa
import pyarrow.compute as pc

from features.schema.model import LIST_ELEMENT_KINDS, LIST_MAX_LENGTH, FieldType, ListItems, TypeKind

__all__ = [
    "AGGREGATES_SUFFIX", "BY_ERROR_SUFFIX", "BY_RUN_SUFFIX", "CHECK_SUFFIX", "IDENTIFIER_RE",
    "MAX_DURATION_S", "MAX_IDENTIFIER", "MAX_SCHEMA_NAME", "PKEY_SUFFIX", "POSIX_CLASSES", "REJECTS_SUFFIX",
    "RESERVED_PREFIXES", "RESERVED_SUFFIXES", "RESERVED_WORDS", "SOURCE_KEY_SUFFIX", "TILES_SUFFIX",
    "duration_seconds", "full_match", "identifier_problem", "parse_type", "regex_problem",
    "reserved_name_problem", "suggest",
]

IDENTIFIER_RE: Final = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
MAX_IDENTIFIER: Final = 63
# The suffixes of the names featureline derives from a schema's name, in the one
# namespace (and Redis database) the schema's tables share with every other schema's:
# a schema named ``x__aggregates`` would share schema ``x``'s aggregates table and Redis
# hashes. The names are built from these constants (compile/postgres.py, compile/layout.py)
# and schema names are refused when they end with one (:func:`reserved_name_problem`).
#: the rejects table ``<schema>__rejects``
REJECTS_SUFFIX: Final = "__rejects"
#: the aggregates table and the Redis hashes ``features:<schema>__aggregates:{<entity>}``
AGGREGATES_SUFFIX: Final = "__aggregates"
#: the request-time window tiles' Redis hashes ``features:<schema>__tiles:{<entity>}``
TILES_SUFFIX: Final = "__tiles"
#: the all-fields check table of a validation-only schema
CHECK_SUFFIX: Final = "__check"
#: a table's primary-key index (a relation of the namespace)
PKEY_SUFFIX: Final = "__pkey"
#: the rejects table's unique index on (``_source``, fingerprint)
SOURCE_KEY_SUFFIX: Final = "__source_key"
#: the rejects table's indexes by run and by error (relations of the namespace)
BY_RUN_SUFFIX: Final = "__by_run"
BY_ERROR_SUFFIX: Final = "__by_error"
RESERVED_SUFFIXES: Final = (REJECTS_SUFFIX, AGGREGATES_SUFFIX, TILES_SUFFIX, CHECK_SUFFIX, PKEY_SUFFIX,
                             SOURCE_KEY_SUFFIX, BY_RUN_SUFFIX, BY_ERROR_SUFFIX)
#: featureline's own tables (``featureline_schemas``, ``featureline_ledger``) and any
#: it may add
RESERVED_PREFIXES: Final = ("featureline_",)

#: a schema name leaves room for the ``__rejects`` suffix of its rejects table.
MAX_SCHEMA_NAME: Final = MAX_IDENTIFIER - len(REJECTS_SUFFIX)

#: PostgreSQL's reserved key words (those that cannot be column names unquoted) plus
#: the ones that need ``AS``; refused as schema (table) names so that hand-written SQL
#: over our tables works; allowed as field, feature and aggregation names (quoted).
RESERVED_WORDS: Final = frozenset("""
all analyse analyze and any array as asc asymmetric authorization binary both case cast
check collate collation column concurrently constraint create cross current_catalog
current_date current_role current_schema current_time current_timestamp current_user
default deferrable desc distinct do else end except false fetch for foreign freeze from
full grant group having ilike in initially inner intersect into is isnull join lateral
leading left like limit localtime localtimestamp natural not notnull null offset on only
or order outer overlaps placing primary references returning right select session_user
similar some symmetric system_user table tablesample then to trailing true union unique
user using variadic verbose when where window with
""".split())

_MAX_DECIMAL_PRECISION: Final = 38
_TIMESTAMP_UNITS: Final = ("s", "ms", "us")
_MAX_REPEAT: Final = 255  # PostgreSQL's regex repetition limit (RE2's is 1000)
_DURATION_RE: Final = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
#: The longest duration (TTL, window, lateness): 100 years. Windows run in int64
#: microseconds next to epoch times, so a bound far below 2**63 us keeps them exact.
MAX_DURATION_S: Final = 100 * 365 * 86_400


def suggest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` (the first thousand: difflib
    costs tens of microseconds per name), or an empty string."""
    match = difflib.get_close_matches(word[:200], list(itertools.islice(choices, 1000)), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def identifier_problem(name: str, *, reserved_ok: bool = False) -> str | None:
    """Why ``name`` cannot be a column/table name, or None when it can. ``reserved_ok``:
    a reserved SQL word is allowed (column names: every one reaches SQL quoted, and real
    data has columns called ``user``, ``order``, ``group``, ``from``)."""
    if not name:
        return "it is empty"
    if len(name) > MAX_IDENTIFIER:
        return f"it is too long ({len(name)} characters, at most {MAX_IDENTIFIER})"
    if name.startswith("_"):
        return "names starting with '_' are reserved for lineage columns"
    if not IDENTIFIER_RE.match(name):
        return "it is not a safe identifier (lowercase letters, digits and '_', starting with a letter)"
    if name in RESERVED_WORDS and not reserved_ok:
        return "it is a reserved SQL word"
    return None


# --------------------------------------------------------------------------- regexes

_ESCAPE_PROBLEMS: Final = {
    "b": r"\b is a word boundary in Python and RE2 but a backspace in PostgreSQL",
    "B": r"\B is a non-boundary in Python and RE2 but a backslash in PostgreSQL",
    "A": r"\A is not portable (patterns always match the whole value)",
    "Z": r"\Z is not portable (patterns always match the whole value)",
    "z": r"\z is not portable (patterns always match the whole value)",
}
#: escapes that mean one and the same character in every engine
_SAME_ESCAPES: Final = frozenset("ntrfva")
#: RE2's ASCII classes; the compiler spells them out for PostgreSQL and Python.
_CLASS_ESCAPES: Final = frozenset("dwsDWS")
#: POSIX classes inside brackets (``[[:alpha:]]``) the compiler can spell out.
POSIX_CLASSES: Final = frozenset({
    "alnum", "alpha", "ascii", "blank", "cntrl", "digit", "graph", "lower", "print", "punct",
    "space", "upper", "word", "xdigit",
})
_REPEAT_RE: Final = re.compile(r"\{(\d*)(,?)(\d*)\}")
_HEX_RE: Final = re.compile(r"\{([0-9A-Fa-f]{1,6})\}|([0-9A-Fa-f]{2})")


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be made to match the same strings in RE2 (the validator),
    PostgreSQL ARE and Python ``re``, or None when it can. Invalid regexes are reported
    as such.

    Accepted: the common syntax of the three engines (literals, ``.``, ``^``/``$``,
    ``[...]`` sets, ``|``, ``(...)`` and ``(?:...)``, ``* + ?`` and lazy forms,
    ``{m}``/``{m,}``/``{m,n}`` up to 255), escaped punctuation, ``\\n \\t \\r \\f \\v \\a``,
    ``\\xHH``/``\\x{H...}``, RE2's ASCII classes ``\\d \\w \\s \\D \\W \\S`` and POSIX classes
    such as ``[[:alpha:]]`` (``features.compile.patterns`` rewrites those for PostgreSQL
    and Python so that all three agree with RE2).

    Refused: lookaround, backreferences, named/atomic groups, comments, conditionals,
    inline flags, possessive quantifiers, ``{,n}``, repetition counts above 255, an
    unescaped ``{`` that starts no repetition, ``\\D \\W \\S`` inside brackets, and
    escapes whose meaning differs (``\\b \\B \\A \\Z \\z``, ``\\1``, ``\\u``, ``\\p``, ``\\_``...).
    """
    scanner = _RegexScanner(pattern)
    problem = scanner.run()
    if problem is None:
        with warnings.catch_warnings():
            # Python warns (FutureWarning) on constructs it may reinterpret later.
            warnings.simplefilter("error")
            try:
                re.compile(scanner.probe())
            except re.error as exc:
                return f"invalid regex: {exc.msg} at position {exc.pos}"
            except Warning as exc:
                problem = str(exc)
    if problem is None:
        # RE2 (the validator) has limits of its own: a repetition count of at most 1000
        # once nested repetitions are multiplied out, and a bounded program size.
        re2 = _re2_problem(pattern)
        if re2 is None:
            return None
        return f"RE2 (the validator) refuses it: {re2}"
    return f"not portable across Python re, RE2 and PostgreSQL: {problem}"


def _re2_problem(pattern: str) -> str | None:
    try:
        pc.match_substring_regex(pa.array([""], pa.string()), f"^(?:{pattern})$")
    except pa.ArrowInvalid as exc:
        return str(exc).removeprefix("Invalid regular expression: ")
    return None


def full_match(pattern: str, value: str) -> bool:
    """Whether ``value`` as a whole matches ``pattern`` the way the validator decides it
    (RE2: linear time, so a pattern such as ``(a+)+`` cannot hang the parser). The
    pattern must have passed :func:`regex_problem`; ``value`` must be UTF-8 encodable."""
    return bool(pc.match_substring_regex(pa.array([value], pa.string()), f"^(?:{pattern})$")[0].as_py())


class _RegexScanner:
    """One pass over a pattern: finds the first non-portable construct and builds a
    *probe*, the pattern with RE2-only spellings (``\\x{41}``, ``[[:alpha:]]``) replaced
    by Python equivalents, so that Python's parser can tell whether it is well formed."""

    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0
        self.out: list[str] = []

    def probe(self) -> str:
        return "".join(self.out)

    def run(self) -> str | None:
        p = self.p
        if "\x00" in p:
            return "a NUL character cannot appear in a PostgreSQL string"
        after_quantifier = False
        while self.i < len(p):
            ch = p[self.i]
            quantifier = False
            if ch == "\\":
                problem = self.escape(in_class=False)
            elif ch == "[":
                problem = self.bracket()
            elif ch == "(" and p.startswith("(?", self.i) and not p.startswith("(?:", self.i):
                problem = _group_problem(p[self.i:])
            elif ch == "{":
                problem, quantifier = self.repeat(), True
            elif ch in "*+?":
                if after_quantifier and ch == "+":
                    return "possessive quantifiers (*+, ++, {m}+) are not supported by RE2 and PostgreSQL"
                # '?' after a quantifier makes it lazy (portable) and ends it.
                quantifier = not (after_quantifier and ch == "?")
                problem = self.take(1)
            else:
                problem = self.take(1)
            if problem is not None:
                return problem
            after_quantifier = quantifier
        return None

    def take(self, n: int) -> str | None:
        """Copy ``n`` characters to the probe; never a problem (returns None)."""
        self.out.append(self.p[self.i:self.i + n])
        self.i += n
        return None

    def escape(self, *, in_class: bool) -> str | None:
        p = self.p
        if self.i + 1 == len(p):
            return "the pattern ends with a lone backslash"
        c = p[self.i + 1]
        if c == "x":
            m = _HEX_RE.match(p, self.i + 2)
            code = None if m is None else int(m[1] or m[2], 16)
            if m is None or code is None or not 0 < code <= 0x10FFFF:
                return "malformed \\x escape (write \\xHH or \\x{H...}, not NUL)"
            self.out.append(re.escape(chr(code)))
            self.i = m.end()
            return None
        if c in _CLASS_ESCAPES and in_class and c.isupper():
            return f"\\{c} inside a bracket expression is not portable; write [^...] instead"
        if c in _CLASS_ESCAPES or c in _SAME_ESCAPES or not (c.isalnum() or c == "_"):
            return self.take(2)
        if c.isdigit():
            return f"backreferences (\\{c}) are not supported by RE2"
        return _ESCAPE_PROBLEMS.get(c, f"the escape \\{c} differs between engines")

    def bracket(self) -> str | None:
        p = self.p
        self.take(1)
        if self.i < len(p) and p[self.i] == "^":
            self.take(1)
        first = True
        while self.i < len(p):
            c = p[self.i]
            if c == "]" and not first:
                self.take(1)
                return None
            if c == "]":  # a ']' first in the set is a literal in every engine
                self.out.append("\\]")
                self.i += 1
            elif c == "\\":
                problem = self.escape(in_class=True)
                if problem is not None:
                    return problem
            elif c == "[" and self.i + 1 < len(p) and p[self.i + 1] in ":.=":
                if p[self.i + 1] != ":":
                    return "collating elements and equivalence classes ([. .] / [= =]) are not portable"
                end = p.find(":]", self.i + 2)
                if end == -1:
                    return "unterminated POSIX class: write [[:alpha:]]"
                name = p[self.i + 2:end]
                if name not in POSIX_CLASSES:
                    known = ", ".join(sorted(POSIX_CLASSES))
                    return f"POSIX class [:{name}:] is not supported (known: {known})"
                self.out.append("a")  # stands in for the class in the probe
                self.i = end + 2
            elif c in "[&~|":  # Python warns on these in sets (future set operations)
                self.out.append("\\" + c)
                self.i += 1
            else:
                self.take(1)
            first = False
        return None  # unterminated: Python's parser reports it

    def repeat(self) -> str | None:
        m = _REPEAT_RE.match(self.p, self.i)
        if m is None or (m[1] == "" and m[3] == ""):
            return "a literal '{' must be escaped as \\{"
        if m[1] == "":
            return f"{{,{m[3]}}} is not supported by RE2 and PostgreSQL; write {{0,{m[3]}}}"
        # a count of thousands of digits: int() refuses it, and it is over the limit anyway
        counts = [int(c) if len(c.lstrip("0")) <= 9 else 10**9 for c in (m[1], m[3]) if c]
        if max(counts) > _MAX_REPEAT:
            shown = str(max(counts)) if max(counts) < 10**9 else "of more than 9 digits"
            return f"repetition count {shown} is above PostgreSQL's limit of {_MAX_REPEAT}"
        self.take(m.end() - self.i)
        return None


def _group_problem(rest: str) -> str:
    if rest.startswith(("(?=", "(?!")):
        return "lookahead (?=...) / (?!...) is not supported by RE2"
    if rest.startswith(("(?<=", "(?<!")):
        return "lookbehind (?<=...) / (?<!...) is not supported by RE2"
    if rest.startswith("(?P="):
        return "backreferences (?P=name) are not supported by RE2"
    if rest.startswith(("(?P<", "(?<", "(?'")):
        return "named groups are not portable; use (?:...)"
    if rest.startswith("(?>"):
        return "atomic groups (?>...) are not supported by RE2 and PostgreSQL"
    if rest.startswith("(?#"):
        return "regex comments (?#...) are not portable"
    if rest.startswith("(?("):
        return "conditional groups are not supported by RE2 and PostgreSQL"
    return "inline flags such as (?i) are not portable"


# --------------------------------------------------------------------------- types


def parse_type(text: str) -> tuple[FieldType | None, str | None]:
    """``decimal(18,2)`` -> FieldType, or (None, reason)."""
    m = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*$", text)
    if m is None:
        return None, f"malformed type '{text}' (expected e.g. int32, decimal(18,2), timestamp(us, UTC))"
    base, raw_args = m[1], m[2]
    kinds = [k.value for k in TypeKind]
    if base not in kinds:
        return None, f"unknown type '{base}'{suggest(base.lower(), kinds)}"
    kind = TypeKind(base)
    if kind is TypeKind.LIST:
        return _parse_list(text, raw_args)
    args = [] if raw_args is None else [a.strip() for a in raw_args.split(",")]
    if kind is TypeKind.DECIMAL:
        if len(args) != 2 or not all(re.fullmatch(r"-?[0-9]+", a) for a in args):
            return None, f"malformed decimal type '{text}': write decimal(precision,scale) like decimal(18,2)"
        # int() of thousands of digits is refused (or slow): such numbers are out of range anyway
        p, s = (int(a) if len(a) <= 9 else 10**9 for a in args)
        if not 1 <= p <= _MAX_DECIMAL_PRECISION:
            return None, f"decimal precision {args[0]} is out of range 1..{_MAX_DECIMAL_PRECISION}"
        if not 0 <= s <= p:
            return None, f"decimal scale {args[1]} must be between 0 and the precision {p}"
        return FieldType(kind, precision=p, scale=s), None
    if kind is TypeKind.TIMESTAMP:
        if not 1 <= len(args) <= 2 or not args[0]:
            return None, f"malformed timestamp type '{text}': write timestamp(us) or timestamp(us, UTC)"
        unit = args[0]
        if unit == "ns":
            return None, "timestamp unit ns is not supported (PostgreSQL keeps microseconds); use s, ms or us"
        if unit not in _TIMESTAMP_UNITS:
            return None, f"unknown timestamp unit '{unit}' (expected s, ms or us)"
        tz = args[1] if len(args) == 2 else None
        if tz is not None:
            try:
                ZoneInfo(tz)
            except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a directory, a name too long
                return None, f"unknown time zone '{tz}'"
        return FieldType(kind, unit=unit, tz=tz), None  # type: ignore[arg-type]
    if raw_args is not None:
        return None, f"type {base} takes no arguments"
    return FieldType(kind), None


_LIST_FORM = "write list(<element>, <length>) or list(<element>, max=<n>), e.g. list(float32, 384)"


def _parse_list(text: str, raw_args: str | None) -> tuple[FieldType | None, str | None]:
    """``list(float32, 384)``, ``list(int64, max=10)``, either with ``, nullable=true``."""
    elements = ", ".join(sorted(k.value for k in LIST_ELEMENT_KINDS))
    if raw_args is None:
        return None, f"malformed list type '{text}': {_LIST_FORM}"
    if "(" in raw_args or ")" in raw_args:
        if raw_args.strip().startswith("list"):
            return None, f"nested lists are not supported ('{text}'): a list's elements are one of {elements}"
        return None, f"list elements must be one of {elements} ('{text}')"
    args = [a.strip() for a in raw_args.split(",")]
    if not 2 <= len(args) <= 3:
        return None, f"malformed list type '{text}': {_LIST_FORM}"
    element = args[0]
    if element == "list":
        return None, f"nested lists are not supported ('{text}'): a list's elements are one of {elements}"
    if element not in {k.value for k in LIST_ELEMENT_KINDS}:
        return None, f"unknown list element type '{element}' (expected one of {elements})"
    size = args[1].replace(" ", "")
    bounded = size.startswith("max=")
    digits = size.removeprefix("max=")
    if not re.fullmatch(r"-?[0-9]+", digits):
        return None, f"malformed list length '{args[1]}' in '{text}': {_LIST_FORM}"
    n = int(digits) if len(digits) <= 9 else 10**9
    if not 1 <= n <= LIST_MAX_LENGTH:
        what = "maximum length" if bounded else "length"
        return None, f"list {what} {digits} is out of range 1..{LIST_MAX_LENGTH}"
    nullable = False
    if len(args) == 3:
        flag = args[2].replace(" ", "")
        if flag not in ("nullable=true", "nullable=false"):
            return None, f"malformed list option '{args[2]}' in '{text}': the only option is nullable=true"
        nullable = flag == "nullable=true"
    items = ListItems(FieldType(TypeKind(element)), length=None if bounded else n,
                      max_length=n if bounded else None, nullable=nullable)
    return FieldType(TypeKind.LIST, items=items), None


def duration_seconds(text: str) -> int | None:
    """``7d``, ``12h``, ``30m``, ``45s`` or a combination in that order (``1d12h``) ->
    seconds; None when ``text`` is not such a duration. A part with more than 15
    digits gives ``MAX_DURATION_S + 1`` (over the limit; never converted)."""
    m = _DURATION_RE.match(text)
    if m is None or not any(m.groups()):
        return None
    if any(len((g or "").lstrip("0")) > 15 for g in m.groups()):
        return MAX_DURATION_S + 1
    d, h, mi, s = (int(g or 0) for g in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def duration_text(seconds: int) -> str:
    """Seconds as the schema writes a duration, the inverse of :func:`duration_seconds`:
    ``7776000`` -> ``90d``, ``5400`` -> ``1h30m``, ``0`` -> ``0s``."""
    if seconds <= 0:
        return f"{seconds}s"
    out = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        n, seconds = divmod(seconds, size)
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)


def reserved_name_problem(name: str) -> str | None:
    """Why ``name`` may not be a schema's name because featureline derives its own
    tables or keys with that name (see :data:`RESERVED_SUFFIXES`, :data:`RESERVED_PREFIXES`),
    or None. The problem names the reserved part."""
    for prefix in RESERVED_PREFIXES:
        if name.startswith(prefix):
            return f"names starting with '{prefix}' are reserved for featureline's own tables"
    for suffix in RESERVED_SUFFIXES:
        if name.endswith(suffix):
            return (f"names ending with '{suffix}' are reserved: featureline derives '{name}' "
                    f"from the schema '{name.removesuffix(suffix)}' (a table or Redis key of its own)")
    return None
