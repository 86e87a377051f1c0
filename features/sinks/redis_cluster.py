"""Redis Cluster routing, shared by the sink (rows, aggregates, ledger) and the SDK.

A cluster splits the key space into 16,384 slots (CRC16 of the key's hash tag, the
text between its first ``{`` and the next ``}``; featureline's keys put the entity
there: ``features:<schema>:{<entity>}``) and every primary owns some slots.
:class:`Cluster` keeps:

- the **slot map**, read with ``CLUSTER SLOTS`` from any node it knows (the URL's seeds
  first, then every node of the last map), refreshed when a node answers ``-MOVED``
  or a connection fails;
- **one connection per primary**, opened on first use (TLS and AUTH as the URL says;
  a cluster has only database 0).

:meth:`Cluster.send_calls` pipelines many commands, each with its slot: it sends every
primary its share before reading any reply (the primaries work in parallel), then
answers redirections: ``-MOVED`` (refresh the map, resend to the new owner), ``-ASK``
(``ASKING`` + resend to the node importing the slot), ``-NOSCRIPT`` (``SCRIPT LOAD``
there, resend), ``-TRYAGAIN``/``-CLUSTERDOWN``/``-LOADING``/``-BUSY`` and a script's "non local key" error
mid-migration (back off, resend).
A resent script call is harmless: featureline's scripts write nothing the second time.

Slots are computed over Arrow arrays (:func:`features.compile.layout.key_slots`: numpy over
the data buffer, memory linear in the keys' bytes) and checked against the server's
``CLUSTER KEYSLOT`` in the tests.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from features.compile.layout import SLOTS
from features.errors import SinkError, SinkUnavailable
from features.sinks.redis_wire import Conn, ReplyError, command

if TYPE_CHECKING:
    from features.sinks.redis_wire import RedisEndpoint

# --------------------------------------------------------------------------- protocol


#: Replies after which the same command is sent again after a pause: the slot's owner is
#: failing over or being elected, a multi-key call hit a slot mid-migration, the node is
#: loading its data or busy with a script.
RETRY_LATER = ("TRYAGAIN", "CLUSTERDOWN", "LOADING", "BUSY", "MASTERDOWN")

#: The error a script gets when one of its commands touches a key of a slot that is
#: migrating and the key is not (or no longer) here: the newest-wins script DELs a hash
#: before its HSET, and while the slot migrates that HSET is refused this way instead of
#: the -ASK the call itself would get. Scripts are not rolled back, so the keys before it
#: are written (a retry finds them equal and skips them) and this one is absent until
#: the retry, which the node now redirects (-ASK) to the importing node.
SCRIPT_KEY_MOVING = "Script attempted to access a non local key"


def retry_later(err: ReplyError) -> bool:
    """Whether ``err`` is transient: the same command succeeds once the cluster settles."""
    return err.code in RETRY_LATER or (err.code == "ERR" and SCRIPT_KEY_MOVING in err.text)


# --------------------------------------------------------------------------- the cluster


class Cluster:
    """The slot map and one connection per primary of one Redis Cluster (see the module
    docstring). Not thread-safe: one per writer or reader."""

    def __init__(self, seed: RedisEndpoint, *, timeout_s: float = 30.0, store: str = "redis",
                 attempts: int = 8, backoff_s: float = 0.1) -> None:
        if seed.db:
            raise SinkError(f"Redis Cluster at {seed.address}: a cluster has only database 0, the URL "
                            f"asks for {seed.db}", store=store, address=seed.address)
        self.seed = seed
        self.seeds = [(h, p) for h, p in (seed.seeds or ((seed.host, seed.port),))]
        self.timeout_s = timeout_s
        self.store = store
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.owner = np.full(SLOTS, -1, dtype=np.int64)   # slot -> index into self.nodes
        self.nodes: list[tuple[str, int]] = []              # primaries of the last map
        self.replicas: dict[tuple[str, int], int] = {}      # primary -> its replicas
        self.conns: dict[tuple[str, int], Conn] = {}
        self.scripts: dict[str, str] = {}                   # sha -> source, loaded on every primary
        self.stale = False

    # --- connections ---------------------------------------------------------------

    @property
    def address(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.seeds)

    def conn(self, node: tuple[str, int]) -> Conn:
        c = self.conns.get(node)
        if c is None:
            endpoint = dataclasses.replace(self.seed, host=node[0], port=node[1], seeds=())
            c = Conn(endpoint.connect(self.timeout_s, store=self.store), endpoint.address)
            self.conns[node] = c
        return c

    def drop(self, node: tuple[str, int]) -> None:
        c = self.conns.pop(node, None)
        if c is not None:
            c.close()

    def close(self) -> None:
        for node in list(self.conns):
            self.drop(node)

    # --- the slot map --------------------------------------------------------------

    def refresh(self) -> None:
        """Read the slot map from the first node that answers (the seeds, then the nodes
        of the last map). None answers: SinkUnavailable naming them all."""
        tried: list[str] = []
        candidates = list(dict.fromkeys([*self.seeds, *self.nodes, *self.replicas]))
        for node in candidates:
            try:
                reply = self.conn(node).call(["CLUSTER", "SLOTS"])
            except (OSError, ConnectionError, SinkUnavailable) as exc:
                self.drop(node)
                tried.append(f"{node[0]}:{node[1]} ({exc})")
                continue
            if isinstance(reply, ReplyError):
                if "cluster support disabled" in reply.text.lower():
                    raise SinkError(f"Redis at {node[0]}:{node[1]} is not a cluster node (a "
                                    "redis+cluster:// URL needs one): use a redis:// URL",
                                    store=self.store, address=f"{node[0]}:{node[1]}")
                tried.append(f"{node[0]}:{node[1]} ({reply.text})")
                continue
            if self._apply(reply, node):
                return
            tried.append(f"{node[0]}:{node[1]} (slot map with uncovered slots)")
        raise SinkUnavailable(f"Redis Cluster: no node gave a slot map covering every slot: "
                              f"{'; '.join(tried)}", store=self.store, address=self.address)

    def _apply(self, reply: list[Any], via: tuple[str, int]) -> bool:
        """Take the map of a ``CLUSTER SLOTS`` reply when it covers every slot."""
        owner = np.full(SLOTS, -1, dtype=np.int64)
        nodes: list[tuple[str, int]] = []
        replicas: dict[tuple[str, int], int] = {}
        for entry in reply:
            lo, hi, primary, *others = entry
            host = primary[0].decode() or via[0]  # an empty host: the node we asked
            node = (host, int(primary[1]))
            if node not in nodes:
                nodes.append(node)
            replicas[node] = max(replicas.get(node, 0), len(others))
            owner[int(lo):int(hi) + 1] = nodes.index(node)
        if (owner < 0).any():
            return False
        gone = set(self.conns) - set(nodes) - set(self.seeds)
        for node in gone:
            self.drop(node)
        self.owner, self.nodes, self.replicas = owner, nodes, replicas
        return True

    def ensure_map(self) -> None:
        if not self.nodes or self.stale:
            self.refresh()
            self.stale = False

    def invalidate(self) -> None:
        """After a failure: close every connection; the next use reads the map again
        (from the seeds and every node of the old map)."""
        self.close()
        self.stale = True

    def node_of(self, slot: int) -> tuple[str, int]:
        self.ensure_map()
        return self.nodes[int(self.owner[slot])]

    # --- scripts -------------------------------------------------------------------

    def load_script(self, source: str, sha: str) -> None:
        """``SCRIPT LOAD`` on every primary (and again on any that answers NOSCRIPT later)."""
        self.ensure_map()
        self.scripts[sha] = source
        for node in self.nodes:
            self._load_on(node, sha)

    def _load_on(self, node: tuple[str, int], sha: str) -> None:
        reply = self.conn(node).call(["SCRIPT", "LOAD", self.scripts[sha]])
        if isinstance(reply, ReplyError):
            raise SinkError(f"Redis at {node[0]}:{node[1]} refused SCRIPT LOAD: {reply.text}",
                            store=self.store, address=f"{node[0]}:{node[1]}")
        if reply != sha.encode():
            raise SinkError(f"unexpected SCRIPT LOAD reply {reply!r}", store=self.store)

    # --- commands ------------------------------------------------------------------

    def call(self, slot: int, args: Sequence[str | bytes]) -> Any:
        """One command for ``slot``, redirections followed; an error reply raises SinkError."""
        reply = self.send_calls([command(args)], np.array([slot]), replies=True)[0]
        if isinstance(reply, ReplyError):
            raise SinkError(f"Redis Cluster refused {args[0]!r}: {reply.text}", store=self.store,
                            address=self.address)
        return reply

    def send_calls(self, calls: Sequence[bytes], slots: npt.NDArray[np.int64], *,
                   replies: bool = False, script_sha: str | None = None) -> list[Any]:
        """Send ``calls[i]`` to the owner of ``slots[i]``, every primary's share before any
        reply is read; follow MOVED/ASK, reload a lost script (``script_sha``), retry the
        transient errors (:data:`RETRY_LATER`) with backoff. Returns the final reply of
        every call, in order (with ``replies``: parsed replies; else the one-line replies
        as bytes, which script calls and SADD give). Other error replies are returned
        for the caller to judge; connection failures raise (OSError/ConnectionError)."""
        self.ensure_map()
        out: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        asking: dict[int, tuple[str, int]] = {}  # call -> the node an -ASK sent it to
        delay = self.backoff_s
        for _ in range(self.attempts):
            by_node: dict[tuple[str, int], list[int]] = {}
            owners = self.owner[slots[todo]] if todo else np.zeros(0, dtype=np.int64)
            for i, o in zip(todo, owners.tolist(), strict=True):
                by_node.setdefault(asking.get(i, self.nodes[o]), []).append(i)
            for node, idx in by_node.items():  # every primary's share first: they work in parallel
                payload = [b"*1\r\n$6\r\nASKING\r\n" + calls[i] if i in asking else calls[i] for i in idx]
                self.conn(node).send(b"".join(payload))
            again: list[int] = []
            moved = later = False
            for node, idx in by_node.items():
                c = self.conn(node)
                lost_script = False
                for i in idx:
                    if i in asking:
                        c.read_reply()  # ASKING's +OK
                    reply = c.read_reply() if replies else _one_line(c)
                    err = reply if isinstance(reply, ReplyError) else None
                    code = err.code if err else ""
                    asking.pop(i, None)
                    if code == "MOVED":
                        moved = True
                        again.append(i)
                    elif code == "ASK" and err is not None:
                        host, _, port = err.text.split(" ")[2].rpartition(":")
                        asking[i] = (host or node[0], int(port))
                        again.append(i)
                    elif code == "NOSCRIPT" and script_sha in self.scripts:
                        lost_script = True  # loaded once this node's replies are all read
                        again.append(i)
                    elif err is not None and retry_later(err):
                        later = True
                        again.append(i)
                    else:
                        out[i] = reply
                if lost_script:
                    assert script_sha is not None
                    self._load_on(node, script_sha)
            if not again:
                return out
            if moved:
                self.refresh()
            if later:
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
            todo = sorted(again)
        pending = ", ".join(sorted({str(int(slots[i])) for i in todo})[:5])
        raise SinkUnavailable(f"Redis Cluster at {self.address}: slots {pending} still redirected or "
                              f"unavailable after {self.attempts} attempts", store=self.store,
                              address=self.address)

    def wait_replicas(self, nodes: Sequence[tuple[str, int]], timeout_ms: int) -> list[str]:
        """``WAIT`` on each primary in ``nodes`` for all of its replicas; returns the
        primaries whose replicas did not all acknowledge in time (their writes may be lost
        if they fail over now)."""
        short = []
        for node in nodes:
            want = self.replicas.get(node, 0)
            if want == 0:
                continue
            got = self.conn(node).call(["WAIT", str(want), str(timeout_ms)])
            if not isinstance(got, int) or got < want:
                short.append(f"{node[0]}:{node[1]} ({got}/{want} replicas)")
        return short


def _one_line(c: Conn) -> bytes | ReplyError:
    line = c.read_lines(1)[0]
    if line.startswith(b"-"):
        return ReplyError(line[1:].decode(errors="replace"))
    return line


class ConnOrCluster:
    """A client of one server or of a cluster (:class:`features.sinks.redis.RedisSink`,
    :class:`features.sdk.redis_read.RawRedis`): ``_conn`` the connection to a standalone
    server, ``_cluster`` the router of a cluster; :meth:`close` drops either."""

    _conn: Conn | None
    _cluster: Cluster | None

    def close(self) -> None:
        """Close the standalone connection (reopened on the next call) and forget the
        cluster's map and connections (read again on the next call)."""
        if self._cluster is not None:
            self._cluster.invalidate()
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


__all__ = ["Cluster", "Conn", "ConnOrCluster", "ReplyError", "command"]
