"""Windowed aggregations evaluated at a request time ``T``: the one definition.

A window read at time ``T`` (a training row's timestamp, later the online read's clock)
covers the entity's history events

- sliding window ``size``: event time in ``(T - size, T]`` (exact, no hop: an event
  exactly ``size`` before ``T`` is out, an event exactly at ``T`` is in);
- tumbling window ``size``: event time in ``T``'s epoch-aligned bucket, ``[floor(T / size)
  * size, T]`` (UTC days for ``1d``);

counting, as the per-event values do, only events that match ``where`` and (with
``of``) have a non-null value. These are the per-event bounds of
``features.aggregate.engine`` with ``t`` replaced by ``T``, so a request at exactly an
event's time reads that event's ``<schema>__aggregates`` value, and a request between
events reads a window that has decayed: events that left it no longer count. An empty
window is the same empty value the engine gives: ``count``, ``count_distinct``,
``approx_count_distinct`` and ``sum`` 0, ``last_k`` ``[]``, every other function null, a
ratio its ``on_zero`` where its denominator is 0 or null.

How (vectorised, no loop per request): each request time becomes one extra row of its
entity's events that counts for nothing, sorted after the events at the same time; the
engine's window machinery (:func:`features.aggregate.engine.window_raw`: window starts
by binary search, prefix sums for counts, sums and moments, a sparse table for min/max,
fills for first/last, a gather for ``last_k``, the linked-list count for
``count_distinct``, the sketches' register runs and wavelet matrix) gives every row the
value of its window, and the request rows' values go through the engine's
:func:`~features.aggregate.engine.finalize`. Cost: one sort of events plus requests,
O((n + m) log(n + m)).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from features.aggregate.engine import (
    I64,
    AggSpec,
    Inputs,
    digest_ranks,
    finalize,
    group_codes,
    raw_schema,
    window_raw,
)
from features.errors import ConfigError
from features.schema.model import Aggregation


def needed(spec: AggSpec, names: Sequence[str]) -> tuple[Aggregation, ...]:
    """The aggregations ``names`` need computed (a ratio needs its numerator and
    denominator), in declaration order; ConfigError naming the unknown ones."""
    by_name = {a.name: a for a in spec.aggregations.features}
    unknown = [x for x in names if x not in by_name]
    if unknown:
        raise ConfigError(f"no aggregation(s) {', '.join(map(repr, unknown))} in schema {spec.schema.name!r} "
                          f"(it has {', '.join(by_name) or 'none'})", key="features")
    want = set(names)
    for x in names:
        a = by_name[x]
        if a.function == "ratio":
            want.update(r for r in (a.numerator, a.denominator) if r is not None)
    return tuple(a for a in spec.aggregations.features if a.name in want)


def sub_spec(spec: AggSpec, names: Sequence[str]) -> AggSpec:
    """``spec`` reduced to the aggregations ``names`` need."""
    aggs = dataclasses.replace(spec.aggregations, features=needed(spec, names))
    out = AggSpec.of(dataclasses.replace(spec.schema, aggregations=aggs))
    assert out is not None
    return out


def fields_read(spec: AggSpec) -> list[str]:
    """The history fields the windowed aggregations of ``spec`` read (``of``, ``where``)."""
    out: dict[str, None] = {}
    for a in spec.windowed:
        if a.of is not None:
            out[a.of] = None
        for name, _ in a.where:
            out[name] = None
    return list(out)


def at_times(spec: AggSpec, events: Inputs, entity: pa.Array, time_us: I64) -> dict[str, pa.Array]:
    """Every aggregation of ``spec`` at each request ``(entity[i], time_us[i])``, over the
    history ``events`` (one per (entity, event time, digest), any order; their entities of the
    type of ``entity``): ``{name: column}``, one value per request in request order,
    typed as stored (:meth:`AggSpec.output_type`). ``events`` must hold every history
    event of the requests' entities in their windows (more do no harm)."""
    n, m = len(events), len(time_us)
    if m == 0:
        return finalize(spec, raw_schema(spec).empty_table())
    if events.entity.type != entity.type:
        entity = entity.cast(events.entity.type)
    codes = group_codes(pa.concat_arrays([events.entity, entity]))
    t = np.concatenate([events.time_us, np.asarray(time_us, dtype=np.int64)])
    is_request = np.concatenate([np.zeros(n, np.bool_), np.ones(m, np.bool_)])
    rows = Inputs.concat([events, _requests(events, entity, m)]) if n else _requests(events, entity, m)
    # by entity, time, and at one time the events (by digest: the tie rule) before the
    # requests (an event at T counts)
    ranks = np.concatenate([digest_ranks(events.digest) if n else np.zeros(0, np.int64),
                            np.zeros(m, np.int64)])
    order: I64 = np.lexsort((ranks, is_request, t, codes)).astype(np.int64)
    raw = window_raw(spec, rows, order, codes[order], t[order])
    at = np.flatnonzero(is_request[order])          # the request rows, in sorted order
    back = np.empty(m, dtype=np.int64)
    back[order[at] - n] = np.arange(m, dtype=np.int64)  # request i is the back[i]-th of them
    take = pa.array(at[back])
    table = pa.table({k: v.take(take) for k, v in raw.items()}) if raw else pa.table({"_": pa.nulls(m)})
    return finalize(spec, table)


def _requests(events: Inputs, entity: pa.Array, m: int) -> Inputs:
    """``m`` rows that count for no aggregation, typed as ``events``' columns."""
    values: dict[str, object] = {}
    for name, v in events.values.items():
        values[name] = pa.nulls(m, v.type) if isinstance(v, pa.Array) else np.zeros(m, dtype=v.dtype)
    return Inputs(entity, np.zeros(m, dtype=np.int64), pa.nulls(m, events.source.type),
                  pa.nulls(m, events.digest.type), {k: np.zeros(m, np.bool_) for k in events.contrib}, values)


__all__ = ["at_times", "fields_read", "needed", "sub_spec"]
