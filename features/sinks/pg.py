"""Postgres connections and driver errors, in one place (what redis_wire is for Redis).

Every connection featureline opens to Postgres comes from :func:`connect`, and every
psycopg error that would cross one of its APIs is translated at that edge by
:func:`map_psycopg_errors` (in the style of httpx's ``map_httpcore_exceptions``):

- a connection refused, lost or timed out is :class:`SinkUnavailable` (transient: a
  retry later is safe) naming the server as ``host:port/dbname``, never the DSN's
  credentials;
- a statement the server refused is :class:`SinkError` naming what was being done.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from features.errors import SinkError, SinkUnavailable

STORE = "postgres"


def address(dsn: str) -> str:
    """``host:port/dbname`` of a DSN (URL or key=value), never its credentials."""
    try:
        d = conninfo_to_dict(dsn)
    except Exception:  # a malformed DSN: connect() reports it; show nothing of it here
        return "(unparsable DSN)"
    return f"{d.get('host') or 'localhost'}:{d.get('port') or 5432}/{d.get('dbname') or ''}"


def session_options(dsn: str, *, utc: bool = False, search_path: str | None = None) -> str:
    """libpq ``options`` for a session: the DSN's own, then ``TimeZone=UTC`` (the sinks
    COPY zoned timestamps as UTC wall clock) and a ``search_path``, when asked for."""
    return " ".join(filter(None, [str(conninfo_to_dict(dsn).get("options") or ""),
                                  "-c TimeZone=UTC" if utc else "",
                                  f"-c search_path={search_path}" if search_path else ""]))


def first_line(exc: BaseException) -> str:
    """The first line of a driver message (psycopg appends context lines), or the class name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def connect(dsn: str, *, timeout_s: float = 5.0, autocommit: bool = False, utc: bool = False,
            search_path: str | None = None, read_only: bool = False, hint: str = ""
            ) -> psycopg.Connection[tuple[Any, ...]]:
    """A psycopg connection to ``dsn``; SinkUnavailable naming the address when the
    server cannot be reached or refuses the session (``hint`` is appended to that message)."""
    options = session_options(dsn, utc=utc, search_path=search_path) if utc or search_path else None
    extra: dict[str, Any] = {"options": options} if options else {}
    try:
        conn = psycopg.connect(dsn, connect_timeout=max(int(timeout_s), 1), autocommit=autocommit, **extra)
    except psycopg.Error as exc:
        where = address(dsn)
        raise SinkUnavailable(f"Postgres unreachable at {where}: {str(exc).strip()}{hint}", store=STORE,
                              address=where) from exc
    if read_only:
        conn.read_only = True
    return conn


@contextmanager
def map_psycopg_errors(dsn: str, what: str, *, passthrough: tuple[type[BaseException], ...] = ()
                       ) -> Iterator[None]:
    """Translate psycopg errors raised in the block: OperationalError (the connection was
    lost or the server is going away) -> SinkUnavailable; any other psycopg.Error ->
    SinkError "Postgres refused <what>". ``passthrough``: driver errors the caller handles
    itself (e.g. UndefinedTable, UniqueViolation)."""
    try:
        yield
    except passthrough:
        raise
    except psycopg.OperationalError as exc:
        where = address(dsn)
        raise SinkUnavailable(f"Postgres at {where} failed during {what}: {first_line(exc)}", store=STORE,
                              address=where) from exc
    except psycopg.Error as exc:
        raise SinkError(f"Postgres refused {what}: {first_line(exc)}{_hint(exc, dsn)}", store=STORE,
                        address=address(dsn)) from exc


#: ``search_path`` set in a DSN's ``options`` (``-c search_path=x`` or ``-csearch_path=x``)
_SEARCH_PATH = re.compile(r"-c\s*search_path\s*=\s*(\S+)")


def _hint(exc: Exception, dsn: str) -> str:
    """What to do about a refusal whose fix is not in Postgres' own words: a search_path
    naming no schema (SQLSTATE 3F000, "no schema has been selected to create in")."""
    if getattr(exc, "sqlstate", None) != "3F000":
        return ""

    try:
        options = psycopg.conninfo.conninfo_to_dict(dsn).get("options") or ""
    except psycopg.Error:
        options = ""
    m = _SEARCH_PATH.search(str(options))
    named = f"search_path {m.group(1)}" if m else "the session's search_path"
    return (f" ({named} names no schema that exists: create it first, e.g. CREATE SCHEMA "
            f"{m.group(1).split(',')[0] if m else '<name>'}, or fix options=-csearch_path=... in "
            "FEATURES_POSTGRES_DSN)")


__all__ = ["STORE", "address", "connect", "first_line", "map_psycopg_errors", "session_options"]
