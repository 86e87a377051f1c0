"""Parquet files -> Arrow batches, row group by row group, memory bounded.

``ParquetSource(paths, compiled)`` expands files, folders (``**/*.parquet``), globs and
URIs that ``pyarrow.fs`` reads (``s3://bucket/prefix/``, ``gs://``, ``hdfs://``, ``file://``),
checks every file's columns against the schema before reading anything
(:func:`column_problems`: a missing required column or a column of an incompatible
type refuses to start with a clear message, the same that ``features validate`` gives
for the file; extra columns are ignored with a warning), then yields one batch per slice
of at most ``batch_rows`` rows of each row group, reading only the schema's columns.
Columns are the input's: a field with ``source: Dep Delay`` reads the column ``Dep Delay``
(the checks and the warning name it so, with the field), and the batches keep that name
(:func:`features.sources.names.as_fields` renames them for validation, so a reject's raw
row shows the file's own column names).
Peak memory is about one row group's worth of the needed columns, whatever the
input size.

Each batch carries a ledger *unit*: ``file:///abs/path@<footer sha256[:16]>/rg<i>/b<j>x<batch_rows>``,
stable across re-runs of the same bytes, so the commit ledger can skip what is stored.
"""

from __future__ import annotations

import glob
import hashlib
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from features.compile import CompiledSchema
from features.compile.arrow import arrow_type
from features.compile.layout import encode_column, key_slots
from features.errors import SourceError
from features.lineage import BatchLineage
from features.schema.model import Field, TypeKind
from features.sources.base import SourceBatch
from features.validation.convert import TEXT_HINT, convert

DEFAULT_BATCH_ROWS = 131_072


class ExtraColumnsWarning(UserWarning):
    """A Parquet file has columns the schema does not declare; they are ignored."""


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _is_uri(raw: str | Path) -> bool:
    return isinstance(raw, str) and _URI.match(raw) is not None


def _expand_uri(raw: str) -> list[str]:
    """A file or folder URI (``s3://``, ``gs://``, ``hdfs://``, ``file://``... whatever
    ``pyarrow.fs`` supports) -> its Parquet files as URIs; [] when nothing is there."""
    try:
        filesystem, path = pafs.FileSystem.from_uri(raw)
        info = filesystem.get_file_info(path)
        if info.type == pafs.FileType.File:
            return [raw]
        if info.type != pafs.FileType.Directory:
            return []
        infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
    except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SourceError(f"{raw}: cannot list it through pyarrow.fs: {exc}", path=raw) from exc
    head = raw[:raw.index("://") + 3]
    base = raw[len(head):].rstrip("/")
    root = path.rstrip("/")
    return sorted(f"{head}{base}{i.path[len(root):]}" for i in infos
                  if i.type == pafs.FileType.File and i.path.endswith(".parquet"))


def expand_paths(paths: Sequence[str | Path]) -> list[str]:
    """Files, folders (recursive ``*.parquet``), globs and URIs -> sorted unique sources:
    local files as absolute paths, URIs (``s3://bucket/prefix/``, ``file:///...``) as
    URIs, read through ``pyarrow.fs`` (globs are for local paths only).

    Raises SourceError naming every argument that matched nothing.
    """
    found: dict[str, None] = {}
    missing: list[str] = []
    for raw in paths:
        if _is_uri(raw):
            hits_uri = _expand_uri(str(raw))
            if not hits_uri:
                missing.append(str(raw))
            for u in hits_uri:
                found[u] = None
            continue
        p = Path(raw)
        if p.is_dir():
            hits = sorted(x for x in p.rglob("*.parquet") if x.is_file())
        elif p.is_file():
            hits = [p]
        else:
            hits = sorted(Path(x) for x in glob.glob(str(raw), recursive=True) if Path(x).is_file())
        if not hits:
            missing.append(str(raw))
        for h in hits:
            found[str(h.resolve())] = None
    if missing:
        raise SourceError(f"no Parquet file found at: {', '.join(missing)}", path=missing[0])
    return sorted(found)


