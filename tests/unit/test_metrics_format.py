"""features.observe.metrics: the registry on prometheus_client, the text exposition format 0.0.4
it writes (checked line by line against the format, independently of both), the
hand-written BatchHistogram, the HTTP endpoint, and the runner's accounting into
RunMetrics (an in-memory sink: wiring only, no store)."""

from __future__ import annotations

import datetime as dt
import functools
import http.client
import math
import re
import socket
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from memory_sink import MemorySink

from features.observe.metrics import (
    CONTENT_TYPE,
    Registry,
    RunMetrics,
    Sample,
    SdkMetrics,
    parse_exposition,
    sample_value,
    serve,
    serve_first_free,
)

# The format, independently of features.observe.metrics (https://prometheus.io/docs/instrumenting/exposition_formats/)
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_VALUE = r'"(?:[^"\\\n]|\\\\|\\"|\\n)*"'
LABELS = rf"\{{(?:[a-zA-Z_][a-zA-Z0-9_]*={LABEL_VALUE})(?:,[a-zA-Z_][a-zA-Z0-9_]*={LABEL_VALUE})*\}}"
VALUE = r"(?:[+-]?Inf|NaN|-?[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)"
HELP_LINE = re.compile(rf"^# HELP ({NAME}) ((?:[^\\\n]|\\\\|\\n)*)$")
TYPE_LINE = re.compile(rf"^# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)$")
SAMPLE_LINE = re.compile(rf"^({NAME})({LABELS})? ({VALUE})$")


