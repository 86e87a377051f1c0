"""Fuzz the schema parser: YAML text -> Schema or SchemaError, and every Schema compiles.

    .venv/bin/python fuzz/fuzz_schema.py --inputs 100000

Each input is a schema file's bytes. UTF-8 text goes to ``parse_schema(text, path)``;
bytes that are not UTF-8 (and one input in eight anyway) are written to a file and go
to ``load_schema(path)``. The promise checked:

- the parser returns a Schema, or raises SchemaError / SchemaErrors whose every
  problem has a non-empty ``reason`` and, inside a SchemaErrors, a line (1-based, in
  the file);
- a Schema compiles (``compile_schema``, Arrow schema, DDL, GX suite as JSON, the
  transform program) or raises CompileError with a message;
- a compiled schema validates and transforms a tiny batch of hostile rows (right
  types, wrong types, bounds, NaN, NUL, huge ints) with counts conserved.

Anything else (another exception, RecursionError, a hang, memory) is a crash.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import random
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzzkit
from fuzzkit import FuzzFailure

from features.compile import compile_schema
from features.errors import CompileError, SchemaError, SchemaErrors
from features.kernels import compile_transforms
from features.lineage import BatchLineage, RunContext
from features.pipeline.prepare import process_batch
from features.schema import load_schema, parse_schema
from features.schema.model import Schema, TypeKind
from features.sources.base import SourceBatch
from features.validation.values import objects_batch

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# --------------------------------------------------------------------------- value pools

TYPES = [
    "int8", "int16", "int32", "int64", "float32", "float64", "decimal(18,2)", "decimal(38,0)",
    "decimal(38,38)", "decimal(1,0)", "decimal(5,5)", "string", "enum", "bool", "date",
    "timestamp(us)", "timestamp(ms)", "timestamp(s)", "timestamp(us, UTC)", "timestamp(ms, UTC)",
    "timestamp(s, Europe/Paris)", "timestamp(us, America/New_York)", "timestamp(ns)", "int128",
    "decimal(39,2)", "decimal(18,-1)", "timestamp(us, Mars/Base)", "decimal", "decimal()", "timestamp()",
    "string(10)", "Int32", " int32 ", "decimal(2,3)", "timestamp(us, ../../etc/passwd)",
    "timestamp(us,)", "decimal(" + "9" * 5000 + ",2)", "timestamp(us, " + "A" * 300 + ")",
]
PATTERNS = [
    "^u[0-9]{1,10}$", "(a+)+", "(a|aa)+$", "(a*)*b", "(.*a){20}", "([a-z]+)*[0-9]",
    "((a{255}){255}){255}", "(((a{100}){100}){100}){100}", "[[:alpha:]]+", "[[:foo:]]", r"\d{3}-\d{4}",
    r"\x{41}\x42", r"\x{110000}", r"\x00", "(?i)abc", "(?=a)", "a{,5}", "a{256}", "a{2,1}", "[", "\\",
    "[]a]", "[^]", ".*", "", "\x00", "é+", r"\p{L}", "a**", "a++", "(?:a|b)*?", r"[\D]", "$^", "a|", "|",
    "()", "(?P<n>a)", r"\1", "{", "a{1", "[a-Z]", r"\u0041", "\U0001f600+", "(a{255}){255}",
    "((((((((((a))))))))))", "(" * 300 + ")" * 300, "a" * 5000, "[[:alpha:][:digit:]]{0,255}",
    r"[\x{1}-\x{10FFFF}]+", "(|a)+", "(a?){30}a{30}", r"\d+\s*\w*", "[\\]]", "[a-]", "^", "$",
]
DURATIONS: list[Any] = [
    "1d", "0s", "7d", "12h", "30m", "45s", "1d12h", "0", 0, -1, 1, 86400, 2**31, 2**63, "1h1d", "1.5h",
    "forever", "", None, True, 1.5, "1e3", "-1d", "P1D", "999999999999999999d", "1" + "0" * 30 + "s",
    {"size": "1d", "type": "tumbling"}, {"size": "0s"}, {"type": "sliding"},
    {"size": "1h", "type": "hopping"},
]
IDENTS = [
    "a", "event_time", "user_id", "price", "_hidden", "Name", "select", "a" * 63, "a" * 64, "a" * 54,
    "a" * 55, "", "x y", "é", "a\x00b", "__rejects", "t__rejects", "featureline_schemas", "1a", "a-b",
    "a\nb", "\ud800", "z" * 1000,
]
STEPS: list[Any] = [
    {"fill_null": 0}, "log1p", {"clip": {"lo": 0, "hi": 1}}, {"zscore": {"mean": 0, "std": 0}},
    {"zscore": {"mean": 0, "std": 1e-300}}, {"minmax": {"lo": 1, "hi": 1}},
    {"minmax": {"lo": 0, "hi": 1e308}}, {"bucketize": [1, 2, 3]}, {"bucketize": []}, {"bucketize": [3, 2]},
    {"ratio": {"denominator": "x", "on_zero": None}},
    {"time_since": "days"}, {"time_since": "years"}, {"hash_bucket": 64}, {"hash_bucket": 2**62},
    {"hash_bucket": {"n": 0}}, "one_hot", {"cast": "int8"}, {"cast": "bool"}, {"cast": "string"},
    {"unknown_op": 1}, {"fill_null": None}, {"clip": {}}, {"fill_null": "x"},
    {"clip": {"lo": 1e308, "hi": -1e308}},
    {"hash_bucket": 2**63}, {"bucketize": list(range(2000))}, ["log1p"], None, 5,
]
STORES: list[Any] = ["hot", "cold", "none", ["hot", "cold"], ["hot", "hot"], [], "warm", ["none"], None, 1]
NUMBERS: list[Any] = [
    0, 1, -1, 0.01, 0.5, -0.0, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 10**38, 10**38 - 1,
    1e308, 5e-324, 3.4028235e38, 3.5e38, 99999999.99, 0.001, 1e-10, 123456789012345678901234567890,
    "1.5", "12", "", "abc", True, None,
    "2024-01-01", "2024-01-01T00:00:00", "2024-01-01T00:00:00Z", "2024-01-01T00:00:00+05:30",
    "2024-02-30", "0001-01-01", "9999-12-31T23:59:59.999999", "2024-01-01T00:00:00.000001Z",
    "2024-01-01T00:00:00.5", dt.date(2024, 1, 1), dt.datetime(2024, 1, 1, 12, 0, 0),
]
STRINGS: list[Any] = [
    "", "a", "x" * 300, "\x00", "a\x00b", "\ud800", "\U0010ffff", "é", "' OR 1=1 --", "$$", "\\",
    "line\nbreak", "\t", "null", "true", "1", "\u2028", "a" * 70000, "%s%n", "{{x}}", "'", '"',
]
#: scalars written into the YAML text as they are (number spellings, tags, anchors, escapes)
RAW: list[str] = [
    "1e999999999", "-1e999999999", "1e-999999999", "1e200", "1e100000", "1e400", "-1e400", "1e-400",
    ".inf", "-.inf", ".nan", ".NaN",
    "0x7FFFFFFF", "0x" + "F" * 3000, "0o17", "017", "0b101", "1:30", "1:30:" + "9" * 5000, "1_000",
    "+1", "-0", "0.0", "1e10", "1E+2", "9" * 5000, "9" * 4300, "9" * 4301, "0." + "0" * 1000 + "1",
    "1" + "0" * 400, "~", "null", "Null", "NULL", "true", "yes", "on", "y", "n", "off",
    "2001-12-14t21:59:43.10-05:00", "2024-01-01", "2024-02-30", "0000-00-00", "9999-12-31T23:59:59.999999Z",
    "'2024-01-01T00:00:00+14:00'", '"\\0"', '"\\x00"', '"\\u0000"', '"\\ud800"', '"\\udfff\\ud800"',
    '"\\U0010FFFF"', '"\\U00110000"', "!!binary aGVsbG8=", "!!python/object/apply:os.system ['true']",
    "!!python/name:os.system", "!!python/object/new:object []", "!!str 5", "!!int '5'", "!!int 0x10",
    "!!float 1", "!!float abc", "!!timestamp 2024-01-01", "!!set {a, b}", "!!omap [a: 1]", "!custom x",
    "!!map {a: 1}", "!!seq [1]", "!!null ''", "!!bool maybe", "&anc 5", "*anc", "*undefined",
    "|\n  block", ">\n  folded", "[]", "{}", "[a, [b, [c]]]", "{a: {b: {c: 1}}}", "''", '""', "' '",
    '"\\t"', "? a", "<<: {a: 1}", "[" * 50 + "]" * 50, "{" * 30 + "}" * 30, '"' + "\\u0041" * 200 + '"',
]
KEYS = [
    "name", "version", "description", "entity", "event_time", "hot", "payload", "fields", "features",
    "aggregations", "evolution_rules", "type", "store", "accept_strings", "values", "constraints",
    "required", "nullable", "min", "max", "pattern", "min_length", "max_length", "default", "empty_as_null",
    "from", "steps", "dtype", "on_invalid", "field", "breaking_change", "allowed_lateness", "function", "of",
    "window", "where", "numerator", "denominator", "on_zero", "ttl", "format", "max_bytes", "size", "<<",
    "unknown", "",
]
#: what a key's value is drawn from in the structure-aware mutation
BY_KEY: dict[str, list[Any]] = {
    "type": TYPES, "dtype": TYPES, "cast": TYPES, "pattern": PATTERNS, "ttl": DURATIONS,
    "window": DURATIONS, "allowed_lateness": DURATIONS, "size": DURATIONS, "name": IDENTS,
    "entity": IDENTS, "event_time": IDENTS, "from": IDENTS, "of": IDENTS, "field": IDENTS,
    "numerator": IDENTS, "denominator": IDENTS, "steps": [[s] for s in STEPS] + [[], STEPS[:5]],
    "store": STORES, "min": NUMBERS, "max": NUMBERS, "default": NUMBERS + STRINGS, "lo": NUMBERS,
    "hi": NUMBERS, "mean": NUMBERS, "std": NUMBERS, "on_zero": NUMBERS, "n": NUMBERS,
    "min_length": NUMBERS, "max_length": NUMBERS, "max_bytes": NUMBERS, "version": [
        "1.0.0", "0.0.0", "01.0.0", "1.0", "1.0.0-rc1", "9" * 5000 + ".0.0", "999999999999999999999.1.1", 1.0,
        "", None],
    "values": [["a", "b"], [], ["a", "a"], ["", "x"], [1, 2], [f"v{i}" for i in range(40)],
               [f"v{i}" for i in range(20000)], None, "a"],
    "function": ["count", "sum", "mean", "min", "max", "last", "count_distinct", "ratio", "median", None],
    "format": ["json", "avro", None], "on_invalid": ["null", "reject", None, "drop"],
    "where": [{"event_type": "click"}, {"event_type": []}, {}, {"nope": [1]}, {"dwell_ms": [1, 2]},
              {"price": [1.5]}, {"event_type": [None]}, None, [1]],
    "description": STRINGS,
}
ANY: list[Any] = NUMBERS + STRINGS + DURATIONS[:8] + [None, True, False, [], {}, [[]], {"a": {"b": None}}]

TOKENS: list[bytes] = [t.encode("utf-8", "surrogatepass") for t in [
    *RAW, "fields:", "- name: x\n    type: int32", "constraints:", "&a", "*a", "<<:", "---", "...",
    "%YAML 1.1",
    "%TAG ! tag:x,2000:", "!!", "!", "#", ":", "- ", "? ", "|", ">", "\t", "'", '"', "\\", ",", "[", "]",
    "{", "}", "`", "@", "%", "&", "*", "\r\n", "\n  ", "\n- ", "\ufeff", "\u2028", "\u0085",
]]


# --------------------------------------------------------------------------- generation


class _Raw:
    """A placeholder for a RAW scalar: dumped as a marker, replaced by the raw text."""


def _dump(obj: Any, rng: random.Random, raws: list[str]) -> bytes:
    """``obj`` as YAML text, RAW markers replaced. libyaml refuses lone surrogates: the
    pure-Python emitter then writes them as ``"\\ud800"`` escapes (what we want)."""
    style = rng.choice((False, None, True))
    width = rng.choice((80, 10**9))
    try:
        text = yaml.dump(obj, Dumper=_DUMPER, sort_keys=False, default_flow_style=style,
                         allow_unicode=rng.random() < 0.5, width=width)
    except (yaml.YAMLError, ValueError):
        text = yaml.dump(obj, Dumper=yaml.SafeDumper, sort_keys=False, default_flow_style=style,
                         allow_unicode=False, width=width)
    for i, raw in enumerate(raws):
        marker = f"RAWTOKEN{i}X"
        for quoted in (f"'{marker}'", f'"{marker}"', marker):
            text = text.replace(quoted, raw)
    return text.encode("utf-8", "surrogatepass")


def _pick(rng: random.Random, key: str | None, raws: list[str]) -> Any:
    if rng.random() < 0.15:
        raws.append(rng.choice(RAW))
        return f"RAWTOKEN{len(raws) - 1}X"
    pool = BY_KEY.get(key or "", ANY) if rng.random() < 0.85 else ANY
    return copy.deepcopy(rng.choice(pool))


VALID_TYPES = [
    "int8", "int16", "int32", "int64", "float32", "float64", "decimal(18,2)", "decimal(38,0)",
    "decimal(38,38)", "decimal(1,0)", "decimal(5,5)", "string", "string", "string", "enum", "enum", "bool",
    "date", "timestamp(us)", "timestamp(ms)", "timestamp(s)", "timestamp(us, UTC)", "timestamp(ms, UTC)",
    "timestamp(s, Europe/Paris)", "timestamp(us, America/New_York)",
]
VALID_PATTERNS = [
    "^u[0-9]{1,10}$", "[a-z]+", "(a+)+", "(a|aa)*b", "[[:alpha:]]{0,255}", r"\d{3}-\d{4}", r"\x{41}+",
    ".*", "", "é+", "(?:ab)*", "[\\]a]", r"[\x{1}-\x{10FFFF}]*", "(.*a){20}", r"\w+@\w+\.[a-z]{2,6}",
    "a{255}", "[^,]*",
]
VALID_DURATIONS: list[Any] = ["1d", "12h", "30m", 3600, "1d12h", "45s", "36500d", 3153600000, "1s", 1]
_NUMERIC_STEPS: list[Any] = [
    {"fill_null": 0}, {"clip": {"lo": -10, "hi": 1e6}}, "log1p", {"zscore": {"mean": 1.5, "std": 2}},
    {"minmax": {"lo": 0, "hi": 100}}, {"bucketize": [0, 10, 100]}, {"cast": "float32"}, {"clip": {"hi": 0}},
    {"zscore": {"mean": -1e300, "std": 1e-300}}, {"minmax": {"lo": -1e308, "hi": 1e308}},
]


def _typed_value(rng: random.Random, t: str, hostile: bool) -> Any:
    """A constraint value for type ``t``: plausible, or (hostile) anything."""
    if hostile and rng.random() < 0.3:
        return rng.choice(NUMBERS)
    if t.startswith("int"):
        bits = int(t[3:]) if t[3:].isdigit() else 64
        return rng.choice((0, 1, -5, 100, 2 ** (bits - 1) - 1, -(2 ** (bits - 1))))
    if t.startswith("float"):
        return rng.choice((0, 0.01, 1.5, -2.25, 99.99, 1e10, 0.1, 3.4e38, -1e308))
    if t.startswith("decimal"):
        return rng.choice((0, 0.5, 1, -1))
    if t == "date":
        return rng.choice(("2024-01-01", "1970-01-01", "2100-12-31", "0001-01-01"))
    if t.startswith("timestamp"):
        z = "Z" if "," in t else ""
        return rng.choice((f"2024-01-01T00:00:00{z}", f"2000-06-30T12:30:00{z}", f"1970-01-01T00:00:00{z}"))
    if t == "bool":
        return rng.random() < 0.5
    return rng.choice(("a", "abc", "", "é", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab", "u12"))


def _field(rng: random.Random, i: int, hostile: bool, t: str | None = None) -> dict[str, Any]:
    t = t or rng.choice(TYPES if hostile else VALID_TYPES)
    f: dict[str, Any] = {"name": f"f{i}", "type": t}
    values = rng.choice((["a", "b", "c"], ["x"], [f"v{k}" for k in range(rng.randint(1, 40))]))
    if t == "enum":
        f["values"] = values
    c: dict[str, Any] = {}
    keys = ["nullable", "required", "default"]
    if t == "string":
        keys += ["pattern", "min_length", "max_length", "empty_as_null"]
    elif t not in ("bool", "enum"):
        keys += ["min", "max"]
    if hostile:
        keys = ["nullable", "required", "min", "max", "pattern", "min_length", "max_length", "default",
                "empty_as_null"]
    for key in rng.sample(keys, rng.randint(0, min(3, len(keys)))):
        if key in ("min", "max"):
            c[key] = _typed_value(rng, t, hostile)
        elif key == "default":
            c[key] = rng.choice(values) if t == "enum" and not hostile else _typed_value(rng, t, hostile)
        elif key == "pattern":
            c[key] = rng.choice(PATTERNS if hostile else VALID_PATTERNS)
        elif key in ("min_length", "max_length"):
            c[key] = rng.choice((0, 1, 5, 64, 2**31, 2**63 - 1))
        else:
            c[key] = rng.random() < 0.5
    if c.get("required"):
        c.pop("default", None)
        c.pop("nullable", None)
    if c:
        f["constraints"] = c
    if rng.random() < 0.2 and t not in ("string", "enum"):
        f["accept_strings"] = True
    return f


def _steps(rng: random.Random, f: dict[str, Any], hostile: bool) -> tuple[list[Any], str]:
    """Steps for a feature from field ``f`` and a dtype that fits them (mostly)."""
    if hostile:
        return ([copy.deepcopy(rng.choice(STEPS)) for _ in range(rng.randint(1, 3))],
                rng.choice(("float32", "float64", "int32", "int8", "bool", "string")))
    t = f["type"]
    if t.startswith(("int", "float", "decimal")):
        return [copy.deepcopy(rng.choice(_NUMERIC_STEPS)) for _ in range(rng.randint(1, 3))], "float64"
    if t == "string":
        return [{"hash_bucket": rng.choice((1, 64, 2**31 - 1, 2**62))}], "int64"
    if t == "enum":
        if rng.random() < 0.5:
            return [{"fill_null": f["values"][0]}, "one_hot"], "int8"
        return [{"hash_bucket": 8}], "int32"
    if t == "bool":
        return [{"fill_null": True}, {"cast": "float32"}], "float32"
    return [{"time_since": rng.choice(("ms", "s", "minutes", "hours", "days", "weeks"))}], "float64"


def generate_schema(rng: random.Random) -> bytes:
    """A schema from the grammar: fields, constraints, features and aggregations; mostly
    valid (so compile, validate and the transforms run), one in three hostile."""
    hostile = rng.random() < 0.35
    raws: list[str] = []
    fields = [_field(rng, i, hostile) for i in range(rng.randint(1, 6))]
    doc: dict[str, Any] = {"name": f"s{rng.randrange(100)}", "version": "1.0.0"}
    durations = DURATIONS if hostile else VALID_DURATIONS
    if rng.random() < 0.6:
        key = _field(rng, 90, hostile, rng.choice(("string", "int64", "int32")))
        when = _field(rng, 91, hostile, rng.choice(("timestamp(us, UTC)", "timestamp(ms)", "date")))
        for f in (key, when):
            f["constraints"] = {"required": True}
        fields[:0] = [key, when]
        doc["entity"], doc["event_time"] = "f90", "f91"
        if rng.random() < 0.5:
            doc["hot"] = {"ttl": rng.choice(durations)}
        feats = []
        for j in range(rng.randint(0, 3)):
            src = rng.choice(fields[1:] if rng.random() < 0.9 else fields)
            steps, dtype = _steps(rng, src, hostile)
            feats.append({"name": f"g{j}", "from": src["name"], "steps": steps, "dtype": dtype,
                          "store": rng.choice(("hot", "cold", ["hot", "cold"]))})
        if feats:
            doc["features"] = feats
        if rng.random() < 0.4:
            aggs: list[dict[str, Any]] = []
            for j in range(rng.randint(1, 4)):
                fn = rng.choice(("count", "sum", "mean", "min", "max", "last", "count_distinct"))
                a: dict[str, Any] = {"name": f"a{j}", "function": fn, "window": rng.choice(durations),
                                     "store": rng.choice(("hot", "cold"))}
                if fn != "count" or rng.random() < 0.3:
                    a["of"] = rng.choice(fields)["name"]
                if rng.random() < 0.3:
                    w = rng.choice(fields)
                    a["where"] = {w["name"]: [_typed_value(rng, w["type"], hostile)]}
                aggs.append(a)
            if len(aggs) > 1 and rng.random() < 0.5:
                aggs.append({"name": "r", "function": "ratio", "numerator": "a0", "denominator": "a1",
                             "on_zero": rng.choice((0, 1.5, None, "x") if hostile else (0, 1.5, -1e300)),
                             "store": "hot"})
            doc["aggregations"] = {"allowed_lateness": rng.choice([*durations[:6], 0]), "features": aggs}
    if rng.random() < 0.3:
        sizes = (1, 1024, 2**28, 2**28 + 1, 2**63, 0, -1) if hostile else (1, 1024, 2**28)
        doc["payload"] = {"format": "json", "max_bytes": rng.choice(sizes)}
    doc["fields"] = fields
    if rng.random() < 0.2:
        rule = {"field": rng.choice(fields)["name"], "breaking_change": rng.random() < 0.5}
        doc["evolution_rules"] = [rule]
    if hostile and rng.random() < 0.5:
        _mutate_tree(doc, rng, raws)
    try:
        return _dump(doc, rng, raws)
    except (yaml.YAMLError, ValueError, TypeError):
        return b"version: 1.0.0\nfields: [{name: a, type: int32}]\n"


def _paths(obj: Any, limit: int = 2000) -> list[tuple[Any, ...]]:
    """Places in a loaded tree (breadth first, at most ``limit``: an aliased seed is a DAG
    that unfolds into millions of places)."""
    out: list[tuple[Any, ...]] = []
    todo: list[tuple[Any, tuple[Any, ...]]] = [(obj, ())]
    while todo and len(out) < limit:
        node, prefix = todo.pop(0)
        out.append(prefix)
        if len(prefix) > 6:
            continue
        if isinstance(node, dict):
            todo.extend((v, (*prefix, k)) for k, v in node.items())
        elif isinstance(node, list):
            todo.extend((v, (*prefix, i)) for i, v in enumerate(node[:50]))
    return out


def _mutate_tree(doc: Any, rng: random.Random, raws: list[str]) -> Any:
    """One change at a random place of a loaded YAML tree (returns the new root)."""
    paths = _paths(doc)
    path = rng.choice(paths)
    if not path:
        return _pick(rng, None, raws) if rng.random() < 0.1 else doc
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    key = last if isinstance(last, str) else None
    if key is None and len(path) > 1 and isinstance(path[-2], str):
        key = path[-2]  # an item of a list: drawn like the list's key (steps, values, store)
    op = rng.random()
    if op < 0.5:
        parent[last] = _pick(rng, key, raws)
    elif op < 0.6:
        del parent[last]
    elif op < 0.75 and isinstance(parent, dict):
        new_key = rng.choice(KEYS)
        parent[new_key] = _pick(rng, new_key, raws)
    elif op < 0.82 and isinstance(parent, list):
        parent.insert(rng.randint(0, len(parent)), copy.deepcopy(parent[last]))
    elif op < 0.88:
        parent[last] = [parent[last]] if rng.random() < 0.5 else {rng.choice(KEYS): parent[last]}
    elif op < 0.94:
        donor = rng.choice(paths)
        node = doc
        for step in donor:
            node = node[step]
        if node is not doc:
            parent[last] = copy.deepcopy(node)
    elif isinstance(parent, dict) and isinstance(last, str):
        parent[rng.choice(KEYS)] = parent.pop(last)
    return doc


_PARSED: dict[bytes, Any] = {}


def mutate_schema(data: bytes, rng: random.Random) -> bytes | None:
    """Load ``data`` as YAML (libyaml, cached), change one to three nodes, dump it again."""
    if data not in _PARSED:
        try:
            _PARSED[data] = yaml.load(data, Loader=_LOADER)
        except Exception:  # any seed libyaml cannot load is mutated as text instead
            _PARSED[data] = None
    tree = _PARSED[data]
    if not isinstance(tree, dict | list):
        return None
    raws: list[str] = []
    try:
        doc = copy.deepcopy(tree)
        for _ in range(rng.randint(1, 3)):
            doc = _mutate_tree(doc, rng, raws)
        return _dump(doc, rng, raws)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        return None


def generate_huge(rng: random.Random) -> bytes:
    """Deep nesting, alias bombs, giant scalars and lists, and texts around the size limit."""
    n = rng.choice((1_000, 10_000, 100_000, 300_000))
    head = "version: 1.0.0\nfields:\n  - {name: a, type: string}\n"
    kind = rng.randrange(9)
    if kind == 0:
        text = head + "description: " + "[" * n + "]" * n
    elif kind == 1:
        text = head + "description: " + "{a: " * n + "1" + "}" * n
    elif kind == 2:
        text = head + "".join("  " * i + "- \n" for i in range(min(n, 3000)))
    elif kind == 3:  # billion laughs: each level lists the previous ten times
        lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        for i in range(1, 10):
            lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
        text = "\n".join(lines) + "\nversion: 1.0.0\nfields: *l9\nevolution_rules: *l9\n"
    elif kind == 4:
        text = head.replace("string}", "string, constraints: {pattern: '" + "a" * n + "'}}")
    elif kind == 5:
        items = "".join(f"  - {{name: f{i}, type: int32}}\n" for i in range(n // 30))
        text = "version: 1.0.0\nfields:\n" + items
    elif kind == 6:
        values = ", ".join(f"v{i}" for i in range(n // 6))
        text = f"version: 1.0.0\nfields:\n  - {{name: e, type: enum, values: [{values}]}}\n"
    elif kind == 7:  # one field mapping aliased many times: the parser walks it each time
        vals = ", ".join(f"v{i}" for i in range(2000))
        text = (f"version: 1.0.0\nx: &f {{name: e, type: enum, values: [{vals}]}}\nfields: ["
                + ", ".join(["*f"] * (n // 100)) + "]\n")
    else:
        text = head + "description: '" + "x" * (n * 3) + "'\n"
    return text.encode()


# --------------------------------------------------------------------------- the target

_NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def _sample(rng: random.Random, kind: TypeKind, values: Sequence[str]) -> Any:
    """A decoded-JSON-like value for a field of ``kind``: right type, edge or wrong type."""
    common: list[Any] = [None, "", "\x00", {"a": 1}, [1], True, 2**64, -(2**63) - 1, float("nan"),
                         float("inf"), 1e308, "9" * 50, " 1 ", "\ud7ff"]
    if rng.random() < 0.4:
        return rng.choice(common)
    if kind in (TypeKind.STRING, TypeKind.ENUM):
        pool: list[Any] = [*values, "a", "x" * 100, "é", "a\x00b", 5]
    elif kind is TypeKind.BOOL:
        pool = [True, False, "true", 0, 1]
    elif kind is TypeKind.DATE:
        pool = ["2024-01-01", "0001-01-01", "9999-12-31", "2024-02-30", 19000, "2024-01-01T00:00:00Z"]
    elif kind is TypeKind.TIMESTAMP:
        pool = ["2024-01-01T00:00:00Z", "2024-01-01T00:00:00", "2024-01-01T00:00:00.123456+05:30",
                "0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", 1_700_000_000_000, -1, "2024"]
    else:
        pool = [0, 1, -1, 0.5, 127, 128, 2**31 - 1, 2**31, 2**63 - 1, -(2**63), 1e10, 0.01, 0.001,
                "1.25", "1e3", "NaN", "-0", 10**38, 10**38 - 1, 5e-324, 3.5e38]
    return rng.choice(pool)


def sample_rows(schema: Schema, rng: random.Random, n: int = 6) -> list[dict[str, Any]]:
    rows = []
    for _ in range(n):
        row: dict[str, Any] = {}
        for f in schema.fields:
            if rng.random() < 0.9:
                row[f.name] = _sample(rng, f.type.kind, f.values)
        rows.append(row)
    return rows


def check_schema_error(exc: SchemaError, text: str | None) -> None:
    """Every problem has a non-empty reason; inside a SchemaErrors, a line in the file."""
    str(exc)
    problems = exc.errors if isinstance(exc, SchemaErrors) else [exc]
    if not problems:
        raise FuzzFailure("SchemaErrors without any error")
    lines = None if text is None else len(text.splitlines()) + 1
    for e in problems:
        if not isinstance(e, SchemaError) or isinstance(e, SchemaErrors):
            raise FuzzFailure(f"SchemaErrors holds {type(e).__name__}")
        if not isinstance(e.reason, str) or not e.reason.strip():
            raise FuzzFailure(f"a schema error without a reason: {e!r}")
        if e.line is not None and (not isinstance(e.line, int) or e.line < 1
                                   or (lines is not None and e.line > lines)):
            raise FuzzFailure(f"schema error at line {e.line!r} of a {lines}-line file: {e}")
        if isinstance(exc, SchemaErrors) and e.line is None:
            raise FuzzFailure(f"a problem inside the document without a line: {e}")
        str(e)


class SchemaTarget:
    name = "schema"
    group_sizes = (1, 1)
    tokens = TOKENS
    timeout_s = 20.0  # the worst valid file (256 KiB of list items) parses in ~5-10 s here
    weights = (0.34, 0.12, 0.13, 0.05, 0.34, 0.02)

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="fuzz-schema-")
        self.path = Path(self._dir.name) / "fuzz.yaml"

    def close(self) -> None:
        self._dir.cleanup()

    def run(self, group: Sequence[bytes]) -> Counter[str]:
        return Counter(self.check(data) for data in group)

    def check(self, data: bytes) -> str:
        digest = hashlib.sha256(data).digest()
        try:
            text: str | None = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        try:
            if text is None or digest[0] % 8 == 0:
                self.path.write_bytes(data)
                schema = load_schema(self.path)
            else:
                schema = parse_schema(text, "fuzz.yaml")
        except SchemaErrors as exc:
            check_schema_error(exc, text)
            return "schema error (problems in the document)"
        except SchemaError as exc:
            check_schema_error(exc, text)
            return "schema error (yaml syntax, empty, unreadable or too big)"
        if not isinstance(schema, Schema):
            raise FuzzFailure(f"parse returned {type(schema).__name__}")
        return self.check_compile(schema, random.Random(digest))

    def check_compile(self, schema: Schema, rng: random.Random) -> str:
        try:
            compiled = compile_schema(schema)
            compiled.arrow_schema  # noqa: B018 - a cached property: build it
            ddl = compiled.ddl
            suite = json.dumps(compiled.expectations, allow_nan=False)
            program = compile_transforms(schema, device="cpu") if schema.features else None
        except CompileError as exc:
            if not str(exc).strip():
                raise FuzzFailure("CompileError without a message") from exc
            return "schema ok, compile error"
        if not ddl or not suite or "\x00" in ddl:
            raise FuzzFailure("empty DDL or suite, or a NUL in the DDL")
        rows = sample_rows(schema, rng)
        ctx = RunContext(schema.name, schema.version_str, compiled.fingerprint, "fuzz", _NOW)
        sb = SourceBatch(objects_batch(rows, [f.name for f in schema.fields]),
                         BatchLineage("fuzz://rows", 0, len(rows)), json_text=True)
        prepared = process_batch(sb, compiled, program, ctx, _NOW)
        if prepared.rows.num_rows + prepared.rejected_rows != len(rows):
            raise FuzzFailure(f"{prepared.rows.num_rows} valid + {prepared.rejected_rows} rejected "
                              f"!= {len(rows)} rows")
        fuzzkit.check_rows_readable(prepared.rows)
        for errors in prepared.rejects.column("errors").to_pylist():
            for entry in json.loads(errors):
                if not entry["message"] or not entry["rule"]:
                    raise FuzzFailure(f"a reject without a message or rule: {entry}")
        return "schema ok, compiled and validated"

    def mutate_structured(self, data: bytes, rng: random.Random) -> bytes | None:
        return mutate_schema(data, rng)

    def generate(self, rng: random.Random) -> bytes:
        return generate_schema(rng)

    def generate_huge(self, rng: random.Random) -> bytes:
        return generate_huge(rng)


if __name__ == "__main__":
    sys.exit(fuzzkit.main(SchemaTarget, "schema"))
