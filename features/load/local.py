"""The batch loader in one process: Parquet -> validate -> transform -> both stores, then
the aggregations (``features.load.load`` with the local engine, each ``--workers``
process, each task of ``--engine flink``). :func:`features.pipeline.run.load_source` is
that core for any source (``FeatureStore.write``'s in-memory tables too)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from features.compile import CompiledSchema
from features.config import Settings
from features.observe.metrics import RunMetrics
from features.pipeline.run import load_source
from features.pipeline.summary import RunSummary
from features.sources.parquet import DEFAULT_BATCH_ROWS, ParquetSource


def load_local(paths: Sequence[str | Path], compiled: CompiledSchema, settings: Settings, *,
               batch_rows: int = DEFAULT_BATCH_ROWS, search_path: str | None = None, key_prefix: str = "",
               progress: bool = False, run_id: str, metrics: RunMetrics | None = None,
               shard: tuple[int, int] | None = None) -> RunSummary:
    """The loader in this process (one shard of the entities with ``shard``): what
    :func:`features.load.load` runs for the local engine, and what each Flink task and
    each worker process runs (see its docstring for the guarantees)."""
    source = ParquetSource(paths, compiled, batch_rows=batch_rows, shard=shard)
    return load_source(source, compiled, settings, search_path=search_path, key_prefix=key_prefix,
                       progress=progress, run_id=run_id, metrics=metrics,
                       started={"files": len(source.files)})
