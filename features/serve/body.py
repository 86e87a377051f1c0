"""A request body -> the exact bytes of each record it holds.

Three shapes (``docs/ingest.md``):

- **NDJSON** (Content-Type ``application/x-ndjson``, ``application/ndjson`` or
  ``application/jsonl``): lines end at ``\n`` only (a ``\r`` before it is JSON
  whitespace), and each line that is not blank (blank: JSON whitespace only, space, tab,
  ``\r``) is one record, its bytes exactly as sent (a line that is not JSON, or not UTF-8,
  such as a lone vertical tab or form feed, is a record the decoder rejects, as the
  stream would);
- **a JSON object**: the body (without surrounding whitespace) is one record;
- **a JSON array**: each element is one record, its exact source text (found by walking
  the array with ``json.JSONDecoder.raw_decode``), so numbers reach Kafka byte for byte as
  sent, never re-serialised through a float. An element that is not an object is a
  record the decoder rejects.

Anything else (a body that is not UTF-8 or does not parse as JSON, or a top-level value
that is neither an object nor an array) raises :class:`BadBody`: the request is refused
whole (HTTP 400) and no record of it is read. A body of more than ``max_records`` records
raises :class:`TooManyRecords` (HTTP 413) as soon as the record past the limit is found:
no list of more than ``max_records + 1`` records is ever built.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

#: Content types whose body is newline-delimited JSON (compared without parameters).
NDJSON_TYPES = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl"})

_WS = " \t\n\r"
#: An NDJSON record: a whole line (up to the ``\n`` that ends it) holding something other
#: than JSON whitespace (space, tab, ``\r``). Not ``bytes.strip()``'s blank, which also
#: takes ``\x0b`` and ``\x0c``: a line of those is a record the decoder rejects. Anchored
#: at a line's start (``^``), so that a long blank line is scanned once, not once per byte.
_RECORD_LINE = re.compile(rb"^[ \t\r]*[^ \t\r\n][^\n]*", re.MULTILINE)
_DECODER = json.JSONDecoder()


class BadBody(ValueError):
    """The body is not one of the accepted shapes; ``str()`` says why (shown to the client)."""


class TooManyRecords(BadBody):
    """The body holds more than ``limit`` records (HTTP 413); none of it is read further."""

    def __init__(self, limit: int, what: str = "records", flag: str = "--max-records") -> None:
        super().__init__(f"the body holds more than {limit:,} {what}, the limit per request "
                         f"({flag}); split it into several requests")
        self.limit = limit


def is_ndjson(content_type: str | None) -> bool:
    """Whether a Content-Type header value names NDJSON (``; charset=...`` ignored)."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() in NDJSON_TYPES


def split_ndjson(body: bytes, max_records: int | None = None) -> list[bytes]:
    """Every non-blank line of ``body``, as sent (a trailing ``\\r`` stays: JSON whitespace).
    TooManyRecords past ``max_records`` (None: no limit), found by one regular-expression
    scan in C: a body of millions of blank lines costs no Python step per line."""
    lines = (m.group() for m in _RECORD_LINE.finditer(body))
    if max_records is None:
        return list(lines)
    out = list(itertools.islice(lines, max_records + 1))
    if len(out) > max_records:
        raise TooManyRecords(max_records)
    return out


