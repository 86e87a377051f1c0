"""The Redis wire, for every client featureline has (the sinks, the Redis Cluster router,
the SDK's reader): where a URL points and how to connect (:class:`RedisEndpoint`: TLS,
AUTH, SELECT), how a command is written (:func:`command`), and how replies are read
(:class:`Conn`: RESP2; many replies at once through hiredis's C reader when it is
installed, a dependency, else in Python). Where redis-py is the client (control calls,
the SDK's fill path and ``online_async``), :func:`map_redis_errors` translates its errors
as the raw connections' are.
"""

from __future__ import annotations

import dataclasses
import functools
import socket
import ssl
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis

from features.config import redact
from features.errors import ConfigError, SinkError, SinkUnavailable

_hiredis: Any
try:  # redis-py's C reply parser
    import hiredis as _hiredis
except ImportError:  # pragma: no cover - hiredis ships wheels for every supported platform
    _hiredis = None


#: TLS parameters a ``rediss://`` URL may carry in its query (the names redis-py reads too).
TLS_PARAMETERS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_cert_reqs",
                  "ssl_check_hostname")
_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


@dataclass(frozen=True)
class RedisEndpoint:
    """Where a ``redis://`` / ``rediss://`` URL points, and how to open a raw connection
    there (TLS, AUTH, SELECT): shared by the sink and the SDK's reader.

    ``rediss://`` connects with TLS, verifying the server's certificate against the
    system's CAs or ``?ssl_ca_certs=/path/ca.pem``, and its host name unless
    ``ssl_check_hostname=false``; ``ssl_certfile``/``ssl_keyfile``/``ssl_password`` give a
    client certificate, ``ssl_cert_reqs=none`` turns verification off (tests only).
    The user name and password come from the URL's userinfo (``rediss://user:pw@host``).
    ``repr()`` never shows a password.
    """

    host: str
    port: int
    tls: bool
    username: str | None
    password: str | None = field(repr=False)
    db: int = 0
    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    key_password: str | None = field(default=None, repr=False)
    cert_reqs: str = "required"
    check_hostname: bool = True
    #: ``redis+cluster://h1:p1,h2:p2``: every seed node of a Redis Cluster (``host``/``port``
    #: are the first); empty for a plain URL
    seeds: tuple[tuple[str, int], ...] = ()

    @property
    def cluster(self) -> bool:
        """The URL names a Redis Cluster (``redis+cluster://``/``rediss+cluster://``)."""
        return bool(self.seeds)

    @classmethod
    def from_url(cls, url: str) -> RedisEndpoint:
        """Parse ``url``. A ``ssl_*`` parameter on a ``redis://`` URL, an unknown
        ``ssl_cert_reqs`` or a malformed port raise ConfigError (without the password).

        ``redis+cluster://[user:password@]host:port[,host:port...]`` (``rediss+cluster://``
        with TLS) names a Redis Cluster by one or more seed nodes; the rest of the URL reads
        as for a single server (a cluster has only database 0)."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
            raise ConfigError(f"Redis URL {redact(url)}: expected redis://, rediss://, redis+cluster:// "
                              "or rediss+cluster://", key="redis_url")
        seeds: tuple[tuple[str, int], ...] = ()
        if parts.scheme.endswith("+cluster"):
            userinfo, _, hosts = parts.netloc.rpartition("@")
            try:
                seeds = tuple((h or "127.0.0.1", int(p or 6379)) for h, _, p in
                              (item.strip().rpartition(":") if ":" in item else (item.strip(), "", "")
                               for item in hosts.split(",") if item.strip()))
            except ValueError as exc:
                raise ConfigError(f"Redis URL {redact(url)}: invalid port", key="redis_url") from exc
            if not seeds:
                raise ConfigError(f"Redis URL {redact(url)}: no cluster node given", key="redis_url")
            # the first seed stands for the URL's host and port in what follows
            query_part = f"?{parts.query}" if parts.query else ""
            parts = urlsplit(f"{parts.scheme.split('+')[0]}://{userinfo + '@' if userinfo else ''}"
                             f"{seeds[0][0]}:{seeds[0][1]}{parts.path}{query_part}")
            if (parts.path or "/0").lstrip("/") not in ("", "0"):
                raise ConfigError(f"Redis URL {redact(url)}: a cluster has only database 0", key="redis_url")
        query = {k: v for k, v in parse_qsl(parts.query) if k in TLS_PARAMETERS}
        tls = parts.scheme == "rediss"
        if query and not tls:
            raise ConfigError(f"Redis URL {redact(url)}: {', '.join(sorted(query))} need(s) a rediss:// URL",
                              key="redis_url")
        reqs = query.get("ssl_cert_reqs", "required").lower()
        if reqs not in _CERT_REQS:
            raise ConfigError(f"Redis URL {redact(url)}: ssl_cert_reqs must be required, optional or none",
                              key="redis_url")
        try:
            port = parts.port or 6379
        except ValueError as exc:
            raise ConfigError(f"Redis URL {redact(url)}: invalid port", key="redis_url") from exc
        db_text = (parts.path or "/0").lstrip("/") or "0"
        if not db_text.isascii() or not db_text.isdigit():  # int() would quote it: maybe a password's tail
            raise ConfigError(f"Redis URL {redact(url)}: the database must be a number", key="redis_url")
        return cls(host=parts.hostname or "127.0.0.1", port=port, tls=tls,
                   username=unquote(parts.username) if parts.username else None,
                   password=unquote(parts.password) if parts.password else None,
                   db=int(db_text),
                   ca_certs=query.get("ssl_ca_certs"), certfile=query.get("ssl_certfile"),
                   keyfile=query.get("ssl_keyfile"), key_password=query.get("ssl_password"),
                   cert_reqs=reqs,
                   check_hostname=query.get("ssl_check_hostname", "true").lower() in ("true", "1", "yes"),
                   seeds=seeds)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context of a ``rediss://`` URL (see the class docstring)."""
        ctx = ssl.create_default_context(cafile=self.ca_certs)
        if self.certfile:
            ctx.load_cert_chain(self.certfile, self.keyfile, password=self.key_password)
        ctx.check_hostname = self.check_hostname and self.cert_reqs != "none"
        ctx.verify_mode = _CERT_REQS[self.cert_reqs]
        return ctx

    def redis_py_options(self) -> dict[str, Any]:
        """Keyword arguments for ``redis.Redis.from_url`` so that redis-py checks the host
        name as this endpoint does (redis-py 5 does not by default); none for ``redis://``."""
        return {"ssl_check_hostname": self.check_hostname and self.cert_reqs != "none"} if self.tls else {}

    def connect(self, timeout_s: float, store: str = "redis") -> socket.socket | ssl.SSLSocket:
        """A connected, authenticated socket on the right database. Unreachable (or a
        TLS handshake that fails): SinkUnavailable naming the address; AUTH or SELECT
        refused: SinkError."""
        try:
            sock: socket.socket | ssl.SSLSocket = socket.create_connection((self.host, self.port),
                                                                             timeout=timeout_s)
            if self.tls:
                sock = self.ssl_context().wrap_socket(sock, server_hostname=self.host)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            raise SinkUnavailable(f"Redis unreachable at {self.address}: {exc}", store=store,
                                  address=self.address) from exc
        setup: list[list[str]] = []
        if self.password is not None:
            setup.append(["AUTH", *([self.username] if self.username else []), self.password])
        if self.db:
            setup.append(["SELECT", str(self.db)])
        try:
            for cmd in setup:
                sock.sendall(command(cmd))
                reply = b""
                while not reply.endswith(b"\r\n"):
                    chunk = sock.recv(4096)
                    if not chunk:
                        raise ConnectionError("connection closed by Redis")
                    reply += chunk
                if not reply.startswith(b"+"):
                    raise SinkError(f"Redis at {self.address} refused {cmd[0]}: "
                                    f"{reply.decode(errors='replace').strip()}", store=store,
                                    address=self.address)
        except BaseException:
            sock.close()
            raise
        return sock