def _open(source: str) -> tuple[pq.ParquetFile, str]:
    """A Parquet file and its lineage URI: ``file:///abs/path`` for a local file (whether
    named by path or by ``file://`` URI: the same units and lineage either way), else the
    URI as given."""
    if _is_uri(source):
        filesystem, path = pafs.FileSystem.from_uri(source)
        uri = Path(path).as_uri() if isinstance(filesystem, pafs.LocalFileSystem) else source
        return pq.ParquetFile(filesystem.open_input_file(path)), uri
    return pq.ParquetFile(source), Path(source).as_uri()


def _textual(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _textual(t.value_type)
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


def compatible(t: pa.DataType, f: Field) -> bool:
    """Whether a column of Arrow type ``t`` can hold values of field ``f`` at all.

    Per-value exactness (range, scale, zone) is the validator's job and yields rejects;
    this only refuses columns that could never convert (a struct for an int, numbers
    for a string, strings for a number without ``accept_strings``).
    """
    if pa.types.is_null(t):
        return True
    if f.accept_strings and _textual(t):
        return True
    kind = f.type.kind
    if f.type.items is not None:  # a list column of numbers (its elements' exactness: the validator)
        listed = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
        return bool(listed and (_numeric(t.value_type) or pa.types.is_null(t.value_type)))
    if kind in (TypeKind.STRING, TypeKind.ENUM):
        return _textual(t)
    if kind is TypeKind.BOOL:
        return bool(pa.types.is_boolean(t))
    if kind is TypeKind.DATE:
        return bool(pa.types.is_date(t) or pa.types.is_timestamp(t))
    if kind is TypeKind.TIMESTAMP:
        return bool(pa.types.is_timestamp(t) or pa.types.is_date(t))
    return _numeric(t)


def column_problems(arrow: pa.Schema, compiled: CompiledSchema) -> list[tuple[str, str]]:
    """Why a file with columns ``arrow`` cannot be read with ``compiled`` at all, as
    ``(field, problem)`` pairs in field order (empty: it can). A problem is a missing
    ``required`` column without a default, or a column whose type could never convert
    (:func:`compatible`); a text column for a number, bool, date or timestamp without
    ``accept_strings`` says how to read it (:data:`~features.validation.convert.TEXT_HINT`).
    The one verdict of the loader, ``features validate`` and the report on a file:
    what refuses here is never turned into a reject per row."""
    problems: list[tuple[str, str]] = []
    for f in compiled.schema.fields:
        column = f.input_name
        of = "" if column == f.name else f" (source of field {f.name!r})"
        idx = arrow.get_field_index(column)
        if idx < 0:
            if f.constraints.required and not f.constraints.has_default:
                problems.append((f.name, f"missing required column {column!r}{of}"))
            continue
        t = arrow.field(idx).type
        if not compatible(t, f):
            hint = TEXT_HINT if _textual(t) else ""
            problems.append((f.name, f"column {column!r}{of} has type {t}, incompatible with {f.type}{hint}"))
    return problems


def refusal(path: str, arrow: pa.Schema, compiled: CompiledSchema) -> SourceError | None:
    """The SourceError refusing the file ``path`` (columns ``arrow``) with every
    :func:`column_problems`, its ``field`` the first one's; None when there is none."""
    problems = column_problems(arrow, compiled)
    if not problems:
        return None
    return SourceError(f"{path}: refusing to load with schema {compiled.name!r}: "
                       + "; ".join(p for _, p in problems), path=str(path), field=problems[0][0])


@dataclass(frozen=True)
class _File:
    path: str       # what expand_paths gave: an absolute local path or a URI
    uri: str
    meta: pq.FileMetaData
    columns: tuple[str, ...]
    digest: str


class ParquetSource:
    """Batches from Parquet files; see the module docstring for the contract."""

    name = "parquet"

    def __init__(self, paths: Sequence[str | Path], compiled: CompiledSchema, *,
                 batch_rows: int = DEFAULT_BATCH_ROWS, shard: tuple[int, int] | None = None) -> None:
        if batch_rows < 1:
            raise SourceError(f"batch_rows must be >= 1, got {batch_rows}")
        if shard is not None and not 0 <= shard[0] < shard[1]:
            raise SourceError(f"shard {shard[0]} of {shard[1]}: expected 0 <= shard < shards")
        self.compiled = compiled
        self.batch_rows = batch_rows
        #: (i, n): only the rows of entity shard i of n (:func:`entity_shards`); None: all
        self.shard = shard
        self.files = [self._inspect(p) for p in expand_paths(paths)]

    @property
    def total_rows(self) -> int:
        return sum(f.meta.num_rows for f in self.files)

    def _inspect(self, path: str) -> _File:
        try:
            pf, uri = _open(path)
        except (OSError, pa.ArrowInvalid) as exc:
            raise SourceError(f"{path}: not a readable Parquet file: {exc}", path=str(path)) from exc
        arrow = pf.schema_arrow
        refused = refusal(path, arrow, self.compiled)
        if refused is not None:
            raise refused
        declared = set(self.compiled.schema.input_names)
        extra = [n for n in arrow.names if n not in declared]
        if extra:
            # a column spelled like a field that reads another column is ignored too: say why
            mapped = {f.name: f.input_name for f in self.compiled.schema.fields if f.input_name != f.name}
            shown = [f"{n} (field {n} reads {mapped[n]!r})" if n in mapped else n for n in extra]
            warnings.warn(f"{path}: ignoring column(s) not in schema {self.compiled.name!r}: "
                          f"{', '.join(shown)}", ExtraColumnsWarning, stacklevel=3)
        columns = tuple(n for n in arrow.names if n in declared)
        # The footer (schema, row group stats, sizes) identifies the bytes well enough for
        # the ledger without reading the data: a rewritten file gets a new digest.
        digest = hashlib.sha256(pf.metadata.to_dict().__repr__().encode()).hexdigest()[:16]
        return _File(path, uri, pf.metadata, columns, digest)

    def batches(self) -> Iterator[SourceBatch]:
        for f in self.files:
            pf, _ = _open(f.path)
            first = 0
            for rg in range(f.meta.num_row_groups):
                for j, batch in enumerate(pf.iter_batches(batch_size=self.batch_rows, row_groups=[rg],
                                                          columns=list(f.columns), use_threads=True)):
                    unit = f"{f.uri}@{f.digest}/rg{rg}/b{j}x{self.batch_rows}"
                    if self.shard is None:
                        yield SourceBatch(batch, BatchLineage(f.uri, first, batch.num_rows, unit))
                    else:
                        i, n = self.shard
                        mine = np.flatnonzero(entity_shards(batch, self.compiled, n, first) == i)
                        rows = pa.array(mine + first, pa.int64())
                        yield SourceBatch(batch.take(pa.array(mine)), BatchLineage(
                            f.uri, first, len(mine), f"{unit}/shard{i}of{n}", source_rows=rows))
                    first += batch.num_rows


def entity_shards(batch: pa.RecordBatch, compiled: CompiledSchema, shards: int,
                  first_row: int = 0) -> npt.NDArray[np.int64]:
    """The shard (0 .. ``shards - 1``) of each row: CRC16 of its entity as the stores
    write it (the raw value converted exactly as the validator converts it, then encoded
    as Redis text), so every row of one entity lands in one shard whatever file or
    representation it comes from. A row whose entity is missing or does not convert (a
    reject to be) goes by its row number. Deterministic across processes and machines."""
    n = batch.num_rows
    field = compiled.schema.field(compiled.schema.entity or "")
    out = (np.arange(n, dtype=np.int64) + first_row) % shards
    names = batch.schema.names  # the input's (the batches of ParquetSource)
    if field.input_name not in names or n == 0:
        return out
    values = convert(batch.column(names.index(field.input_name)), field, arrow_type(field.type)).values
    text = encode_column(values)
    ok = np.asarray(text.is_valid(), dtype=bool)
    if ok.any():
        good = text.filter(pa.array(ok))
        out[ok] = key_slots(good) % shards
    return out

