"""Kafka record values -> one Arrow table per micro-batch, in C++ (the stream's fast path).

:func:`features.sources.records.decode` reads one record at a time (``json.loads``) into
a batch that keeps each value's JSON kind (a column of JSON texts where kinds mix or a
key is absent, :mod:`features.validation.values`), which the validator converts value by
value by Python type. That costs
about 20 µs per record. :class:`ColumnarDecoder` instead joins a micro-batch's values
into newline-delimited JSON and reads them with Arrow's JSON reader, with an explicit
type per declared field (its *read type*), into one table the validator checks like a
Parquet batch: about 2 µs per record.

The fast path must give exactly what the per-record path gives, so it takes only the
records it can read with the same meaning, and hands every other one to the
per-record path (``slow``), which then decides as it always did:

- **Before reading** (vectorised checks over the batch): a tombstone, an empty value,
  one over ``payload.max_bytes``, invalid UTF-8 (Arrow's reader would take it in a
  field it ignores), a value that does not start with ``{`` and end with ``}`` (arrays,
  scalars, truncated text, whitespace around it), a line break in it (NDJSON would cut
  it), a ``\\uD800``-``\\uDFFF`` escape (``json.loads`` takes lone surrogates, Arrow
  does not), a ``NaN``/``Inf`` token (Arrow also takes ``-NaN`` and ``Inf``, which
  ``json.loads`` refuses), a ``}`` followed by ``{`` (several objects in one value), an
  integer longer than Python's digit limit (``sys.get_int_max_str_digits()``, which
  ``json.loads`` refuses), and more than :data:`MAX_BRACKETS` brackets (``json.loads``
  stops at Python's recursion limit; Arrow reads any depth).
- **While reading**: a record Arrow refuses (not JSON, a duplicate key, a value of
  another JSON kind than its field's read type, a number beyond float64) is found by
  the row in Arrow's message, or by halving the records when the message names none,
  and goes to the per-record path; the rest is read again. A micro-batch that needs
  more than :data:`MAX_READS` reads sends what is left to the per-record path.
  A record that Arrow reads as more than one row (``{...} {...}``) is found the same way.
- **After reading**: a null in a ``required`` field without a default (``json.loads``
  tells an absent key, a ``missing`` reject, from an explicit null; Arrow does not);
  in a field read as float64, an integral value of magnitude >= 2**53 (the JSON token
  may have been an integer that float64 cannot hold exactly) and, for float fields,
  a negative zero (the token may have been the integer ``-0``).

And the caller (``features.sources.micro_batch.decode_micro_batch``) sends through the per-record
path the records whose ``type`` failure on the fast path shows a value as read in a field
read as float64 (``100.0``, where ``json.loads`` may have read the integer ``100``).
Every other reject's message shows the converted value, which both paths hold equal, and
the raw payload of a fast-path reject is rendered from ``json.loads`` as before.

Numbers: an integer field is read as int64 (as ``json.loads`` + Arrow would type JSON
integers), switching to float64 for the rest of the stream when a micro-batch holds a
JSON number with a fraction or exponent in it: an integer token below 2**53 is exact in
float64, larger ones are caught above, and the validator's float -> int rule is the
one the per-record path applies to ``json.loads``' floats. A float field is read as
float64. A decimal field is read as text when it ``accept_strings`` (producers send
``"12.50"``) and as float64 otherwise (``json.loads`` gives a float, or an int the
guards above keep exact); the first record of a micro-batch holding a value of the
other kind (the records before it hold null there) switches the read type for the rest
of the stream. Dates and timestamps are text
(JSON has no date type). A list field is a JSON array read as ``list<int64>`` (integer
elements) or ``list<float64>`` (float elements; a record with an integral element of
magnitude >= 2**53 or a negative zero goes to the per-record path, as for a float field).

Fields the schema does not know are not read (Arrow ignores them, so a key costs no
column). ``unknown_fields`` counts, per unknown key, the records in which it holds a
value (not null), as the per-record path does: one Arrow regex match over the records'
text (:func:`other_key`: a key token whose name is none of the schema's; a key of a
nested object or one written with escapes matches too, so this may over-find, never
under-find) finds the records that may hold one; only those are read again with
``json.loads`` for their keys, into a bounded :class:`~features.sources.records.TopCounter`.

Keys are the input's: a field with ``source: depDelay`` is read from the key
``depDelay`` and the table's column keeps that name (the caller renames it with
:func:`features.sources.names.as_fields`); a key spelled like such a field
(``dep_delay``) is an unknown key.
"""