def split_json(body: bytes, max_records: int | None = None) -> list[bytes]:
    """The records of a JSON body (an object: itself; an array: its elements' source text).

    Raises BadBody for a body that is not UTF-8, not JSON, or whose top-level value is
    neither an object nor an array, TooManyRecords for an array of more than
    ``max_records`` elements (None: no limit). An object too deeply nested for Python's
    parser is still one record (the decoder rejects it, as the stream would); inside an
    array such an element cannot be delimited, so the body is refused.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadBody(f"the body is not UTF-8 (byte {exc.start})") from None
    start = len(text) - len(text.lstrip(_WS))
    stripped = text.strip(_WS)
    if not stripped:
        raise BadBody("the body is empty; send a JSON object, a JSON array of objects, or NDJSON")
    if stripped[0] == "{":
        try:
            _DECODER.decode(stripped)
        except RecursionError:
            pass  # valid or not, the decoder rejects it as nested too deeply
        except ValueError as exc:
            raise BadBody(f"the body is not valid JSON: {exc}") from None
        return [stripped.encode("utf-8")]
    if stripped[0] != "[":
        try:
            value = json.loads(stripped)
        except (ValueError, RecursionError) as exc:
            raise BadBody(f"the body is not valid JSON: {exc}") from None
        raise BadBody(f"the body is a JSON {type(value).__name__}; send a JSON object, a JSON array of "
                      "objects, or NDJSON (Content-Type application/x-ndjson)")
    return _array_elements(text, start, body if body.isascii() else None, max_records)


def _array_elements(text: str, pos: int, ascii_body: bytes | None, max_records: int | None) -> list[bytes]:
    """The source text of each element of the array starting at ``text[pos]`` (``[``),
    which must be the whole rest of the body (whitespace aside)."""
    out: list[bytes] = []
    n = len(text)
    i = _skip(text, pos + 1)
    if i < n and text[i] == "]":
        i += 1
    else:
        while True:
            if max_records is not None and len(out) == max_records:
                raise TooManyRecords(max_records)
            try:
                _, end = _DECODER.raw_decode(text, i)
            except RecursionError:
                raise BadBody(f"array element {len(out)} is nested too deeply to read") from None
            except ValueError as exc:
                raise BadBody(f"the body is not valid JSON: {exc}") from None
            out.append(ascii_body[i:end] if ascii_body is not None else text[i:end].encode("utf-8"))
            i = _skip(text, end)
            if i < n and text[i] == ",":
                i = _skip(text, i + 1)
                continue
            if i < n and text[i] == "]":
                i += 1
                break
            raise BadBody(f"the body is not valid JSON: expected ',' or ']' at character {i}")
    if _skip(text, i) != n:
        raise BadBody(f"the body is not valid JSON: extra data after the array at character {i}")
    return out


def _skip(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def split_body(body: bytes, content_type: str | None, max_records: int | None = None) -> list[bytes]:
    """The records of ``body`` (see the module docstring); BadBody when it is refused,
    TooManyRecords (a BadBody) when it holds more than ``max_records`` (None: no limit)."""
    if is_ndjson(content_type):
        return split_ndjson(body, max_records)
    return split_json(body, max_records)


# --- the view route's body: {"rows": [...], "lineage": false} --------------------------------

#: ``POST /v1/views/{name}/online``'s ``Content-Type``: JSON (parameters such as
#: ``charset`` aside), ``application/<anything>+json``, or none at all (taken as JSON).
_JSON_TYPE = re.compile(r"^application/(?:[a-z0-9.+-]*\+)?json$")
#: A lone UTF-16 surrogate: JSON's ``\ud800`` escape makes one, and no store can encode it.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: The longest value text, and message, echoed in a 422's errors (the rest is cut, with a
#: mark saying how long it was): a message quotes the value it refuses.
MAX_VALUE_CHARS = 200
MAX_MESSAGE_CHARS = 500


class UnsupportedType(BadBody):
    """The request's Content-Type is not JSON (HTTP 415)."""


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type header value names JSON (a missing one counts as JSON)."""
    if not content_type:
        return True
    return _JSON_TYPE.match(content_type.split(";", 1)[0].strip().lower()) is not None


@dataclass(frozen=True)
class ViewRequest:
    """A view request's body, read: its rows (dicts as JSON gives them), ``lineage``,
    ``windows`` (checked by the read; None: absent, the SDK's default, ``"request_time"``)
    and ``at`` (the request time, parsed)."""

    rows: list[dict[str, Any]]
    lineage: bool
    windows: str | None = None
    at: dt.datetime | None = None


def read_view_request(body: bytes, content_type: str | None, max_rows: int) -> ViewRequest:
    """``{"rows": [{...}, ...], "lineage": false, "windows": "request_time", "at": null}``
    -> :class:`ViewRequest` (``windows``: ``"request_time"``, the default when absent, or
    ``"event"``, checked by the read; ``at``: an ISO 8601 time, the request time of
    ``"request_time"``).

    Raises UnsupportedType for a Content-Type other than JSON, TooManyRecords as soon as
    the body holds more than ``max_rows + 1`` JSON objects (the rows and the body itself:
    counted while parsing, so a body of millions of ``{}`` never becomes millions of
    dicts), BadBody for anything else that is not such an object: not UTF-8, not JSON,
    nested too deeply for the parser, a string holding a lone surrogate (``"\\ud800"``),
    ``rows`` not a list of objects, ``lineage`` not a boolean, ``windows`` not a string,
    ``at`` not an ISO 8601 time. Never another exception.
    """
    if not is_json(content_type):
        raise UnsupportedType(f"Content-Type {content_type!r} is not JSON; send application/json")
    objects = 0

    def counted(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal objects
        objects += 1
        if objects > max_rows + 1:
            raise TooManyRecords(max_rows, "rows", "--max-view-rows")
        return dict(pairs)

    try:
        text = body.decode("utf-8")
        value = json.loads(text, object_pairs_hook=counted)
    except TooManyRecords:
        raise
    except UnicodeDecodeError as exc:
        raise BadBody(f"the body is not UTF-8 (byte {exc.start})") from None
    except RecursionError:
        raise BadBody("the body is nested too deeply to read") from None
    except ValueError as exc:
        raise BadBody(f"the body is not JSON: {exc}") from None
    rows = value.get("rows") if isinstance(value, dict) else None
    if not isinstance(rows, list) or not all(type(r) is dict for r in rows):
        raise BadBody('expected a JSON object {"rows": [{<request key>: <value>, ...}, ...]}')
    lineage = value.get("lineage", False)
    if type(lineage) is not bool:
        raise BadBody(f'"lineage" must be true or false, got {json.dumps(lineage)[:40]}')
    if "\\u" in text and _SURROGATE.search(json.dumps(value, ensure_ascii=False)):
        raise BadBody("a string in the body holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
                      "escape): it is no Unicode text")
    windows = value.get("windows")
    if windows is not None and not isinstance(windows, str):
        raise BadBody(f'"windows" must be "event" or "request_time", got {json.dumps(windows)[:40]}')
    at = value.get("at")
    if at is not None:
        at = _instant(at)
    return ViewRequest(rows, lineage, windows, at)


def _instant(text: Any) -> dt.datetime:
    """``"at"``: an ISO 8601 time (``2026-11-01T12:00:00Z``; without an offset: UTC)."""
    when = None
    if isinstance(text, str):
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            when = None
    if when is None:
        raise BadBody(f'"at" must be an ISO 8601 time such as "2026-11-01T12:00:00Z", '
                      f"got {json.dumps(text)[:40]}")
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def bounded_errors(errors: list[dict[str, Any]], max_errors: int) -> dict[str, Any]:
    """A 422's error list: the first ``max_errors`` errors (in the order given), each
    ``value`` cut to MAX_VALUE_CHARS characters and ``message`` to MAX_MESSAGE_CHARS
    (``...`` and the length marking a cut), with ``errors_total`` (all of them) and
    ``errors_truncated`` (whether some were left out), as the events route answers."""
    out = []
    for e in errors[:max_errors]:
        for key, limit in (("value", MAX_VALUE_CHARS), ("message", MAX_MESSAGE_CHARS)):
            v = e.get(key)
            if isinstance(v, str) and len(v) > limit:
                e = {**e, key: f"{v[:limit]}... ({len(v):,} characters)"}
        out.append(e)
    return {"errors": out, "errors_total": len(errors), "errors_truncated": len(errors) > len(out)}
