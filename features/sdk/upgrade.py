"""Which version of a schema the stores hold, for the SDK's reads (:class:`Versions`):
the fingerprint check against Postgres, the hashes an earlier version wrote (rewritten in
the current layout by :class:`features.sinks.versions.Upgrader`, then read again) and a
compatible newer version's (read in this reader's layout: docs/evolution.md, "Readers of
an earlier version")."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from psycopg import errors

from features.compile import CompiledSchema
from features.compile.layout import ENCODING_VERSION
from features.compile.migration import mismatch_hint
from features.compile.postgres import SCHEMAS_TABLE, quote_ident
from features.errors import SinkError
from features.sdk.online import OnlineRequest, Outdated
from features.sinks.versions import Newer, Upgrader, newer_readable, read_recorded

if TYPE_CHECKING:
    from features.sdk.connections import Connections


class Versions:
    """The version checks of the schemas read through ``connections`` (``schemas_path``:
    where this reader's schema files are, named in the errors)."""

    def __init__(self, connections: Connections, schemas_path: Path) -> None:
        self.connections = connections
        self.schemas_path = schemas_path
        self._checked: set[str] = set()
        #: schema name -> the Upgrader of hashes older versions wrote
        self._upgraders: dict[str, Upgrader] = {}
        #: schema name -> the compatible newer version the stores hold (read in this
        #: reader's layout), kept until a fingerprint it does not know is met
        self._newer: dict[str, Newer] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            upgraders, self._upgraders = list(self._upgraders.values()), {}
        for up in upgraders:
            up.close()

    def check_fingerprint(self, c: CompiledSchema, *, writing: bool = False) -> None:
        """The stores must hold ``c``'s version, or (for a read, not ``writing``) a compatible
        newer one this reader reads in its layout (:meth:`newer_version`); else SinkError
        saying what to do. A read's answer is kept for the store's life."""
        if c.name in self._checked and not writing:
            return

        row = self.connections.run_postgres("the fingerprint check", lambda conn: conn.execute(
            f"SELECT version, fingerprint FROM {quote_ident(SCHEMAS_TABLE)} WHERE schema_name = %s",
            (c.name,)).fetchone())
        if row is not None and row[1] != c.fingerprint and (
                writing or self.newer_version(c, {row[1]}) is None):
            raise SinkError(f"the stores hold schema {c.name} {row[0]} (fingerprint {row[1][:12]}), but "
                            f"{self.schemas_path} has {c.schema.version_str} (fingerprint "
                            f"{c.fingerprint[:12]}): {mismatch_hint(c.schema, row[0])}", store="postgres")
        self._checked.add(c.name)

    def check_fingerprint_or_none(self, c: CompiledSchema) -> None:
        """:meth:`check_fingerprint`, where a database without the schema's tables passes."""
        try:
            self.check_fingerprint(c)
        except errors.UndefinedTable:
            pass

    def newer_version(self, c: CompiledSchema, others: set[str], *, read: bool = True) -> Newer | None:
        """The :class:`features.sinks.versions.Newer` the stores hold when every fingerprint
        of ``others`` is a compatible version migrated (transitively) from ``c``'s that a
        reader of ``c`` reads in ``c``'s layout; else None. Read from Postgres again when
        one of ``others`` is not known yet (``read=False``: only what is known)."""
        with self._lock:
            newer = self._newer.get(c.name)
        if newer is not None and others <= newer.fingerprints:
            return newer
        if not read:
            return None
        recorded = self.connections.run_postgres("the schema versions read",
                                                 lambda conn: read_recorded(conn, c.name))
        newer = newer_readable(recorded, c)
        if newer is None or not others <= newer.fingerprints:
            return None
        with self._lock:
            self._newer[c.name] = newer
        return newer

    def upgrader(self, c: CompiledSchema, others: set[str]) -> Upgrader | None:
        """The Upgrader of ``c`` when every fingerprint of ``others`` is an earlier version
        the stores were migrated from (read from Postgres again when one is not known yet:
        a migration may have run since), else None."""
        with self._lock:
            up = self._upgraders.get(c.name)
        if up is not None and others <= up.old_fingerprints:
            return up
        recorded = self.connections.run_postgres("the schema versions read",
                                                 lambda conn: read_recorded(conn, c.name))
        if recorded.fingerprint != c.fingerprint or not others <= set(recorded.ancestors(c.fingerprint)):
            return None
        up = Upgrader(self.connections, c, recorded)
        with self._lock:
            old = self._upgraders.get(c.name)
            self._upgraders[c.name] = up
        if old is not None:
            old.close()
        return up

    def upgrade(self, req: OnlineRequest) -> None:
        """Rewrite the hashes of ``req`` that an earlier version of its schema wrote."""
        plan = req.plan
        with self._lock:
            up = self._upgraders.get(plan.c.name)  # made by the check that raised Outdated
        if up is None:
            return
        up.upgrade(req.reads[0][0], False)
        if plan.aggs:
            up.upgrade(req.reads[1][0], True)

    def check_hashes(self, c: CompiledSchema, encodings: pa.Array, fingerprints: pa.Array,
                     what: str) -> Newer | None:
        """Every hash found must be encoding v1 of this schema's fingerprint (docs/redis.md),
        or of an earlier version the stores were migrated from (then :class:`Outdated`), or
        of a compatible newer version this reader reads in its layout (then that
        :class:`features.sinks.versions.Newer` is returned; else None).
        ``encodings``, ``fingerprints``: the ``_enc`` and ``_schema_fingerprint`` of the
        hashes; ``what`` names the hashes in the message (``hashes``, ``aggregates hashes``)."""
        encs = set(pc.unique(encodings).to_pylist()) - {None}
        fps = set(pc.unique(fingerprints).to_pylist()) - {None}
        if encs - {ENCODING_VERSION}:
            raise SinkError(f"Redis holds {c.name} {what} with encoding version "
                            f"{sorted(encs - {ENCODING_VERSION})[0]}; this reader knows version "
                            f"{ENCODING_VERSION}", store="redis")
        others = fps - {c.fingerprint}
        if others:
            newer = self.newer_version(c, others, read=False)
            if newer is not None:
                return newer  # a compatible newer version, read in this layout
            if self.upgrader(c, others) is not None:
                raise Outdated  # rewritten in this layout, then read again (docs/evolution.md)
            newer = self.newer_version(c, others)
            if newer is not None:
                return newer
            self._checked.discard(c.name)
            self.check_fingerprint(c)  # Postgres holds another version: that error says what to do
            raise SinkError(f"Redis holds {c.name} {what} written with schema fingerprint "
                            f"{sorted(others)[0][:12]}, which is no earlier version the stores were migrated "
                            f"from to {c.schema.version_str} (fingerprint {c.fingerprint[:12]}, "
                            f"{self.schemas_path}): {mismatch_hint(c.schema, '')}", store="redis")
        return None


__all__ = ["Versions"]
