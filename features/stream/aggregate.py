"""The stream job's aggregation stage: Flink keyed state, event-time timers, a writer UDF.

When the schema declares ``aggregations``, the job continues after the main UDF::

    featureline_process (per record: the aggregation inputs of a valid row, JSON)
      -> DataStream: watermarks (bounded out-of-orderness = allowed lateness)
      -> key_by(entity) -> AggregateFunction   (KeyedProcessFunction: features.aggregate.KeyState
                                                 in ValueState; an event-time timer clears an
                                                 idle entity's state once nothing can change it)
      -> featureline_aggregates (pandas UDF: finalize, upsert Postgres + Redis, late rejects)

**Checkpoints.** The keyed state is in every checkpoint; before a barrier passes, each
Python operator finishes its bundle, so the writer UDF has stored every value the keyed
stage emitted before it. After a restore, the records after the checkpoint are
replayed into the restored state and emit the same values again: upserts of equal
values change nothing.

**Lateness** is decided per entity in arrival order (``features.aggregate.engine``), not
by the watermark, so the stream and a batch backfill of the same history agree
exactly; the watermark only drives the state clean-up timers.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

#: emitted record kinds
VALUE, LATE, DUPLICATE = 0, 1, 2


def make_keyed_function(schema_path: str) -> Any:
    from pyflink.common.typeinfo import Types
    from pyflink.datastream import KeyedProcessFunction, RuntimeContext
    from pyflink.datastream.state import ValueStateDescriptor

    class AggregateFunction(KeyedProcessFunction):  # type: ignore[misc]  # untyped base class
        """Per entity: KeyState in ValueState; emits values, late and duplicate verdicts."""

        def __init__(self, path: str) -> None:
            self.path = path
            self.spec: Any = None
            self.state: Any = None

        def open(self, runtime_context: RuntimeContext) -> None:
            from features.aggregate.engine import AggSpec
            from features.schema import load_schema

            self.spec = AggSpec.of(load_schema(self.path))
            self.state = runtime_context.get_state(
                ValueStateDescriptor("featureline_aggregation", Types.PICKLED_BYTE_ARRAY()))

        def process_element(self, value: Any, ctx: Any) -> Any:
            from pyflink.common import Row

            from features.aggregate.engine import KeyState

            line = value[0]
            if not line:
                return  # a rejected record: nothing to aggregate
            entity, t, source, contrib = json.loads(line.split("\x1f", 1)[1])
            st = self.state.value() or KeyState()
            before = st.newest
            out = st.add(self.spec, t, source, contrib)
            if out in ("late", "released"):
                yield Row(json.dumps({"k": LATE, "e": str(entity), "t": t, "s": source, "n": st.newest,
                                      "r": int(out == "released")}))
                return
            if out == "duplicate":
                yield Row(json.dumps({"k": DUPLICATE, "e": str(entity), "t": t, "s": source}))
                return
            self.state.update(st)
            if st.newest != before:
                # event time ms at which nothing can change this entity's values any more
                ctx.timer_service().register_event_time_timer((st.newest + self.spec.horizon_us) // 1000 + 1)
            names = self.spec.raw_names()
            assert isinstance(out, list)
            for te, se, raw in out:
                yield Row(json.dumps({"k": VALUE, "e": str(entity), "t": te, "s": se,
                                      "a": int(te == t and se == source),
                                      **dict(zip(names, raw, strict=True))}))

        def on_timer(self, timestamp: int, ctx: Any) -> Any:
            st = self.state.value()
            if st is not None and not st.released and st.expired(self.spec, timestamp * 1000):
                st.release()  # a few bytes stay per entity: its newest time, for exact lateness
                self.state.update(st)
            return iter(())

    return AggregateFunction(schema_path)


def make_writer_udf(cfg: Any) -> Any:
    import pandas as pd
    from pyflink.table import DataTypes
    from pyflink.table.udf import FunctionContext, ScalarFunction, udf

    class FeaturelineAggregates(ScalarFunction):  # type: ignore[misc]  # untyped base class
        """One call per micro-batch of emitted aggregation records: write them."""

        def __init__(self, config: Any) -> None:
            self.cfg = config
            self.writer: Any = None
            self.server: Any = None
            self.metrics: Any = None

        def open(self, function_context: FunctionContext) -> None:
            from features.aggregate.engine import AggSpec
            from features.aggregate.writer import AggregateCounts, AggregateWriter
            from features.compile import compile_schema
            from features.schema import load_schema

            c = self.cfg
            self.compiled = compile_schema(load_schema(c.schema_path))
            self.spec = AggSpec.of(self.compiled.schema)
            self.writer = AggregateWriter(self.compiled, c.postgres_dsn, c.redis_url,
                                          search_path=c.search_path, key_prefix=c.key_prefix)
            self.writer.open()
            self.counts = AggregateCounts()
            self.instance = uuid.uuid4().hex[:8]
            from features.stream.job import _metrics_endpoint

            self.metrics, self.server = _metrics_endpoint(c, self.compiled.name, aggregations=True)
            self._save()
            group = function_context.get_metric_group().add_group("featureline_aggregations")
            for name in ("events", "accepted", "late", "duplicates"):
                group.gauge(name, lambda n=name: int(getattr(self.counts, n)))

        def eval(self, lines: Any) -> Any:
            import datetime as dt

            import numpy as np
            import pyarrow as pa
            import pyarrow.compute as pc
            import pyarrow.json as pj

            from features.aggregate.engine import finalize, raw_schema
            from features.aggregate.writer import late_rejects
            from features.lineage import RunContext

            t0 = time.perf_counter()
            spec, n = self.spec, len(lines)
            assert spec is not None
            entity_type = pa.string()
            fields = [pa.field("k", pa.int8()), pa.field("e", entity_type), pa.field("t", pa.int64()),
                      pa.field("s", pa.string()), pa.field("n", pa.int64()), pa.field("a", pa.int8()),
                      pa.field("r", pa.int8()),
                      *raw_schema(spec)]
            table = pj.read_json(pa.py_buffer("\n".join(lines.tolist()).encode()),
                                 parse_options=pj.ParseOptions(explicit_schema=pa.schema(fields),
                                                               unexpected_field_behavior="error"))
            kind = table.column("k").to_numpy()
            c = self.compiled
            ctx = RunContext(c.name, c.schema.version_str, c.fingerprint, self.cfg.run_id,
                             dt.datetime.now(dt.UTC))
            entity_field = c.schema.field(str(c.schema.entity))
            from features.compile.arrow import arrow_type

            etype = arrow_type(entity_field.type)
            vals = table.filter(pa.array(kind == VALUE))
            late = table.filter(pa.array(kind == LATE))
            values = finalize(spec, vals.select(raw_schema(spec).names))
            ent = vals.column("e").combine_chunks().cast(etype)
            rejects = late_rejects(spec, ctx, late.column("e").combine_chunks().cast(etype),
                                   late.column("t").to_numpy(), late.column("s").combine_chunks(),
                                   pc.fill_null(late.column("n"), 0).to_numpy(),
                                   released=pc.fill_null(late.column("r"), 0).to_numpy().astype(bool))
            done = self.writer.write(spec, ctx, ent, vals.column("t").to_numpy(),
                                     vals.column("s").combine_chunks(), values, late=rejects)
            counts = self.counts
            # an event is counted once: at its first emission (updates re-emit older events)
            accepted = int(pc.sum(pc.fill_null(vals.column("a"), 0)).as_py() or 0)
            duplicates = int((kind == DUPLICATE).sum())
            counts.accepted += accepted
            counts.late += late.num_rows
            counts.duplicates += duplicates
            if self.metrics is not None:
                self.metrics.add(accepted=accepted, late=late.num_rows, duplicates=duplicates)
            counts.rows_written += done.rows_written
            counts.hot_written += done.hot_written
            counts.late_rejects_stored += done.late_rejects_stored
            counts.events = counts.accepted + counts.late + counts.duplicates
            counts.seconds += time.perf_counter() - t0
            self._save()
            return pd.Series(np.zeros(n, dtype=np.int32))

        def _save(self) -> None:
            if self.cfg.summary_dir:
                out = Path(self.cfg.summary_dir)
                out.mkdir(parents=True, exist_ok=True)
                tmp = out / f".{self.cfg.run_id}.agg-{self.instance}.json.tmp"
                tmp.write_text(json.dumps(self.counts.as_dict()))
                tmp.rename(out / f"{self.cfg.run_id}.agg-{self.instance}.json")
            from features.stream.job import save_exposition

            save_exposition(self.cfg, f"{self.cfg.run_id}.agg-{self.instance}", self.server, self.metrics)

        def close(self) -> None:
            if self.writer is not None:
                self._save()
                self.writer.close()
            if self.server is not None:
                self.server.close()
                self.server = None

    return udf(FeaturelineAggregates(cfg), result_type=DataTypes.INT(), func_type="pandas")


__all__ = ["DUPLICATE", "LATE", "VALUE", "make_keyed_function", "make_writer_udf"]