def check_format(text: str) -> dict[str, str]:
    """Every line is HELP, TYPE or a sample of the family declared just before it; histograms
    are cumulative and end at +Inf == _count. Returns family name -> type."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    helped: set[str] = set()
    current: str | None = None
    buckets: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[str, float]]] = {}
    counts: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if m := HELP_LINE.match(line):
            assert m.group(1) not in helped, f"second HELP for {m.group(1)}"
            helped.add(m.group(1))
            current = m.group(1)
            continue
        if m := TYPE_LINE.match(line):
            assert m.group(1) == current, "TYPE must follow its HELP"
            assert m.group(1) not in types
            types[m.group(1)] = m.group(2)
            continue
        m = SAMPLE_LINE.match(line)
        assert m, f"not a sample line: {line!r}"
        assert current is not None
        name = m.group(1)
        kind = types[current]
        if kind == "histogram":
            assert name in (current + "_bucket", current + "_sum", current + "_count"), line
        else:
            assert name == current, f"{name} outside its family {current}"
        if kind == "counter":
            assert name.endswith("_total")
        if name.endswith("_bucket") and kind == "histogram":
            labels = parse_exposition(line)[0].labels
            le = labels.pop("le")
            buckets.setdefault((current, tuple(sorted(labels.items()))), []).append((le, float(m.group(3))))
        if name.endswith("_count") and kind == "histogram":
            counts[(current, tuple(sorted(parse_exposition(line)[0].labels.items())))] = float(m.group(3))
    for key, series in buckets.items():
        bounds = [float(le) for le, _ in series]
        assert bounds == sorted(bounds) and series[-1][0] == "+Inf"
        values = [v for _, v in series]
        assert values == sorted(values), "buckets are cumulative"
        assert values[-1] == counts[key], "+Inf bucket == _count"
    assert set(types) == helped
    return types


def test_counter_lines_and_escaping_read_back() -> None:
    reg = Registry()
    c = reg.counter("demo_events_total", 'Events seen.\nSecond line with a \\ and "quotes".',
                    ["path", "kind"])
    tricky = 'C:\\dir\\"quoted"\nnext line'
    c.labels(tricky, "a").inc()
    c.labels(path="/plain", kind="b").inc(2.5)
    text = reg.exposition()
    lines = text.splitlines()
    assert lines[0] == '# HELP demo_events_total Events seen.\\nSecond line with a \\\\ and "quotes".'
    assert lines[1] == "# TYPE demo_events_total counter"
    assert 'demo_events_total{kind="b",path="/plain"} 2.5' in lines  # labels in name order
    assert 'demo_events_total{kind="a",path="C:\\\\dir\\\\\\"quoted\\"\\nnext line"} 1.0' in lines
    assert not [line for line in lines if "_created" in line]  # prometheus_client's, left out
    assert check_format(text) == {"demo_events_total": "counter"}
    samples = parse_exposition(text)
    assert Sample("demo_events_total", {"path": tricky, "kind": "a"}, 1.0) in samples
    assert sample_value(samples, "demo_events_total", kind="b") == 2.5
    assert sample_value(samples, "demo_events_total") == 3.5
    assert sample_value(samples, "demo_events_total", kind="zzz") is None


def test_label_value_escaping_is_exactly_the_three_sequences() -> None:
    reg = Registry()
    c = reg.counter("esc_total", "x", ["v"])
    c.labels('a\\b"c\nd').inc()
    c.labels("tab\tand ünïcode} {").inc()
    lines = reg.exposition().splitlines()
    assert 'esc_total{v="a\\\\b\\"c\\nd"} 1.0' in lines
    assert 'esc_total{v="tab\tand ünïcode} {"} 1.0' in lines


def test_values_are_what_go_parsefloat_reads() -> None:
    values = (0, 3, -2, 0.5, 0.1, 1e-05, 1e20, math.inf, -math.inf, math.nan)
    reg = Registry()
    g = reg.gauge("v", "x", ["i"])
    for i, v in enumerate(values):
        g.labels(str(i)).set(v)
    text = reg.exposition()
    check_format(text)
    written = {line.split('"')[1]: line.rsplit(" ", 1)[1]
               for line in text.splitlines() if line.startswith("v{")}
    assert [written[str(i)] for i in range(len(values))] == \
        ["0.0", "3.0", "-2.0", "0.5", "0.1", "1e-05", "1e+20", "+Inf", "-Inf", "NaN"]
    for i, v in enumerate(values):  # read back exactly
        got = float(written[str(i)])
        assert got == v or (math.isnan(got) and math.isnan(v))


def test_histogram_buckets_sum_count_and_le_semantics() -> None:
    reg = Registry()
    h = reg.histogram("demo_latency_seconds", "Latency.", ["store"], buckets=[0.1, 1, 0.5])
    child = h.labels("redis")
    for v in (0.05, 0.1, 0.3, 0.5, 2.0):  # 0.1 and 0.5 are on a bound: le counts them there
        child.observe(v)
    text = reg.exposition()
    check_format(text)
    assert [line for line in text.splitlines() if line.startswith("demo_latency_seconds")] == [
        'demo_latency_seconds_bucket{le="0.1",store="redis"} 2.0',
        'demo_latency_seconds_bucket{le="0.5",store="redis"} 4.0',
        'demo_latency_seconds_bucket{le="1.0",store="redis"} 4.0',
        'demo_latency_seconds_bucket{le="+Inf",store="redis"} 5.0',
        'demo_latency_seconds_count{store="redis"} 5.0',
        'demo_latency_seconds_sum{store="redis"} 2.95',
    ]


def test_bucket_bounds_are_written_as_prometheus_clients_are() -> None:
    """The rows buckets' le labels (1e+06: Go's formatting, as every client library writes it)."""
    from features.observe.metrics import ROWS_BUCKETS

    reg = Registry()
    reg.histogram("rows", "x", buckets=ROWS_BUCKETS).observe(3)
    les = [s.labels["le"] for s in parse_exposition(reg.exposition()) if s.name == "rows_bucket"]
    assert les == ["1.0", "10.0", "100.0", "500.0", "1000.0", "2000.0", "5000.0", "10000.0", "50000.0",
                   "100000.0", "131072.0", "500000.0", "1e+06", "+Inf"]


def test_batch_histogram_equals_prometheus_clients_observed_one_by_one() -> None:
    import numpy as np

    values = np.random.default_rng(3).exponential(0.2, 5_000)
    values[::97] = 0.25  # exactly on a bound
    one, many = Registry(), Registry()
    h1 = one.histogram("x_seconds", "x", ["s"], buckets=[0.01, 0.1, 0.25, 1, 1e6])
    h2 = many.batch_histogram("x_seconds", "x", ["s"], buckets=[0.01, 0.1, 0.25, 1, 1e6])
    for v in values.tolist():
        h1.labels("a").observe(v)
    h2.labels("a").observe_many(np.concatenate([values[:1000], [math.nan]]))  # NaN: left out
    h2.labels("a").observe_many(iter(values[1000:].tolist()))
    check_format(many.exposition())
    a, b = parse_exposition(one.exposition()), parse_exposition(many.exposition())
    assert [(s.name, s.labels) for s in a] == [(s.name, s.labels) for s in b]
    for x, y in zip(a, b, strict=True):
        assert x.value == pytest.approx(y.value, rel=1e-12)
    assert many.batch_histogram("x_seconds", "x", ["s"], buckets=[0.01, 0.1, 0.25, 1, 1e6]) is h2
    with pytest.raises(ValueError, match="another definition"):
        many.histogram("x_seconds", "x", ["s"], buckets=[0.01, 0.1, 0.25, 1, 1e6])


def test_gauge_set_inc_and_scrape_time_function() -> None:
    reg = Registry()
    g = reg.gauge("demo_queue_depth", "Depth.", ["queue"])
    g.labels("a").set(5)
    g.labels("a").inc(-2)
    g.labels("b").set_function(lambda: 7.5)
    g.labels("c").set_function(lambda: math.nan)  # "unknown", as RunMetrics' freshness says it
    samples = parse_exposition(reg.exposition())
    assert sample_value(samples, "demo_queue_depth", queue="a") == 3
    assert sample_value(samples, "demo_queue_depth", queue="b") == 7.5
    value = sample_value(samples, "demo_queue_depth", queue="c")
    assert value is not None and math.isnan(value)
    check_format(reg.exposition())
    g.labels("d").set_function(lambda: 1 / 0)  # a callback that raises fails the scrape (documented)
    with pytest.raises(ZeroDivisionError):
        reg.exposition()


def test_unlabelled_families_start_at_zero_and_empty_labelled_ones_have_no_samples() -> None:
    reg = Registry()
    reg.counter("plain_total", "Plain.")
    reg.histogram("plain_seconds", "Plain.", buckets=[1])
    reg.gauge("labelled", "Labelled.", ["x"])
    text = reg.exposition()
    check_format(text)
    assert "plain_total 0.0" in text.splitlines()
    assert 'plain_seconds_bucket{le="+Inf"} 0.0' in text.splitlines()
    assert not [s for s in parse_exposition(text) if s.name == "labelled"]


@pytest.mark.parametrize(("make", "message"), [
    (lambda r: r.counter("no_suffix", "x"), "end in _total"),
    (lambda r: r.gauge("bad-name", "x"), "invalid metric name"),
    (lambda r: r.gauge("ok", "x", ["bad-label"]), "invalid label name"),
    (lambda r: r.gauge("ok", "x", ["__reserved"]), "invalid label name"),
    (lambda r: r.histogram("ok_seconds", "x", ["le"]), "invalid label name"),
    (lambda r: r.gauge("ok", "x", ["a", "a"]), "duplicate label"),
    (lambda r: r.histogram("ok_seconds", "x", buckets=[]), "buckets"),
])
def test_invalid_definitions_raise(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(Registry())  # type: ignore[operator]


def test_registry_returns_the_same_family_or_refuses_another_definition() -> None:
    reg = Registry()
    a = reg.counter("shared_total", "x", ["schema"])
    assert reg.counter("shared_total", "x", ["schema"]) is a
    with pytest.raises(ValueError, match="another definition"):
        reg.counter("shared_total", "x", ["schema", "more"])
    with pytest.raises(ValueError, match="another definition"):
        reg.gauge("shared_total", "x", ["schema"])
    reg.counter("clash_total", "x")
    with pytest.raises(ValueError, match="Duplicated timeseries"):  # prometheus_client's own check
        reg.gauge("clash", "x")


def test_labels_and_counters_refuse_misuse() -> None:
    c = Registry().counter("c_total", "x", ["a", "b"])
    with pytest.raises(ValueError, match="label count"):
        c.labels("only one")
    with pytest.raises(ValueError, match="label names"):
        c.labels(a="1", c="2")
    with pytest.raises(ValueError, match="non-negative"):
        c.labels("1", "2").inc(-1)


def test_concurrent_increments_are_all_counted() -> None:
    reg = Registry()
    c = reg.counter("racy_total", "x", ["t"])
    h = reg.histogram("racy_seconds", "x", buckets=[0.5])

    def work(i: int) -> None:
        for _ in range(5_000):
            c.labels(str(i % 2)).inc()
            h.observe(0.1)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    samples = parse_exposition(reg.exposition())
    assert sample_value(samples, "racy_total") == 20_000
    assert sample_value(samples, "racy_seconds_count") == 20_000


def test_endpoint_serves_the_exposition_and_frees_its_port() -> None:
    reg = Registry()
    reg.counter("served_total", "x").inc(3)
    server = serve(reg, 0)
    try:
        assert server.url == f"http://127.0.0.1:{server.port}/metrics"
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read().decode()
        assert resp.status == 200
        assert resp.getheader("Content-Type") == CONTENT_TYPE
        assert body == reg.exposition()
        conn.request("GET", "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        resp = conn.getresponse()
        body = resp.read().decode()
        assert resp.getheader("Content-Type", "").startswith("application/openmetrics-text")
        assert body.endswith("# EOF\n") and "served_total 3.0" in body and "_created" not in body
        conn.close()
    finally:
        server.close()
    server.close()  # idempotent
    with socket.socket() as s:  # the port is free again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", server.port))


def test_endpoint_serves_a_text_source_as_read_at_each_scrape() -> None:
    """The stream job serves its subtasks' saved final values (features.flink.stream)."""
    reg = Registry()
    RunMetrics(reg, "s", stream=True).unit(read=5, stored=4, rejected=1, already_present=0,
                                           by_rule={"income.min": 1})
    text = reg.exposition()
    server = serve(functools.partial(str, text), 0)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read().decode()
        conn.close()
    finally:
        server.close()
    assert resp.status == 200 and resp.getheader("Content-Type") == CONTENT_TYPE
    check_format(body)
    assert parse_exposition(body) == parse_exposition(text)


