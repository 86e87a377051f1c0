"""``features topics create`` and ``features produce`` against the real broker (issue 47, item 3).

The topics are created by the command under test (twice: idempotent), the files are sent
by it, and the topic is read back: every record once, keyed by its entity, and the
stream's own micro-batch step (columnar decoder, validator) reads the produced Parquet
rows back to the values of the file, as the batch validator reads the file itself.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.config import Settings
from features.ops.examples import applicant_events, applicant_schema, applicants
from features.stream.kafka import entity_keys, read_topic
from features.stream.produce import json_values

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "credit_applicant"


def features_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "features.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env or dict(os.environ), timeout=120)


@pytest.fixture()
def topic(settings: Settings) -> Iterator[str]:
    """A fresh topic name; the test's command creates it; it and ``<name>.rejects`` are deleted after."""
    from confluent_kafka.admin import AdminClient

    name = f"t_produce_{uuid.uuid4().hex[:8]}"
    yield name
    AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).delete_topics([name, name + ".rejects"])


def test_topics_create_is_idempotent(topic: str, settings: Settings) -> None:
    from features.stream.kafka import topic_partitions

    first = features_cli("topics", "create", "--schema", SCHEMA, "--topic", topic)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [f"created topic {topic} (2 partitions)",
                                         f"created topic {topic}.rejects (1 partition)"]
    again = features_cli("topics", "create", "--schema", SCHEMA, "--topic", topic)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [f"topic {topic} exists (2 partitions)",
                                         f"topic {topic}.rejects exists (1 partition)"]
    other = features_cli("topics", "create", "--schema", SCHEMA, "--topic", topic, "--partitions", "3",
                         "--no-dead-letter")
    assert other.returncode == 0, other.stderr
    assert other.stdout.startswith(f"topic {topic} exists with 2 partitions, not 3: left as it is")
    assert len(other.stdout.splitlines()) == 1
    have = topic_partitions(settings.kafka_bootstrap)
    assert (have[topic], have[topic + ".rejects"]) == (2, 1)
    listed = features_cli("topics", "list")
    assert listed.returncode == 0, listed.stderr
    assert f"{topic}\t2" in listed.stdout.splitlines()


def test_produce_parquet_reads_back_as_the_file(tmp_path: Path, topic: str, settings: Settings) -> None:
    from features.config import resolve_settings
    from features.kernels import transform_program
    from features.lineage import RunContext
    from features.pipeline.prepare import prepare_records
    from features.sources.columnar import ColumnarDecoder
    from features.validation import validate

    assert features_cli("topics", "create", "--schema", SCHEMA, "--topic", topic).returncode == 0
    table = applicants(3000, seed=11)  # ~2% rows break a rule: they go too
    path = tmp_path / "applicants.parquet"
    pq.write_table(table, path, row_group_size=1000)
    done = features_cli("produce", "--schema", SCHEMA, "--topic", topic, str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"produced 3,000 records to {topic} (2 partitions) in ")
    assert "without an entity id" not in done.stdout  # every applicant has an id

    msgs = read_topic(settings.kafka_bootstrap, topic)
    values = [m.value() for m in msgs]
    sent = json_values(table).cast(pa.binary()).to_pylist()
    assert Counter(values) == Counter(sent) and len(set(sent)) == 3000  # every record, once
    for m in msgs:
        assert m.key() == json.loads(m.value())["application_id"].encode()
        assert m.key() == entity_keys([m.value()], "application_id")[0]
    by_partition: dict[int, set[bytes]] = {}
    for m in msgs:
        by_partition.setdefault(m.partition(), set()).add(m.key())
    assert len(by_partition) == 2 and not set.intersection(*by_partition.values())

    # the stream's own step on the records, against the batch validator on the file
    compiled = applicant_schema()
    now = dt.datetime.now(dt.UTC)
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "ref", now)
    prepared = prepare_records(values, pa.array([f"kafka://{topic}/x/{i}" for i in range(len(values))]),
                               np.arange(len(values), dtype=np.int64), compiled,
                               transform_program(compiled, resolve_settings(root=ROOT)), ctx, now,
                               decoder=ColumnarDecoder(compiled.schema,
                                                       max_bytes=compiled.schema.payload.max_bytes))
    assert prepared.decode_rejects == 0
    assert prepared.slow < 30  # the columnar path read the rest (a null required field goes per record)
    fields = list(compiled.schema.field_names)
    stream_rows = prepared.prepared.rows.select(fields).sort_by("application_id")
    valid = pa.Table.from_batches([validate(table, compiled).valid])
    file_rows = valid.select(fields).sort_by("application_id")
    assert 0 < file_rows.num_rows < 3000
    for name in fields:  # every value in its declared type: decimals, timestamps, dates exact
        assert stream_rows.column(name).type == file_rows.column(name).type, name
        assert stream_rows.column(name).to_pylist() == file_rows.column(name).to_pylist(), name
    assert prepared.prepared.rejected_rows == 3000 - file_rows.num_rows


