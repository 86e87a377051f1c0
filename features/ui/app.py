"""The ASGI application of ``features ui``: read-only pages, no framework.

=====================================  ==================================================
``GET /`` , ``/registry``              every schema (version, fingerprint, counts)
``GET /registry/{schema}``             one schema: fields, derived features, aggregations,
                                       placement, gates, the generated DDL and GX suite, its
                                       version history (``featureline_schema_versions``)
``GET /registry/{schema}/diff?from=&to=``  ``features schema diff`` between two recorded
                                       versions (a version or fingerprint; ``to=file``: the
                                       schemas folder's YAML)
``GET /views/{view}``                  one view: keys, request fields, the columns it reads
                                       from each schema, request-time features, fingerprint
``GET /runs[?schema=&page=]``          the runs, newest first, 50 a page, with their counts
                                       and gates; with a schema, a chart of its last runs
``GET /runs/{schema}/{run}``           one run: counts, reject rate, gates, top reasons
``GET /rejects?schema=&run=&rule=&     a page of rejects (keyset ``after``: the last id of
field=&after=``                        the page before)
``GET /rejects/{schema}/{id}``         one reject: its errors, raw payload and lineage
``GET /drift[/{schema}]?recent=&        per field, the recent window's distribution against
reference=&end=&reference_end=&        the reference window's (PSI, KS as the validation
sample=``                              report computes them; 400 for a bad parameter)
``GET /freshness[/{schema}]``          newest event and ingestion times, stream lag, Redis
                                       coverage (every schema, or one)
``GET /healthz``                       200 while the process serves (no store asked)
=====================================  ==================================================

Auth as ``features serve``: with tokens (``tokens`` not None) every request needs
``Authorization: Bearer <token>`` (401 missing or malformed, 403 unknown); the command
allows no tokens on a loopback host only. Other methods than GET and HEAD: 405. The
store's reads run in worker threads, never on the event loop. Every page is sent with a
Content-Security-Policy that allows no script, no font and no remote resource at all.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from features.errors import SinkError
from features.ops.catalog import Catalog, describe, list_all
from features.schema.syntax import duration_text
from features.ui import registry
from features.ui.chart import runs_chart
from features.ui.data import RejectFilter, UIData
from features.ui.drift import SLICES, BadRequest, DriftRequest, category_chart, numeric_chart, read_drift
from features.ui.freshness import FreshnessReader
from features.ui.pages import render
from features.ui.runs import RUNS_PAGE

log = logging.getLogger("features.ui")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

#: runs on the chart of /runs?schema=
CHART_RUNS = RUNS_PAGE

#: No script, no font, no remote anything: styles inline, images as data: only.
CSP = b"default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; base-uri 'none'"


@dataclass(frozen=True)
class Page:
    status: int
    html: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


class UIApp:
    """The UI over ``catalog`` (the project's schemas and views) and ``data`` (their stores).

    ``tokens``: accepted bearer tokens, or None to serve every request (loopback only:
    the command checks that). ``schemas_dir``: shown on the registry page. ``freshness``:
    the reader of the freshness page (None: the page says it is not configured).
    """

    def __init__(self, catalog: Catalog, data: UIData, *, tokens: Sequence[str] | None,
                 schemas_dir: str | Path = "schemas", freshness: FreshnessReader | None = None) -> None:
        self.catalog = catalog
        self.data = data
        self.freshness = freshness
        self.tokens = None if tokens is None else [t.encode() for t in tokens]
        self.schemas_dir = str(schemas_dir)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        elif scope["type"] == "http":
            page = await self.answer(scope)
            body = page.html.encode()
            await send({"type": "http.response.start", "status": page.status, "headers": [
                (b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                (b"content-security-policy", CSP), (b"x-content-type-options", b"nosniff"),
                (b"referrer-policy", b"no-referrer"), *page.headers]})
            await send({"type": "http.response.body", "body": b"" if scope.get("method") == "HEAD" else body})

    async def answer(self, scope: Scope) -> Page:
        """The page for one HTTP request (auth, method, route)."""
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if (denied := self._authorize(headers)) is not None:
            return denied
        method = scope.get("method", "GET")
        if method not in ("GET", "HEAD"):
            return Page(405, _error("Method not allowed", f"{method} is not allowed: the UI is read-only"),
                        ((b"allow", b"GET, HEAD"),))
        path = scope.get("raw_path") or scope.get("path", "/").encode()
        parts = [urllib.parse.unquote(p) for p in path.decode("latin-1").split("?")[0].strip("/").split("/")]
        params = {k: v[-1] for k, v in urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"),
                                                             keep_blank_values=False).items()}
        try:
            return await asyncio.to_thread(self._page, [p for p in parts if p], params)
        except SinkError as exc:
            log.warning("ui: %s", exc)
            return Page(503, _error("Store unavailable", str(exc)))
        except Exception:  # a bug: answer 500 and keep serving; the traceback goes to the log
            log.exception("ui: GET %s failed", scope.get("path"))
            return Page(500, _error("Internal error", "internal error; see the server log"))

    def _page(self, parts: list[str], params: dict[str, str]) -> Page:
        match parts:
            case [] | ["registry"] | ["views"]:
                listing = list_all(self.catalog)["schemas"]
                return Page(200, render("registry", title="Registry", section="Registry", schemas=listing,
                                        schemas_dir=self.schemas_dir, views=registry.view_rows(self.catalog)))
            case ["registry", name]:
                return self._schema(name)
            case ["registry", name, "diff"]:
                return self._diff(name, params)
            case ["views", name]:
                if name not in self.catalog.views:
                    return _not_found(f"no view {name!r}")
                return Page(200, render("view", title=f"View {name}", section="Registry",
                                        v=registry.view_page(self.catalog, name)))
            case ["runs"]:
                return self._runs(params)
            case ["runs", schema, run_id]:
                if schema not in self.data.schemas:
                    return _not_found(f"no schema {schema!r}")
                run = self.data.run(schema, run_id)
                if run is None:
                    return _not_found(f"no run {run_id!r} of schema {schema!r}")
                return Page(200, render("run", title=f"Run {run_id}", section="Runs", r=run))
            case ["rejects"]:
                return self._rejects(params)
            case ["rejects", schema, reject_id] if reject_id.isdigit():
                if schema not in self.data.schemas:
                    return _not_found(f"no schema {schema!r}")
                reject = self.data.reject(schema, int(reject_id))
                if reject is None:
                    return _not_found(f"no reject {reject_id} of schema {schema!r}")
                return Page(200, render("reject", title=f"Reject {reject.id} of {schema}", section="Rejects",
                                        r=reject))
            case ["drift"]:
                return Page(200, render("drift", title="Drift", section="Drift", v=None,
                                        schemas=list(self.data.schemas)))
            case ["drift", name]:
                return self._drift(name, params)
            case ["freshness"]:
                return self._freshness(None)
            case ["freshness", schema]:
                return self._freshness(schema)
            case ["healthz"]:
                return Page(200, "ok")
        return _not_found(f"no page /{'/'.join(parts)}; pages: /registry, /runs, /rejects, /freshness, "
                          "/drift")

    def _freshness(self, schema: str | None) -> Page:
        if schema is not None and (schema not in self.data.schemas
                                   or not self.data.schemas[schema].schema.loadable):
            return _not_found(f"no loadable schema {schema!r}")
        if self.freshness is None:
            return _not_found("the freshness page is not configured")
        found = self.freshness.read(None if schema is None else [schema])
        return Page(200, render("freshness", title="Freshness and lag" + (f" of {schema}" if schema else ""),
                                section="Freshness", schemas=found, one=schema is not None,
                                streams=self.freshness.streams, sample_rows=self.freshness.sample_rows))

    def _schema(self, name: str) -> Page:
        if name not in self.catalog.schemas or name not in self.data.schemas:
            return _not_found(f"no schema {name!r}")
        h = registry.history(self.data, name)
        newest = h.newest()
        other: registry.DiffPage | str | None = None  # the stores hold another version than the file
        if newest is not None and newest.fingerprint != self.data.schemas[name].fingerprint:
            try:
                other = registry.diff(self.data, self.catalog, name, newest.fingerprint, registry.FILE)
            except registry.NotFound as exc:
                other = str(exc)
        return Page(200, render("schema", title=f"Schema {name}", section="Registry",
                                d=describe(self.catalog, name), ddl=self.data.schemas[name].ddl,
                                recorded=h.held, history=h, newest=newest, other=other, file=registry.FILE,
                                suites=registry.suites(self.data.schemas[name])))

    def _diff(self, name: str, params: dict[str, str]) -> Page:
        if name not in self.catalog.schemas or name not in self.data.schemas:
            return _not_found(f"no schema {name!r}")
        old, new = params.get("from"), params.get("to")
        if not old or not new:
            return Page(400, _error("Bad request", "a diff needs from=VERSION and to=VERSION (a recorded "
                                    f"version or fingerprint, or {registry.FILE}: the schemas folder's "
                                    "YAML)"))
        try:
            d = registry.diff(self.data, self.catalog, name, old, new)
        except registry.NotFound as exc:
            return _not_found(str(exc))
        return Page(200, render("diff", title=f"Diff of {name}: {d.old.version} -> {d.new.version}",
                                section="Registry", d=d))

    def _drift(self, name: str, params: dict[str, str]) -> Page:
        if name not in self.data.schemas:
            return _not_found(f"no schema {name!r}")
        try:
            view = read_drift(self.data, name, DriftRequest.parse(params))
        except BadRequest as exc:
            return Page(400, _error("Bad request", str(exc)))
        return Page(200, render("drift", title=f"Drift of {name}", section="Drift", v=view, schemas=[],
                                numeric_chart=numeric_chart, category_chart=category_chart, slices=SLICES,
                                duration=lambda d: duration_text(int(d.total_seconds()))))

    def _runs(self, params: dict[str, str]) -> Page:
        schema = params.get("schema")
        if schema is not None and schema not in self.data.schemas:
            return _not_found(f"no schema {schema!r}")
        number = params.get("page", "1")
        if not number.isdigit() or int(number) < 1:
            return Page(400, _error("Bad request", f"page must be a number from 1, got {number!r}"))
        # the chart: the schema's newest runs (none without a schema)
        p, chart_runs = self.data.runs_page(schema, int(number), chart=0 if schema is None else CHART_RUNS)
        return Page(200, render("runs", title="Runs", section="Runs", p=p, schema=schema,
                                schemas=list(self.data.schemas), chart=runs_chart(chart_runs),
                                chart_runs=len(chart_runs)))

    def _rejects(self, params: dict[str, str]) -> Page:
        names = list(self.data.schemas)
        if not names:
            return _not_found("no schema in the project")
        schema = params.get("schema") or names[0]
        if schema not in self.data.schemas:
            return _not_found(f"no schema {schema!r}")
        after = params.get("after", "0")
        if not after.isdigit():
            return Page(400, _error("Bad request", f"after must be a reject id, got {after!r}"))
        f = RejectFilter(schema, params.get("run"), params.get("rule"), params.get("field"), int(after))
        return Page(200, render("rejects", title=f"Rejects of {schema}", section="Rejects", f=f,
                                page=self.data.rejects(f), schemas=names))

    def _authorize(self, headers: dict[bytes, bytes]) -> Page | None:
        """None when the request may go on; else the 401/403 page (every token compared in
        constant time, as ``features serve`` does)."""
        if self.tokens is None:
            return None
        challenge = ((b"www-authenticate", b'Bearer realm="featureline"'),)
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            return Page(401, _error("Unauthorized", "send Authorization: Bearer <token>"), challenge)
        ok = False
        for known in self.tokens:
            ok |= hmac.compare_digest(token, known)
        return None if ok else Page(403, _error("Forbidden", "token not accepted"))


def _error(title: str, message: str) -> str:
    return render("error", title=title, section="", message=message)


def _not_found(message: str) -> Page:
    return Page(404, _error("Not found", message))
