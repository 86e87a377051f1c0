"""Files -> Kafka records: test and backfill data onto a schema's topic, as producers send it.

:func:`file_records` reads a file into batches of record values (JSON bytes):

- ``.jsonl`` / ``.ndjson``: each line is one record, sent as its exact bytes (without
  its ``\\n`` or ``\\r\\n`` ending); blank lines are not records and are counted apart.
- ``.json``: a JSON array (each element one record, its exact text from the file) or a
  single JSON value (one record).
- ``.parquet``: each row one JSON object, written column by column with Arrow kernels
  (:func:`json_values`) the way the stream decodes it (``docs/streaming.md``).

:func:`produce_batches` sends them to a topic, keyed as ``features serve`` keys them
(:func:`features.stream.kafka.entity_keys`), checks every delivery report and returns a
:class:`ProduceSummary`. Nothing is validated or dropped here: a record that the stream
will reject (no entity, not JSON, a broken rule) is produced all the same, so the stream
rejects it with its reasons.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from confluent_kafka import KafkaException, Producer

from features.errors import ConfigError, SourceError
from features.observe.progress import LineProgress
from features.stream.kafka import client_config, entity_keys, topic_partitions

#: the file extensions :func:`file_records` reads
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}
#: records per batch read from a file (and per progress update)
BATCH_RECORDS = 10_000
#: how long the final flush waits for the broker's acknowledgements, seconds
FLUSH_TIMEOUT_S = 120.0


@dataclass
class FileRecords:
    """A file's records: ``batches`` (lists of values, read lazily), ``total`` (the
    record count when known before reading: Parquet's row count, else None) and, once
    read, ``blank_lines`` (JSONL lines holding only whitespace: not records)."""

    path: Path
    format: str
    total: int | None
    batches: Iterator[list[bytes]]
    blank_lines: list[int] = field(default_factory=lambda: [0])


def file_records(path: str | Path, *, batch_records: int = BATCH_RECORDS) -> FileRecords:
    """The records of ``path`` (see the module docstring), by its extension.

    Raises :class:`ConfigError` for another extension or a missing file,
    :class:`SourceError` (with ``path``) for a ``.json`` file that is not UTF-8 JSON or a
    Parquet file pyarrow cannot open. A JSONL line is never parsed here."""
    p = Path(path)
    kind = FORMATS.get(p.suffix.lower())
    if kind is None:
        raise ConfigError(f"{p}: unknown file type {p.suffix or '(none)'!r}; expected one of "
                          f"{', '.join(FORMATS)}", key="file")
    if not p.is_file():
        raise ConfigError(f"{p}: no such file", key="file", looked_in=[str(p)])
    if kind == "parquet":
        try:
            pf = pq.ParquetFile(p)
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"{p}: not a readable Parquet file: {exc}", path=str(p)) from exc
        batches = (json_values(b).cast(pa.binary()).to_pylist()
                   for b in pf.iter_batches(batch_size=batch_records))
        return FileRecords(p, kind, pf.metadata.num_rows, batches)
    if kind == "json":
        return FileRecords(p, kind, None, _chunks(_json_elements(p), batch_records))
    out = FileRecords(p, kind, None, iter(()))
    out.batches = _chunks(_lines(p, out.blank_lines), batch_records)
    return out


def _chunks(values: Iterable[bytes], n: int) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for v in values:
        chunk.append(v)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _lines(path: Path, blank: list[int]) -> Iterator[bytes]:
    """Each line's bytes without its line ending; whitespace-only lines counted in ``blank[0]``."""
    with path.open("rb") as f:
        for line in f:
            value = line[:-1] if line.endswith(b"\n") else line
            value = value[:-1] if value.endswith(b"\r") else value
            if not value.strip():
                blank[0] += 1
                continue
            yield value


