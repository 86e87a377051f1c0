"""Views read the sketch aggregations (issue 50) like any stored column: a view naming
``approx_count_distinct`` and ``approx_percentile`` (one quantile, a list of them) compiles,
fetches them in their stored types (int64, float64, list<float64>) and a derived feature
can compute from the percentile."""

from __future__ import annotations

import pyarrow as pa

from features.compile import compile_schema
from features.schema import parse_schema
from features.views import compile_view, parse_view

SCHEMA = """\
name: card_txn
version: 1.0.0
entity: card_id
event_time: ts
fields:
  - {name: card_id, type: string, store: [hot, cold], constraints: {required: true}}
  - {name: ts, type: "timestamp(us, UTC)", store: cold, constraints: {required: true}}
  - {name: amount, type: "decimal(12,2)", store: cold}
  - {name: merchant, type: string, store: cold}
aggregations:
  features:
    - {name: merchants_7d, function: approx_count_distinct, of: merchant, window: 7d, store: [hot, cold]}
    - {name: amount_p90_30d, function: approx_percentile, of: amount, q: 0.9, window: 30d, store: [hot, cold]}
    - {name: amount_pcts_30d, function: approx_percentile, of: amount, q: [0.5, 0.99], window: 30d,
       store: [hot, cold]}
"""
VIEW = """\
name: card_sketches
version: 1.0.0
request:
  keys:
    card_id: string
  fields:
    - {name: amount, type: "decimal(12,2)", constraints: {required: true}}
sources:
  - schema: card_txn
    features: [merchants_7d, amount_p90_30d, amount_pcts_30d]
    join: {card_id: card_id}
features:
  - name: amount_over_p90
    from: amount
    steps: [{ratio: {denominator: amount_p90_30d, on_zero: 0}}]
    dtype: float64
"""


def test_a_view_reads_sketch_aggregations_in_their_stored_types() -> None:
    schema = parse_schema(SCHEMA)
    view = parse_view(VIEW, "views/card_sketches.yaml", {"card_txn": schema})
    cv = compile_view(view, {"card_txn": compile_schema(schema)}, device="cpu")
    assert [(f.name, f.type) for f in cv.fetched] == [
        ("merchants_7d", pa.int64()), ("amount_p90_30d", pa.float64()),
        ("amount_pcts_30d", pa.list_(pa.float64()))]
    assert cv.derived.names == ["amount_over_p90"]
