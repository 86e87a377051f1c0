"""The Feast side of ``bench/views.py`` (issue 31): a long-lived worker in the Feast venv.

Run by ``bench/views.py`` as ``.cache/bench-feast-venv/bin/python bench/feast_side.py``
(``bench/feast_venv.sh`` makes that venv). It never imports featureline. It reads one JSON
request per line on stdin and answers one JSON line on stdout (Feast's own output, logs
and progress bars go to stderr), so the driver can interleave its rounds with
featureline's in one run:

- ``{"op": "setup", "repo": DIR, "files": {view: parquet}, "redis": "host:port,db=N",
  "materialize": bool}``: writes ``DIR/feature_store.yaml`` (file offline store, Redis
  online store), applies three FeatureViews (``card_txn``, ``card_profile``,
  ``merchant``) over the Parquet files and one FeatureService ``card_scoring`` over the
  three, and (``materialize``) materializes them into Redis: ``{"apply_s", "materialize_s"}``.
- ``{"op": "historical", "frame": parquet, "out": parquet | null}``: the frame (columns
  ``row``, ``card_id``, ``merchant_id``, ``timestamp``) read into pandas (not timed), then
  ``get_historical_features(entity_df, features=service).to_arrow()`` timed:
  ``{"seconds", "rows", "columns"}``; ``out`` writes the result (for the value check).
- ``{"op": "online", "batches": [[[card_id, merchant_id], ...], ...], "warmup": n}``:
  one ``get_online_features(features=service, entity_rows=...).to_dict()`` per batch,
  each timed: ``{"ns": [...], "sample": {...}}`` (the first batch's result).
- ``{"op": "quit"}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

#: the protocol's stream: the real stdout; everything else printed goes to stderr
_OUT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

PROJECT = "bench_views"
#: Feast's TTL bounds how far back a historical join looks: ten years is "no limit" here,
#: as featureline's view has no max_age.
TTL = timedelta(days=3650)


def repo_yaml(redis: str) -> str:
    return (f"project: {PROJECT}\nregistry: data/registry.db\nprovider: local\n"
            f"online_store:\n  type: redis\n  connection_string: \"{redis}\"\n"
            "offline_store:\n  type: file\nentity_key_serialization_version: 3\n")


def definitions(files: dict[str, str]) -> list[Any]:
    from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
    from feast.types import Float64, Int32, Int64, String

    card = Entity(name="card", join_keys=["card_id"], value_type=ValueType.STRING)
    merchant = Entity(name="merchant", join_keys=["merchant_id"], value_type=ValueType.INT64)

    def view(name: str, entity: Any, key: tuple[str, Any], ts: str, fields: list[tuple[str, Any]]) -> Any:
        source = FileSource(name=f"{name}_source", path=files[name], timestamp_field=ts)
        return FeatureView(name=name, entities=[entity], ttl=TTL, online=True, source=source,
                           schema=[Field(name=key[0], dtype=key[1])]
                           + [Field(name=n, dtype=t) for n, t in fields])

    txn = view("card_txn", card, ("card_id", String), "event_time",
               [("txn_24h", Int64), ("amount_mean_7d", Float64), ("amount_max_24h", Float64)])
    profile = view("card_profile", card, ("card_id", String), "updated_at",
                   [("credit_limit", Float64), ("account_age_days", Int32), ("card_tier", String)])
    merch = view("merchant", merchant, ("merchant_id", Int64), "updated_at",
                 [("risk_score", Float64), ("mcc", Int32)])
    service = FeatureService(name="card_scoring", features=[txn, profile, merch])
    return [card, merchant, txn, profile, merch, service]


class Worker:
    def __init__(self) -> None:
        self.store: Any = None
        self.service: Any = None

    def setup(self, repo: str, files: dict[str, str], redis: str, materialize: bool) -> dict[str, Any]:
        from feast import FeatureStore

        root = Path(repo)
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / "feature_store.yaml").write_text(repo_yaml(redis))
        self.store = FeatureStore(repo_path=str(root))
        objects = definitions(files)
        t0 = time.perf_counter()
        self.store.apply(objects)
        apply_s = time.perf_counter() - t0
        self.service = self.store.get_feature_service("card_scoring")
        materialize_s = None
        if materialize:
            t0 = time.perf_counter()
            self.store.materialize(datetime(2000, 1, 1, tzinfo=UTC),
                                   datetime(2100, 1, 1, tzinfo=UTC))
            materialize_s = time.perf_counter() - t0
        return {"apply_s": apply_s, "materialize_s": materialize_s}

    def historical(self, frame: str, out: str | None) -> dict[str, Any]:
        import pyarrow.parquet as pq

        df = pq.read_table(frame).to_pandas().rename(columns={"timestamp": "event_timestamp"})
        t0 = time.perf_counter()
        table = self.store.get_historical_features(entity_df=df, features=self.service).to_arrow()
        seconds = time.perf_counter() - t0
        if out:
            pq.write_table(table, out)
        return {"seconds": seconds, "rows": table.num_rows, "columns": table.column_names}

    def online(self, batches: list[list[list[Any]]], warmup: int) -> dict[str, Any]:
        requests = [[{"card_id": c, "merchant_id": m} for c, m in b] for b in batches]
        for rows in requests[:warmup]:
            self.store.get_online_features(features=self.service, entity_rows=rows).to_dict()
        ns: list[int] = []
        sample: dict[str, Any] = {}
        for i, rows in enumerate(requests[warmup:]):
            t0 = time.perf_counter_ns()
            result = self.store.get_online_features(features=self.service, entity_rows=rows).to_dict()
            ns.append(time.perf_counter_ns() - t0)
            if i == 0:
                sample = result
        return {"ns": ns, "sample": sample}


def main() -> None:
    worker = Worker()
    for line in sys.stdin:
        req = json.loads(line)
        op = req.pop("op")
        if op == "quit":
            break
        try:
            reply = getattr(worker, op)(**req)
        except Exception as exc:  # reported to the driver, which stops the Feast side
            import traceback

            traceback.print_exc()
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        _OUT.write(json.dumps(reply, default=str) + "\n")


if __name__ == "__main__":
    main()