def _json_elements(path: Path) -> Iterator[bytes]:
    """Each element of a top-level JSON array (its exact text, UTF-8), or the one
    top-level value. ``raw_decode`` parses one element at a time to find where it ends."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})", path=str(path)) from exc
    decoder = json.JSONDecoder()
    ws = " \t\n\r"

    def skip(i: int) -> int:
        while i < len(text) and text[i] in ws:
            i += 1
        return i

    def element(i: int) -> int:
        try:
            return decoder.raw_decode(text, i)[1]
        except ValueError as exc:
            raise SourceError(f"{path}: not valid JSON: {exc}", path=str(path)) from exc

    i = skip(0)
    if not text.startswith("[", i):
        end = element(i)
        if skip(end) != len(text):
            raise SourceError(f"{path}: not valid JSON: extra data at character {skip(end)}", path=str(path))
        yield text[i:end].encode("utf-8")
        return
    i = skip(i + 1)
    if text.startswith("]", i):
        return
    while True:
        end = element(i)
        yield text[i:end].encode("utf-8")
        i = skip(end)
        if text.startswith("]", i):
            if skip(i + 1) != len(text):
                raise SourceError(f"{path}: not valid JSON: extra data at character {skip(i + 1)}",
                                  path=str(path))
            return
        if not text.startswith(",", i):
            raise SourceError(f"{path}: not valid JSON: expected ',' or ']' at character {i}", path=str(path))
        i = skip(i + 1)


def json_values(batch: pa.RecordBatch | pa.Table) -> pa.Array:
    """One compact JSON object per row (a string array, no nulls), every column a key in
    column order, as the stream decodes it:

    - a null is ``null`` (the key is present);
    - integers and booleans as JSON numbers and ``true``/``false``;
    - decimals exact at their scale as JSON numbers (``12.50``);
    - floats as their shortest round-trip text, integral ones with ``.0`` (``100.0``:
      ``json.loads`` reads a float), NaN and infinities as Python's ``json`` writes them
      (``NaN``, ``Infinity``, ``-Infinity``: the stream reads them and its field rules
      reject them);
    - timestamps as ISO 8601 in UTC with ``Z`` and the column's fraction
      (``2023-01-01T00:00:05.123456Z``); one without a time zone is taken as UTC;
    - dates ``YYYY-MM-DD``; strings JSON-escaped; lists as arrays (elements by these rules);
    - any other type (structs, binary, times) through ``json.dumps`` per value
      (``default=str``), a per-row path.

    Everything but that last case runs as Arrow kernels over whole columns."""
    n = batch.num_rows
    if batch.num_columns == 0:
        return pa.array(["{}"] * n, pa.string())
    parts = []
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        parts.append(pc.binary_join_element_wise(json.dumps(name, ensure_ascii=False) + ":", _json(arr), ""))
    body = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, ",")
    return pc.binary_join_element_wise("{", body, "}", "")


_INTEGRAL = r"^-?[0-9]+$"
_RARE_CONTROL = "[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f]"


def _json(arr: pa.Array) -> pa.Array:
    """``arr``'s values as JSON texts (a string array; a null is ``null``)."""
    t = arr.type
    if pa.types.is_dictionary(t):
        return _json(arr.dictionary_decode())
    if pa.types.is_null(t):
        return pa.array(["null"] * len(arr), pa.string())
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_date(t):
        text = pc.cast(arr, pa.string())
        if pa.types.is_date(t):
            text = pc.binary_join_element_wise('"', text, '"', "")
    elif pa.types.is_floating(t):
        text = pc.cast(pc.cast(arr, pa.float64()) if pa.types.is_float16(t) else arr, pa.string())
        text = pc.if_else(pc.match_substring_regex(text, _INTEGRAL),
                          pc.binary_join_element_wise(text, ".0", ""), text)
        for arrow, python in (("nan", "NaN"), ("-inf", "-Infinity"), ("inf", "Infinity")):
            text = pc.if_else(pc.equal(text, arrow), python, text)
    elif pa.types.is_timestamp(t):
        utc = arr.cast(pa.timestamp(t.unit, "UTC")) if t.tz else arr
        text = pc.binary_join_element_wise('"', pc.strftime(utc, "%Y-%m-%dT%H:%M:%SZ"), '"', "")
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        text = _json_strings(arr)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        elements = _json(arr.values)
        lists = type(arr).from_arrays(arr.offsets, elements, mask=arr.is_null())
        text = pc.binary_join_element_wise("[", pc.binary_join(lists, ","), "]", "")
    else:
        text = pa.array([json.dumps(v, default=str, ensure_ascii=False) for v in arr.to_pylist()],
                        pa.string())
    return pc.fill_null(pc.cast(text, pa.string()), "null")


