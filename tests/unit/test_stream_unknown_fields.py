"""Unknown JSON keys cost bounded memory: per micro-batch (the columnar decoder ignores
them; it never makes a column per key) and for the job's life (``unknown_fields`` keeps
the top keys and an ``other`` count, docs/streaming.md)."""
from __future__ import annotations

import json
import pickle
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.compile import compile_schema
from features.lineage import RunContext
from features.pipeline.prepare import prepare_records
from features.pipeline.summary import RunSummary
from features.schema import load_schema
from features.sources.records import record_uris
from features.stream.core import StreamStats

ROOT = Path(__file__).resolve().parents[2]

#: the child's peak RSS must stay under this (imports and the 25 MB micro-batch are ~150 MB)
PEAK_RSS_LIMIT_MB = 300
#: the child's address space is capped so that a regression fails (Arrow/Python run out of
#: memory, the child exits 1) instead of taking the shared machine's memory: it took 3.5 GB
#: and more with a column per unknown key
ADDRESS_SPACE_LIMIT = 4 << 30


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))

_CHILD = textwrap.dedent("""
    import datetime as dt, json, resource, sys
    import numpy as np, pyarrow as pa
    from features.compile import compile_schema
    from features.ops.examples import click_history, click_records
    from features.lineage import RunContext
    from features.schema import load_schema
    from features.sources.columnar import ColumnarDecoder
    from features.pipeline.prepare import prepare_records
    from features.sources.records import record_uris

    compiled = compile_schema(load_schema(sys.argv[1] + "/schemas/clicks.yaml"))
    records, keys = int(sys.argv[2]), int(sys.argv[3])
    values = []
    for i, (_, v) in enumerate(click_records(click_history(records))[:records]):
        obj = json.loads(v)
        obj.update({f"x{i:05d}_{j:04d}": 1 for j in range(keys)})  # every key new
        values.append(json.dumps(obj, separators=(",", ":")).encode())
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "run", now)
    n = len(values)
    offsets = np.arange(n, dtype=np.int64)
    uris = record_uris(pa.array(["t"] * n), pa.array([0] * n, pa.int32()), pa.array(offsets))
    decoder = ColumnarDecoder(compiled.schema, max_bytes=compiled.schema.payload.max_bytes)
    def peak_kib():  # VmHWM: this image's own peak (ru_maxrss keeps the forking parent's across exec)
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    before = peak_kib()
    part = prepare_records(values, uris, offsets, compiled, None, ctx, now, decoder=decoder)
    print(json.dumps({"records": n, "bytes": sum(map(len, values)),
                      "rows": part.prepared.rows.num_rows, "rejected": part.prepared.rejected_rows,
                      "before_mb": before / 1024,
                      "peak_mb": peak_kib() / 1024}))
""")


