"""One portable regex, three engines: RE2 (the validator), PostgreSQL ARE, Python ``re``.

A schema ``pattern`` is written in the portable subset the parser accepts and means
what RE2 says it means: the *whole* string must match, ``.`` does not match a
newline, ``\\d``/``\\w``/``\\s`` are ASCII classes (``\\s`` is ``[\\t\\n\\f\\r ]``,
no vertical tab). The same text does not mean the same thing elsewhere:

- PostgreSQL ARE: ``.`` matches a newline; ``\\d``/``\\w``/``\\s`` follow the
  database locale (``é`` is a word character under ``C.UTF-8``, ``\\v`` a space);
  ``\\x41B`` is one character (hex digits are greedy); repetition counts above 255
  are an error raised at the first INSERT, not at CREATE TABLE.
- Python ``re`` (what Great Expectations' pandas engine runs): ``$`` also matches
  before a final newline; ``\\d``/``\\w``/``\\s`` are Unicode classes;
  ``[[:alpha:]]`` is not a POSIX class but a set of characters (with a warning).

:func:`to_postgres` and :func:`to_python` rewrite a pattern so that each engine
accepts exactly the strings RE2 accepts: classes are spelled out as ASCII ranges,
``.`` becomes ``[^\\n]`` for PostgreSQL, ``$`` becomes ``\\Z`` for Python, hex
escapes become fixed-width ``\\U`` escapes. Constructs that cannot be made to agree
raise :class:`~features.errors.CompileError` (the parser should refuse them first).
Both functions return the pattern *without* the full-match anchors; use
:func:`postgres_full_match` / :func:`python_full_match` for the anchored form.
"""

from __future__ import annotations

from typing import Literal

from features.errors import CompileError

Dialect = Literal["postgres", "python"]

#: PostgreSQL's RE_DUP_MAX: ``{n,m}`` with a bound above this fails at match time.
PG_MAX_REPEAT = 255

# RE2's ASCII classes, as the inside of a bracket expression.
_CLASS_BODY = {
    "d": "0-9",
    "w": "0-9A-Za-z_",
    "s": "\\t\\n\\f\\r ",
}
# RE2's ASCII POSIX classes (``[[:alpha:]]``), as the inside of a bracket expression.
_POSIX_BODY = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\U00000000-\\U0000007F",
    "blank": "\\t ",
    "cntrl": "\\U00000000-\\U0000001F\\U0000007F",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}
# Escapes that mean the same single character in RE2, ARE and Python.
_SAME_ESCAPES = frozenset("ntrfva")
_HEX = frozenset("0123456789abcdefABCDEF")


def _fail(pattern: str, reason: str) -> CompileError:
    return CompileError(f"pattern {pattern!r} cannot be used in every engine: {reason}")