def _json_strings(arr: pa.Array) -> pa.Array:
    """Strings as JSON string literals (``json.dumps(..., ensure_ascii=False)``'s text):
    backslash, quote, ``\\n``, ``\\r``, ``\\t`` escaped by kernels; a column holding another
    control character goes through ``json.dumps`` per value (rare in practice)."""
    if pc.any(pc.match_substring_regex(arr, _RARE_CONTROL)).as_py():
        return pa.array([None if v is None else json.dumps(v, ensure_ascii=False) for v in arr.to_pylist()],
                        pa.string())
    text = arr
    for raw, escaped in (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")):
        text = pc.replace_substring(text, raw, escaped)
    return pc.binary_join_element_wise('"', text, '"', "")


@dataclass
class ProduceSummary:
    """What :func:`produce_batches` did: ``records`` sent, ``delivered`` (acknowledged by
    the broker), ``failed`` (a delivery report with an error, or unacknowledged when the
    flush timed out), ``unkeyed`` (records sent without a key: no entity id, see
    :func:`~features.stream.kafka.entity_keys`), the topic's ``partitions``, ``seconds``
    (wall clock, from the first record to the last acknowledgement) and the first few
    delivery ``errors``."""

    topic: str
    partitions: int
    records: int = 0
    delivered: int = 0
    failed: int = 0
    unkeyed: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every record acknowledged."""
        return self.failed == 0 and self.delivered == self.records


def produce_batches(bootstrap: str, topic: str, batches: Iterable[list[bytes]], *, entity: str,
                    properties: Mapping[str, str] | None = None, timeout_s: float = 10.0,
                    progress: LineProgress | None = None,
                    flush_timeout_s: float = FLUSH_TIMEOUT_S) -> ProduceSummary:
    """Send every value of ``batches`` to ``topic`` in order, keyed by ``entity_keys(values,
    entity)`` (``entity``: the entity field's JSON key), with an idempotent producer (a
    retry never duplicates a record), and wait for every acknowledgement.

    The topic must exist: the broker is asked first (``timeout_s``), so a broker that is
    down is a :class:`ServiceError` naming ``bootstrap`` before anything is read, and a
    missing topic a :class:`ConfigError` naming ``features topics create``. Delivery
    failures are not raised: they are counted in the summary (``ok`` is False). Never
    creates the topic, whatever the broker's ``auto.create.topics.enable``."""
    partitions = topic_partitions(bootstrap, timeout_s=timeout_s, properties=properties).get(topic)
    if partitions is None:
        raise ConfigError(f"Kafka at {bootstrap} has no topic {topic!r}: create it first with "
                          f"`features topics create --topic {topic} --schema NAME`", key="topic")
    summary = ProduceSummary(topic, partitions)
    producer = Producer(client_config(bootstrap, properties, **{
        "enable.idempotence": True, "linger.ms": 20}))

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            summary.delivered += 1
            return
        summary.failed += 1
        if len(summary.errors) < 5:
            summary.errors.append(str(err))

    t0 = time.perf_counter()
    try:
        for values in batches:
            keys = entity_keys(values, entity)
            summary.unkeyed += sum(k is None for k in keys)
            for value, key in zip(values, keys, strict=True):
                while True:
                    try:
                        producer.produce(topic, value=value, key=key, on_delivery=delivered)
                        break
                    except BufferError:  # the local queue is full: let deliveries drain it
                        producer.poll(0.1)
                    except KafkaException as exc:  # a record over message.max.bytes, a fatal producer
                        summary.failed += 1
                        if len(summary.errors) < 5:
                            summary.errors.append(str(exc.args[0] if exc.args else exc))
                        break
            summary.records += len(values)
            producer.poll(0)
            if progress is not None:
                progress.update(summary.records, summary.failed, tail=f"  unkeyed {summary.unkeyed:,}")
        left = producer.flush(flush_timeout_s)
    finally:
        producer.poll(0)  # deliver its log lines (LibrdkafkaLog)
    summary.seconds = time.perf_counter() - t0
    if left:
        summary.failed += left
        summary.errors.append(f"{left:,} records not acknowledged within {flush_timeout_s:g} s")
    if progress is not None:
        progress.close(summary.records, summary.failed, tail=f"  unkeyed {summary.unkeyed:,}")
    return summary


__all__ = ["FORMATS", "FileRecords", "ProduceSummary", "file_records", "json_values", "produce_batches"]
