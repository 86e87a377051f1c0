"""List values as text, and back, with Arrow string kernels (no Python loop per row).

Two spellings of one format, the elements' shortest round-trip text joined by ``,``:

- **Redis** (encoding v1, ``docs/redis.md``): the JSON array ``[0.5,-0,1e-45,3.4e+38]``,
  a null element ``null`` (only in a ``nullable=true`` list), ``[]`` the empty list;
- **PostgreSQL** array literal (``COPY`` in and out, CSV): ``{0.5,-0,1e-45}``, a null
  element ``NULL``.

Integers are decimal; floats the shortest text that parses back to the same float32 or
float64 (negative zero ``-0`` kept); NaN and infinities never occur (the validator
refuses them). Parsing is exact for the same reason: Arrow's string -> float parse
is correctly rounded, so every text written here reads back bit for bit.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: (open, close, null element) of each spelling
JSON = ("[", "]", "null")
POSTGRES = ("{", "}", "NULL")


def list_text(arr: pa.Array, spelling: tuple[str, str, str] = JSON) -> pa.Array:
    """List values (``list``, ``large_list``, ``fixed_size_list`` of numbers) -> text;
    a null list stays null."""
    open_, close, null = spelling
    lst = arr if pa.types.is_list(arr.type) else arr.cast(pa.list_(arr.type.value_type))
    lst = lst if lst.offset == 0 else pa.concat_arrays([lst])
    elements = pc.fill_null(pc.cast(lst.flatten(), pa.string()), null)
    lengths = np.asarray(pc.fill_null(pc.list_value_length(lst), 0).to_numpy(zero_copy_only=False))
    if lst.null_count:
        lengths = np.where(np.asarray(lst.is_valid()), lengths, 0)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    texts = pa.ListArray.from_arrays(offsets, elements, mask=pc.is_null(lst) if lst.null_count else None)
    return pc.binary_join_element_wise(open_, pc.binary_join(texts, ","), close, "")


def parse_list_text(text: pa.Array, target: pa.DataType, spelling: tuple[str, str, str] = JSON) -> pa.Array:
    """Text written by :func:`list_text` -> ``target`` (a list type), exactly. Raises
    ``pa.ArrowInvalid`` for text that is not such a list of ``target``'s elements."""
    open_, close, null = spelling
    text = text.cast(pa.string()) if text.type != pa.string() else text
    n = len(text)
    valid = np.asarray(text.is_valid()) if text.null_count else np.ones(n, dtype=np.bool_)
    framed = pc.fill_null(pc.and_(pc.starts_with(text, open_), pc.ends_with(text, close)), True)
    if not pc.all(framed).as_py():
        raise pa.ArrowInvalid(f"a list value that is not {open_}...{close} text")
    inner = pc.utf8_slice_codeunits(text, 1, -1)
    parts = pc.split_pattern(inner, ",")
    lengths = np.asarray(pc.fill_null(pc.list_value_length(parts), 0).to_numpy(zero_copy_only=False))
    empty = np.asarray(pc.fill_null(pc.equal(inner, ""), False).to_numpy(zero_copy_only=False))
    lengths = np.where(valid & ~empty, lengths, 0)
    pieces = parts.flatten()
    keep = np.repeat(valid & ~empty, np.where(valid, np.asarray(
        pc.fill_null(pc.list_value_length(parts), 0).to_numpy(zero_copy_only=False)), 0))
    pieces = pieces.filter(pa.array(keep)) if not keep.all() else pieces
    pieces = pc.if_else(pc.equal(pieces, null), pa.scalar(None, pa.string()), pieces)
    elements = pieces.cast(target.value_type)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    out = pa.ListArray.from_arrays(offsets, elements, mask=pa.array(~valid) if not valid.all() else None)
    return out.cast(target) if out.type != target else out


__all__ = ["JSON", "POSTGRES", "list_text", "parse_list_text"]
