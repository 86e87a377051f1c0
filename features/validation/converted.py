"""The result of converting one column to its declared type (``features.validation.convert``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

Index = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Converted:
    """One column converted to its declared type.

    ``values``: the declared Arrow type, same length as the input; null where the
    input was null (or a null marker) or failed to convert. ``fail_rows``: sorted input
    rows whose (non-null) value failed to convert; ``fail_values``/``fail_shown`` render
    each failing value as text (plain, and as shown in a message, e.g. quoted strings);
    ``fail_hints``: per failure, text a message appends after the expected type
    (:data:`TEXT_HINT`), null for none; None when no failure has one.
    """

    values: pa.Array
    fail_rows: Index
    fail_values: pa.Array
    fail_shown: pa.Array
    fail_hints: pa.Array | None = None

    @property
    def failed(self) -> bool:
        return len(self.fail_rows) > 0


__all__ = ["Converted"]
