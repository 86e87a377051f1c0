"""Example data for the demo, the benchmarks and the tests: deterministic generators.

Every generator is seeded and vectorised (NumPy/Arrow), so a million rows take well
under a second, and the same seed always gives the same bytes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema, compile_schema
from features.schema import load_schema

#: The example schemas, shipped in the package (in a checkout: links to ``schemas/``).
EXAMPLE_SCHEMAS = Path(__file__).resolve().parents[1] / "example_schemas"
#: The example views over them (in a checkout: links to ``views/``).
EXAMPLE_VIEWS = Path(__file__).resolve().parents[1] / "example_views"
SEED = 20240611
INVALID_SHARE = 0.02


def applicant_schema() -> CompiledSchema:
    return compile_schema(load_schema(EXAMPLE_SCHEMAS / "credit_applicant.yaml"))


def applicants(rows: int, seed: int = SEED, *, first_id: int = 10**9, invalid_share: float = INVALID_SHARE,
               compiled: CompiledSchema | None = None) -> pa.Table:
    """``rows`` applicant rows for ``schemas/credit_applicant.yaml`` in its declared types.

    Deterministic for a given ``seed``. About ``invalid_share`` of the rows carry one
    fault (5% of those a second one), spread over 16 kinds across the columns and rules
    (bad id pattern, null event time, income 0 / null / too large, duration out of
    range, unknown enum value, age, debt, score, amount, region length). Application
    ids are ``APP-`` + 12 digits counting from ``first_id``.""" 
    rng = np.random.default_rng(seed)
    n = rows
    ids = pc.binary_join_element_wise(
        "APP-",
        pc.utf8_lpad(pc.cast(pa.array(np.arange(n, dtype=np.int64) + first_id), pa.string()), 12, "0"),
        "",
    )
    start = np.datetime64("2023-01-01T00:00:00", "us").astype(np.int64)
    submitted = start + rng.integers(0, 365 * 86_400 * 10**6, n)
    income = rng.integers(50_000, 2_000_000, n)  # cents
    duration = rng.integers(0, 480, n).astype(np.int32)
    duration_null = rng.random(n) < 0.05
    statuses = np.array(["employed", "self_employed", "unemployed", "retired", "student"])
    status = statuses[rng.integers(0, len(statuses), n)].astype(object)
    status_null = rng.random(n) < 0.02
    age = rng.integers(18, 90, n).astype(np.int16)
    debt = rng.integers(0, 5_000_000, n)
    debt_null = rng.random(n) < 0.3
    score = rng.integers(300, 851, n).astype(np.int32)
    score_null = rng.random(n) < 0.1
    amount = rng.integers(10_000, 100_000_000, n)
    regions = np.array(["north", "south", "east", "west", "centre", "overseas-territories"])
    region = regions[rng.integers(0, len(regions), n)].astype(object)
    region_null = rng.random(n) < 0.05
    since = rng.integers(8_000, 19_700, n).astype(np.int32)
    since_null = rng.random(n) < 0.4
    submitted_null = np.zeros(n, dtype=bool)
    income_null = np.zeros(n, dtype=bool)

    # Faults: ~2% of rows, each one of 16 kinds (5% of those get a second fault).
    bad = np.flatnonzero(rng.random(n) < invalid_share)
    kinds = rng.integers(0, 16, len(bad))
    second = bad[rng.random(len(bad)) < 0.05]
    bad_ids: list[int] = []
    for rows_, kind in [(bad[kinds == k], k) for k in range(16)] + [(second, 4)]:
        if kind == 0:
            bad_ids += rows_.tolist()
        elif kind == 1:
            submitted_null[rows_] = True
        elif kind == 2:
            income[rows_] = 0
        elif kind == 3:
            income_null[rows_] = True
        elif kind == 4:
            income[rows_] = 10_000_000_000
        elif kind == 5:
            duration[rows_] = -1
            duration_null[rows_] = False
        elif kind == 6:
            duration[rows_] = 1500
            duration_null[rows_] = False
        elif kind == 7:
            status[rows_] = "contractor"
            status_null[rows_] = False
        elif kind == 8:
            age[rows_] = 15
        elif kind == 9:
            age[rows_] = 130
        elif kind == 10:
            debt[rows_] = -500
            debt_null[rows_] = False
        elif kind == 11:
            score[rows_] = 200
            score_null[rows_] = False
        elif kind == 12:
            score[rows_] = 900
            score_null[rows_] = False
        elif kind == 13:
            amount[rows_] = 5_000
        elif kind == 14:
            region[rows_] = "X"
            region_null[rows_] = False
        else:
            region[rows_] = "a-region-name-much-longer-than-allowed"
            region_null[rows_] = False
    if bad_ids:
        bad_idx = np.asarray(sorted(bad_ids), dtype=np.int64)
        replacement = pa.array([f"APP-{i}" for i in bad_idx], pa.string())
        pos = np.arange(n, dtype=np.int64)
        pos[bad_idx] = n + np.arange(len(bad_idx))
        ids = pa.concat_arrays([ids, replacement]).take(pa.array(pos))

    compiled = compiled or applicant_schema()
    schema = compiled.arrow_schema
    columns = {
        "application_id": ids,
        "submitted_at": pa.array(submitted, pa.int64(), mask=submitted_null).view(
            pa.timestamp("us", tz="UTC")),
        "income_monthly": _cents(income, income_null),
        "employment_duration_months": pa.array(duration, pa.int32(), mask=duration_null),
        "employment_status": pa.array(status, pa.string(), mask=status_null),
        "age": pa.array(age, pa.int16()),
        "existing_debt": _cents(debt, debt_null),
        "credit_score": pa.array(score, pa.int32(), mask=score_null),
        "requested_amount": _cents(amount, None),
        "region": pa.array(region, pa.string(), mask=region_null),
        "customer_since": pa.array(since, pa.int32(), mask=since_null).view(pa.date32()),
    }
    # Written with nullable fields: a file at rest may hold nulls anywhere.
    file_schema = pa.schema([pa.field(f.name, f.type, nullable=True) for f in schema])
    return pa.Table.from_arrays([columns[f.name] for f in file_schema], schema=file_schema)


#: Payloads that are not events: every one must end as a ``_payload.decode`` reject.
UNDECODABLE: tuple[bytes | None, ...] = (
    b'{"application_id": "APP-000000000001", "submitted_at": ',   # truncated JSON
    b"\xff\xfe not utf-8 \xc3\x28",                               # invalid UTF-8
    b'["an", "array", "not", "an", "object"]',                       # JSON, not an object
    b"null",
    None,                                                             # a tombstone
    b'{"a": ' * 5_000 + b"1" + b"}" * 5_000,                          # nested too deeply (35 KB)
    b'{"application_id": "' + b"x" * 70_000 + b'"}',                # over payload.max_bytes (64 KiB)
)


def applicant_events(events: int, seed: int = SEED, *, entities: int | None = None,
                     duplicate_share: float = 0.02, undecodable_every: int = 500,
                     invalid_share: float = INVALID_SHARE) -> list[bytes | None]:
    """Kafka record values (JSON) for ``schemas/credit_applicant.yaml``, as a producer
    would send them: ``events`` application events over ``entities`` application ids
    (default ``events // 3``, so most ids get several events, in random event-time
    order: out-of-order arrivals), about ``duplicate_share`` of them sent twice (the
    same bytes again, later), ~``invalid_share`` breaking a rule (see
    :func:`applicants`), and one of :data:`UNDECODABLE` after every
    ``undecodable_every`` events. Timestamps and dates are ISO 8601 text, decimals
    decimal text. Deterministic for a seed; a test-data generator (a loop over rows)."""
    rng = np.random.default_rng(seed + 1)
    rows = applicants(events, seed, invalid_share=invalid_share).to_pylist()
    pool = rng.integers(0, max(entities or events // 3, 1), events)
    good_id = re.compile(r"^APP-[0-9]{12}$")
    out: list[bytes | None] = []
    dupes: list[bytes] = []
    bad = 0
    for i, row in enumerate(rows):
        if isinstance(row["application_id"], str) and good_id.match(row["application_id"]):
            row["application_id"] = f"APP-{7 * 10**11 + int(pool[i]):012d}"
        value = json.dumps(row, default=str).encode()
        out.append(value)
        if rng.random() < duplicate_share:
            dupes.append(value)
        if dupes and rng.random() < 0.1:
            out.append(dupes.pop(0))
        if undecodable_every and (i + 1) % undecodable_every == 0:
            out.append(UNDECODABLE[bad % len(UNDECODABLE)])
            bad += 1
    out.extend(dupes)
    return out


def _cents(cents: npt.NDArray[np.int64], null: npt.NDArray[np.bool_] | None) -> pa.Array:
    """decimal128(18, 2) from integer cents, built from its 16-byte storage."""
    cents = np.asarray(cents, dtype=np.int64)
    words = np.empty((len(cents), 2), dtype=np.int64)
    words[:, 0] = cents
    words[:, 1] = cents >> 63
    validity = None
    if null is not None and null.any():
        validity = pa.array(~null).buffers()[1]
    return pa.Array.from_buffers(
        pa.decimal128(18, 2), len(cents), [validity, pa.py_buffer(words.tobytes())],
        null_count=-1 if validity is not None else 0,
    )


def clicks_schema() -> CompiledSchema:
    return compile_schema(load_schema(EXAMPLE_SCHEMAS / "clicks.yaml"))


CLICKS_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def click_history(events: int, seed: int = SEED, *, users: int = 3000, days: float = 9.0,
                  late_share: float = 0.002, duplicate_share: float = 0.01, invalid_share: float = 0.004,
                  edge_share: float = 0.03) -> pa.Table:
    """An event history for ``schemas/clicks.yaml``, in arrival order, that exercises
    every aggregation rule: about ``events`` events of ``users`` users over ``days``
    days; ~30% arrive out of order within the allowed lateness (up to 50 minutes
    behind); ``late_share`` arrive 1-30 hours behind their user's newest event (too
    late); ``duplicate_share`` are sent again a little later (same event id and
    time); ``edge_share`` sit exactly
    on a window edge (1 h or 24 h after another event of the user, or on a UTC
    midnight); long quiet gaps; ``invalid_share`` break a field rule. Types are the
    schema's (Parquet-ready); :func:`click_records` gives the same rows as Kafka JSON.
    Deterministic for a seed; vectorised."""
    rng = np.random.default_rng(seed + 7)
    hour_ms, day_ms = 3_600_000, 86_400_000
    n = events
    weights = 1.0 / np.arange(1, users + 1) ** 0.8                       # a few busy users
    user = rng.choice(users, size=n, p=weights / weights.sum())
    # each user is active in bursts: quiet gaps of days between them
    base = CLICKS_START_MS + (rng.random(n) * days * day_ms).astype(np.int64)
    burst = (user * 7919) % 5 == 0
    base[burst] = CLICKS_START_MS + (((base[burst] - CLICKS_START_MS) // (2 * day_ms)) * 2 * day_ms
                                     + rng.integers(0, 2 * hour_ms, burst.sum()))
    base = (base // 1000) * 1000                                          # whole seconds: ties happen
    k = int(n * edge_share)
    src = rng.integers(0, n, k)
    shift = rng.choice(np.array([hour_ms, day_ms], dtype=np.int64), k)
    edge_t = base[src] + shift
    midnight = rng.random(k) < 0.3
    edge_t[midnight] = (base[src][midnight] // day_ms + 1) * day_ms
    user = np.concatenate([user, user[src]])
    base = np.concatenate([base, edge_t])
    order = np.argsort(base, kind="stable")
    user, base = user[order], base[order]
    m = len(base)
    t = base.copy()
    ooo = rng.random(m) < 0.3
    t[ooo] -= rng.integers(0, 50 * 60_000, ooo.sum())
    # too late: more than the allowed lateness (1 h) behind the user's newest event so far
    prev = pd.Series(t).groupby(user).cummax().groupby(user).shift(1).to_numpy(dtype=np.float64,
                                                                                na_value=np.nan)
    late = (rng.random(m) < late_share) & ~np.isnan(prev)
    t[late] = prev[late].astype(np.int64) - rng.integers(hour_ms + 60_000, 30 * hour_ms, late.sum())
    items = rng.integers(0, 400, m)
    kinds = rng.choice(np.array(["view", "click", "add_to_cart", "purchase"]), m, p=[0.55, 0.3, 0.1, 0.05])
    dwell = rng.integers(0, 120_000, m)
    dwell_null = rng.random(m) < 0.1
    price = rng.integers(0, 50_000, m)
    price_null = (kinds == "view") & (rng.random(m) < 0.7)
    user_txt = np.char.add("u", user.astype(str)).astype(object)
    bad = rng.random(m) < invalid_share
    user_txt[bad] = np.char.add("bad-", user[bad].astype(str))
    ids = np.char.add("e", np.arange(m).astype(str)).astype(object)
    # duplicates: the same event again, 1-20 positions later (a producer's retry)
    d = int(m * duplicate_share)
    dsrc = rng.integers(0, m, d)
    pos = np.concatenate([np.arange(m), np.minimum(dsrc + rng.integers(1, 20, d), m - 1) + 0.5])
    idx = np.concatenate([np.arange(m), dsrc])[np.argsort(pos, kind="stable")]
    return pa.table({
        "event_id": pa.array(ids[idx], pa.string()),
        "user_id": pa.array(user_txt[idx], pa.string()),
        "item_id": pa.array(np.char.add("i", items[idx].astype(str)).astype(object), pa.string()),
        "event_type": pa.array(kinds[idx].astype(object), pa.string()),
        "event_time": pa.array(t[idx], pa.timestamp("ms", "UTC")),
        "dwell_ms": pa.array(dwell[idx].astype(np.int32), pa.int32(), mask=dwell_null[idx]),
        "price": _cents(price[idx], price_null[idx]).cast(pa.decimal128(12, 2)),
        "session_id": pa.array(np.char.add("s", (user[idx] * 31 + t[idx] // (6 * hour_ms)).astype(str))
                               .astype(object), pa.string()),
    })


def click_records(history: pa.Table) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` Kafka records of :func:`click_history` rows, in the same order:
    keyed by user id (so each user's events keep their order in one partition), values
    JSON with ISO 8601 times and decimal text prices."""
    cols = {name: history.column(name).to_pylist() for name in history.column_names}
    out = []
    for i in range(history.num_rows):  # test-data generator: a loop over rows
        row = {k: v[i] for k, v in cols.items()}
        row["event_time"] = row["event_time"].isoformat().replace("+00:00", "Z")
        row["price"] = None if row["price"] is None else str(row["price"])
        out.append((row["user_id"].encode(), json.dumps(row).encode()))
    return out
