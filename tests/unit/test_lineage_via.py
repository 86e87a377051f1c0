"""``kafka://topic/partition/offset via http://<request id>#<index>`` (a record HTTP
ingest produced): the stream keeps a valid ``featureline-source`` header after the
Kafka coordinates, refuses any other, and what reads a Kafka source (the aggregations'
offsets and lanes, the report's origins) reads the coordinates of both forms alike."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from features.aggregate.stream import _lanes, _offsets
from features.report.core import origin
from features.sources.records import record_uris


def test_record_uris_keep_a_valid_header_and_refuse_the_others() -> None:
    via = pa.array([b"http://req-1#0", b"http://r#1 <b>", b"http://" + b"a" * 200 + b"#0",
                    b"http://r\xff#0", None, b"kafka://x/0/1", b"http://r#12345678901"], pa.binary())
    n = len(via)
    uris = record_uris(pa.array(["t"] * n), pa.array([0] * n, pa.int32()),
                       pa.array(range(n), pa.int64()), via)
    want = ["kafka://t/0/0 via http://req-1#0"] + [f"kafka://t/0/{i}" for i in range(1, n)]
    assert uris.to_pylist() == want


def test_kafka_coordinates_are_read_alike_with_or_without_the_http_source() -> None:
    sources = pa.array(["kafka://t/1/41 via http://req-1:a.b#7", "kafka://t/1/41", "file:///a.parquet#3"])
    assert _offsets(sources).tolist() == [42, 42, 0]
    assert _lanes(sources).to_pylist()[:2] == ["kafka://t/1", "kafka://t/1"]
    assert [origin(s) for s in sources.to_pylist()] == ["kafka://t/1", "kafka://t/1", "file:///a.parquet"]
    assert np.asarray(_offsets(pa.array([], pa.string()))).size == 0
