"""Benchmark: the sketch aggregations' batch kernels (``features.aggregate.sketches``) against
the libraries (Apache DataSketches ``hll_sketch``, DataDog ``ddsketch``), and the libraries'
order dependence.

Usage::

    .venv/bin/python bench/sketches.py [--events 1000000] [--entities 20000] [--library-events 5000]

The libraries are optional (not featureline dependencies): with ``--libraries DIR`` their
site-packages folder is appended to ``sys.path`` (a scratch venv: ``pip install
datasketches==5.2.0 ddsketch==3.0.1``); without them only our kernels are timed.

1. **Windowed values** (what the backfill computes: one value per event over its entity's
   7-day sliding window, events sorted by entity and time): our hash, ``hll_windows``
   (precision 12; the engine skips it where no window passes 2^p / 8 distinct values) and
   the exact distinct-hash count (the engine's raw parts), and ``percentile_windows`` (q =
   0.9, relative accuracy 0.01) over ``--events``; the
   libraries have no windowed form (no deletes), so per event a sketch of its window is
   built (``--library-events`` events, the rate extrapolates).
2. **One sketch of all values** (a tile's state): ``hll_state`` / ``percentile_state`` vs one
   library sketch updated value by value (their Python API takes one value per call).
3. **Order**: the same distinct values in 200 random orders; how many distinct estimates
   each HLL gives (DataSketches' default HIP estimate depends on the order).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from features.aggregate import sketches as sk  # noqa: E402
from features.aggregate.engine import _distinct_counts  # noqa: E402

DAY_US = 86_400_000_000


def _data(n: int, entities: int, seed: int = 50) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    codes = np.sort(rng.integers(0, entities, n)).astype(np.int64)
    t = rng.integers(0, 30 * DAY_US, n)
    order = np.lexsort((t, codes))
    codes, t = codes[order], t[order]
    items = rng.zipf(1.3, n) % 100_000          # a heavy-tailed catalogue
    price = np.round(rng.lognormal(3, 1.5, n), 2)
    return codes, t, items.astype(np.int64), price


def _lo(codes: np.ndarray, t: np.ndarray, size: int) -> np.ndarray:
    key = codes * (40 * DAY_US) + t
    return np.searchsorted(key, key - size, side="right").astype(np.int64)


def _line(label: str, secs: float, n: int, unit: str = "events/s") -> None:
    print(f"{label:52} {secs:7.2f} s  {n / secs:12,.0f} {unit}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--entities", type=int, default=20_000)
    ap.add_argument("--library-events", type=int, default=5_000)
    ap.add_argument("--libraries", type=Path, default=None, help="a site-packages folder with the libraries")
    args = ap.parse_args(argv)
    if args.libraries is not None:
        sys.path.append(str(args.libraries))
    try:
        import datasketches
        import ddsketch
    except ImportError:
        datasketches = ddsketch = None  # type: ignore[assignment]
    codes, t, items, price = _data(args.events, args.entities)
    lo = _lo(codes, t, 7 * DAY_US)
    mask = np.ones(len(codes), dtype=np.bool_)
    values = pa.array(items)
    print(f"{args.events:,} events, {args.entities:,} entities, 7-day windows "
          f"(mean {float(np.mean(np.arange(len(lo)) - lo + 1)):,.0f} events per window)")
    t0 = time.perf_counter()
    h = sk.hash64(values)
    sk.hll_windows(codes, h, mask, lo, 12)
    _distinct_counts(codes, h.view(np.int64), mask, lo)
    secs = time.perf_counter() - t0
    _line("ours    approx_count_distinct windows (p=12)", secs, len(codes))
    t0 = time.perf_counter()
    sk.percentile_windows(price, mask, lo, (0.9,), 0.01)
    secs = time.perf_counter() - t0
    _line("ours    approx_percentile windows (q=0.9, a=0.01)", secs, len(codes))
    k = min(args.library_events, len(codes))
    if datasketches is not None and ddsketch is not None:
        t0 = time.perf_counter()
        item_list, price_list = items.tolist(), price.tolist()
        for i in range(k):
            h = datasketches.hll_sketch(12)
            for j in range(int(lo[i]), i + 1):
                h.update(item_list[j])
            h.get_estimate()
        secs = time.perf_counter() - t0
        _line(f"library hll_sketch per window ({k:,} events)", secs, k)
        t0 = time.perf_counter()
        for i in range(k):
            d = ddsketch.DDSketch(0.01)
            for j in range(int(lo[i]), i + 1):
                d.add(price_list[j])
            d.get_quantile_value(0.9)
        secs = time.perf_counter() - t0
        _line(f"library DDSketch per window ({k:,} events)", secs, k)
    # one sketch of every value
    t0 = time.perf_counter()
    sk.hll_state(values, 12)
    secs = time.perf_counter() - t0
    _line(f"ours    hll_state of {len(codes):,} values", secs, len(codes), "values/s")
    t0 = time.perf_counter()
    sk.percentile_state(price, 0.01)
    secs = time.perf_counter() - t0
    _line(f"ours    percentile_state of {len(codes):,} values", secs, len(codes), "values/s")
    if datasketches is not None and ddsketch is not None:
        h = datasketches.hll_sketch(12)
        t0 = time.perf_counter()
        for v in items.tolist():
            h.update(v)
        secs = time.perf_counter() - t0
        _line(f"library hll_sketch.update x {len(codes):,}", secs, len(codes), "values/s")
        d = ddsketch.DDSketch(0.01)
        t0 = time.perf_counter()
        for x in price.tolist():
            d.add(x)
        secs = time.perf_counter() - t0
        _line(f"library DDSketch.add x {len(codes):,}", secs, len(codes), "values/s")
        rng = np.random.default_rng(7)
        distinct = np.arange(20_000, dtype=np.int64) * 7919
        lib, ours = set(), set()
        for _ in range(200):
            perm = distinct[rng.permutation(len(distinct))]
            h = datasketches.hll_sketch(12)
            for v in perm.tolist():
                h.update(v)
            lib.add(h.get_estimate())
            ours.add(sk.hll_state_estimate(sk.hll_state(pa.array(perm), 12), 12))
        print(f"order: 20,000 distinct values in 200 orders: datasketches hll get_estimate gives {len(lib)} "
              f"distinct estimates, ours {len(ours)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
