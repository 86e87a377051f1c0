"""``features migrate SCHEMA_FILE [--apply]``: bring both stores to a compatible new version.

A compatible change of a schema (``features schema diff`` says which are) needs the stores
moved with it. Postgres: the migration DDL (the cold and aggregates tables),
``featureline_schemas`` (the version the stores hold) and ``featureline_schema_versions``
(every version held, with its YAML text). Redis: every entity and aggregates hash written
by an earlier version rewritten in the new layout (values cast to the new types, renamed
fields renamed, new hot columns read from Postgres where it holds them, else their
default or null) and stamped with the new fingerprint, chunk by chunk.

Without ``--apply`` this is a dry run: it prints the plan (the SQL, the Redis hashes by
version) and changes nothing. With it, the Postgres part runs in one transaction, then the
Redis part; each chunk is one atomic rewrite per hash that changes only a hash still
holding the event and the fingerprint it was read with, so a stream writing meanwhile is
never overwritten, and a run stopped half way is resumed by running it again. Until every
hash is rewritten (and for hashes an old writer still writes afterwards), readers of the
new version rewrite the old hashes they meet themselves (:class:`Upgrader`), so online
reads, fills, prewarm and loads keep working during and after the change.

A history table made before content digests (keyed by entity and event time alone, one
event per instant) is moved to the key (entity, event time, ``_digest``) too: each row's
digest computed, chunk by chunk, and the key replaced (docs/evolution.md, "Events at one
instant"); this applies with the current schema file as well.

A breaking change is refused (exit 1): it needs a new major version and a manual
migration or a new table (docs/evolution.md). Exit 0 when done or nothing is to do, 2 on
usage, schema or store errors.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from features.cli import COMMANDS
from features.compile import compile_schema
from features.compile.fingerprint import fingerprint as fp_of
from features.compile.migration import brief
from features.config import resolve_settings
from features.errors import ConfigError
from features.ops.digests import migrate_digests, plan_digests
from features.ops.migrate import (
    DEFAULT_CHUNK,
    Recorded,
    Upgrader,
    Version,
    apply_postgres,
    count_versions,
    plan,
    read_recorded,
    scan_keys,
)
from features.schema.parse import load_schema
from features.sdk.connections import Connections
from features.sinks import pg


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "migrate", help=COMMANDS["migrate"].summary,
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        epilog="Exit codes: 0 done (or a dry run, or nothing to do), 1 refused (a breaking change), "
               "2 usage, schema or store errors. See docs/evolution.md.")
    p.add_argument("schema_file", metavar="SCHEMA_FILE", help="the new version of the schema (YAML)")
    p.add_argument("--apply", action="store_true", help="change the stores (default: print the plan only)")
    p.add_argument("--from", dest="old_file", metavar="OLD_FILE", default=None,
                   help="the file the stores were loaded with, when Postgres holds no YAML text for it")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK,
                   help=f"Redis hashes read and rewritten at a time (default {DEFAULT_CHUNK})")
    p.add_argument("--json", action="store_true", help="print the result as one JSON document on stdout")
    p.set_defaults(func=run)


def _brief(statement: str) -> str:
    short = brief(statement)
    return short if short != statement else f"{statement};"


def run(args: argparse.Namespace) -> int:
    if args.chunk < 1:
        raise ConfigError("--chunk must be at least 1", key="chunk")
    schema = load_schema(args.schema_file)
    if not schema.loadable:
        raise ConfigError(f"schema {schema.name!r} is validation-only: it has no stores to migrate",
                          key="schema")
    c = compile_schema(schema)
    settings = resolve_settings()
    t0 = time.perf_counter()
    out: dict[str, Any] = {"schema": schema.name, "version": schema.version_str,
                           "fingerprint": c.fingerprint, "apply": bool(args.apply)}
    say: Callable[[str], None] = (lambda _: None) if args.json else (lambda line: print(line, flush=True))
    with Connections(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn) as fs:
        p = plan(fs, c, args.old_file)
        digest_plan = fs.run_postgres("the digest check", lambda conn: plan_digests(conn, c))
        out["stores_hold"] = {"version": p.recorded.version, "fingerprint": p.recorded.fingerprint}
        for note in p.notes:
            say(note)
        if p.refusal is not None:
            out["refusal"] = p.refusal
            if args.json:
                print(json.dumps(out, indent=2))
            print(f"features migrate: refused: {p.refusal}", file=sys.stderr)
            return 1
        if p.migration is not None and p.old is not None:
            say(f"postgres: {schema.name} {p.old.version_str} ({str(p.recorded.fingerprint)[:12]}) -> "
                f"{schema.version_str} ({c.fingerprint[:12]}), {len(p.migration.diff.changes)} change(s):")
            for ch in p.migration.diff.changes:
                say(f"  {ch.field}  {ch.kind.value}: {ch.detail}")
            say("BEGIN;")
            for statement in p.migration.statements:
                say(_brief(statement))
            say("COMMIT;")
            out["postgres"] = {"from": p.old.version_str, "statements": list(p.migration.statements)}
        elif p.recorded.fingerprint == c.fingerprint:
            say(f"postgres: already holds {schema.name} {schema.version_str} ({c.fingerprint[:12]})")
            out["postgres"] = {"from": schema.version_str, "statements": []}
        if digest_plan.needed:
            say(f"postgres: {digest_plan.table} predates content digests (one event per entity and event "
                f"time): {digest_plan.rows:,} rows get a _digest and the key becomes (entity, event time, "
                "_digest):")
            for statement in digest_plan.statements():
                say(f"  {statement}")
            if digest_plan.hot_only:
                say(f"  note: {', '.join(digest_plan.hot_only)} (store: hot only) are not in Postgres: the "
                    "digests computed here leave them out")
            out["digests"] = {"table": digest_plan.table, "rows": digest_plan.rows,
                              "statements": digest_plan.statements(), "hot_only": list(digest_plan.hot_only)}
        if p.recorded.fingerprint is None:
            if args.json:
                print(json.dumps(out, indent=2))
            return 0
        if not args.apply:
            recorded = p.recorded
            if p.migration is not None:  # what the versions table will say once applied
                assert p.old is not None
                versions = dict(recorded.versions)
                versions[c.fingerprint] = Version(c.fingerprint, schema.version_str, schema.text,
                                                  fp_of(p.old))
                recorded = Recorded(schema.version_str, c.fingerprint, versions)
            olds = set(recorded.ancestors(c.fingerprint))
            counts = count_versions(fs, c, args.chunk)
            out["redis"] = {kind: {"hashes": sum(t.values()),
                                   "to_rewrite": sum(v for k, v in t.items() if k in olds),
                                   "other": sum(v for k, v in t.items()
                                                if k not in olds and k != c.fingerprint),
                                   "by_fingerprint": t} for kind, t in counts.items()}
            for kind, r in out["redis"].items():
                other = f", {r['other']:,} of an unknown version (left as they are)" if r["other"] else ""
                say(f"redis: {r['hashes']:,} {kind} hashes, {r['to_rewrite']:,} from an earlier version to "
                    f"rewrite{other}")
            say("dry run: nothing changed; run again with --apply")
            if args.json:
                print(json.dumps(out, indent=2))
            return 0
        if p.migration is not None:
            apply_postgres(fs, p, waiting=say)
            say(f"postgres: migrated to {schema.version_str} ({time.perf_counter() - t0:.1f} s)")
        if digest_plan.needed:
            with pg.map_psycopg_errors(settings.postgres_dsn, "the digest migration"), \
                    pg.connect(settings.postgres_dsn, autocommit=True, utc=True) as conn:
                filled = migrate_digests(conn, c, progress=lambda n: say(f"postgres: {n:,} digests written"))
            say(f"postgres: {digest_plan.table} keyed by (entity, event time, _digest), {filled:,} digests "
                f"written ({time.perf_counter() - t0:.1f} s)")
            out["digests"]["written"] = filled
        recorded = fs.run_postgres("the version read", lambda conn: read_recorded(conn, c.name))
        up = Upgrader(fs, c, recorded)
        totals: dict[str, dict[str, int]] = {}
        try:
            kinds = [("entity", False)] + ([("aggregates", True)] if schema.aggregations is not None else [])
            for kind, aggs in kinds:
                seen = rewritten = 0
                for keys in scan_keys(fs, c.name, aggs, args.chunk):
                    seen += len(keys)
                    rewritten += up.upgrade(keys, aggs)
                    say(f"redis: {kind} hashes: {seen:,} scanned, {rewritten:,} rewritten "
                        f"({time.perf_counter() - t0:.1f} s)")
                totals[kind] = {"scanned": seen, "rewritten": rewritten}
        finally:
            up.close()
    out["redis"] = totals
    out["seconds"] = round(time.perf_counter() - t0, 3)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"migrate {schema.name}: the stores hold {schema.version_str} ({c.fingerprint[:12]}); "
              + ", ".join(f"{v['rewritten']:,} of {v['scanned']:,} {k} hashes rewritten"
                          for k, v in totals.items())
              + f" in {out['seconds']:.1f} s")
    return 0


__all__ = ["add_parser", "run"]
