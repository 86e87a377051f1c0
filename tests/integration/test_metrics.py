"""Metrics and logs against the real stores: the loader's endpoint scraped over HTTP
while and after it runs, the SDK's counters after real lookups, ``features load
--log-format json`` in its own process, and one bounded stream job's endpoint.

Every expected number comes from the run's own summary or from the stores, never from
the metrics code."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from conftest import cli_environment

from features import FeatureStore
from features.compile import CompiledSchema
from features.compile.layout import entity_key
from features.config import Settings
from features.load import load
from features.observe.metrics import Registry, RunMetrics, Sample, parse_exposition, sample_value, serve
from features.ops.examples import applicant_events, applicant_schema, applicants, click_history, clicks_schema

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[2]
NAME = "credit_applicant"
#: The subprocess tests' own Redis database (the CLI has no key prefix), flushed by them.
CLI_REDIS_DB = 12


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return applicant_schema()


def scrape(port: int) -> list[Sample]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read().decode()
        assert resp.status == 200, body
        assert resp.getheader("Content-Type", "").startswith("text/plain; version=0.0.4")
        return parse_exposition(body)
    finally:
        conn.close()


def value(samples: list[Sample], name: str, **labels: str) -> float:
    got = sample_value(samples, name, **labels)
    assert got is not None, f"no sample {name}{labels}"
    return got


def free_port(span: int = 1) -> int:
    """A port P with P .. P+span-1 free right now."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        try:
            for p in range(port, port + span):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port


def rejects_by_rule(samples: list[Sample], schema: str) -> dict[str, int]:
    return {s.labels["rule"]: int(s.value) for s in samples
            if s.name == "featureline_rejects_total" and s.labels["schema"] == schema}


def test_load_metrics_over_http_equal_the_summary(tmp_path: Path, settings: Settings,
                                                  compiled: CompiledSchema, pg_schema: str,
                                                  redis_prefix: str) -> None:
    paths = []
    for i in range(2):
        path = tmp_path / f"part-{i}.parquet"
        pq.write_table(applicants(6_000, seed=21 + i, first_id=10**9 + i * 6_000), path, row_group_size=1_500)
        paths.append(path)
    registry = Registry()
    metrics = RunMetrics(registry, NAME)
    server = serve(registry, 0)
    seen: list[float] = []
    stop = threading.Event()

    def scraper() -> None:  # scrapes while the load runs: counters only ever go up
        while True:
            seen.append(value(scrape(server.port), "featureline_rows_read_total", schema=NAME))
            if stop.wait(0.01):
                return

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        summary = load(paths, compiled, settings, batch_rows=1_000, search_path=pg_schema,
                       key_prefix=redis_prefix, metrics=metrics)
    finally:
        stop.set()
        thread.join()
    try:
        after = scrape(server.port)
        again = load(paths, compiled, settings, batch_rows=1_000, search_path=pg_schema,
                     key_prefix=redis_prefix, metrics=metrics)  # every batch committed: all already present
        rerun = scrape(server.port)
    finally:
        server.close()

    assert summary.adds_up and summary.rejected > 0 and summary.stored > 0
    assert seen and seen == sorted(seen) and seen[-1] <= summary.read
    for name in ("read", "stored", "rejected", "already_present"):
        assert value(after, f"featureline_rows_{name}_total", schema=NAME) == getattr(summary, name), name
    assert rejects_by_rule(after, NAME) == dict(summary.by_rule)
    assert sum(rejects_by_rule(after, NAME).values()) >= summary.rejected  # a row may fail several rules
    assert value(after, "featureline_batch_rows_count", schema=NAME) == summary.units
    assert value(after, "featureline_batch_rows_sum", schema=NAME) == summary.read
    for store in ("postgres", "redis"):
        assert value(after, "featureline_write_seconds_count", schema=NAME, store=store) == summary.units
        assert value(after, "featureline_write_seconds_sum", schema=NAME, store=store) == pytest.approx(
            summary.sinks[store].seconds)
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        newest = conn.execute("SELECT max(submitted_at) FROM credit_applicant").fetchone()[0]
    assert value(after, "featureline_newest_event_time_seconds", schema=NAME) == newest.timestamp()
    assert value(after, "featureline_freshness_seconds", schema=NAME) >= time.time() - newest.timestamp() - 5

    assert again.skipped_units == again.units and again.already_present == again.read
    assert value(rerun, "featureline_rows_read_total", schema=NAME) == summary.read + again.read
    assert value(rerun, "featureline_rows_stored_total", schema=NAME) == summary.stored
    assert value(rerun, "featureline_rows_already_present_total", schema=NAME) == \
        summary.already_present + again.read


