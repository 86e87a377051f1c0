"""Exact conversion of list columns (``list(float32, 384)``, ``list(int64, max=10)``).

A list value converts when it is a list (Arrow ``list``, ``large_list`` or
``fixed_size_list``; in decoded JSON a Python ``list``) whose length is the declared
length (or at most the declared maximum), whose every element converts exactly to the
element type by the scalar rules of :mod:`features.validation.convert` (no float64 ->
float32 narrowing, no fraction into an integer, no ``±inf``, no text), and which holds
no null element unless the type says ``nullable=true``. Anything else is a ``type``
reject of the row, its message naming why (``(length 2)``, ``(element 3: 'x')``,
``(a null element)``). NaN elements convert; the ``nan`` rule rejects them.

Everything is vectorised over the flattened elements: one conversion of all elements
of the column, then per-row verdicts by ``np.repeat``/``np.add.reduceat`` over the
list offsets. Only the few failing rows are rendered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.schema.model import Field
from features.validation.converted import Converted
from features.validation.masks import valid_mask

Index = npt.NDArray[np.int64]
BoolMask = npt.NDArray[np.bool_]
#: the scalar conversion an element takes (``convert.convert`` / ``convert.convert_pylist``)
ConvertArrow = Callable[[pa.Array, Field, pa.DataType], Converted]
ConvertValues = Callable[[Sequence[Any], Field, pa.DataType], Converted]
Render = Callable[[pa.Array], tuple[pa.Array, pa.Array]]
_NO_TEXT = pa.array([], pa.string())


def is_list_type(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def element_field(field: Field) -> Field:
    """The field an element is converted as: the list's element type, no constraints."""
    assert field.type.items is not None
    return Field(name=field.name, type=field.type.items.element)


def to_list(raw: pa.Array, field: Field, target: pa.DataType, convert: ConvertArrow,
            render: Render) -> Converted:
    """Convert an Arrow column to the list type ``target`` (see the module docstring),
    each element with ``convert`` (failures shown with ``render``)."""
    t = raw.type
    if not is_list_type(t):
        rows = np.flatnonzero(valid_mask(raw)).astype(np.int64)
        plain, text = render(raw.take(pa.array(rows)))
        return Converted(pa.nulls(len(raw), target), rows, plain,
                         pc.binary_join_element_wise(text, " (not a list)", ""))
    lst = raw if pa.types.is_list(t) else raw.cast(pa.list_(t.value_type))
    lengths = np.asarray(pc.fill_null(pc.list_value_length(lst), 0).to_numpy(zero_copy_only=False),
                         dtype=np.int64)
    valid = valid_mask(lst)
    lengths = np.where(valid, lengths, 0)
    elements = lst.flatten()
    converted = convert(elements, element_field(field), target.value_type)

    def shown(rows: Index) -> tuple[pa.Array, pa.Array]:
        return render_lists(lst.take(pa.array(rows)), render)

    return _assemble(field, target, valid, lengths, converted, valid_mask(elements), shown)


def to_list_pylist(values: Sequence[Any], field: Field, target: pa.DataType,
                   convert: ConvertValues) -> Converted:
    """Convert decoded JSON values (Python lists, None, anything else refused) to
    ``target``, the elements with ``convert``."""
    is_list = np.fromiter((isinstance(v, list) for v in values), np.bool_, len(values))
    present = np.fromiter((v is not None for v in values), np.bool_, len(values))
    lengths = np.fromiter((len(v) if isinstance(v, list) else 0 for v in values), np.int64, len(values))
    flat = list(chain.from_iterable(v for v in values if isinstance(v, list)))
    elements_valid = np.fromiter((v is not None for v in flat), np.bool_, len(flat))
    converted = convert(flat, element_field(field), target.value_type)

    def shown(rows: Index) -> tuple[pa.Array, pa.Array]:
        text = pa.array([repr(values[i]) for i in rows.tolist()], pa.string())
        return text, text

    c = _assemble(field, target, is_list, lengths, converted, elements_valid, shown)
    others = np.flatnonzero(present & ~is_list).astype(np.int64)
    if not len(others):
        return c
    text = pa.array([repr(values[i]) + " (not a list)" for i in others.tolist()], pa.string())
    plain = pa.array([str(values[i]) for i in others.tolist()], pa.string())
    rows = np.concatenate([c.fail_rows, others])
    order = np.argsort(rows, kind="stable")
    take = pa.array(order)
    return Converted(c.values, rows[order], pa.concat_arrays([c.fail_values, plain]).take(take),
                        pa.concat_arrays([c.fail_shown, text]).take(take))


