"""What a project defines, as ``features list`` and ``features describe`` show it: every
schema and view of the project's folders, and one schema, view or feature in full (its
fields with types, constraints and sources, derived features and their steps,
aggregations and their windows, hot/cold placement, version, fingerprint, owner
description, and which views read it). Reads the YAML only: no store is needed.

Every function returns plain data (dicts and lists, JSON-ready) or text made from it, so
``--json`` and the terminal show one thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from features.compile import compile_schema, gates_text
from features.errors import ConfigError
from features.schema import load_schemas
from features.schema.model import Aggregation, Constraints, Feature, Field, Schema
from features.schema.syntax import duration_text
from features.views.model import View
from features.views.parse import load_views


@dataclass(frozen=True)
class Catalog:
    """The schemas and views of one project (``views`` empty when its folder is missing)."""

    schemas: Mapping[str, Schema]
    views: Mapping[str, View]


def read_catalog(schemas_dir: str | Path, views_dir: str | Path | None) -> Catalog:
    """The project's schemas and, when ``views_dir`` exists, its views (parsed against the
    schemas). SchemaErrors as ``features compile`` reports them."""
    schemas = load_schemas(schemas_dir)
    views: Mapping[str, View] = {}
    if views_dir is not None and Path(views_dir).is_dir():
        views = load_views(views_dir, schemas)
    return Catalog(schemas, views)


def _placement(store: frozenset[str]) -> str:
    return "+".join(s for s in ("hot", "cold") if s in store) or "validation only"


def _rules(c: Constraints) -> list[str]:
    out = []
    if c.required:
        out.append("required")
    elif not c.nullable:
        out.append("not null")
    for key in ("min", "max", "pattern", "min_length", "max_length"):
        value = getattr(c, key)
        if value is not None:
            out.append(f"{key} {value}")
    if c.has_default:
        out.append(f"default {c.default}")
    return out


def _field(f: Field) -> dict[str, Any]:
    return {"name": f.name, "type": str(f.type), "store": _placement(f.store),
            "constraints": _rules(f.constraints), "values": list(f.values), "source": f.source,
            "description": f.description}


def _step(step: Any) -> str:
    args = ", ".join(f"{k}: {v}" for k, v in step.args)
    return f"{step.op}({args})" if args else str(step.op)


def _feature(f: Feature) -> dict[str, Any]:
    return {"name": f.name, "from": f.source, "steps": [_step(s) for s in f.steps], "dtype": str(f.dtype),
            "store": _placement(f.store), "on_invalid": f.on_invalid, "description": f.description}


def _aggregation(a: Aggregation) -> dict[str, Any]:
    window = None if a.window is None else f"{duration_text(a.window.size_s)} {a.window.kind}"
    what = (f"{a.numerator} / {a.denominator}" if a.function == "ratio"
            else f"{a.function}({a.of or ''})")
    where = {name: list(values) for name, values in a.where}
    return {"name": a.name, "function": a.function, "computes": what, "window": window, "where": where,
            "store": _placement(a.store), "description": a.description}


def _readers(catalog: Catalog, schema: str, feature: str | None = None) -> list[str]:
    """The views that read ``schema`` (and, given, its ``feature``)."""
    return sorted(v.name for v in catalog.views.values() if any(
        s.schema == schema and (feature is None or feature in s.features) for s in v.sources))


def list_all(catalog: Catalog) -> dict[str, Any]:
    """One line's worth of each schema and view."""
    schemas = []
    for name, s in sorted(catalog.schemas.items()):
        schemas.append({"name": name, "version": s.version_str,
                        "fingerprint": compile_schema(s).fingerprint[:12], "entity": s.entity,
                        "event_time": "none" if s.static else s.event_time, "fields": len(s.fields),
                        "derived": len(s.features),
                        "aggregations": len(s.aggregations.features) if s.aggregations else 0,
                        "views": _readers(catalog, name), "description": s.description})
    views = [{"name": name, "version": v.version_str, "sources": [s.schema for s in v.sources],
              "keys": [k.name for k in v.keys], "features": sum(len(s.features) for s in v.sources),
              "request_time": len(v.features), "description": v.description}
             for name, v in sorted(catalog.views.items())]
    return {"schemas": schemas, "views": views}