def test_load_counts_aggregation_outcomes(tmp_path: Path, settings: Settings, pg_schema: str,
                                          redis_prefix: str) -> None:
    path = tmp_path / "clicks.parquet"
    pq.write_table(click_history(6_000, seed=9, users=150), path)
    registry = Registry()
    summary = load([path], clicks_schema(), settings, search_path=pg_schema, key_prefix=redis_prefix,
                   metrics=RunMetrics(registry, "clicks"))
    agg = summary.aggregations
    # a backfill has no late events (lateness is the stream's); its duplicates are counted
    assert agg is not None and agg["adds_up"] and agg["late"] == 0 and agg["duplicates"] > 0
    samples = parse_exposition(registry.exposition())
    for outcome, key in (("accepted", "accepted"), ("late", "late"), ("duplicate", "duplicates")):
        assert value(samples, "featureline_aggregation_events_total", schema="clicks",
                     outcome=outcome) == agg[key], outcome


@pytest.fixture()
def loaded(tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str,
           redis_prefix: str) -> list[str]:
    """The example applicants loaded by the batch loader; returns the stored ids."""
    path = tmp_path / "applicants.parquet"
    pq.write_table(applicants(1_000, seed=13), path)
    summary = load([path], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert summary.adds_up and summary.stored > 900
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        return [r[0] for r in conn.execute("SELECT DISTINCT application_id FROM credit_applicant "
                                           "ORDER BY 1").fetchall()]


def test_sdk_counts_lookups_fallbacks_and_misses(loaded: list[str], settings: Settings, pg_schema: str,
                                                 redis_prefix: str) -> None:
    import asyncio
    import datetime as dt

    from features.errors import ConfigError

    evicted, in_redis = loaded[:7], loaded[7:27]
    unknown = ["APP-999999999999", "APP-999999999998", None]
    client = redis.Redis.from_url(settings.redis_url)
    client.delete(*[redis_prefix + entity_key(NAME, i) for i in evicted])
    client.close()
    # fill=False: every call below that misses Redis must take the fallback (a fill would
    # turn the later calls for the same ids into Redis hits)
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=ROOT / "schemas", search_path=pg_schema, key_prefix=redis_prefix,
                      metrics_port=0, fill=False) as fs:
        assert fs.metrics_server is not None
        port = fs.metrics_server.port
        got = fs.online(NAME, [*in_redis, *evicted, *unknown])
        assert got.column("_from").to_pylist().count("postgres") == len(evicted)  # the stores' view
        fs.online(NAME, in_redis[:3], fallback=False)
        # a second store counting into the same registry (an application sharing one)
        other = FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                             schemas=ROOT / "schemas", search_path=pg_schema, key_prefix=redis_prefix,
                             registry=fs.registry, fill=False)

        async def lookup_async() -> None:
            try:
                await other.online_async(NAME, [*evicted[:2], unknown[0]])
            finally:
                await other.aclose()

        asyncio.run(lookup_async())
        entity_df = pa.table({"application_id": [in_redis[0], unknown[0]],
                              "timestamp": pa.array([dt.datetime(2100, 1, 1, tzinfo=dt.UTC)] * 2,
                                                    pa.timestamp("us", "UTC"))})
        fs.historical(NAME, entity_df, ["income_monthly"])
        with pytest.raises(ConfigError):
            fs.online(NAME, in_redis[:1], ["no_such_feature"])
        samples = scrape(port)
        assert parse_exposition(fs.metrics()) == samples  # the text the application can serve itself
    with pytest.raises(OSError):  # close() stopped the endpoint
        scrape(port)

    def v(name: str, method: str) -> float:
        return value(samples, name, schema=NAME, method=method)

    assert v("featureline_sdk_lookups_total", "online") == len(in_redis) + len(evicted) + len(unknown) + 3
    assert v("featureline_sdk_fallback_total", "online") == len(evicted)
    assert v("featureline_sdk_miss_total", "online") == len(unknown)
    assert v("featureline_sdk_lookup_seconds_count", "online") == 2
    assert v("featureline_sdk_errors_total", "online") == 1
    assert v("featureline_sdk_lookups_total", "online_async") == 3
    assert v("featureline_sdk_fallback_total", "online_async") == 2
    assert v("featureline_sdk_miss_total", "online_async") == 1
    assert v("featureline_sdk_lookups_total", "historical") == 2
    assert v("featureline_sdk_miss_total", "historical") == 1
    assert v("featureline_sdk_lookup_seconds_count", "historical") == 1