@contextmanager
def map_redis_errors(address: str, what: str, *, store: str = "redis") -> Iterator[None]:
    """Translate redis-py errors raised in the block (sync and asyncio clients share the
    classes): a refused AUTH -> SinkError (not transient: retrying will not help); a
    connection refused, lost or timed out -> SinkUnavailable "Redis unreachable at";
    any other error reply -> SinkError "Redis at ... refused <what>"."""
    try:
        yield
    except redis.AuthenticationError as exc:  # a ConnectionError subclass, but not transient
        raise SinkError(f"Redis at {address} refused the credentials (AUTH): {exc}", store=store,
                        address=address) from exc
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise SinkUnavailable(f"Redis unreachable at {address}: {exc}", store=store, address=address) from exc
    except redis.RedisError as exc:
        raise SinkError(f"Redis at {address} refused {what}: {exc}", store=store, address=address) from exc


def command(args: Sequence[str | bytes]) -> bytes:
    """One Redis command as protocol bytes."""
    parts = [f"*{len(args)}\r\n".encode()]
    for a in args:
        data = a.encode() if isinstance(a, str) else a
        parts += [f"${len(data)}\r\n".encode(), data, b"\r\n"]
    return b"".join(parts)


def _bulk(text: str) -> str:
    return f"${len(text.encode())}\r\n{text}\r\n"