def _assemble(field: Field, target: pa.DataType, valid: BoolMask, lengths: Index, elements: Converted,
              elements_valid: BoolMask, shown: Any) -> Converted:
    """The list column of rows ``valid`` (their ``lengths``; the others null) from their
    converted ``elements``, with the rows that fail the type as failures."""
    items = field.type.items
    assert items is not None
    n = len(valid)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    parent = np.repeat(np.arange(n, dtype=np.int64), lengths)
    note = np.full(n, "", dtype=object)  # filled for failing rows only
    bad = np.zeros(n, dtype=np.bool_)
    if items.length is not None:
        wrong = valid & (lengths != items.length)
    else:
        wrong = valid & (lengths > int(items.max_length or 0))
    bad |= wrong
    for i in np.flatnonzero(wrong).tolist():
        note[i] = f" (length {int(lengths[i])})"
    if not items.nullable:
        null_rows = np.unique(parent[~elements_valid])
        for i in null_rows.tolist():
            if not bad[i]:
                note[i] = " (a null element)"
        bad[null_rows] = True
    if elements.failed:
        elem_rows = parent[elements.fail_rows]
        rows, first = np.unique(elem_rows, return_index=True)
        which = (elements.fail_rows[first] - starts[rows]).tolist()
        texts = elements.fail_shown.take(pa.array(first)).to_pylist()
        for i, j, text in zip(rows.tolist(), which, texts, strict=True):
            note[i] = f" (element {j}: {text})"
        bad[rows] = True
    ok = valid & ~bad
    values = _build(target, ok, lengths, starts, elements.values)
    fail = np.flatnonzero(bad).astype(np.int64)
    if not len(fail):
        return Converted(values, fail, _NO_TEXT, _NO_TEXT)
    plain, text = shown(fail)
    text = pc.binary_join_element_wise(text, pa.array(note[fail].tolist(), pa.string()), "")
    return Converted(values, fail, plain, text)


def _build(target: pa.DataType, ok: BoolMask, lengths: Index, starts: Index, elements: pa.Array) -> pa.Array:
    """A ``target`` array: row i holds ``elements[starts[i]:starts[i] + lengths[i]]`` where
    ``ok``, else null."""
    mask = None if ok.all() else pa.array(~ok)
    if pa.types.is_fixed_size_list(target):
        size = target.list_size
        n = len(ok)
        idx = starts[:-1, None] + np.arange(size, dtype=np.int64)[None, :]
        keep = np.repeat(ok, size)
        flat = idx.ravel()
        taken = elements.take(pa.array(np.where(keep, flat, 0), mask=~keep)) if len(elements) \
            else pa.nulls(n * size, target.value_type)
        return pa.FixedSizeListArray.from_arrays(taken, type=target, mask=mask)
    kept = np.where(ok, lengths, 0)
    offsets = pa.array(np.concatenate([[0], np.cumsum(kept)]).astype(np.int32))
    keep_elements = np.repeat(ok, lengths)
    values = elements if keep_elements.all() else elements.filter(pa.array(keep_elements))
    return pa.ListArray.from_arrays(offsets, values, type=target, mask=mask)


def render_lists(arr: pa.Array, render: Render) -> tuple[pa.Array, pa.Array]:
    """``(plain, shown)`` text of list values: ``[0.5, 1.25]``, elements rendered by
    ``render`` (``convert.render``); null as null (shown: ``null``)."""
    lst = arr if pa.types.is_list(arr.type) else arr.cast(pa.list_(arr.type.value_type))
    plain_elements, _ = render(lst.flatten())
    lengths = np.asarray(pc.fill_null(pc.list_value_length(lst), 0).to_numpy(zero_copy_only=False))
    lengths = np.where(valid_mask(lst), lengths, 0)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    texts = pa.ListArray.from_arrays(offsets, pc.fill_null(plain_elements, "null"),
                                     mask=None if not lst.null_count else pc.is_null(lst))
    plain = pc.binary_join_element_wise("[", pc.binary_join(texts, ", "), "]", "")
    return plain, pc.fill_null(plain, "null")


__all__ = ["element_field", "is_list_type", "render_lists", "to_list", "to_list_pylist"]