def describe(catalog: Catalog, name: str) -> dict[str, Any]:
    """A schema, a view, or a feature (``schema.feature``, or a name one schema alone
    defines) in full. ConfigError naming what exists when ``name`` is none of those."""
    if name in catalog.schemas:
        s = catalog.schemas[name]
        c = compile_schema(s)
        aggs = s.aggregations.features if s.aggregations else ()
        lateness = duration_text(s.aggregations.allowed_lateness_s) if s.aggregations else None
        return {"kind": "schema", "name": name, "version": s.version_str, "fingerprint": c.fingerprint,
                "description": s.description, "path": s.path, "entity": s.entity,
                "event_time": "none" if s.static else s.event_time,
                "hot_ttl": None if s.hot.ttl_seconds is None else duration_text(s.hot.ttl_seconds),
                "fields": [_field(f) for f in s.fields], "derived": [_feature(f) for f in s.features],
                "aggregations": [_aggregation(a) for a in aggs], "allowed_lateness": lateness,
                "quality": gates_text(s), "owner": s.quality.owner if s.quality else None,
                "views": _readers(catalog, name)}
    if name in catalog.views:
        v = catalog.views[name]
        return {"kind": "view", "name": name, "version": v.version_str, "description": v.description,
                "path": v.path, "keys": [_field(k) for k in v.keys],
                "request_fields": [_field(f) for f in v.request_fields],
                "sources": [{"schema": s.schema, "alias": s.alias, "join": {s.key: s.entity},
                             "features": {f: s.column(f) for f in s.features},
                             "max_age": (None if s.max_age_seconds is None
                                         else duration_text(s.max_age_seconds))}
                            for s in v.sources],
                "request_time": [_feature(f) for f in v.features]}
    hits = []
    schema_name, _, feature = name.rpartition(".")
    for sname, s in sorted(catalog.schemas.items()):
        if schema_name and sname != schema_name:
            continue
        for f in s.fields:
            if f.name == feature:
                hits.append({"kind": "field", "schema": sname, **_field(f)})
        for d in s.features:
            if d.name == feature:
                hits.append({"kind": "derived feature", "schema": sname, **_feature(d)})
        for a in (s.aggregations.features if s.aggregations else ()):
            if a.name == feature:
                hits.append({"kind": "aggregation", "schema": sname, **_aggregation(a)})
    if len(hits) == 1:
        hit = hits[0]
        return {**hit, "views": _readers(catalog, hit["schema"], hit["name"])}
    if len(hits) > 1:
        raise ConfigError(f"{name!r} is defined by several schemas: "
                          f"{', '.join(h['schema'] + '.' + h['name'] for h in hits)}; name one of them")
    raise ConfigError(f"no schema, view or feature {name!r}; schemas: "
                      f"{', '.join(sorted(catalog.schemas)) or 'none'}; views: "
                      f"{', '.join(sorted(catalog.views)) or 'none'} (a feature: SCHEMA.FEATURE)")


def render_list(listing: dict[str, Any]) -> str:
    lines = [f"schemas ({len(listing['schemas'])})"]
    for s in listing["schemas"]:
        key = f"entity {s['entity']}, event time {s['event_time']}" if s["entity"] else "validation only"
        lines.append(f"  {s['name']:<24} {s['version']:<8} {s['fingerprint']}  {key}; {s['fields']} fields, "
                     f"{s['derived']} derived, {s['aggregations']} aggregations"
                     + (f"; read by {', '.join(s['views'])}" if s["views"] else ""))
        if s["description"]:
            lines.append(f"    {s['description']}")
    lines.append(f"views ({len(listing['views'])})")
    for v in listing["views"]:
        lines.append(f"  {v['name']:<24} {v['version']:<8} keys {', '.join(v['keys'])}; "
                     f"{v['features']} features from {', '.join(v['sources'])}, "
                     f"{v['request_time']} request-time")
        if v["description"]:
            lines.append(f"    {v['description']}")
    return "\n".join(lines)


