"""``features load --engine flink``: the batch loader as a Flink job in BATCH execution mode.

The job is N tasks, one per shard of the entities (``--parallelism N``), each running
the unchanged loader over its shard (:func:`features.load.load` with ``shard=(i, N)``:
the same core, ledger, counts and lineage as ``--workers``, see ``docs/loading.md``)::

    shards 0..N-1 (a bounded collection) --rebalance--> load shard i (a Python map, one per task)
      --> each task's RunSummary, collected by the client and added up

Why shards of entities rather than (file, row group) splits: two tasks must never write
one entity (both stores decide by key, and an entity's windowed aggregations need its
whole history in one place), and Flink's own Parquet connector needs Hadoop jars and
loses row positions. Every task reads every file, keeping its entities' rows; files must
be at the same path on every TaskManager (a shared file system).

**Failures.** A task that fails (its TaskManager killed, a store unreachable after the
loader's own retries) is restarted by Flink (``restart_attempts``, fixed delay); the
restarted task runs its shard again and the commit ledger skips what the failed
attempt committed, so the result is exact. When the attempts are spent, the job fails
and running the same command again completes it.

Locally the job runs on a Flink mini-cluster in this process's JVM; under ``flink run
-py "$(features job-file batch)"`` (where ``--engine flink`` is the default) it runs on that
cluster.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from features.compile import CompiledSchema
from features.config import Settings
from features.errors import ConfigError
from features.flink.cluster import slots
from features.flink.env import environment, python_executables, restart_strategy, scrub_environment
from features.load.gates import check_gates
from features.load.local import load_local
from features.load.stores import open_stores
from features.observe.logs import bind_run_id, has_handler, set_run_id, setup_logging
from features.pipeline.summary import RunSummary, merge_summaries
from features.sources.parquet import ParquetSource

log = logging.getLogger("features.load")


def _shard_load(compiled: CompiledSchema, paths: list[str], settings: Settings, shards: int,
                kw: dict[str, Any]) -> Any:
    """The map function of the job (built lazily: importing PyFlink costs ~1 s). It is
    pickled into the job graph, so it carries ``settings.for_job()``: the stores'
    credentials, not the ingest tokens."""
    # pyflink: heavy, and only a Flink job needs it (no other entry point loads it)
    from pyflink.datastream.functions import MapFunction, RuntimeContext

    settings = settings.for_job()

    class ShardLoad(MapFunction):  # type: ignore[misc]  # untyped base class
        """Load shard ``i`` of ``shards`` (one element per task); returns its RunSummary."""

        def open(self, runtime_context: RuntimeContext) -> None:
            if kw.get("run_id"):
                set_run_id(kw["run_id"])
            if not has_handler("features"):
                setup_logging(None, logger="features")

        def map(self, shard: int) -> RunSummary:
            with bind_run_id(kw["run_id"]):
                return load_local(paths, compiled, settings, shard=(shard, shards), **kw)

    return ShardLoad()


def load_flink(paths: Sequence[str | Path], compiled: CompiledSchema, settings: Settings, *,
               parallelism: int | None, batch_rows: int, search_path: str | None = None, key_prefix: str = "",
               run_id: str, restart_attempts: int = 3, cluster: str | None = None) -> RunSummary:
    """Run the load as a Flink BATCH job of ``parallelism`` shard tasks (module docstring)
    and return the summary of all of them. ``cluster``: the REST address (``host:port``) of
    a running Flink cluster to submit to (``features load --engine flink --cluster``; its
    slots in all when ``parallelism`` is None); None: a mini-cluster in this process, or
    the cluster ``flink run`` chose."""
    # pyflink: heavy, and only a Flink job needs it (no other entry point loads it)
    from pyflink.common import Configuration, Types
    from pyflink.datastream import RuntimeExecutionMode

    if parallelism is not None and parallelism < 1:
        raise ConfigError(f"parallelism must be >= 1, got {parallelism}", key="parallelism")
    source = ParquetSource(paths, compiled, batch_rows=batch_rows)  # checks every file first
    files = [f.path for f in source.files]  # absolute paths or URIs: the same on any TaskManager
    # the quality gates judge the whole input, here, before any task writes (GateBreached)
    verdict = check_gates(paths, compiled, settings, run_id=run_id, batch_rows=batch_rows,
                          search_path=search_path, key_prefix=key_prefix) if compiled.gates else None
    open_stores(compiled, settings, search_path=search_path, key_prefix=key_prefix)
    scrub_environment()  # the settings travel inside the pickled function, not the environment
    conf = Configuration()
    restart_strategy(conf, restart_attempts)
    env = environment(conf, cluster)
    python_executables(env)
    if cluster is not None and parallelism is None:
        parallelism = max(1, slots(cluster))
    env.set_runtime_mode(RuntimeExecutionMode.BATCH)
    if parallelism is None:  # `flink run -p N`, or the cores of this machine for a mini-cluster
        parallelism = int(env.get_parallelism())
    env.set_parallelism(parallelism)
    log.info("load started", extra={"schema": compiled.name, "files": len(files), "rows": source.total_rows,
                                    "engine": "flink", "parallelism": parallelism})
    kw = {"batch_rows": batch_rows, "search_path": search_path, "key_prefix": key_prefix, "run_id": run_id}
    fn = _shard_load(compiled, files, settings, parallelism, kw)
    shards = env.from_collection(list(range(parallelism)), type_info=Types.INT())
    # set on the operator: in BATCH mode Flink's adaptive scheduler would otherwise derive
    # its parallelism from the input's size (a few integers: one task for every shard)
    summaries = shards.rebalance().map(fn, output_type=Types.PICKLED_BYTE_ARRAY())
    summaries.set_parallelism(parallelism)
    t0 = time.perf_counter()
    with summaries.execute_and_collect(f"featureline load {compiled.name}") as results:
        parts: list[RunSummary] = list(results)
    summary = merge_summaries(run_id, compiled.name, parts, seconds=time.perf_counter() - t0)
    if verdict is not None:
        summary.gates = verdict.as_dict()
    if len(parts) != parallelism:
        raise ConfigError(f"the Flink job returned {len(parts)} shard summaries, expected {parallelism}",
                          key="parallelism")
    d = summary.as_dict()
    log.info("load finished", extra={k: d[k] for k in ("schema", "read", "stored", "rejected",
                                                       "already_present", "restored", "adds_up", "units",
                                                       "skipped_units", "seconds")})
    return summary
