"""A brute-force reference for windowed aggregations, independent of the engine, and the
random histories the aggregation tests share.

:func:`reference` reads ``docs/aggregations.md`` literally, one event at a time, with
Python's own numbers: the history keeps every distinct event (entity, event time,
content digest) once; each instant gets, per aggregation, the value over the entity's
history events in its window, every event at that instant included, events at one
instant ordered by digest. No code of ``features.aggregate`` is used (only the parsed
schema, for the declarations, and the digest of ``features.kernels.digest``, whose
per-value words the sketches hash too). The sketches (``approx_count_distinct``,
``approx_percentile``) are the docs' definitions in plain Python integers and floats.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import sys
from collections import defaultdict
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from features.schema.model import Aggregation, Schema, TypeKind

#: the key of an event dict holding its event time, microseconds since the epoch
T = "__t_us"


def stream_late(schema: Schema, events: list[dict[str, Any]]) -> set[int]:
    """Indices of the events the stream calls late: more than ``allowed_lateness``
    older than the newest earlier non-late event of their entity (arrival order)."""
    assert schema.aggregations is not None and schema.entity is not None
    lateness = schema.aggregations.allowed_lateness_s * 1_000_000
    newest: dict[Any, int] = {}
    late = set()
    for i, e in enumerate(events):
        key, t = e[schema.entity], e[T]
        if key in newest and t < newest[key] - lateness:
            late.add(i)
            continue
        newest[key] = max(newest.get(key, t), t)
    return late


def reference(schema: Schema, events: list[dict[str, Any]]) -> dict[tuple[Any, int], tuple[Any, ...]]:
    """``{(entity, event time us): (value per aggregation, declaration order)}`` for the
    history of ``events`` (dicts of field values plus :data:`T`, in input order)."""
    out: dict[tuple[Any, int], tuple[Any, ...]] = {}
    for key, evs in history_of(schema, events).items():
        for e in evs:
            out[(key, e[T])] = values_at(schema, evs, e[T])
    return out


def history_of(schema: Schema, events: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    """Per entity, its history events (every distinct event: the first of each (entity,
    event time, digest) in input order), oldest first, at one instant by digest (the tie
    rule: the greater digest is the later event)."""
    assert schema.entity is not None
    history: dict[tuple[Any, int, str], dict[str, Any]] = {}
    for e, d in zip(events, event_digests(schema, events), strict=True):
        history.setdefault((e[schema.entity], e[T], d), e)
    pairs: dict[Any, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for (key, _, d), e in history.items():
        pairs[key].append((d, e))
    per: dict[Any, list[dict[str, Any]]] = {}
    for key, ps in pairs.items():
        ps.sort(key=lambda p: (p[1][T], p[0]))
        per[key] = [e for _, e in ps]
    return per


def reference_at(schema: Schema, events: list[dict[str, Any]], requests: list[tuple[Any, int]]
                 ) -> list[tuple[Any, ...]]:
    """Request-time windows (docs/aggregations.md, "Windows at request time"): for each
    request ``(entity, T us)``, the value per aggregation (declaration order) over the
    entity's history events in its window at ``T``, by a plain scan per request."""
    per = history_of(schema, events)
    return [values_at(schema, per.get(key, []), t) for key, t in requests]


def values_at(schema: Schema, evs: list[dict[str, Any]], t: int) -> tuple[Any, ...]:
    """Every aggregation (declaration order) over the events ``evs`` of one entity in
    their windows at time ``t`` (µs): sliding ``(t - size, t]``, tumbling
    ``[t // size * size, t]``."""
    assert schema.aggregations is not None
    values: dict[str, Any] = {}
    for agg in schema.aggregations.features:
        if agg.function == "ratio":
            continue
        assert agg.window is not None
        size = agg.window.size_s * 1_000_000
        if agg.window.kind == "sliding":
            window = [x for x in evs if t - size < x[T] <= t]
        else:
            start = t // size * size
            window = [x for x in evs if start <= x[T] <= t]
        window = [x for x in window if all(x[f] in allowed for f, allowed in agg.where)]
        vs = ([x.get(agg.of) for x in window if x.get(agg.of) is not None] if agg.of
              else [1] * len(window))
        values[agg.name] = (vs[::-1][:agg.k] if agg.function == "last_k"  # newest first
                            else _value(schema, agg, vs))
    for agg in schema.aggregations.features:
        if agg.function == "ratio":
            num, den = values[agg.numerator or ""], values[agg.denominator or ""]
            values[agg.name] = agg.on_zero if not den else (None if num is None else num / den)
    return tuple(values[a.name] for a in schema.aggregations.features)