def test_a_micro_batch_of_unique_unknown_keys_stays_small() -> None:
    """2,000 records with 800 keys each that the schema does not know, each key unique
    (1.6 M distinct keys), through the stream's decode path in a child process."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT), "2000", "800"], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, check=False, preexec_fn=_cap_memory)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["records"] == 2000 and out["rows"] + out["rejected"] == 2000, out
    assert out["rows"] > 1500, out  # the records are valid: the unknown keys are only counted
    assert out["peak_mb"] < PEAK_RSS_LIMIT_MB, (
        f"peak RSS {out['peak_mb']:.0f} MB decoding {out['bytes'] / 1e6:.0f} MB of records with "
        f"unique unknown keys (limit {PEAK_RSS_LIMIT_MB} MB; {out['before_mb']:.0f} MB before decoding)")


def test_unknown_fields_stay_bounded_over_many_micro_batches() -> None:
    """10,000 distinct unknown keys over 100 micro-batches (the job's summary is written
    after each): at most the top keys and an ``other`` count are kept, and the counts
    add up to every unknown value seen."""
    import datetime as dt

    compiled = compile_schema(load_schema(ROOT / "schemas" / "clicks.yaml"))
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "run", now)
    stats = StreamStats(RunSummary(run_id="run", schema=compiled.name))
    base = {"event_id": "e", "user_id": "u1", "item_id": "i", "event_type": "view",
            "event_time": "2026-01-01T00:00:00Z"}
    total = 0
    for b in range(100):
        values = []
        for i in range(10):
            keys = {f"k{b:03d}_{i}_{j}": 1 for j in range(10)}  # 100 new keys per batch
            if i < 3:
                keys["often"] = 1  # one key in 300 records: it must stay on top
            total += len(keys)
            values.append(json.dumps({**base, **keys}).encode())
        offsets = np.arange(b * 10, b * 10 + 10, dtype=np.int64)
        uris = record_uris(pa.array(["t"] * 10), pa.array([0] * 10, pa.int32()), pa.array(offsets))
        part = prepare_records(values, uris, offsets, compiled, None, ctx, now)
        stats.unknown_fields.update(part.unknown_fields)
        shown = stats.as_dict()
        assert len(shown["unknown_fields"]) <= 100, f"batch {b}: {len(shown['unknown_fields'])} keys kept"
    from features.sources.records import UNKNOWN_FIELDS_TOP

    assert UNKNOWN_FIELDS_TOP == 100  # docs/streaming.md says so
    shown = stats.as_dict()
    assert shown["unknown_fields"]["often"] == 300
    assert sum(shown["unknown_fields"].values()) + shown["unknown_fields_other"] == total
    assert len(json.dumps(shown["unknown_fields"])) < 100 * 64


def test_top_counter_keeps_the_top_keys_and_counts_the_rest() -> None:
    """At most ``2 * top`` keys are held whatever arrives; ``shown()`` names ``top`` keys,
    largest first, and the held counts plus ``other`` are every count added."""
    from features.sources.records import TopCounter

    c = TopCounter(top=3)
    total = 0
    for i in range(1000):
        c.update([f"new{i}", "a", "a"] + (["b"] if i % 2 else []))  # "a" twice, "b" every other
        total += 3 + i % 2
        assert len(c) <= 6, f"{len(c)} keys held after {i + 1} updates"
        assert sum(c.values()) + c.other == total
    top, other = c.shown()
    assert list(top)[:2] == ["a", "b"] and top["a"] == 2000 and top["b"] == 500
    assert len(top) == 3 and sum(top.values()) + other == total


def test_top_counter_merges_copies_and_pickles_with_its_other_count() -> None:
    """Merging two counters (the job adds each micro-batch's, the summary each
    subtask's) keeps both ``other`` counts; ``+=``, a copy and a pickle keep the bound."""
    from features.sources.records import TopCounter

    a, b = TopCounter(top=2), TopCounter(top=2)
    a.update(["x", "x", "y", "z", "w", "v"])  # 6 keys > 2 * 2: pruned to x and one other
    b.update({"x": 3, "q": 1, "r": 1, "s": 1, "t": 1})
    assert (len(a), a.other, len(b), b.other) == (2, 3, 2, 3)
    a.update(b)
    assert a["x"] == 5 and sum(a.values()) + a.other == 13
    for c in (a.copy(), pickle.loads(pickle.dumps(a))):
        assert (type(c), dict(c), c.top, c.other) == (TopCounter, dict(a), 2, a.other)
    c = a.copy()
    c += {f"k{i}": 1 for i in range(50)}
    assert len(c) <= 4 and sum(c.values()) + c.other == 63


def test_the_unknown_key_pattern_finds_every_record_with_an_unknown_key() -> None:
    """``other_key`` (one regex pass for the records the columnar decoder re-reads for
    their keys) matches any key that is not the schema's, at any place, and no record
    whose keys are all known: it may over-find (escapes, nested keys), never under-find."""
    from features.sources.columnar import other_key

    pattern = other_key(frozenset({"user_id", "user", "ab"}))
    cases = {b'{"user_id":1}': False, b'{"user":1,"ab":2}': False, b'{ "ab" : 1 , "user" :2}': False,
             b'{"ab":"x\\",\\"zz\\":1"}': False,  # the key's text inside a string value
             b'{"use":1}': True, b'{"user_":1}': True, b'{"user_idx":1}': True, b'{"a":1}': True,
             b'{"abc":1}': True, b'{"":1}': True, b'{"ab":1,"x\\"y":2}': True,
             b'{"us\\u0065r":1}': True, b'{"ab":{"q":1}}': True}  # over-found: re-read, nothing counted
    text = pa.array(list(cases), pa.binary()).cast(pa.string())
    found = pc.match_substring_regex(text, pattern).to_pylist()
    assert dict(zip(cases, found, strict=True)) == cases