def test_produce_jsonl_sends_each_line_as_its_bytes(tmp_path: Path, topic: str, settings: Settings) -> None:
    assert features_cli("topics", "create", "--schema", SCHEMA, "--topic", topic,
                        "--no-dead-letter").returncode == 0
    # events as producers send them, undecodable ones among them (not JSON, no entity, null)
    events = applicant_events(600, seed=4, undecodable_every=50)
    lines = [v for v in events if v is not None and b"\n" not in v]
    unkeyed = sum(k is None for k in entity_keys(lines, "application_id"))
    assert unkeyed >= 5
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines[:100]) + b"\n\n" + b"\r\n".join(lines[100:]) + b"\r\n")
    done = features_cli("produce", "--schema", SCHEMA, "--topic", topic, str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"produced {len(lines):,} records to {topic} (2 partitions) in ")
    assert f"; {unkeyed:,} without an entity id (application_id), sent unkeyed" in done.stdout
    assert "; 1 blank lines skipped" in done.stdout
    msgs = read_topic(settings.kafka_bootstrap, topic)
    assert Counter(m.value() for m in msgs) == Counter(lines)  # the exact bytes, each once
    for m in msgs:
        assert m.key() == entity_keys([m.value()], "application_id")[0]


def test_produce_json_array_elements(tmp_path: Path, topic: str, settings: Settings) -> None:
    assert features_cli("topics", "create", "--schema", SCHEMA, "--topic", topic).returncode == 0
    elements = [b'{"application_id": "APP-000000000001", "income_monthly": 12.50}',
                b'{"application_id":"APP-000000000002","note":"a, ] b"}', b'[1, 2]']
    path = tmp_path / "events.json"
    path.write_bytes(b"[\n  " + b",\n  ".join(elements) + b"\n]\n")
    done = features_cli("produce", "--schema", SCHEMA, "--topic", topic, str(path))
    assert done.returncode == 0, done.stderr
    assert "1 without an entity id" in done.stdout
    assert Counter(m.value() for m in read_topic(settings.kafka_bootstrap, topic)) == Counter(elements)


def test_json_values_escape_strings_as_json_dumps() -> None:
    texts = ['plain', 'quote " and \\ backslash', 'line\nbreak\ttab\r', 'é ☃ \U0001f600', '', None]
    got = json_values(pa.table({"s": texts})).to_pylist()
    assert got == ['{"s":' + json.dumps(t, ensure_ascii=False) + "}" for t in texts]
    rare = json_values(pa.table({"s": ["bell \x07", "ok"]})).to_pylist()
    assert [json.loads(v)["s"] for v in rare] == ["bell \x07", "ok"]
    floats = json_values(pa.table({"f": [1.0, 0.1, float("nan"), float("-inf"), -0.0, 1e300]})).to_pylist()
    assert floats == ['{"f":1.0}', '{"f":0.1}', '{"f":NaN}', '{"f":-Infinity}', '{"f":-0.0}', '{"f":1e+300}']


@pytest.mark.parametrize("command", [["topics", "create", "--schema", SCHEMA], ["topics", "list"],
                                     ["produce", "--schema", SCHEMA, "FILE"]])
def test_kafka_down_exits_2_naming_the_address(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "one.jsonl"
    path.write_bytes(b'{"application_id": "APP-000000000001"}\n')
    env = {**os.environ, "FEATURES_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    done = features_cli(*[str(path) if a == "FILE" else a for a in command], "--timeout", "3", env=env)
    assert done.returncode == 2
    assert "Kafka at 127.0.0.1:1 is unreachable" in done.stderr
    assert done.stdout == ""


def test_produce_to_a_missing_topic_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_bytes(b'{"application_id": "APP-000000000001"}\n')
    name = f"t_missing_{uuid.uuid4().hex[:8]}"
    done = features_cli("produce", "--schema", SCHEMA, "--topic", name, str(path))
    assert done.returncode == 2
    assert f"no topic {name!r}: create it first with `features topics create" in done.stderr
