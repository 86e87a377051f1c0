"""``features ui``: read-only web pages over the project's schemas and stores (docs/ui.md).

:mod:`features.ui.data` reads (the schemas through :mod:`features.ops.catalog`, the
ledger and the rejects tables through indexed, paged queries); :mod:`features.ui.pages`
renders HTML (Jinja2 with autoescape: every string from YAML or the data is escaped);
:mod:`features.ui.app` is the ASGI application ``features ui`` serves with uvicorn.
"""