class _Translator:
    def __init__(self, pattern: str, dialect: Dialect) -> None:
        self.p = pattern
        self.dialect = dialect
        self.i = 0
        self.out: list[str] = []

    def run(self) -> str:
        p = self.p
        if "\x00" in p:
            raise _fail(p, "a NUL character cannot appear in a PostgreSQL string")
        while self.i < len(p):
            c = p[self.i]
            if c == "\\":
                self.out.append(self._escape(in_bracket=False))
            elif c == "[":
                self.out.append(self._bracket())
            elif c == ".":
                self.out.append("[^\\n]" if self.dialect == "postgres" else ".")
                self.i += 1
            elif c == "$":
                self.out.append("\\Z" if self.dialect == "python" else "$")
                self.i += 1
            elif c == "(":
                self._group()
            elif c == "{":
                self._repeat()
            else:
                self.out.append(c)
                self.i += 1
        return "".join(self.out)

    def _group(self) -> None:
        p, i = self.p, self.i
        if p.startswith("(?:", i):
            self.out.append("(?:")
            self.i += 3
        elif p.startswith("(?", i):
            raise _fail(p, f"group syntax {p[i:i + 4]!r} (only plain and (?:...) groups are portable)")
        else:
            self.out.append("(")
            self.i += 1

    def _repeat(self) -> None:
        p = self.p
        end = p.find("}", self.i)
        body = p[self.i + 1:end] if end != -1 else ""
        parts = body.split(",")
        if end == -1 or not 1 <= len(parts) <= 2 or not parts[0].isdigit() or not all(
            x.isdigit() or x == "" for x in parts
        ):
            # RE2 and Python read a brace that starts no valid repetition as a literal.
            self.out.append("\\{")
            self.i += 1
            return
        if any(x and (len(x.lstrip("0")) > 9 or int(x) > PG_MAX_REPEAT) for x in parts):
            raise _fail(p, f"repetition {{{body}}} exceeds PostgreSQL's limit of {PG_MAX_REPEAT}")
        self.out.append("{" + body + "}")
        self.i = end + 1

    def _escape(self, *, in_bracket: bool) -> str:
        """Translate the escape at ``self.i`` (a backslash) and advance past it."""
        p = self.p
        if self.i + 1 >= len(p):
            raise _fail(p, "trailing backslash")
        c = p[self.i + 1]
        self.i += 2
        if c in _CLASS_BODY:
            return _CLASS_BODY[c] if in_bracket else f"[{_CLASS_BODY[c]}]"
        if c in "DWS":
            if in_bracket:
                raise _fail(p, f"\\{c} inside a bracket expression")
            return f"[^{_CLASS_BODY[c.lower()]}]"
        if c in _SAME_ESCAPES:
            return "\\" + c
        if c == "x":
            return self._hex()
        if c.isalnum() or c == "_":
            raise _fail(p, f"escape \\{c} (word boundaries, backreferences, Unicode classes, "
                           "anchors and octal escapes differ between engines)")
        if not c.isascii() or not c.isprintable():
            return c
        return "\\" + c

    def _hex(self) -> str:
        p, i = self.p, self.i
        if i < len(p) and p[i] == "{":
            end = p.find("}", i)
            digits = p[i + 1:end] if end != -1 else ""
            self.i = end + 1
        else:
            digits = p[i:i + 2]
            self.i = i + 2
        if not digits or len(digits) > 6 or not set(digits) <= _HEX or int(digits, 16) > 0x10FFFF:
            raise _fail(p, "malformed \\x escape")
        if int(digits, 16) == 0:
            raise _fail(p, "a NUL character cannot appear in a PostgreSQL string")
        return f"\\U{int(digits, 16):08X}"

    def _bracket(self) -> str:
        p = self.p
        self.i += 1
        parts = ["["]
        if self.i < len(p) and p[self.i] == "^":
            parts.append("^")
            self.i += 1
        first = True
        while True:
            if self.i >= len(p):
                raise _fail(p, "unterminated bracket expression")
            c = p[self.i]
            if c == "]" and not first:
                self.i += 1
                break
            if c == "]":  # a ']' first in the set is a literal in every engine
                parts.append("\\]")
                self.i += 1
            elif c == "\\":
                parts.append(self._escape(in_bracket=True))
            elif c == "[" and p.startswith("[:", self.i):
                end = p.find(":]", self.i + 2)
                name = p[self.i + 2:end] if end != -1 else ""
                negated = name.startswith("^")
                if end == -1 or negated or name not in _POSIX_BODY:
                    raise _fail(p, f"POSIX class [:{name}:] is not supported")
                body = _POSIX_BODY[name]
                if self.dialect == "postgres":  # PostgreSQL strings cannot hold NUL anyway
                    body = body.replace("\\U00000000", "\\U00000001")
                parts.append(body)
                self.i = end + 2
            elif c in "[&~|":
                # Python warns on '[', '&&', '~~', '||' in sets (future set operations).
                parts.append("\\" + c)
                self.i += 1
            else:
                parts.append(c)
                self.i += 1
            first = False
        parts.append("]")
        return "".join(parts)


def to_postgres(pattern: str) -> str:
    """``pattern`` rewritten for PostgreSQL ARE, same language as RE2. Unanchored."""
    return _Translator(pattern, "postgres").run()


def to_python(pattern: str) -> str:
    """``pattern`` rewritten for Python ``re``, same language as RE2. Unanchored."""
    return _Translator(pattern, "python").run()


def postgres_full_match(pattern: str) -> str:
    """The ARE regex for ``col ~ '...'`` that accepts exactly RE2's full matches."""
    return f"^(?:{to_postgres(pattern)})$"


def python_full_match(pattern: str) -> str:
    """The Python regex for ``re.search`` that accepts exactly RE2's full matches."""
    return f"^(?:{to_python(pattern)})\\Z"
