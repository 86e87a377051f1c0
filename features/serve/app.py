"""The service's ASGI application (``features serve``): six routes, no framework.

====================================  =======================================================
``POST /v1/schemas/{name}/events``    records -> rejects table + dead letters, then the topic
``POST /v1/views/{name}/online``      request rows -> the view's feature vectors (docs/views.md;
                                      at most ``--max-view-rows``, worked off the event loop)
``GET /healthz``                      200 while the process serves
``GET /readyz``                       200 when the broker answers and every topic exists
                                      (the reason and the schemas: with a valid token only)
``GET /metrics``                      this worker's Prometheus metrics
====================================  =======================================================

(``docs/ingest.md`` has the request and response formats.) An events request runs:

1. auth (``Authorization: Bearer <token>``: 401 missing or malformed, 403 unknown),
   method (405), schema (404), body size (413: Content-Length first, then counted while
   reading), body shape (400, :mod:`features.serve.body`), records per body (413);
2. :meth:`~features.serve.ingest.SchemaIngest.submit` (503 when the bodies waiting to be
   checked are at their limit): the schema's checking thread runs the stream's
   micro-batch step on it, together with the requests that arrived meanwhile (never on
   the event loop);
3. the schema's rate gates over the worker's sliding window (``quality:``, docs/operations.md
   "Quality gates"): a breached ``fail`` gate answers 422 naming the gate, the measured
   rate, the limit and the top reasons, and nothing of the request is stored or produced;
   a breached ``warn`` gate is reported in the answer and the metrics;
4. when some records are rejected: their rows into the rejects table (a thread) and their
   dead letters to the dead-letter topic, acknowledged, **before** anything else;
5. the valid records to the schema's topic; the response waits for every acknowledgement:
   202 (all accepted) or 422 (some rejected, the others accepted, the first
   ``--max-errors`` field errors listed), each with the request id; 503 when Postgres or
   Kafka could not take them for now (a :class:`~features.errors.Transient` error: nothing
   is acknowledged; a retry is safe: the stream's stores keep each event once (entity,
   event time, content digest), rejects are unique per ``http://<request id>#<index>``); 413
   when Kafka refused a record as too large for the topic, 502 when it or Postgres refused
   the request for good otherwise (no Retry-After: the same request fails again).

The lifespan startup compiles nothing itself: it opens each schema's rejects writer and
the producer (failing the worker's start when Postgres refuses); the lifespan shutdown,
which uvicorn runs after the in-flight requests finished, flushes the producer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hmac
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from features.errors import ConfigError, RequestRejected, SinkError, Transient
from features.observe.logs import fields
from features.observe.metrics import CONTENT_TYPE, MetricsServer, Registry
from features.serve.body import (
    BadBody,
    TooManyRecords,
    UnsupportedType,
    bounded_errors,
    is_json,
    read_view_request,
)
from features.serve.ingest import Checked, IngestBusy, SchemaIngest
from features.serve.limits import MAX_ERRORS, MAX_VIEW_ROWS
from features.serve.producer import AsyncProducer, RecordRefused

log = logging.getLogger("features.serve")
access_log = logging.getLogger("features.serve.access")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

#: A client's ``X-Request-Id`` is used when it matches this; otherwise a fresh uuid4 hex.
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
EVENTS_ROUTE = "/v1/schemas/{name}/events"
_EVENTS_PATH = re.compile(r"^/v1/schemas/([^/]+)/events/?$")
VIEWS_ROUTE = "/v1/views/{name}/online"
_VIEWS_PATH = re.compile(r"^/v1/views/([^/]+)/online/?$")
#: /readyz asks the broker at most this often (seconds); in between it answers from cache.
READY_CACHE_S = 1.0
#: How long /readyz waits for the broker's metadata (seconds).
READY_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Response:
    """An answer: ``body`` a dict (sent as JSON, the request id added), text (metrics) or
    bytes (JSON encoded already, off the event loop)."""

    status: int
    body: dict[str, Any] | str | bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()
    records: int = 0
    accepted: int = 0
    rejected: int = 0


class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


class IngestMetrics:
    """The service's metrics (one registry per worker; names in ``docs/operations.md``)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.requests = registry.counter("featureline_ingest_requests_total",
                                         "HTTP requests answered, by route and status code.",
                                         ["route", "status"])
        self.records = registry.counter("featureline_ingest_records_total",
                                        "Records received over HTTP, by schema and outcome (accepted: "
                                        "acknowledged by Kafka; rejected: in the rejects table).",
                                        ["schema", "outcome"])
        self.gate_breaches = registry.counter("featureline_gate_breaches_total",
                                              "Quality gates breached over the ingest's sliding window "
                                              "(docs/operations.md, \"Quality gates\"), counted per "
                                              "request, by gate and what the breach did (fail: the request "
                                              "was refused; warn: stored).", ["schema", "gate", "on_breach"])
        self.gate_measured = registry.gauge("featureline_gate_measured",
                                            "The rate a quality gate was last judged on over the ingest's "
                                            "sliding window (rows / rows read).", ["schema", "gate"])
        self.seconds = registry.histogram("featureline_ingest_request_seconds",
                                          "Seconds from a request's start to its response, by route.",
                                          ["route"])