@pytest.fixture()
def cli_env(settings: Settings, pg_schema: str) -> Iterator[dict[str, str]]:
    """Environment for a CLI subprocess: the test's Postgres schema, Redis database CLI_REDIS_DB."""
    with cli_environment(settings, pg_schema, CLI_REDIS_DB) as env:
        yield env


def _sigint_as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_cli_load_json_logs_and_lingering_endpoint(tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = tmp_path / "applicants.parquet"
    pq.write_table(applicants(2_500, seed=17), path, row_group_size=1_000)
    port = free_port()
    cmd = [sys.executable, "-m", "features.cli", "load", "--schema", NAME, str(path), "--json",
           "--metrics-port", str(port), "--metrics-linger-s", "600", "--log-format", "json"]
    # SIGINT as a terminal would send it: a test run started as a background job of a
    # non-interactive shell (`make test &`) has SIGINT ignored, a supervisor may have it
    # blocked, and children inherit both (exec keeps the mask)
    # PYTHONFAULTHANDLER: should it hang after all, SIGABRT makes it print every thread's stack
    with subprocess.Popen(cmd, env={**cli_env, "PYTHONFAULTHANDLER": "1"}, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          preexec_fn=_sigint_as_from_a_terminal) as proc:
        err_lines: list[str] = []
        assert proc.stderr is not None and proc.stdout is not None
        for line in proc.stderr:  # until the load is done and the endpoint lingers
            err_lines.append(line)
            if "metrics: serving" in line:
                break
        assert proc.poll() is None, "".join(err_lines)
        samples = scrape(port)  # after the run, before the process ends
        proc.send_signal(signal.SIGINT)  # end the linger
        try:
            out, rest = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out, rest = proc.communicate(timeout=30)
            pytest.fail("SIGINT did not end the linger within 60 s; stacks at SIGABRT:\n" + "".join(err_lines)
                        + rest)
    err_lines += rest.splitlines(keepends=True)
    assert proc.returncode == 130, "".join(err_lines)
    summary = json.loads(out)
    logged = [json.loads(line) for line in err_lines]  # every stderr line is one JSON object
    assert logged and all(o["run_id"] == summary["run_id"] for o in logged)
    assert all({"ts", "level", "logger", "message"} <= set(o) for o in logged)
    finished = [o for o in logged if o["message"] == "load finished"]
    assert len(finished) == 1 and finished[0]["read"] == summary["read"] == 2_500
    assert logged[-1]["message"] == "features load: interrupted"
    for name in ("read", "stored", "rejected", "already_present"):
        assert value(samples, f"featureline_rows_{name}_total", schema=NAME) == summary[name], name
    by_rule = rejects_by_rule(samples, NAME)  # the summary lists the top 10 rules
    assert summary["top_reasons"] and all(by_rule[r["rule"]] == r["count"] for r in summary["top_reasons"])


def test_cli_metrics_port_taken_is_a_usage_error(tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = tmp_path / "applicants.parquet"
    pq.write_table(applicants(10, seed=17), path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "features.cli", "--log-format", "json", "load",
                               "--schema", NAME, str(path), "--metrics-port", str(port)], env=cli_env,
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    obj = json.loads(line)
    assert obj["level"] == "ERROR" and obj["error"] == "ConfigError" and f":{port}" in obj["message"]


# --------------------------------------------------------------------------- the stream


@pytest.mark.flink
def test_bounded_stream_serves_its_metrics(settings: Settings, stream_topic: str, cli_env: dict[str, str],
                                           tmp_path: Path) -> None:
    from features.stream.kafka import entity_keys, produce

    values = applicant_events(400, seed=3, undecodable_every=50)
    produce(settings.kafka_bootstrap, stream_topic, values, keys=entity_keys(values, "application_id"))
    port = free_port(2)  # parallelism 2: one endpoint per subtask, on port and port + 1
    cmd = [sys.executable, str(ROOT / "jobs" / "stream_job.py"), "--schema", NAME, "--topic", stream_topic,
           "--bounded", "--restart-attempts", "0", "--state-dir", str(tmp_path / "state"), "--json",
           "--batch-size", "100", "--parallelism", "2", "--metrics-port", str(port),
           "--metrics-linger-s", "5", "--log-format", "json", "--log-every-s", "0"]
    proc = subprocess.Popen(cmd, env=cli_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    scrapes: list[list[Sample]] = []
    stop = threading.Event()

    def scraper() -> None:  # while the job runs: the first subtask's own endpoint
        while not stop.wait(0.2):
            try:
                scrapes.append(scrape(port))
            except OSError:
                pass  # not serving yet (the JVM and the Python worker start), or between the two servers

    thread = threading.Thread(target=scraper)
    thread.start()
    err: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)
            if "serving the subtasks' final values" in line:  # the job ended; the client lingers
                break
        stop.set()
        thread.join()
        assert proc.poll() is None, "".join(err)[-4000:]
        first, second = scrape(port), scrape(port + 1)  # the final values, served by the client
        out, rest = proc.communicate(timeout=120)  # after the linger
        err.append(rest)
    finally:
        stop.set()
        thread.join()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    job_log = "".join(err)
    assert proc.returncode == 0, job_log[-4000:]
    summary = json.loads(out)
    assert summary["read"] == len(values) and summary["adds_up"]
    reads = [value(s, "featureline_rows_read_total", schema=NAME) for s in [*scrapes, first]]
    assert reads == sorted(reads)
    final = [*first, *second]  # sample_value sums the two subtasks' series
    assert value(first, "featureline_rows_read_total", schema=NAME) > 0
    assert value(second, "featureline_rows_read_total", schema=NAME) > 0
    for name in ("read", "stored", "rejected", "already_present"):
        assert value(final, f"featureline_rows_{name}_total", schema=NAME) == summary[name], name
    by_rule: dict[str, int] = {}
    for s in final:
        if s.name == "featureline_rejects_total":
            by_rule[s.labels["rule"]] = by_rule.get(s.labels["rule"], 0) + int(s.value)
    assert by_rule == summary["by_rule"]
    assert value(final, "featureline_dead_letters_total", schema=NAME) == summary["dead_letters"] > 0
    assert value(final, "featureline_produce_to_stored_seconds_count", schema=NAME) == len(values)
    assert value(final, "featureline_batch_rows_sum", schema=NAME) == len(values)
    lags = [s for s in final if s.name == "featureline_consumer_lag"]
    assert {(s.labels["topic"], s.labels["partition"]) for s in lags} == {(stream_topic, "0"),
                                                                          (stream_topic, "1")}
    assert all(s.value == 0 for s in lags)
    assert value(first, "featureline_freshness_seconds", schema=NAME) > 0
    # our own lines are JSON with the run id (the JVM's own output is not ours)
    ours = [json.loads(line) for line in job_log.splitlines() if line.startswith('{"ts"')]
    (submitting,) = [o for o in ours if o["message"] == "stream: submitting"]
    assert submitting["topic"] == stream_topic
    # the topic the dead letters went to, not null (the default, resolved)
    assert submitting["dead_letter_topic"] == f"{stream_topic}.rejects"
    # a status line per micro-batch (--log-every-s 0), fields merged in, from both subtasks
    last: dict[str, int] = {}
    for o in ours:
        if o["message"] == "stream":
            last[o["instance"]] = max(last.get(o["instance"], 0), o["read"])
    assert len(last) == 2 and sum(last.values()) == len(values)
    # "stream finished" comes from the worker's close(), which Flink does not always let finish
    finished = [o for o in ours if o["message"] == "stream finished"]
    assert len(finished) <= 2 and all(o["read"] == last[o["instance"]] for o in finished)
    assert all(o["run_id"] == summary["run_id"] for o in ours)