def test_first_free_port_skips_a_taken_one_and_gives_up_quietly() -> None:
    reg = Registry()
    taken = serve(reg, 0)
    try:
        with pytest.raises(OSError):
            serve(reg, taken.port)
        assert serve_first_free(reg, range(taken.port, taken.port + 1)) is None
        other = serve_first_free(reg, range(taken.port, taken.port + 50))
        assert other is not None and other.port != taken.port
        other.close()
    finally:
        taken.close()


def test_run_metrics_count_rejects_by_field_and_rule_and_freshness_once_written() -> None:
    reg = Registry()
    m = RunMetrics(reg, "s")
    samples = parse_exposition(reg.exposition())
    assert sample_value(samples, "featureline_rows_read_total", schema="s") == 0
    assert sample_value(samples, "featureline_freshness_seconds") is None  # nothing written yet
    m.unit(read=10, stored=6, rejected=3, already_present=1,
           by_rule={"income.min": 2, "income.not_null": 1, "_payload.decode": 1})
    m.event_time(dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp())
    m.event_time(dt.datetime(2023, 1, 1, tzinfo=dt.UTC).timestamp())  # older: the newest stays
    m.write("postgres", 0.02)
    text = reg.exposition()
    types = check_format(text)
    assert "featureline_consumer_lag" not in types  # the stream's own only with stream=True
    s = parse_exposition(text)
    assert sample_value(s, "featureline_rejects_total", field="income", rule="income.min") == 2
    assert sample_value(s, "featureline_rejects_total", field="_payload", rule="_payload.decode") == 1
    assert sample_value(s, "featureline_newest_event_time_seconds") == 1704067200
    fresh = sample_value(s, "featureline_freshness_seconds", schema="s")
    assert fresh is not None and fresh > 0
    assert sample_value(s, "featureline_write_seconds_count", store="postgres") == 1
    assert sample_value(s, "featureline_batch_rows_sum") == 10