def _table(rows: list[list[str]], head: list[str]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return ["    " + fmt.format(*head).rstrip(), *("    " + fmt.format(*r).rstrip() for r in rows)]


def render_describe(d: dict[str, Any]) -> str:
    if d["kind"] == "schema":
        lines = [f"schema {d['name']} {d['version']} (fingerprint {d['fingerprint'][:12]}, {d['path']})"]
        if d["description"]:
            lines.append(f"  {d['description']}")
        lines.append(f"  entity {d['entity']}, event time {d['event_time']}, "
                     f"hot ttl {d['hot_ttl'] or 'none'}")
        if d["quality"]:
            lines.append(f"  quality gates: {d['quality']}")
        lines.append("  fields:")
        lines += _table([[f["name"], f["type"], f["store"], "; ".join(f["constraints"] + (
            [f"values {', '.join(f['values'])}"] if f["values"] else []) + (
            [f"source {f['source']!r}"] if f["source"] else [])), f["description"]] for f in d["fields"]],
            ["name", "type", "store", "rules", "description"])
        if d["derived"]:
            lines.append("  derived features:")
            lines += _table([[f["name"], f["from"], " -> ".join(f["steps"]), f["dtype"], f["store"],
                              f["description"]] for f in d["derived"]],
                            ["name", "from", "steps", "dtype", "store", "description"])
        if d["aggregations"]:
            lines.append(f"  aggregations (allowed lateness {d['allowed_lateness']}):")
            lines += _table([[a["name"], a["computes"], a["window"] or "-", ", ".join(
                f"{k} in {v}" for k, v in a["where"].items()) or "-", a["store"], a["description"]]
                for a in d["aggregations"]], ["name", "computes", "window", "where", "store", "description"])
        lines.append(f"  read by views: {', '.join(d['views']) or 'none'}")
        return "\n".join(lines)
    if d["kind"] == "view":
        lines = [f"view {d['name']} {d['version']} ({d['path']})"]
        if d["description"]:
            lines.append(f"  {d['description']}")
        lines.append(f"  request keys: {', '.join(k['name'] + ' ' + k['type'] for k in d['keys'])}")
        if d["request_fields"]:
            fields = ", ".join(f["name"] + " " + f["type"] for f in d["request_fields"])
            lines.append(f"  request fields: {fields}")
        lines.append("  sources:")
        for s in d["sources"]:
            cols = ", ".join(f if f == c else f"{f} as {c}" for f, c in s["features"].items())
            lines.append(f"    {s['schema']} (alias {s['alias']}, join {s['join']}, "
                         f"max age {s['max_age'] or 'none'}): {cols}")
        if d["request_time"]:
            lines.append("  request-time features:")
            lines += _table([[f["name"], f["from"], " -> ".join(f["steps"]), f["dtype"], f["description"]]
                             for f in d["request_time"]], ["name", "from", "steps", "dtype", "description"])
        return "\n".join(lines)
    body = {k: v for k, v in d.items()
            if k not in ("kind", "schema", "name", "views") and v not in (None, "", [], {})}
    lines = [f"{d['kind']} {d['schema']}.{d['name']}"]
    lines += [f"  {k}: {', '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in body.items()]
    lines.append(f"  read by views: {', '.join(d['views']) or 'none'}")
    return "\n".join(lines)


__all__ = ["Catalog", "describe", "list_all", "read_catalog", "render_describe", "render_list"]
