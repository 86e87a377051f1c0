"""The PyFlink streaming job: Kafka -> micro-batches -> the batch loader's core -> stores.

Pipeline (Table API, so each record keeps its Kafka metadata)::

    Kafka topic --(connector: value BYTES + topic, partition, offset, timestamp)-->
      featureline_process(...)   a vectorised (pandas) Python UDF: one call per micro-batch
        -> features.stream.core.StreamProcessor.process  (validate, transform, write)
      --> blackhole

**Micro-batches.** Flink's Python runner hands the UDF Arrow batches of at most
``batch_size`` records (``python.fn-execution.arrow.batch.size`` and ``bundle.size``)
and at most ``max_wait_ms`` old (``python.fn-execution.bundle.time``).

**Effectively once.** Before a checkpoint barrier passes a Python operator, Flink
finishes the open bundle (``prepareSnapshotPreBarrier`` -> ``invokeFinishBundle``): the
UDF has returned for every record before the barrier, and it returns only after the
micro-batch is written to both stores and the dead-letter topic. The operator keeps no
state of its own, so a checkpoint's only state is the Kafka offsets, and the source
commits them to the consumer group when the checkpoint completes. After a failure
the job resumes from the last checkpoint (``--from-checkpoint``, or the group offsets,
which the source committed with that checkpoint): the records after it are replayed,
and the idempotent writes make the replay a no-op.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from features.compile import compile_schema
from features.config import Device, Settings, env_var, redact
from features.errors import ConfigError, GateBreached
from features.flink.connector import kafka_connector_jar
from features.flink.env import environment, python_executables, restart_strategy, scrub_environment
from features.home import CONFIG_FILE
from features.observe.logs import fields, has_handler, set_run_id, setup_logging
from features.observe.metrics import (
    MetricsServer,
    Registry,
    RunMetrics,
    serve_first_free,
    sleep_interruptibly,
)
from features.schema import load_schema
from features.sources.records import SOURCE_HEADER, TopCounter
from features.stream.core import StreamProcessor

log = logging.getLogger("features.stream")

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """Everything the job needs; plain values so the UDF can be shipped to workers.

    The credentials (in the DSN, the URL and the Kafka properties) travel to the Python
    workers inside the pickled UDF, never through their environment (see
    :func:`features.flink.env.scrub_environment`); ``repr()`` leaves them out.
    """

    schema_path: str
    topic: str
    bootstrap: str
    postgres_dsn: str = dataclasses.field(repr=False)
    redis_url: str = dataclasses.field(repr=False)
    device: Device = "auto"
    group_id: str | None = None
    dead_letter_topic: str | None = None      # None: "<topic>.rejects"; "" disables it
    batch_size: int = 16000                   # bench/RESULTS.md (stream): throughput and latency
    max_wait_ms: int = 200
    parallelism: int = 1
    checkpoint_interval_ms: int = 5000
    checkpoint_dir: str | None = None
    from_checkpoint: str | None = None
    bounded: bool = False
    startup: str = "group-offsets"            # or "earliest-offset" / "latest-offset"
    run_id: str = ""
    summary_dir: str | None = None
    search_path: str | None = None
    key_prefix: str = ""
    restart_attempts: int = 3
    log_every_s: float = 10.0
    #: librdkafka properties of the dead-letter producer and the lag consumer (``Settings``)
    kafka_properties: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False, hash=False)
    #: Java client properties of the Flink Kafka source, as ``'properties.<name>'`` options
    kafka_java_properties: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False,
                                                                 hash=False)
    #: Prometheus endpoint of each subtask's Python worker: the first free port of
    #: N .. N+parallelism-1 (docs/operations.md); None: no endpoint
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: > 0: each subtask also saves its metrics for the client, which serves their final values
    #: this many seconds after the job ends (:func:`serve_final_metrics`)
    metrics_linger_s: float = 0.0
    #: ``text``/``json`` for the workers' log lines; None: ``FEATURES_LOG_FORMAT``, else text
    log_format: str | None = None
    #: the REST address (``host:port``) of a running Flink cluster to submit to
    #: (``features stream --cluster``); None: a mini-cluster in this process, or the cluster
    #: ``flink run`` chose
    cluster: str | None = None

    @property
    def group(self) -> str:
        return self.group_id or default_group_id(self.schema_path, self.topic)

    @property
    def dlq(self) -> str | None:
        if self.dead_letter_topic == "":
            return None
        return self.dead_letter_topic or f"{self.topic}.rejects"

    def check(self) -> None:
        for name, value in (("topic", self.topic), ("dead-letter topic", self.dlq)):
            if value is not None and not _TOPIC.match(value):
                raise ConfigError(f"{name} {value!r} is not a valid Kafka topic name "
                                  "(letters, digits, '.', '_', '-'; at most 249)", key=name)
        numbers = {"batch size": self.batch_size, "max wait ms": self.max_wait_ms,
                   "parallelism": self.parallelism, "checkpoint interval ms": self.checkpoint_interval_ms}
        for label, number in numbers.items():
            if number < 1:
                raise ConfigError(f"{label} must be >= 1, got {number}", key=label)
        if self.bounded and self.from_checkpoint:
            # FLINK-31006 (open in flink-connector-kafka 5.0.0): a bounded KafkaSource restored
            # from a checkpoint reads to its stopping offsets and then never finishes.
            raise ConfigError(
                "--bounded with --from-checkpoint never finishes (Kafka connector bug FLINK-31006: a "
                "restored bounded source never signals its end). Restart a bounded job without "
                "--from-checkpoint: it resumes from the consumer group's offsets, which the source "
                "committed with the last completed checkpoint", key="from_checkpoint")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535 - 2 * self.parallelism:
            raise ConfigError(f"metrics port {self.metrics_port}: the job needs ports up to metrics port + "
                              f"2 x parallelism ({2 * self.parallelism}) within 0..65535", key="metrics_port")
        if self.log_format not in (None, "text", "json"):
            raise ConfigError(f"log format {self.log_format!r}: expected text or json", key="log_format")
        if self.startup not in ("group-offsets", "earliest-offset", "latest-offset"):
            raise ConfigError(f"startup mode {self.startup!r}: expected group-offsets, earliest-offset "
                              "or latest-offset", key="startup")
        protocol = self.kafka_properties.get("security.protocol", "plaintext")
        if protocol.lower() != "plaintext" and "security.protocol" not in self.kafka_java_properties:
            # the two clients name some settings differently: no silent translation
            raise ConfigError(
                f"the Kafka clients use security.protocol {protocol} ({env_var('kafka_properties')}), "
                f"but the Flink Kafka connector (a Java client) has none: set "
                f"{env_var('kafka_java_properties')} (Java property names, e.g. sasl.jaas.config, "
                "ssl.truststore.location; see docs/security.md)", key="kafka_java_properties")


def default_group_id(schema_path: str, topic: str) -> str:
    """The consumer group of a stream given no ``--group-id``:
    ``featureline-<project>-<8 hex>-<schema>-<topic>``, where the project is the nearest
    folder at or above the schema file holding ``featureline.toml`` (else the schema
    file's folder) and the hex is a digest of its absolute path. So two projects on one
    broker, or one schema read from two topics, never share offsets; the same project,
    schema and topic always get the same group (it depends on the schema file's place,
    never on the current folder)."""
    schema = Path(schema_path).absolute()
    folders = schema.parents
    project = next((f for f in folders if (f / CONFIG_FILE).is_file()), schema.parent)
    tag = hashlib.sha256(str(project).encode()).hexdigest()[:8]
    return f"featureline-{project.name or 'root'}-{tag}-{schema.stem}-{topic}"


def redacted(cfg: StreamConfig) -> dict[str, Any]:
    """``cfg`` as plain values with every credential masked (``features.config.redact``):
    what the job logs. The defaults the job resolves itself are shown resolved: the
    ``dead_letter_topic`` it writes to (``<topic>.rejects`` unless given; null: disabled)
    and its consumer ``group_id``."""
    out = dataclasses.asdict(cfg)
    out["dead_letter_topic"], out["group_id"] = cfg.dlq, cfg.group
    for name in ("postgres_dsn", "redis_url", "kafka_properties", "kafka_java_properties"):
        out[name] = redact(getattr(cfg, name))
    return out


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# --------------------------------------------------------------------------- the UDF


def _as_bytes(values: list[Any]) -> list[bytes | None]:
    """A BYTES column's values as bytes or None (copied only when some are not bytes)."""
    if not set(map(type, values)) <= {bytes, type(None)}:  # map/set: C-level, no copy
        return [None if v is None else bytes(v) for v in values]
    return values


def _make_udf(cfg: StreamConfig) -> Any:
    # pyflink: heavy, and only a Flink job needs it (no other entry point loads it)
    from pyflink.table import DataTypes
    from pyflink.table.udf import FunctionContext, ScalarFunction, udf

    class FeaturelineProcess(ScalarFunction):  # type: ignore[misc]  # untyped base class
        """One call per micro-batch; see features.stream.core.StreamProcessor."""

        def __init__(self, config: StreamConfig) -> None:
            self.cfg = config
            self.proc: Any = None
            self.server: Any = None
            self.metrics: Any = None

        def open(self, function_context: FunctionContext) -> None:
            c = self.cfg
            _log_setup(c.log_format, c.run_id)
            compiled = compile_schema(load_schema(c.schema_path))
            settings = Settings(postgres_dsn=c.postgres_dsn, redis_url=c.redis_url,
                                kafka_bootstrap=c.bootstrap, kafka_properties=dict(c.kafka_properties),
                                device=c.device)
            self.instance = uuid.uuid4().hex[:8]
            self.metrics, self.server = _metrics_endpoint(c, compiled.name)
            self.proc = StreamProcessor(compiled, settings, run_id=c.run_id, dead_letter_topic=c.dlq,
                                        search_path=c.search_path, key_prefix=c.key_prefix,
                                        log_every_s=c.log_every_s, instance=self.instance,
                                        metrics=self.metrics)
            self.proc.open()
            self._save()  # a subtask that never gets a record still reports its zeros
            s = self.proc.stats.summary
            group = function_context.get_metric_group().add_group("featureline")
            for name in ("read", "stored", "rejected", "already_present"):
                group.gauge(name, lambda n=name: int(getattr(s, n)))
            group.gauge("lag", lambda: int(sum(self.proc.stats.lag.values())))

        def eval(self, value: Any, topic: Any, partition: Any, offset: Any, ts: Any, via: Any) -> Any:
            return pd.Series(self._process(value, topic, partition, offset, ts, via).astype("int32"))

        def _process(self, value: Any, topic: Any, partition: Any, offset: Any, ts: Any, via: Any) -> Any:
            values = _as_bytes(value.tolist())  # the BYTES column as Python objects
            stamps = pd.to_datetime(ts, utc=True)
            epoch = pd.Timestamp(0, tz="UTC")
            ms = ((stamps - epoch) // pd.Timedelta(milliseconds=1)).to_numpy(dtype=np.int64)
            try:
                out = self.proc.process(values, pa.array(topic, pa.string(), from_pandas=True),
                                        pa.array(partition, pa.int32(), from_pandas=True),
                                        pa.array(offset, pa.int64(), from_pandas=True), ms,
                                        pa.array(_as_bytes(via.tolist()), pa.binary()))
            except GateBreached:
                # the breaker tripped: its record (message, offsets) reaches the client through
                # the summary; raising fails the bundle, so no checkpoint covers this micro-batch
                self._save()
                raise
            self._save()
            return out

        def _save(self) -> dict[str, Any]:
            """This subtask's counts so far, replaced atomically after every micro-batch:
            the worker's close() is not always called when a job ends (or is killed)."""
            stats: dict[str, Any] = self.proc.stats.as_dict()
            if self.cfg.summary_dir:
                out = Path(self.cfg.summary_dir)
                out.mkdir(parents=True, exist_ok=True)
                tmp = out / f".{self.cfg.run_id}-{self.instance}.json.tmp"
                tmp.write_text(json.dumps(stats, default=str))
                tmp.rename(out / f"{self.cfg.run_id}-{self.instance}.json")
            save_exposition(self.cfg, f"{self.cfg.run_id}-{self.instance}", self.server, self.metrics)
            return stats

        def close(self) -> None:
            if self.proc is None:
                return

            # Flink may end this worker soon after the job ends: a short lag query, so
            # that the summary and this line come out (the lag is also refreshed with
            # every status line, see --log-every-s).
            self.proc.update_lag(timeout=1.0)
            log.info("stream finished", extra=fields({**self._save(), "instance": self.instance}))
            self.proc.close()
            if self.server is not None:
                self.server.close()
                self.server = None

    return udf(FeaturelineProcess(cfg), result_type=DataTypes.INT(), func_type="pandas")


def _log_setup(fmt: str | None = None, run_id: str | None = None) -> None:
    """The ``features`` loggers' lines on stderr (a Python worker's go to Flink's task
    manager log), in ``fmt`` (else ``FEATURES_LOG_FORMAT``, else text), with ``run_id``;
    left alone when the CLI already set logging up in this process."""
    if run_id:
        set_run_id(run_id)
    if not has_handler("features"):
        setup_logging(fmt, logger="features")


def save_exposition(cfg: StreamConfig, name: str, server: Any, metrics: Any) -> None:
    """With ``metrics_linger_s``: a subtask's metrics as last rendered, and its port, in
    ``<summary_dir>/<name>.prom`` (replaced atomically after every micro-batch), for
    :func:`serve_final_metrics`. A Python worker cannot linger itself: Flink ends its
    process soon after the job ends."""
    if server is None or metrics is None or not cfg.summary_dir or cfg.metrics_linger_s <= 0:
        return
    out = Path(cfg.summary_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{name}.prom.tmp"
    tmp.write_text(f"# featureline port {server.port}\n" + metrics.registry.exposition())
    tmp.rename(out / f"{name}.prom")


def serve_final_metrics(summary_dir: str | Path, run_id: str, host: str, seconds: float) -> list[int]:
    """After a job ended (``--metrics-linger-s``): serve each subtask's last metrics
    (:func:`save_exposition`) on the port it used, for ``seconds``; returns the ports.
    A port the ending worker still holds is retried for up to 10 s, then skipped."""
    servers: list[MetricsServer] = []
    try:
        for path in sorted(Path(summary_dir).glob(f"{run_id}*.prom")):
            head, _, body = path.read_text().partition("\n")
            port = int(head.rsplit(" ", 1)[1])
            deadline = time.monotonic() + 10
            while True:
                try:
                    servers.append(MetricsServer(functools.partial(str, body), port, host))
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        log.warning("metrics: port %s still taken (%s); its final values are not served",
                                    port, exc)
                        break
                    time.sleep(0.2)
        if servers:
            log.info("metrics: serving the subtasks' final values %.0f s more", seconds,
                     extra={"metrics_urls": [s.url for s in servers], "linger_s": seconds})
            sleep_interruptibly(seconds)
        return [s.port for s in servers]
    finally:
        for server in servers:
            server.close()


def _metrics_endpoint(cfg: StreamConfig, schema: str) -> tuple[Any, Any]:
    """A subtask's metrics (``RunMetrics``, aggregation outcomes included) and their
    endpoint on the first free port of ``metrics_port`` .. ``+ parallelism - 1``; (None,
    None) without a port. Never fails the job: without a free port the metrics are only
    not served."""
    if cfg.metrics_port is None:
        return None, None

    registry = Registry()
    metrics: Any = RunMetrics(registry, schema, stream=True)
    start = cfg.metrics_port
    server = serve_first_free(registry, range(start, start + cfg.parallelism), cfg.metrics_host)
    if server is not None:
        log.info("metrics on %s", server.url, extra={"metrics_url": server.url})
    return metrics, server


# --------------------------------------------------------------------------- the job


def build(cfg: StreamConfig) -> tuple[Any, Any]:
    """The configured Flink environment and the job's statement set (not started)."""
    # pyflink: heavy, and only a Flink job needs it (no other entry point loads it)
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, StreamTableEnvironment

    cfg.check()
    scrub_environment()
    conf = Configuration()
    conf.set_string("pipeline.name", f"featureline stream {Path(cfg.schema_path).stem} <- {cfg.topic}")
    conf.set_string("python.fn-execution.bundle.size", str(cfg.batch_size))
    conf.set_string("python.fn-execution.arrow.batch.size", str(cfg.batch_size))
    conf.set_string("python.fn-execution.bundle.time", str(cfg.max_wait_ms))
    conf.set_string("execution.checkpointing.interval", f"{cfg.checkpoint_interval_ms} ms")
    conf.set_string("execution.checkpointing.mode", "EXACTLY_ONCE")
    if cfg.checkpoint_dir:
        conf.set_string("execution.checkpointing.dir", Path(cfg.checkpoint_dir).resolve().as_uri())
        conf.set_string("execution.checkpointing.externalized-checkpoint-retention",
                        "RETAIN_ON_CANCELLATION")
    if cfg.from_checkpoint:
        conf.set_string("execution.state-recovery.path", cfg.from_checkpoint)
    restart_strategy(conf, cfg.restart_attempts)
    env = environment(conf, cfg.cluster)
    python_executables(env)
    # Appended to pipeline.jars: under `flink run` that list already holds flink-python,
    # which replacing it would drop (ClassNotFoundException for the Python operator).
    env.add_jars(kafka_connector_jar().as_uri())
    env.set_parallelism(cfg.parallelism)
    t_env = StreamTableEnvironment.create(env, EnvironmentSettings.in_streaming_mode())
    with_clause = ",\n".join(f"{_sql_string(k)} = {_sql_string(v)}" for k, v in source_options(cfg).items())
    t_env.execute_sql(f"""
        CREATE TEMPORARY TABLE featureline_source (
          `value` BYTES,
          `topic` STRING METADATA VIRTUAL,
          `partition` INT METADATA VIRTUAL,
          `offset` BIGINT METADATA VIRTUAL,
          `ts` TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL,
          `headers` MAP<STRING, BYTES> METADATA VIRTUAL
        ) WITH ({with_clause})""")
    t_env.execute_sql("CREATE TEMPORARY TABLE featureline_done (outcome INT) "
                      "WITH ('connector' = 'blackhole')")
    t_env.create_temporary_function("featureline_process", _make_udf(cfg))
    stmt = t_env.create_statement_set()
    select = ("SELECT featureline_process(`value`, `topic`, `partition`, `offset`, `ts`, "
              f"`headers`[{_sql_string(SOURCE_HEADER)}]) AS outcome "
              "FROM featureline_source")
    stmt.add_insert_sql(f"INSERT INTO featureline_done {select}")
    return env, stmt


#: Where ``flink-sql-connector-kafka`` relocates the Kafka client's classes.
SHADED_KAFKA = "org.apache.flink.kafka.shaded.org.apache.kafka."


def _shaded(name: str, value: str) -> str:
    if name == "sasl.jaas.config" or name.endswith(".class"):
        return re.sub(r"(?<![\w.])org\.apache\.kafka\.", SHADED_KAFKA, value)
    return value


def source_options(cfg: StreamConfig) -> dict[str, str]:
    """The ``WITH`` options of the Kafka source table. ``cfg.kafka_java_properties`` become
    ``'properties.<name>'`` options (the connector hands those to its Java Kafka client:
    TLS, SASL); the job's own settings (bootstrap servers, group id, offsets, timeouts) win
    over a property of the same name. Holds credentials: never log it.

    The SQL connector jar relocates the Kafka client to :data:`SHADED_KAFKA`, so a class
    named in ``sasl.jaas.config`` or a ``*.class`` property as ``org.apache.kafka...``
    (as Kafka's documentation writes it) is rewritten to its relocated name."""
    options = {f"properties.{k}": _shaded(k, v) for k, v in cfg.kafka_java_properties.items()}
    options |= {
        "connector": "kafka",
        "topic": cfg.topic,
        "properties.bootstrap.servers": cfg.bootstrap,
        "properties.group.id": cfg.group,
        "properties.auto.offset.reset": "earliest",
        "properties.commit.offsets.on.checkpoint": "true",
        "properties.request.timeout.ms": "15000",
        "properties.default.api.timeout.ms": "30000",
        "scan.startup.mode": cfg.startup,
        "format": "raw",
    }
    if cfg.bounded:
        options["scan.bounded.mode"] = "latest-offset"
    return options


def run(cfg: StreamConfig, *, wait: bool = True) -> Any:
    """Submit the job (to the mini-cluster when run locally, to the cluster under
    ``flink run``). With ``wait``, block until it ends (a bounded job ends at the end
    offsets seen at start) and return its TableResult."""
    _log_setup(cfg.log_format, cfg.run_id)
    _, stmt = build(cfg)
    log.info("stream: submitting", extra=fields(redacted(cfg)))
    result = stmt.execute()
    if wait:
        result.wait()
    return result


def merged_summary(summary_dir: str | Path, run_id: str) -> dict[str, Any]:
    """The counts of every subtask of run ``run_id`` (each replaces its own file after every
    micro-batch and when it closes)."""
    parts = [json.loads(p.read_text()) for p in sorted(Path(summary_dir).glob(f"{run_id}-*.json"))]
    keys = ("read", "stored", "rejected", "already_present", "batches", "dead_letters")
    total: dict[str, Any] = {k: sum(int(p.get(k) or 0) for p in parts) for k in keys}
    total["run_id"] = run_id
    total["subtasks"] = len(parts)
    # No subtask report at all is a failure, not a vacuous "0 = 0".
    total["adds_up"] = bool(parts) and (
        total["read"] == total["stored"] + total["rejected"] + total["already_present"])
    rules: dict[str, int] = {}
    for p in parts:
        for r in p.get("top_reasons", []):
            rules[r["rule"]] = rules.get(r["rule"], 0) + int(r["count"])
    total["by_rule"] = dict(sorted(rules.items(), key=lambda kv: -kv[1]))
    lat = [p["latency_ms"] for p in parts if p.get("latency_ms", {}).get("p50") is not None]
    total["latency_ms"] = {"p50": max((x["p50"] for x in lat), default=None),
                           "p99": max((x["p99"] for x in lat), default=None)}
    # consumer lag as each subtask last measured it (with its status lines and on close)
    total["lag"] = {k: int(v) for p in parts for k, v in (p.get("lag") or {}).items()}
    total["lag_total"] = sum(total["lag"].values()) if total["lag"] else None
    unknown = TopCounter()
    for p in parts:
        unknown.update({k: int(v) for k, v in (p.get("unknown_fields") or {}).items()})
        unknown.other += int(p.get("unknown_fields_other") or 0)
    total["unknown_fields"], total["unknown_fields_other"] = unknown.shown()
    gates = [p["gates"] for p in parts if p.get("gates")]
    if gates:  # the breaker of each subtask: the gates breached, and the trip (the first) if any
        breached: dict[str, int] = {}
        for g in gates:
            for name, count in g.get("breached_batches", {}).items():
                breached[name] = breached.get(name, 0) + int(count)
        tripped = [g["tripped"] for g in gates if g.get("tripped")]
        total["gates"] = {"window_records": gates[0].get("window_records"),
                          "window_min_records": gates[0].get("window_min_records"),
                          "breached_batches": breached,
                          "worst": {k: max(float(g.get("worst", {}).get(k, 0.0)) for g in gates)
                                    for k in breached},
                          "tripped": tripped[0] if tripped else None}
    aggs = [p["aggregations"] for p in parts if p.get("aggregations")]
    if aggs:  # events = accepted + late + duplicates, per subtask and in total
        akeys = ("events", "accepted", "late", "duplicates", "rows_written", "hot_written",
                 "late_rejects_stored", "from_history")
        agg: dict[str, Any] = {k: sum(int(a.get(k) or 0) for a in aggs) for k in akeys}
        agg["adds_up"] = agg["events"] == agg["accepted"] + agg["late"] + agg["duplicates"]
        total["aggregations"] = agg
        total["adds_up"] = total["adds_up"] and agg["adds_up"]
    return total


def latest_checkpoint(checkpoint_dir: str | Path) -> str | None:
    """The newest completed checkpoint under ``checkpoint_dir`` (``<job>/chk-N`` with a
    ``_metadata`` file), as a path for ``--from-checkpoint``; None when there is none."""
    best: tuple[float, int, Path] | None = None
    for meta in Path(checkpoint_dir).glob("*/chk-*/_metadata"):
        chk = meta.parent
        key = (meta.stat().st_mtime, int(chk.name.split("-")[1]), chk)
        if best is None or key[:2] > best[:2]:
            best = key
    return str(best[2]) if best else None


__all__ = ["StreamConfig", "build", "latest_checkpoint", "merged_summary", "redacted", "run",
           "save_exposition", "serve_final_metrics", "source_options"]