class IngestApp:
    """The ASGI application of one worker (see the module docstring).

    ``schemas``: the :class:`SchemaIngest` of every schema served, opened by the lifespan
    startup. ``tokens``: the accepted bearer tokens, or None to accept every request
    (``--insecure-no-auth``). ``worker``: this worker's index (its metrics port is
    ``metrics_port + worker``). ``on_ready`` is called once the startup is done,
    ``on_failure`` with the reason (one line) when it failed, before the worker exits.
    """

    def __init__(self, schemas: Sequence[SchemaIngest], producer_factory: Callable[[], AsyncProducer], *,
                 tokens: Sequence[str] | None, max_body_bytes: int, worker: int = 0,
                 metrics_port: int | None = None, metrics_host: str = "127.0.0.1",
                 access_log: bool = True, on_ready: Callable[[], None] | None = None,
                 on_failure: Callable[[str], None] | None = None, views: Sequence[str] = (),
                 store_factory: Callable[[], Any] | None = None, ingest: bool = True,
                 max_view_rows: int = MAX_VIEW_ROWS, max_errors: int = MAX_ERRORS) -> None:
        self.schemas = {s.name: s for s in schemas} if ingest else {}
        self._producer_factory = producer_factory
        #: the views served on VIEWS_ROUTE, read through one FeatureStore per worker
        self.views = set(views)
        self._store_factory = store_factory
        self.store: Any = None
        self.ingest = ingest
        self.producer: AsyncProducer | None = None
        self.tokens = None if tokens is None else [t.encode() for t in tokens]
        self.max_body_bytes = max_body_bytes
        self.max_view_rows = max_view_rows
        self.max_errors = max_errors
        self.worker = worker
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.access_log = access_log
        self.on_ready = on_ready
        self.on_failure = on_failure
        self.metrics = IngestMetrics(Registry())
        self._metrics_server: MetricsServer | None = None
        self._ready: tuple[float, bool, str] | None = None
        self._ready_lock: asyncio.Lock | None = None

    # --- ASGI ------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        # websocket: not served (uvicorn refuses the upgrade when the app does not accept it)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await asyncio.to_thread(self._start)
                except Exception as exc:  # reported to uvicorn, which exits the worker (status 3)
                    log.error("serve: worker %d cannot start: %s", self.worker, exc)
                    if self.on_failure is not None:
                        self.on_failure(f"{type(exc).__name__}: {exc}")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                self._ready_lock = asyncio.Lock()
                await send({"type": "lifespan.startup.complete"})
                if self.on_ready is not None:
                    self.on_ready()
            elif message["type"] == "lifespan.shutdown":
                await asyncio.to_thread(self._stop)
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _start(self) -> None:
        if self.views and self._store_factory is not None:
            self.store = self._store_factory()
            for name in sorted(self.views):
                self.store.view(name)  # a view that does not compile fails the start
        if not self.ingest:
            self._metrics_start()
            return
        for s in self.schemas.values():
            s.open()
        self.producer = self._producer_factory()
        self._metrics_start()

    def _metrics_start(self) -> None:
        if self.metrics_port is not None:
            port = self.metrics_port + self.worker
            self._metrics_server = MetricsServer(self.metrics.registry, port, self.metrics_host)

    def _stop(self) -> None:
        """After the last request: flush the producer (every 202 was acknowledged already;
        this only waits for dead letters of requests that failed), close the stores."""
        try:
            if self.producer is not None:
                left = self.producer.close(30)
                if left:
                    log.error("serve: worker %d: %d Kafka messages unacknowledged at shutdown", self.worker,
                              left)
        finally:
            for s in self.schemas.values():
                s.close()
            if self.store is not None:
                self.store.close()
            if self._metrics_server is not None:
                self._metrics_server.close()
        log.info("serve: worker %d stopped", self.worker)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = given if REQUEST_ID.match(given) else uuid.uuid4().hex
        path: str = scope.get("path", "")
        method: str = scope.get("method", "GET")
        route, handler = self._route(path)
        try:
            response = await handler(method, path, headers, receive, request_id)
        except _ClientGone:
            response = Response(499, {"error": "the client went away"})
        except Exception:  # a bug: answer 500 and keep serving; the traceback goes to the log
            log.exception("serve: %s %s failed", method, path)
            response = Response(500, {"error": "internal error; see the server log"})
        if response.status != 499:
            await self._send(send, response, request_id)
        seconds = time.perf_counter() - t0
        self.metrics.requests.labels(route, str(response.status)).inc()
        self.metrics.seconds.labels(route).observe(seconds)
        if self.access_log:
            access_log.info("request", extra=fields({
                "request_id": request_id, "method": method, "path": path, "status": response.status,
                "records": response.records, "accepted": response.accepted, "rejected": response.rejected,
                "ms": round(seconds * 1000, 2), "worker": self.worker}))

    async def _send(self, send: Send, r: Response, request_id: str) -> None:
        if isinstance(r.body, str):
            body, ctype = r.body.encode(), CONTENT_TYPE.encode()
        elif isinstance(r.body, bytes):
            body, ctype = r.body, b"application/json"
        else:
            if "request_id" not in r.body:
                r = Response(r.status, {"request_id": request_id, **r.body}, r.headers)
            assert isinstance(r.body, dict)
            body, ctype = json.dumps(r.body, default=_json_value).encode(), b"application/json"
        await send({"type": "http.response.start", "status": r.status, "headers": [
            (b"content-type", ctype), (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id.encode()), *r.headers]})
        await send({"type": "http.response.body", "body": body})

    def _route(self, path: str) -> tuple[str, Any]:
        if _EVENTS_PATH.match(path):
            return EVENTS_ROUTE, self._events
        if _VIEWS_PATH.match(path):
            return VIEWS_ROUTE, self._view_online
        return {"/healthz": ("/healthz", self._healthz), "/readyz": ("/readyz", self._readyz),
                "/metrics": ("/metrics", self._metrics)}.get(path, ("other", self._not_found))

    # --- routes ----------------------------------------------------------------------

    async def _not_found(self, method: str, path: str, *_: Any) -> Response:
        return Response(404, {"error": f"no route {path}; routes: POST {EVENTS_ROUTE}, POST {VIEWS_ROUTE}, "
                              "GET /healthz, GET /readyz, GET /metrics"})

    async def _healthz(self, method: str, *_: Any) -> Response:
        return _get_only(method) or Response(200, {"status": "ok", "worker": self.worker})

    async def _metrics(self, method: str, *_: Any) -> Response:
        return _get_only(method) or Response(200, self.metrics.registry.exposition())

    async def _readyz(self, method: str, path: str, headers: dict[bytes, bytes], *_: Any) -> Response:
        """200 ready / 503 not ready. The reason (which may name topics and the broker's
        address and errors), the schemas and the worker go to a client with a valid token
        only (or to every client under ``--insecure-no-auth``); a probe without one (or
        with a wrong one) learns the status alone."""
        if (wrong := _get_only(method)) is not None:
            return wrong
        ok, reason = await self.readiness()
        body: dict[str, Any] = {"status": "ready" if ok else "not ready"}
        if self._authorize(headers) is None:
            body.update(reason=reason, schemas=sorted(self.schemas), worker=self.worker)
        return Response(200 if ok else 503, body)

    async def readiness(self) -> tuple[bool, str]:
        """(ready, reason): the broker answers a metadata request and every topic (and
        dead-letter topic) exists. Asked at most every READY_CACHE_S seconds."""
        assert self._ready_lock is not None
        if self.producer is None:  # views only (--no-ingest): ready once the views compiled
            return True, f"views {', '.join(sorted(self.views)) or 'none'} compiled; no ingest"
        async with self._ready_lock:
            now = time.monotonic()
            if self._ready is not None and now - self._ready[0] < READY_CACHE_S:
                return self._ready[1], self._ready[2]
            try:
                topics = await asyncio.to_thread(self.producer.topics, READY_TIMEOUT_S)
            except Exception as exc:  # KafkaException and kin: the reason is the answer
                ok, reason = False, f"Kafka at {self.producer.bootstrap} did not answer: {exc}"
            else:
                needed = sorted({t for s in self.schemas.values()
                                 for t in (s.topic, s.dead_letter_topic) if t})
                missing = [t for t in needed if t not in topics]
                ok = not missing
                reason = (f"missing topic(s): {', '.join(missing)}" if missing
                          else "schemas compiled, broker up")
            self._ready = (time.monotonic(), ok, reason)
            return ok, reason

    async def _events(self, method: str, path: str, headers: dict[bytes, bytes], receive: Receive,
                      request_id: str) -> Response:
        if (denied := self._authorized_post(method, headers)) is not None:
            return denied
        m = _EVENTS_PATH.match(path)
        assert m is not None
        ingest = self.schemas.get(m.group(1))
        if ingest is None:
            return Response(404, {"error": f"unknown schema {m.group(1)!r}",
                                  "schemas": sorted(self.schemas)})
        body = await self._body(headers, receive)
        if isinstance(body, Response):
            return body
        ctype = headers.get(b"content-type", b"").decode("latin-1")
        try:
            checked = await asyncio.wrap_future(ingest.submit(body, ctype, request_id))
        except TooManyRecords as exc:
            return Response(413, {"error": str(exc), "max_records": exc.limit})
        except BadBody as exc:
            return Response(400, {"error": str(exc)})
        except IngestBusy as exc:
            log.warning("serve: request %s: %s", request_id, exc)
            return Response(503, {"error": str(exc)}, headers=((b"retry-after", b"1"),))
        assert self.producer is not None
        gate = self._gate_report(ingest.name, checked)
        if checked.refused:
            # a breached fail gate: nothing of the request is stored or produced (its errors
            # are in the answer); it is not in the window either, so a fixed retry is judged anew
            self.metrics.records.labels(ingest.name, "refused").inc(checked.records)
            assert gate is not None
            return Response(422, {"request_id": request_id, "accepted": 0, "rejected": checked.rejected,
                                  "refused": checked.records, **gate, "errors": checked.errors,
                                  "errors_total": checked.errors_total,
                                  "errors_truncated": checked.errors_truncated},
                            records=checked.records, accepted=0, rejected=checked.rejected)
        try:
            if checked.rejected:  # rejects are stored and acknowledged before any valid record
                await asyncio.to_thread(ingest.write_rejects, checked.rejects)
                if ingest.dead_letter_topic:
                    await self.producer.send(ingest.dead_letter_topic,
                                             [(k, v, None) for k, v in checked.dead_letters])
            await self.producer.send(ingest.topic, checked.messages)
        except SinkError as exc:
            return _sink_failed(exc, request_id, checked.records)
        self.metrics.records.labels(ingest.name, "accepted").inc(checked.accepted)
        self.metrics.records.labels(ingest.name, "rejected").inc(checked.rejected)
        body_out: dict[str, Any] = {"request_id": request_id, "accepted": checked.accepted,
                                    "rejected": checked.rejected}
        if checked.rejected:
            body_out.update(errors=checked.errors, errors_total=checked.errors_total,
                            errors_truncated=checked.errors_truncated)
        if gate is not None:  # a breached warn gate: stored, and said so
            body_out.update(gate)
        return Response(422 if checked.rejected else 202, body_out, records=checked.records,
                        accepted=checked.accepted, rejected=checked.rejected)

    def _gate_report(self, schema: str, checked: Checked) -> dict[str, Any] | None:
        """The quality gates judged at a request (its metrics counted): None when none is
        breached, else what the answer says of them: ``error`` (a breached ``fail`` gate),
        ``gates_breached`` (each gate: measured, limit, on_breach, rows of the window),
        ``window_records``, ``top_reasons``, ``owner``."""
        check = checked.gate
        if check is None or check.verdict is None:
            return None
        verdict = check.verdict
        for r in verdict.results:
            self.metrics.gate_measured.labels(schema, r.gate.name).set(float(r.measured))
            if r.breached:
                self.metrics.gate_breaches.labels(schema, r.gate.name, r.gate.on_breach).inc()
        if not verdict.breaches:
            return None
        read = verdict.counts.read
        out: dict[str, Any] = {
            "gates_breached": [{"gate": r.gate.name, "on_breach": r.gate.on_breach, "measured": r.measured,
                                "limit": r.gate.limit, "rows": r.rows, "describe": r.describe(read)}
                               for r in verdict.breaches],
            "window_records": read,
            "top_reasons": [{"rule": rule, "count": n} for rule, n in verdict.top_reasons()],
            "owner": verdict.owner}
        if checked.refused:
            out["error"] = ("quality gate " + "; ".join(r.describe(read) for r in verdict.failed)
                            + f" over the last {read:,} records (on_breach: fail): nothing of this request "
                            "was accepted or stored")
        for r in verdict.warned:
            log.warning("serve: quality gate breached (warn): %s", r.describe(read),
                        extra={"schema": schema, "gate": r.gate.name})
        return out

    async def _view_online(self, method: str, path: str, headers: dict[bytes, bytes], receive: Receive,
                           request_id: str) -> Response:
        """``POST /v1/views/{name}/online`` (docs/views.md, "Over HTTP"): ``{"rows": [{key:
        value, ...}, ...], "lineage": false, "windows": "request_time", "at": null}`` -> 200
        ``{"view", "version", "rows": [...]}`` (``"windows"``: ``"request_time"``, the
        default, the aggregations' windows at ``at``, an ISO 8601 time, default now;
        ``"event"`` their values as of each entity's newest event); 400 a body that
        is no such object (or a bad ``windows``/``at``), 404 an unknown view, 413 over the body limit or
        ``--max-view-rows``, 415 not JSON, 422 request rows the view refuses (the first
        ``--max-errors`` field errors), 503 a store down (retry). Everything past reading the
        body (parsing it, the read, encoding the answer) runs in a worker thread: the event
        loop keeps answering other requests (``/healthz``) meanwhile."""
        if (denied := self._authorized_post(method, headers)) is not None:
            return denied
        m = _VIEWS_PATH.match(path)
        assert m is not None
        name = m.group(1)
        if name not in self.views or self.store is None:
            return Response(404, {"error": f"unknown view {name!r}", "views": sorted(self.views)})
        ctype = headers.get(b"content-type", b"").decode("latin-1")
        if not is_json(ctype):
            return Response(415, {"error": f"Content-Type {ctype!r} is not JSON; send application/json"})
        raw = await self._body(headers, receive)
        if isinstance(raw, Response):
            return raw
        return await asyncio.to_thread(self._answer_view, name, raw, ctype, request_id)

    def _answer_view(self, name: str, raw: bytes, ctype: str, request_id: str) -> Response:
        """The view route's work after the body was read (in a worker thread): the answer,
        its JSON already encoded (``Response.body`` bytes) when it is a 200."""
        try:
            request = read_view_request(raw, ctype, self.max_view_rows)
        except TooManyRecords as exc:
            return Response(413, {"error": str(exc), "max_view_rows": exc.limit})
        except UnsupportedType as exc:
            return Response(415, {"error": str(exc)})
        except BadBody as exc:
            return Response(400, {"error": str(exc)})
        n = len(request.rows)
        try:
            # no "windows" in the body: the SDK's default (request time)
            windows = {} if request.windows is None else {"windows": request.windows}
            out = self.store.online_view_dicts(name, request.rows, lineage=request.lineage, at=request.at,
                                               **windows)
        except RequestRejected as exc:
            return Response(422, {"error": str(exc).splitlines()[0], "rejected": exc.rejected,
                                  **bounded_errors(exc.errors, self.max_errors)},
                            records=n, rejected=exc.rejected)
        except ConfigError as exc:
            return Response(400, {"error": str(exc)}, records=n)
        except SinkError as exc:
            return _sink_failed_read(exc, request_id, n)
        cv = self.store.view(name)
        body = {"request_id": request_id, "view": name, "version": cv.version_str, "rows": out}
        return Response(200, json.dumps(body, default=_json_value).encode(), records=n, accepted=n)

    def _authorized_post(self, method: str, headers: dict[bytes, bytes]) -> Response | None:
        """None for an authorized POST, else the answer (401/403 as :meth:`_authorize`, 405)."""
        if (denied := self._authorize(headers)) is not None:
            return denied
        if method != "POST":
            return Response(405, {"error": f"{method} not allowed here; use POST"},
                            headers=((b"allow", b"POST"),))
        return None

    def _authorize(self, headers: dict[bytes, bytes]) -> Response | None:
        """None when the request may go on; else the 401/403 response. Every configured
        token is compared (constant time each), whichever matches."""
        if self.tokens is None:
            return None
        challenge = ((b"www-authenticate", b'Bearer realm="featureline"'),)
        value = headers.get(b"authorization")
        if not value:
            return Response(401, {"error": "missing Authorization: Bearer <token>"}, challenge)
        scheme, _, token = value.partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            return Response(401, {"error": "malformed Authorization header; expected Bearer <token>"},
                            challenge)
        ok = False
        for known in self.tokens:
            ok |= hmac.compare_digest(token, known)
        return None if ok else Response(403, {"error": "token not accepted"})

    async def _body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes | Response:
        """The request's body, or the answer when it is over the limit (413) or its
        Content-Length is invalid (400)."""
        try:
            return await self._read_body(headers, receive)
        except _BodyTooLarge:
            return Response(413, {"error": f"the body is over the limit of {self.max_body_bytes:,} bytes"})
        except ValueError:
            return Response(400, {"error": "invalid Content-Length"})

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes:
        declared = headers.get(b"content-length")
        if declared is not None and int(declared) > self.max_body_bytes:
            raise _BodyTooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _json_value(value: Any) -> Any:
    """JSON for the values a view returns beyond JSON's own: a decimal as its exact text,
    a timestamp or a date in ISO 8601 (``...+00:00`` for UTC), bytes as text."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _sink_failed(exc: SinkError, request_id: str, records: int) -> Response:
    """The answer to a request that a store could not take: 503 with Retry-After when
    the error is Transient (a retry may succeed), else no Retry-After: 413 for a record
    too large for its topic, 502 for any other refusal (``kafka_error`` names Kafka's)."""
    if isinstance(exc, Transient):
        log.warning("serve: request %s: %s", request_id, exc)
        return Response(503, {"error": f"{exc}; nothing was acknowledged, retry the request (it is "
                              "idempotent)"}, headers=((b"retry-after", b"1"),), records=records)
    log.error("serve: request %s refused for good: %s", request_id, exc)
    body: dict[str, Any] = {"error": f"{exc}; the request was not fully accepted: do not retry it unchanged"}
    if isinstance(exc, RecordRefused):
        body["kafka_error"] = exc.code
        return Response(413 if exc.too_large else 502, body, records=records)
    return Response(502, body, records=records)


def _sink_failed_read(exc: SinkError, request_id: str, records: int) -> Response:
    """A view read a store could not answer: 503 with Retry-After when it is Transient
    (a store down: a retry may succeed), else 502."""
    if isinstance(exc, Transient):
        log.warning("serve: request %s: %s", request_id, exc)
        return Response(503, {"error": str(exc)}, headers=((b"retry-after", b"1"),), records=records)
    log.error("serve: request %s: %s", request_id, exc)
    return Response(502, {"error": str(exc)}, records=records)


def _get_only(method: str) -> Response | None:
    if method in ("GET", "HEAD"):
        return None
    return Response(405, {"error": f"{method} not allowed here; use GET"}, headers=((b"allow", b"GET"),))