def event_digests(schema: Schema, events: list[dict[str, Any]]) -> list[str]:
    """The content digest of each event (dicts of field values plus :data:`T`), as the
    stores compute it from the same values in the schema's types."""
    from features.compile.arrow import arrow_type
    from features.kernels.digest import digests

    cols: dict[str, pa.Array] = {}
    for f in schema.fields:
        t = arrow_type(f.type)
        if f.name == schema.event_time:
            us = [e[T] for e in events]
            if pa.types.is_date(t):
                cols[f.name] = pa.array([u // 86_400_000_000 for u in us], pa.int32()).cast(pa.date32())
            else:
                per = {"s": 1_000_000, "ms": 1000, "us": 1, "ns": 1}[t.unit]
                cols[f.name] = pa.array([u // per * (1000 if t.unit == "ns" else 1) for u in us],
                                        pa.int64()).cast(t)
        else:
            cols[f.name] = pa.array([e.get(f.name) for e in events], t)
    return digests(pa.table(cols), schema).to_pylist()


def with_digest(schema: Schema, table: pa.Table) -> pa.Table:
    """A table of events (the schema's fields, as :func:`history_table` makes them) with
    the ``_digest`` column the stores give every valid row."""
    from features.kernels.digest import digests

    return table.append_column("_digest", digests(table, schema))


def _value(schema: Schema, agg: Aggregation, vs: list[Any]) -> Any:
    function, of = agg.function, agg.of
    if function == "approx_count_distinct":
        assert of is not None and agg.precision is not None
        return hll_reference(schema, of, vs, agg.precision)
    if function == "approx_percentile":
        assert of is not None and agg.relative_accuracy is not None
        got = percentile_reference(schema, of, vs, agg.quantiles, agg.relative_accuracy)
        return got if isinstance(agg.q, tuple) or got is None else got[0]
    if function == "count":
        return len(vs)
    if function == "count_distinct":
        return len(set(vs))
    if function in ("min", "max", "last", "first") and not vs:
        return None
    if function == "first":
        return vs[0]
    if function == "min":
        return min(vs)
    if function == "max":
        return max(vs)
    if function == "last":
        return vs[-1]
    assert of is not None
    ft = schema.field(of).type
    scale = int(ft.scale or 0) if ft.kind is TypeKind.DECIMAL else 0
    if agg.scale is not None:  # a float field: fixed point
        return _fixed(function, [_unscaled_float(v, agg.scale) for v in vs], agg.scale)
    if function in _MOMENTS:
        unscaled = [int(v.scaleb(scale)) if isinstance(v, Decimal) else int(v) for v in vs]
        return _fixed(function, unscaled, scale)
    if function == "sum":
        return sum(vs, Decimal(0) if scale or ft.kind is TypeKind.DECIMAL else 0)
    # mean: the exact sum (unscaled) as a double, / count, / 10**scale (docs/aggregations.md)
    if not vs:
        return None
    unscaled = sum(int(v.scaleb(scale)) if isinstance(v, Decimal) else int(v) for v in vs)
    mean = float(unscaled) / float(len(vs))
    return mean / float(10 ** scale) if scale else mean


_MOMENTS = ("variance", "stddev", "variance_sample", "stddev_sample")
_M64 = (1 << 64) - 1


def splitmix64(word: int) -> int:
    """SplitMix64 of ``word`` (the sketches' hash, docs/aggregations.md), in Python integers."""
    z = (word + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def hll_reference(schema: Schema, of: str, vs: list[Any], p: int) -> int:
    """approx_count_distinct by docs/aggregations.md: the distinct hashes while at most
    2^p / 8, else registers and Ertl's estimator."""
    from features.compile.arrow import arrow_type
    from features.kernels.digest import value_words

    if not vs:
        return 0
    hashes = {splitmix64(int(word)) for word in value_words(pa.array(vs, arrow_type(schema.field(of).type)))}
    if len(hashes) <= (1 << p) // 8:  # exact while small
        return len(hashes)
    m = 1 << p
    regs = [0] * m
    for h in hashes:
        rest = (h << p) & _M64
        rho = min(64 - rest.bit_length() + 1, 63 - p)
        regs[h >> (64 - p)] = max(regs[h >> (64 - p)], rho)
    x = regs.count(0) / m
    z, y, xx = x, 1.0, x
    while x > 0:  # sigma(x), the paper's loop
        xx = xx * xx
        z_new = z + xx * y
        y = y + y
        if z_new == z:
            break
        z = z_new
    w = sum(1 << (63 - p - r) for r in regs if r)
    est = (m * m / (2.0 * math.log(2.0))) / (m * z + float(w) * 2.0 ** -(63 - p))
    return round(est)


def percentile_reference(schema: Schema, of: str, vs: list[Any], qs: tuple[float, ...], a: float
                         ) -> list[float] | None:
    """approx_percentile by docs/aggregations.md: each value's bucket from its exponent
    and fraction bits, the bucket of rank floor(q (n - 1)), its harmonic mean."""
    if not vs:
        return None
    ft = schema.field(of).type
    scale = int(ft.scale or 0) if ft.kind is TypeKind.DECIMAL else 0
    xs = sorted(float(int(v.scaleb(scale))) / float(10 ** scale) if isinstance(v, Decimal) else float(v)
                for v in vs)
    b = math.ceil((1 - a) / (2 * a))
    while 1 / (2 * b + 1) > a:
        b += 1
    out = []
    for q in qs:
        x = xs[math.floor(q * float(len(xs) - 1))]
        if x == 0:
            out.append(0.0)
            continue
        mant, e = math.frexp(abs(x))           # |x| = mant 2^e, mant in [0.5, 1)
        f = int(mant * 2 ** 53) - 2 ** 52      # the fraction bits of (2 mant) 2^(e - 1)
        k = (e - 1) * b + (f * b >> 52)
        e2, j = divmod(k, b)
        try:
            mag = math.ldexp(2.0 * (b + j) * (b + j + 1) / (b * (2 * b + 2 * j + 1)), e2)
        except OverflowError:  # the top buckets: clamped to the largest double
            mag = sys.float_info.max
        out.append(mag if x > 0 else -mag)
    return out


def _unscaled_float(v: float, scale: int) -> int:
    """A float's exact value in units of 10^-scale, rounded half to even (docs/aggregations.md)."""
    return int((Decimal(v) * Decimal(10) ** scale).to_integral_value(ROUND_HALF_EVEN))


def _fixed(function: str, xs: list[int], scale: int) -> Any:
    """sum, mean, variance and stddev of unscaled integers ``xs`` at ``scale``: the exact
    integers, then double precision (docs/aggregations.md)."""
    n, s, ss = len(xs), sum(xs), sum(x * x for x in xs)
    if function == "sum":
        return float(s) / float(10 ** scale)
    if function == "mean":
        return None if not n else float(s) / float(n) / float(10 ** scale)
    sample = function.endswith("_sample")
    if n < (2 if sample else 1):
        return None
    var = float(n * ss - s * s) / float(n * (n - 1) if sample else n * n)
    var = var / float(10 ** (2 * scale)) if scale else var
    return math.sqrt(var) if function.startswith("stddev") else var


# --------------------------------------------------------------------------- shared test data

#: one schema with every function, both window kinds, where filters, and hot values
SCHEMA = """
name: agg_props
version: 1.0.0
entity: uid
event_time: ts
fields:
  - {name: uid, type: string, constraints: {required: true}}
  - {name: ts, type: "timestamp(ms, UTC)", constraints: {required: true}}
  - {name: kind, type: enum, values: [a, b, c], constraints: {required: true}}
  - {name: amount, type: "decimal(10,2)", accept_strings: true, constraints: {nullable: true}}
  - {name: qty, type: int32, constraints: {nullable: true}}
  - {name: score, type: float64, constraints: {nullable: true}}
  - {name: item, type: string, constraints: {nullable: true}}
  - {name: temp, type: float64, constraints: {nullable: true}}
aggregations:
  allowed_lateness: 30m
  features:
    - {name: n_1h, function: count, window: 1h, store: [hot, cold]}
    - {name: a_1h, function: count, where: {kind: a}, window: 1h, store: cold}
    - {name: ratio_a, function: ratio, numerator: a_1h, denominator: n_1h, on_zero: -1.0, store: [hot, cold]}
    - {name: qty_sum_2h, function: sum, of: qty, window: 2h, store: cold}
    - {name: amount_mean_1h, function: mean, of: amount, where: {kind: [a, b]}, window: 1h,
       store: [hot, cold]}
    - {name: amount_day, function: sum, of: amount, window: {size: 1d, type: tumbling}, store: [hot, cold]}
    - {name: score_min, function: min, of: score, window: 1h, store: cold}
    - {name: score_max, function: max, of: score, window: 3h, store: cold}
    - {name: qty_max_hour, function: max, of: qty, window: {size: 1h, type: tumbling}, store: cold}
    - {name: score_last, function: last, of: score, window: 1h, store: cold}
    - {name: items_2h, function: count_distinct, of: item, window: 2h, store: cold}
    - {name: qty_count, function: count, of: qty, window: 90m, store: cold}
    # moments, float fixed point, first (issue 32)
    - {name: qty_var, function: variance, of: qty, window: 2h, store: cold}
    - {name: qty_std_hour, function: stddev_sample, of: qty, window: {size: 1h, type: tumbling},
       store: [hot, cold]}
    - {name: amount_std, function: stddev, of: amount, window: 1h, store: [hot, cold]}
    - {name: amount_var_s, function: variance_sample, of: amount, where: {kind: [a, b]}, window: 3h,
       store: cold}
    - {name: temp_sum, function: sum, of: temp, scale: 1, window: 1h, store: [hot, cold]}
    - {name: temp_mean, function: mean, of: temp, window: 2h, store: cold}
    - {name: temp_std_s, function: stddev_sample, of: temp, scale: 3, window: 90m, store: [hot, cold]}
    - {name: temp_var_day, function: variance, of: temp, scale: 0, window: {size: 1d, type: tumbling},
       store: cold}
    - {name: qty_first, function: first, of: qty, window: 1h, store: [hot, cold]}
    - {name: score_first, function: first, of: score, window: 2h, store: cold}
    - {name: amount_first_day, function: first, of: amount, window: {size: 1d, type: tumbling}, store: cold}
    - {name: score_last3, function: last_k, of: score, k: 3, window: 1h, store: [hot, cold]}
    - {name: qty_last2_day, function: last_k, of: qty, k: 2, where: {kind: [a, b]},
       window: {size: 1d, type: tumbling}, store: cold}
    # sketches (issue 50)
    - {name: items_approx_2h, function: approx_count_distinct, of: item, precision: 4, window: 2h,
       store: [hot, cold]}
    - {name: qty_approx_day, function: approx_count_distinct, of: qty, where: {kind: [a, b]},
       window: {size: 1d, type: tumbling}, store: cold}
    - {name: score_p90, function: approx_percentile, of: score, q: 0.9, window: 1h, store: [hot, cold]}
    - {name: amount_pcts, function: approx_percentile, of: amount, q: [0, 0.5, 0.99], relative_accuracy: 0.05,
       window: 2h, store: [hot, cold]}
"""
#: 22:00 UTC: the 9 hours of a history cross a UTC midnight (the tumbling day)
BASE_US = int(dt.datetime(2026, 3, 1, 22, 0, tzinfo=dt.UTC).timestamp()) * 1_000_000
MINUTE_US = 60_000_000
USERS = ("u1", "u2", "u3")

#: one event of :data:`SCHEMA` (field values, and its time under :data:`T`): minutes over
#: 9 hours (ties on purpose) or a window edge to the millisecond
EVENT = st.fixed_dictionaries({
    "uid": st.sampled_from(USERS),
    T: st.one_of(st.integers(0, 540).map(lambda m: BASE_US + m * MINUTE_US),
                 st.sampled_from([BASE_US + 60 * MINUTE_US - 1000, BASE_US + 60 * MINUTE_US,
                                  BASE_US + 120 * MINUTE_US])),
    "kind": st.sampled_from(["a", "b", "c"]),
    "amount": st.one_of(st.none(), st.decimals(min_value=Decimal("-500"), max_value=Decimal("99999"),
                                               places=2, allow_nan=False, allow_infinity=False)),
    "qty": st.one_of(st.none(), st.integers(-2**31, 2**31 - 1)),
    "score": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=64)),
    "item": st.one_of(st.none(), st.sampled_from(["i1", "i2", "i3", "i4"])),
    # finite floats the fixed points hold (|x| * 10^6 < 2^52), with exact halves (ties at
    # scales 0 and 1) and products that round to a half in double precision
    "temp": st.one_of(st.none(), st.floats(-1e6, 1e6), st.integers(-4000, 4000).map(lambda k: k / 4),
                      st.sampled_from([5e-7, 1.5e-6, 2.5e-6, -5e-7, 0.05, 0.15, 0.25, -0.35, 1e-300, -0.0])),
})


def one_content_per_key(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every event of one (uid, time) made the first one's copy: a history's content then
    cannot depend on the input order."""
    first: dict[Any, dict[str, Any]] = {}
    return [first.setdefault((e["uid"], e[T]), e) for e in events]


def history_table(events: list[dict[str, Any]]) -> pa.Table:
    """Events of :data:`SCHEMA` as an Arrow table (Parquet-ready, the schema's types)."""
    return pa.table({
        "uid": pa.array([e["uid"] for e in events], pa.string()),
        "ts": pa.array([e[T] // 1000 for e in events], pa.timestamp("ms", "UTC")),
        "kind": pa.array([e["kind"] for e in events], pa.string()),
        "amount": pa.array([e["amount"] for e in events], pa.decimal128(10, 2)),
        "qty": pa.array([e["qty"] for e in events], pa.int32()),
        "score": pa.array([e["score"] for e in events], pa.float64()),
        "item": pa.array([e["item"] for e in events], pa.string()),
        "temp": pa.array([e.get("temp") for e in events], pa.float64()),
    })


def random_history(rng: Any, n: int, *, users: int, minutes: int) -> list[dict[str, Any]]:
    """``n`` random events of SCHEMA over ``users`` entities and ``minutes`` minutes from
    BASE_US, one per (entity, time) key (the first drawn wins), drawn from ``rng``."""
    events = [{"uid": f"user-{rng.randrange(users)}", T: BASE_US + rng.randrange(minutes) * MINUTE_US,
               "kind": rng.choice("abc"), "amount": Decimal(rng.randrange(-500, 5000)) / 100,
               "qty": rng.choice([None, rng.randrange(10)]), "score": rng.choice([None, rng.random()]),
               "item": rng.choice([None, "x", "y", "z"]),
               "temp": rng.choice([None, rng.uniform(-50, 50)])} for _ in range(n)]
    return list({(e["uid"], e[T]): e for e in events}.values())


def check_hot(client: Any, key_prefix: str, schema: Schema, want: dict[tuple[Any, int], tuple[Any, ...]]
              ) -> None:
    """Redis holds, per entity of ``want``, the hot values of its newest event (a null
    value: an absent field)."""
    from features.compile.layout import aggregates_key

    assert schema.aggregations is not None
    names = [a.name for a in schema.aggregations.features]
    hot = [a.name for a in schema.aggregations.features if "hot" in a.store]
    for entity in {k[0] for k in want}:
        newest = max(t for (e, t) in want if e == entity)
        stored = client.hgetall(key_prefix + aggregates_key(schema.name, entity))
        assert int(stored[b"_event_time"]) == newest, entity
        values = dict(zip(names, want[(entity, newest)], strict=True))
        for name in hot:
            if values[name] is None:
                assert name.encode() not in stored, (entity, name)
            elif isinstance(values[name], list):  # last_k: a JSON array (docs/redis.md)
                assert json.loads(stored[name.encode()]) == values[name], (entity, name)
            else:
                assert Decimal(stored[name.encode()].decode()) == Decimal(str(values[name])), (entity, name)


__all__ = ["BASE_US", "EVENT", "MINUTE_US", "SCHEMA", "USERS", "T", "check_hot", "history_of",
           "history_table",
           "one_content_per_key", "random_history", "reference", "reference_at", "splitmix64", "stream_late",
           "values_at"]