def test_stream_and_sdk_metrics_have_their_names() -> None:
    reg = Registry()
    m = RunMetrics(reg, "s", stream=True)
    m.lag("topic.a", 1, 42)
    m.latency([0.2, 0.3])
    m.dead_letters(2)
    sdk = SdkMetrics(reg)
    sdk.lookup("s", "online", 0.001, entities=3, fallback=1, missed=1)
    sdk.error("s", "historical")
    text = reg.exposition()
    types = check_format(text)
    assert types["featureline_consumer_lag"] == "gauge"
    assert types["featureline_sdk_lookup_seconds"] == "histogram"
    s = parse_exposition(text)
    assert sample_value(s, "featureline_consumer_lag", topic="topic.a", partition="1") == 42
    assert sample_value(s, "featureline_produce_to_stored_seconds_count") == 2
    assert sample_value(s, "featureline_dead_letters_total") == 2
    assert sample_value(s, "featureline_sdk_lookups_total", method="online") == 3
    assert sample_value(s, "featureline_sdk_errors_total", method="historical") == 1


# --------------------------------------------------------------------------- runner wiring


def test_runner_accounting_and_metrics_agree(tmp_path: Path) -> None:
    from features.config import Settings
    from features.kernels import transform_program
    from features.lineage import RunContext
    from features.ops.examples import applicant_schema, applicants
    from features.pipeline.run import run
    from features.sources.parquet import ParquetSource

    compiled = applicant_schema()
    path = tmp_path / "a.parquet"
    table = applicants(3_000, seed=5)
    pq.write_table(pa.concat_tables([table, table.slice(0, 200)]), path, row_group_size=800)
    entity, event_time = str(compiled.schema.entity), str(compiled.schema.event_time)
    cold, hot = MemorySink("postgres", entity, event_time), MemorySink("redis", entity, event_time)
    reg = Registry()
    metrics = RunMetrics(reg, compiled.name)
    program = transform_program(compiled, Settings(device="cpu"))
    summaries = []
    for _ in range(2):  # the second run: every unit already committed
        ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "r",
                         dt.datetime.now(dt.UTC))
        summaries.append(run(ParquetSource([path], compiled, batch_rows=500), compiled, [cold, hot], ctx=ctx,
                             program=program, metrics=metrics))
    first, second = summaries
    assert first.rejected > 0 and first.already_present > 0 and second.skipped_units == second.units
    s = parse_exposition(reg.exposition())
    for name, attr in (("read", "read"), ("stored", "stored"), ("rejected", "rejected"),
                       ("already_present", "already_present")):
        total = getattr(first, attr) + getattr(second, attr)
        assert sample_value(s, f"featureline_rows_{name}_total", schema=compiled.name) == total, name
    by_rule = {x.labels["rule"]: x.value for x in s if x.name == "featureline_rejects_total"}
    assert by_rule == {k: float(v) for k, v in (first.by_rule + second.by_rule).items()}
    assert all(x.labels["rule"].startswith(x.labels["field"] + ".") for x in s
               if x.name == "featureline_rejects_total")
    assert sample_value(s, "featureline_batch_rows_count") == first.units + second.units
    assert sample_value(s, "featureline_write_seconds_count", store="postgres") == first.units
    newest = max(t for _, t in cold.keys)  # the newest event time written
    assert isinstance(newest, dt.datetime)
    assert sample_value(s, "featureline_newest_event_time_seconds") == newest.timestamp()
