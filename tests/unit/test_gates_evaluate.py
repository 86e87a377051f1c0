"""The gates' measure and verdict (``features.pipeline.gates``), without services: the
measure counts what the load's prepare step rejects, row for row (transform rejects
included), and the verdict compares exactly."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.kernels import transform_program
from features.lineage import RunContext
from features.ops.examples import EXAMPLE_SCHEMAS, applicants
from features.pipeline.gates import GateCounts, evaluate, measure
from features.pipeline.prepare import process_batch
from features.schema import parse_schema
from features.sources.parquet import ParquetSource

LOGS = """
name: logs
version: 1.0.0
entity: id
event_time: t
fields:
  - name: id
    type: int64
    store: cold
    constraints: {required: true}
  - name: t
    type: timestamp(us)
    store: cold
    constraints: {required: true}
  - name: x
    type: float64
    constraints: {max: 100}
features:
  - name: x_log
    from: x
    steps: [log1p]
    dtype: float64
    store: cold
    on_invalid: reject
"""


def gated(text: str, quality: str) -> CompiledSchema:
    return compile_schema(parse_schema(text + quality))


def test_the_measure_counts_what_the_load_rejects_transforms_included(tmp_path: Path,
                                                                     settings: Settings) -> None:
    c = gated(LOGS, "quality:\n  max_reject_rate: 0.12\n  max_rule_rate:\n    x_log.transform: 0.05\n"
                    "    x.max: 0.02\n")
    n = 1_000
    x = [float(i % 50) for i in range(n)]
    for i in range(0, n, 10):
        x[i] = -5.0  # log1p(-5) is NaN: a transform reject
    for i in range(5, n, 50):
        x[i] = 500.0  # over max: a validation reject
    t0 = dt.datetime(2026, 1, 1)
    table = pa.table({"id": pa.array(range(n), pa.int64()),
                      "t": pa.array([t0 + dt.timedelta(seconds=i) for i in range(n)], pa.timestamp("us")),
                      "x": pa.array(x, pa.float64())})
    path = tmp_path / "x.parquet"
    pq.write_table(table, path, row_group_size=300)
    now = dt.datetime.now(dt.UTC)
    program = transform_program(c, settings)
    counts = measure(ParquetSource([path], c, batch_rows=128).batches(), c, program, now)
    ctx = RunContext(c.name, "1.0.0", c.fingerprint, "run", now)
    prepared = [process_batch(sb, c, program, ctx, now)
                for sb in ParquetSource([path], c, batch_rows=128).batches()]
    want: Counter[str] = Counter()
    for p in prepared:
        want.update(p.reject_rules)
    assert dict(counts.by_rule) == dict(want) == {"x_log.transform": 100, "x.max": 20}
    assert counts.rejected == sum(p.rejected_rows for p in prepared) == 120 and counts.read == n
    verdict = evaluate(c, counts)
    assert [r.gate.name for r in verdict.failed] == ["max_rule_rate[x_log.transform]"]
    assert verdict.failed[0].rows == 100 and verdict.failed[0].measured == 0.1
    # 120 of 1000 and 20 of 1000 are exactly at their limits: they pass
    assert [(r.rows, r.breached) for r in verdict.results] == [(120, False), (100, True), (20, False)]


@pytest.mark.parametrize(("rows", "read", "limit", "breached"), [
    (29, 100, "0.29", False),     # 0.29 as a float is below 29/100: compared as written
    (30, 100, "0.29", True),
    (7, 100, "0.07", False),
    (1, 3, "0.3333", True),
    (0, 0, "0", False),           # no rows: rate 0
    (1, 1_000_000, "0", True),
    (1_000_000, 1_000_000, "1", False),
])
def test_a_rate_at_its_limit_passes_and_above_it_breaches(rows: int, read: int, limit: str,
                                                          breached: bool) -> None:
    base = (EXAMPLE_SCHEMAS / "credit_applicant.yaml").read_text()
    c = gated(base, f"quality:\n  max_reject_rate: {limit}\n  max_rule_rate:\n    age.min: {limit}\n")
    verdict = evaluate(c, GateCounts(read=read, rejected=rows, by_rule=Counter({"age.min": rows})))
    assert [r.breached for r in verdict.results] == [breached, breached]
    assert bool(verdict.failed) is breached


def test_min_rows_and_the_verdicts_text() -> None:
    base = (EXAMPLE_SCHEMAS / "credit_applicant.yaml").read_text()
    c = gated(base, "quality:\n  owner: risk\n  on_breach: warn\n  min_rows: 1000\n"
                    "  max_reject_rate: {limit: 0.01, on_breach: fail}\n")
    by_rule = Counter({"age.min": 3, "age.max": 3, "region.max_length": 1})
    counts = GateCounts(read=999, rejected=5, by_rule=by_rule)
    v = evaluate(c, counts)
    assert [r.gate.name for r in v.warned] == ["min_rows"] and not v.failed
    assert v.lines() == [
        "quality gates of credit_applicant: read 999, rejected 5 (owner risk)",
        "  ok               max_reject_rate: 5 of 999 rows rejected = 0.5005% <= limit 1%",
        "  breached (warn)  min_rows: 999 rows read < minimum 1,000",
        "  top reasons: age.max 3, age.min 3, region.max_length 1",
    ]
    assert v.as_dict()["breached"] == ["min_rows"] and v.as_dict()["passed"] is True
    assert evaluate(c, GateCounts(read=1_000)).breaches == ()


def test_a_schema_without_gates_passes_anything() -> None:
    c = compile_schema(parse_schema((EXAMPLE_SCHEMAS / "credit_applicant.yaml").read_text()))
    v = evaluate(c, GateCounts(read=10, rejected=10, by_rule=Counter({"age.min": 10})))
    assert v.results == () and not v.failed and "  (the schema has no load gates)" in v.lines()


def test_the_measure_of_the_example_data_matches_the_validator(tmp_path: Path, settings: Settings) -> None:
    from features.validation import validate

    table = applicants(5_000)
    path = tmp_path / "a.parquet"
    pq.write_table(table, path)
    c = compile_schema(parse_schema((EXAMPLE_SCHEMAS / "credit_applicant.yaml").read_text()))
    counts = measure(ParquetSource([path], c).batches(), c, transform_program(c, settings),
                     dt.datetime.now(dt.UTC))
    direct = validate(table, c).counts
    assert counts.read == 5_000 and counts.rejected == direct.rejected_rows > 0
    assert dict(counts.by_rule) == dict(direct.by_rule)