from __future__ import annotations

import io
import json
import operator
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from features.schema.model import INTEGER_KINDS, Schema, TypeKind
from features.sources.records import TopCounter
from features.validation.masks import valid_mask

Index = npt.NDArray[np.int64]

#: a record with more ``{``/``[`` than this goes to the per-record path (``json.loads``
#: refuses nesting near Python's recursion limit, about 1,000 levels; Arrow reads any depth)
MAX_BRACKETS = 256
#: Arrow reads of one micro-batch (the first, and re-reads after a refusal); then the rest goes per record
MAX_READS = 8
#: what the fast path leaves to ``json.loads``: line breaks, surrogate escapes, NaN/Inf tokens
_HOSTILE = r"[\n\r]|\\u[dD][89a-fA-F]|[:,\[][ \t]*-?(?:NaN|Inf)|\}[ \t]*\{"
_ROW = re.compile(r" in row (\d+)\s*$")
_CHANGED = re.compile(r"Column\(/([^)]*)\) changed from (\w+) to (\w+) in row (\d+)")
_TWO53 = float(2**53)
#: the rest of a JSON string's body (RE2): any characters but ``"`` and ``\``, or escapes
_BODY = r'(?:[^"\\]|\\.)*'

_STRING = pa.string()
_INT = pa.int64()
_FLOAT = pa.float64()
_BOOL = pa.bool_()
_LIST_FLOAT = pa.list_(_FLOAT)
#: JSON kinds in Arrow's messages -> the read type that takes them
_KIND_TYPES = {"string": _STRING, "number": _FLOAT}


@dataclass
class Columnar:
    """One micro-batch, read. ``table``: the records of ``index`` (record positions,
    ascending), one column per declared field in its read type (not yet validated),
    named by the field's JSON key (``Field.input_name``);
    ``slow``: the positions left to the per-record path (ascending);
    ``unknown_rows``: the rows of ``table`` that may hold unknown keys (ascending), and
    ``unknown_values``: their records; ``known``: the JSON keys the schema reads;
    ``reads``: Arrow reads this batch took (1 when nothing was refused)."""

    table: pa.Table
    index: Index
    slow: Index
    unknown_rows: Index = field(default_factory=lambda: np.zeros(0, np.int64))
    unknown_values: list[bytes] = field(default_factory=list)
    known: frozenset[str] = frozenset()
    reads: int = 0

    def unknown_fields(self, rows: Index | None = None) -> TopCounter:
        """Per unknown key, how many of ``rows`` (rows of ``table``; all when None) hold a
        value (bounded: :class:`~features.sources.records.TopCounter`). One ``json.loads``
        per record that may hold one (``unknown_rows``), none for the others."""
        out = TopCounter()
        pick = (np.ones(len(self.unknown_rows), dtype=np.bool_) if rows is None
                else np.isin(self.unknown_rows, rows))
        for i in np.flatnonzero(pick).tolist():
            try:
                obj = json.loads(self.unknown_values[i])
            except ValueError:  # Arrow read it; json.loads' digit limit may refuse it
                continue
            if isinstance(obj, dict):
                out.update(k for k in obj.keys() - self.known if obj[k] is not None)
        return out


