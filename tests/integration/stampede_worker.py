"""One process of the cross-process stampede test (test_sdk_stampede.py): ``THREADS``
threads of one FeatureStore ask for the same entity at the same moment; prints what its
fallback did as one JSON line. Run as ``python stampede_worker.py '<json args>'``: once its
store is warm and its threads wait, it prints ``ready`` and waits for a line on stdin (the
test sends ``go`` to every process at once, whatever each one's start-up took)."""

from __future__ import annotations

import datetime as dt
import json
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from features import FeatureStore  # noqa: E402


def main() -> None:
    args = json.loads(sys.argv[1])
    fs = FeatureStore(redis_url=args["redis_url"], postgres_dsn=args["dsn"], schemas=ROOT / "schemas",
                      search_path=args["search_path"], key_prefix=args["prefix"],
                      fill_wait=dt.timedelta(seconds=args["fill_wait_s"]))
    fs.schema(args["schema"])  # compiled before the start, as in a warm server
    fs.online(args["schema"], ["warm-up-id-that-is-nowhere"], fallback=False)
    barrier = threading.Barrier(args["threads"] + 1)  # the threads and the main thread's "go"
    results: list[tuple[str | None, str]] = []
    lock = threading.Lock()

    def call() -> None:
        barrier.wait()
        row = fs.online(args["schema"], [args["id"]], ["income_monthly"]).to_pylist()[0]
        with lock:
            results.append((row["_from"], str(row["income_monthly"])))

    threads = [threading.Thread(target=call) for _ in range(args["threads"])]
    for t in threads:
        t.start()
    print("ready", flush=True)
    sys.stdin.readline()
    barrier.wait()
    for t in threads:
        t.join()
    counts = fs._fallback.counts
    fs.close()
    print(json.dumps({"queries": counts.queries, "fills": counts.fills, "filled": counts.filled,
                      "waited": counts.waited, "shared": counts.shared,
                      "sources": sorted({r[0] or "" for r in results}),
                      "values": sorted({r[1] for r in results}), "calls": len(results)}))


if __name__ == "__main__":
    main()