@functools.lru_cache(maxsize=256)
def _bulks(texts: tuple[str, ...]) -> str:
    """Texts as bulk strings, joined (the SDK reads the same fields call after call)."""
    return "".join(_bulk(t) for t in texts)


def repeated_commands(head: Sequence[str], keys: Sequence[str], tail: Sequence[str]) -> bytes:
    """``head key *tail`` for every key, as protocol bytes: one pipeline of the same command
    over many keys (the SDK's HMGETs), the head and tail encoded once."""
    start = f"*{len(head) + 1 + len(tail)}\r\n" + _bulks(tuple(head))
    end = _bulks(tuple(tail))
    return "".join(f"{start}{_bulk(k)}{end}" for k in keys).encode()


class Conn:
    """One connection: commands out as protocol bytes, replies parsed (RESP2)."""

    def __init__(self, sock: socket.socket | ssl.SSLSocket, address: str) -> None:
        self.sock = sock
        self.address = address
        self.buf = b""

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _more(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError(f"connection closed by Redis at {self.address}")
        self.buf += chunk

    def read_lines(self, n: int) -> list[bytes]:
        """The next ``n`` one-line replies (integers, statuses, errors)."""
        while self.buf.count(b"\r\n") < n:
            self._more()
        lines = self.buf.split(b"\r\n", n)
        self.buf = lines[n] if len(lines) > n else b""
        return lines[:n]

    def read_replies(self, n: int) -> list[Any]:
        """The next ``n`` whole replies, which must be all the replies pending (what a
        pipeline just sent): parsed by hiredis's C reader when it is installed (~20x the
        Python parser's speed), else one :meth:`read_reply` at a time. Error replies are
        returned as :class:`ReplyError`."""
        if _hiredis is None:
            return [self.read_reply() for _ in range(n)]
        reader = _hiredis.Reader()
        if self.buf:
            reader.feed(self.buf)
            self.buf = b""
        out: list[Any] = []
        while len(out) < n:
            reply = reader.gets()
            if reply is False:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError(f"connection closed by Redis at {self.address}")
                reader.feed(chunk)
                continue
            out.append(ReplyError(str(reply)) if isinstance(reply, _hiredis.ReplyError) else reply)
        return out

    def read_reply(self) -> Any:
        """One whole reply: bytes, int, None, a list, or :class:`ReplyError` (returned,
        not raised, so a caller reading many replies reads them all)."""
        value, pos = self._parse(0)
        self.buf = self.buf[pos:]
        return value

    def _line(self, pos: int) -> tuple[bytes, int]:
        while True:
            end = self.buf.find(b"\r\n", pos)
            if end >= 0:
                return self.buf[pos:end], end + 2
            self._more()

    def _parse(self, pos: int) -> tuple[Any, int]:
        line, pos = self._line(pos)
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest, pos
        if kind == b"-":
            return ReplyError(rest.decode(errors="replace")), pos
        if kind == b":":
            return int(rest), pos
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None, pos
            while len(self.buf) < pos + size + 2:
                self._more()
            return self.buf[pos:pos + size], pos + size + 2
        if kind == b"*":
            size = int(rest)
            if size < 0:
                return None, pos
            items = []
            for _ in range(size):
                item, pos = self._parse(pos)
                items.append(item)
            return items, pos
        raise ConnectionError(f"Redis at {self.address}: unexpected reply {line[:60]!r}")

    def call(self, args: Sequence[str | bytes]) -> Any:
        self.send(command(args))
        return self.read_reply()


@dataclasses.dataclass(frozen=True)
class ReplyError:
    """An error reply (``-ERR ...``, ``-MOVED 3999 127.0.0.1:7102``)."""

    text: str

    @property
    def code(self) -> str:
        return self.text.split(" ", 1)[0]