class ColumnarDecoder:
    """Reads micro-batches of one schema's JSON records (see the module docstring).
    Keeps the read types it learnt from earlier micro-batches; not thread-safe."""

    def __init__(self, schema: Schema, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        #: the JSON keys read, one per field (everything below is keyed by them)
        self.names = list(schema.input_names)
        self.known = frozenset(self.names)
        #: a key token naming no declared field (RE2, :func:`other_key`)
        self.other_key = other_key(self.known)
        #: JSON key -> field name (the rejects name fields)
        self.field_of = {f.input_name: f.name for f in schema.fields}
        self.types: dict[str, pa.DataType] = {}
        self.alternatives: dict[str, frozenset[pa.DataType]] = {}
        self.required = [f.input_name for f in schema.fields if f.constraints.required]
        self.float_fields = [f.input_name for f in schema.fields if f.type.kind in (TypeKind.FLOAT32,
                                                                                    TypeKind.FLOAT64)]
        for f in schema.fields:
            kind = f.type.kind
            if f.type.items is not None:  # a JSON array: ints read as int64, floats as float64
                element = _INT if f.type.items.element.kind in INTEGER_KINDS else _FLOAT
                self.types[f.input_name] = pa.list_(element)
                self.alternatives[f.input_name] = frozenset({pa.list_(element)})
                continue
            if kind in INTEGER_KINDS:
                first, alts = _INT, {_INT, _FLOAT} | ({_STRING} if f.accept_strings else set())
            elif kind in (TypeKind.FLOAT32, TypeKind.FLOAT64):
                first, alts = _FLOAT, {_FLOAT} | ({_STRING} if f.accept_strings else set())
            elif kind is TypeKind.DECIMAL:
                first = _STRING if f.accept_strings else _FLOAT
                alts = {_FLOAT} | ({_STRING} if f.accept_strings else set())
            elif kind is TypeKind.BOOL:
                first, alts = _BOOL, {_BOOL}
            else:  # string, enum; date and timestamp are ISO text in JSON
                first, alts = _STRING, {_STRING}
            self.types[f.input_name] = first
            self.alternatives[f.input_name] = frozenset(alts)

    def float_read(self) -> frozenset[str]:
        """The fields (their names, as the rejects give them) read as float64 now."""
        return frozenset(self.field_of[n] for n, t in self.types.items() if t == _FLOAT)

    def read_schema(self) -> pa.Schema:
        return pa.schema([pa.field(n, self.types[n]) for n in self.names])

    # --------------------------------------------------------------------------- entry

    def decode(self, values: Sequence[bytes | None]) -> Columnar:
        n = len(values)
        arr = pa.array(values, pa.binary())
        ok = _valid(arr)
        if n:
            lengths = np.asarray(pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False))
            ok &= (lengths > 0) & (lengths <= self.max_bytes)
        candidates = np.flatnonzero(ok).astype(np.int64)
        if len(candidates) < n:
            arr = arr.take(pa.array(candidates))
        texts, keep = _utf8(arr)
        if not keep.all():
            candidates = candidates[keep]
        if len(candidates):
            records = _gather(values, candidates)
            blob = b"".join(records)
            shape = _np_bool(pc.starts_with(texts, "{")) & _np_bool(pc.ends_with(texts, "}"))
            shape &= ~_hostile(texts, records, blob)
            shape &= ~_deep(texts, blob)
            if not shape.all():
                candidates = candidates[shape]
        out = Columnar(self.read_schema().empty_table(), np.zeros(0, np.int64), np.zeros(0, np.int64))
        tables: list[tuple[Index, pa.Table]] = []
        self._read(values, candidates, tables, out)
        if tables:
            tables.sort(key=lambda t: int(t[0][0]))
            index = np.concatenate([i for i, _ in tables])
            table = _concat([t for _, t in tables], self.known)
            table, index = self._after(table, index)
            out.table, out.index = table.select(self.names), index
            out.known = self.known
            records = _gather(values, index)
            text = pa.array(records, pa.binary()).cast(pa.string())
            out.unknown_rows = np.flatnonzero(_np_bool(pc.match_substring_regex(text, self.other_key)))
            out.unknown_values = [records[i] for i in out.unknown_rows.tolist()]
        fast = np.zeros(n, dtype=np.bool_)
        fast[out.index] = True
        out.slow = np.flatnonzero(~fast).astype(np.int64)
        return out

    # --------------------------------------------------------------------------- reading

    def _read(self, values: Sequence[bytes | None], index: Index, tables: list[tuple[Index, pa.Table]],
              out: Columnar) -> None:
        """Read the records ``index`` of ``values`` into ``tables``; what Arrow refuses is
        split off and left out (the per-record path takes every record no table holds; see
        the module docstring). An explicit stack, not recursion: a batch may be large."""
        todo = [index]
        while todo:
            idx = todo.pop()
            if len(idx) == 0:
                continue
            if out.reads >= MAX_READS:
                continue
            out.reads += 1
            try:
                table = self._parse(b"\n".join(_gather(values, idx)))
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
                message = str(exc)
                # Read types change only before the batch's first table (all tables of a batch
                # share them), on what the batch's first record holding a value shows.
                if not tables and idx[0] == index[0]:
                    change = self._learn(message)
                    if change is not None:
                        if self._first_value(values, idx, message, change, tables):
                            self._apply(change)
                            todo.append(idx)
                            continue
                        if tables:  # the records before the refused one, read already
                            todo.append(idx[len(tables[0][0]) + 1:])
                            continue
                row = _ROW.search(message)
                if row is not None and int(row.group(1)) < len(idx):
                    r = int(row.group(1))
                    todo += [idx[r + 1:], idx[:r]]
                elif len(idx) > 1:
                    todo += [idx[len(idx) // 2:], idx[:len(idx) // 2]]
                continue
            if table.num_rows != len(idx):  # a value held several JSON objects
                if len(idx) > 1:
                    todo += [idx[len(idx) // 2:], idx[:len(idx) // 2]]
                continue
            tables.append((idx, table))

    def _parse(self, blob: bytes) -> pa.Table:
        options = pa_json.ParseOptions(explicit_schema=self.read_schema(), unexpected_field_behavior="ignore")
        read = pa_json.ReadOptions(use_threads=False, block_size=max(len(blob) + 1, 1 << 16))
        return pa_json.read_json(io.BytesIO(blob), read_options=read, parse_options=options)

    def _learn(self, message: str) -> tuple[str, pa.DataType] | None:
        """The read type change Arrow's refusal suggests, when the other type is one the
        field takes (:meth:`__init__`): ``("*int", float64)`` for every integer field, or
        ``(field, type)``; None when there is none."""
        if "Failed to convert JSON to int64" in message:
            if any(t == _INT and _FLOAT in self.alternatives[n] for n, t in self.types.items()):
                return ("*int", _FLOAT)
            return None
        m = _CHANGED.search(message)
        if m is None:
            return None
        name, kind = m.group(1), m.group(3)
        new = _KIND_TYPES.get(kind)
        if name not in self.known or new is None or new not in self.alternatives[name]:
            return None
        if self.types[name] == new or (new == _FLOAT and self.types[name] == _INT):
            return None
        return (name, new)

    def _first_value(self, values: Sequence[bytes | None], idx: Index, message: str,
                     change: tuple[str, pa.DataType], tables: list[tuple[Index, pa.Table]]) -> bool:
        """Whether the refused record is the first of the batch with a value in the field
        (the records before it hold null there or lack it). When it is not, the records
        before it, read with the current types, are appended to ``tables``."""
        name = change[0]
        m = _CHANGED.search(message)
        r = int(m.group(4)) if m is not None else 0
        if name == "*int" or r == 0:
            return True
        try:
            before = self._parse(b"\n".join(_gather(values, idx[:r])))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            return False
        if before.num_rows != r:
            return False
        if before.column(name).null_count == r:
            return True
        tables.append((idx[:r], before))
        return False

    def _apply(self, change: tuple[str, pa.DataType]) -> None:
        name, new = change
        if name == "*int":
            for n, t in self.types.items():
                if t == _INT and _FLOAT in self.alternatives[n]:
                    self.types[n] = _FLOAT
        else:
            self.types[name] = new

    def _after(self, table: pa.Table, index: Index) -> tuple[pa.Table, Index]:
        """Rows that only the per-record path reads exactly (module docstring, "After
        reading") leave the table (the per-record path takes them): (table, index)."""
        bad = np.zeros(len(index), dtype=np.bool_)
        for name in self.required:
            col = table.column(name)
            if col.null_count:
                bad |= ~_valid(col)
        for name in self.names:
            if self.types[name] == _LIST_FLOAT:
                bad |= _inexact_elements(table.column(name).combine_chunks())
            if self.types[name] != _FLOAT:
                continue
            col = table.column(name)
            v = np.asarray(pc.fill_null(col, 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
            with np.errstate(invalid="ignore"):
                bad |= (np.abs(v) >= _TWO53) & (np.trunc(v) == v)
            if name in self.float_fields:
                bad |= (v == 0.0) & np.signbit(v)
        if not bad.any():
            return table, index
        return table.filter(pa.array(~bad)), index[~bad]



def _inexact_elements(col: pa.Array) -> npt.NDArray[np.bool_]:
    """Rows of a list of floats read as float64 holding an element the JSON token may
    have written otherwise (an integer >= 2**53, the integer ``-0``): the per-record path
    reads them exactly, as for a float field."""
    elements = col.flatten()
    if not len(elements):
        return np.zeros(len(col), dtype=np.bool_)
    v = np.asarray(pc.fill_null(elements, 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        odd = ((np.abs(v) >= _TWO53) & (np.trunc(v) == v)) | ((v == 0.0) & np.signbit(v))
    lengths = np.asarray(pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False))
    lengths = np.where(_valid(col), lengths, 0)
    bad = np.zeros(len(col), dtype=np.bool_)
    bad[np.repeat(np.arange(len(col)), lengths)[odd]] = True
    return bad


def _valid(arr: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    return valid_mask(arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr)


def _np_bool(arr: pa.Array) -> npt.NDArray[np.bool_]:
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=np.bool_)


def other_key(names: frozenset[str]) -> str:
    """An RE2 pattern matching an object key token (after ``{`` or ``,``, a JSON string,
    then ``:``) whose string is none of ``names``: the complement of the names' trie, so
    one pass finds a record's unknown keys without counting the known ones. A key
    written with an escape (``"a\\u0062"``) matches whatever it decodes to."""
    trie: dict[str, Any] = {}
    for name in names:
        node = trie
        for c in name:
            node = node.setdefault(c, {})
        node[""] = {}  # a name ends here

    def rest(node: dict[str, Any]) -> str:
        kids = sorted(c for c in node if c)
        alts = [] if "" in node else [""]  # the string ends before any name does
        alts.append('[^"\\\\' + "".join(map(_char, kids)) + "]" + _BODY)  # leaves the trie
        alts.append(r"\\." + _BODY)
        alts += [_char(c) + rest(node[c]) for c in kids]
        return "(?:" + "|".join(alts) + ")"

    return r'[{,]\s*"' + rest(trie) + r'"\s*:'


def _char(c: str) -> str:
    """``c`` in an RE2 pattern, also inside a class (``\\x{..}``)."""
    return f"\\x{{{ord(c):x}}}"


def _gather(values: Sequence[bytes | None], index: Index) -> list[bytes]:
    """``values[i]`` for each ``i`` of ``index`` (C-level: ``operator.itemgetter``)."""
    if len(index) == 0:
        return []
    if len(index) == 1:
        return [values[int(index[0])]]  # type: ignore[list-item]
    return list(operator.itemgetter(*index.tolist())(values))


def _utf8(arr: pa.Array) -> tuple[pa.Array, npt.NDArray[np.bool_]]:
    """``arr`` (binary) as text, and which values are UTF-8 (the others are left out of the
    text). One C++ check for the whole batch; when it fails, halving finds each bad value
    (about 2 log2(n) more checks per bad value)."""
    keep = np.ones(len(arr), dtype=np.bool_)
    try:
        return arr.cast(pa.string()), keep
    except pa.ArrowInvalid:
        pass
    todo = [(0, len(arr))]
    while todo:
        start, stop = todo.pop()
        if stop - start == 1:
            keep[start] = False
            continue
        mid = (start + stop) // 2
        for lo, hi in ((start, mid), (mid, stop)):
            try:
                arr.slice(lo, hi - lo).cast(pa.string())
            except pa.ArrowInvalid:
                todo.append((lo, hi))
    return arr.filter(pa.array(keep)).cast(pa.string()), keep


def _hostile(texts: pa.Array, records: list[bytes], blob: bytes) -> npt.NDArray[np.bool_]:
    """Records holding what only ``json.loads`` reads right (see ``_HOSTILE``); the
    regular expression runs only when a look at the whole batch (``blob``: ``records``
    joined, memchr speed) finds a hint."""
    if blob.find(b"\n") < 0 and blob.find(b"\r") < 0 and blob.find(b"\\") < 0 and (
            blob.find(b"N") < 0 or b"NaN" not in blob) and (blob.find(b"I") < 0 or b"Inf" not in blob) and (
            b"}{" not in blob and b"} " not in blob and b"}\t" not in blob):
        hostile = np.zeros(len(texts), dtype=np.bool_)
    else:
        hostile = _np_bool(pc.match_substring_regex(texts, _HOSTILE))
    limit = sys.get_int_max_str_digits()
    if limit:  # json.loads refuses longer integers; Arrow reads them (only long records can hold one)
        digits = re.compile(rb"[0-9]{%d}" % (limit + 1))
        for i in np.flatnonzero(np.fromiter(map(len, records), np.int64, len(records)) > limit).tolist():
            if digits.search(records[i]):  # a loop over records longer than the limit only
                hostile[i] = True
    return hostile


def _deep(texts: pa.Array, blob: bytes) -> npt.NDArray[np.bool_]:
    """Records with more than :data:`MAX_BRACKETS` brackets (counted per record only when
    the whole batch, ``blob``, has more than that many brackets beyond one per record)."""
    brackets = blob.count(b"{") + (blob.count(b"[") if blob.find(b"[") >= 0 else 0)
    if brackets <= len(texts) + MAX_BRACKETS:
        return np.zeros(len(texts), dtype=np.bool_)
    counts = pc.count_substring_regex(texts, r"[\[{]")
    return np.asarray(counts.to_numpy(zero_copy_only=False)) > MAX_BRACKETS


def _concat(tables: list[pa.Table], known: frozenset[str]) -> pa.Table:
    """Tables of one read (same known columns; unknown columns may differ) as one."""
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # unknown columns of clashing types: keep the known columns and each unknown
        # column's count of values as a column of booleans
        unified: list[pa.Table] = []
        for t in tables:
            cols = {name: (t.column(name) if name in known else pc.is_valid(t.column(name)))
                    for name in t.column_names}
            unified.append(pa.table(cols))
        merged = pa.concat_tables(unified, promote_options="permissive")
        return pa.table({name: (merged.column(name) if name in known else
                                pc.if_else(pc.fill_null(merged.column(name), False), True, None))
                         for name in merged.column_names})


__all__ = ["MAX_BRACKETS", "MAX_READS", "Columnar", "ColumnarDecoder"]
