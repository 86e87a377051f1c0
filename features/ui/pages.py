"""The UI's HTML: Jinja2 templates (``templates/``) rendered with autoescape on.

Every value from YAML or the stores (schema and field names, descriptions, sources,
payloads, messages) is escaped on output; markup comes only from the templates. On top of
that, every value printed passes :func:`visible`: control characters (other than tab and
newline) are shown as ``\\xNN`` rather than sent raw. The pages share the validation
report's stylesheet and its formatting filters (:mod:`features.report.html`); the UI's own
few rules are in ``templates/ui.css``. The page loads nothing: no script, no font, no
image from anywhere (the app's Content-Security-Policy says so to the browser too).
"""

from __future__ import annotations

import functools
import importlib.resources
import re
import urllib.parse
from typing import Any

import jinja2
import markupsafe

from features.report.html import ident, num, text

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(value: Any) -> Any:
    """``value`` with each control character (except tab and newline) as ``\\xNN`` text;
    markup (from a filter that escaped already) and non-strings unchanged."""
    if isinstance(value, str) and not isinstance(value, markupsafe.Markup):
        return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", value)
    return value


def query(**params: Any) -> str:
    """A query string (``?a=1&b=x``) of the params that are not None, URL-encoded."""
    kept = {k: str(v) for k, v in params.items() if v is not None and v != ""}
    return "?" + urllib.parse.urlencode(kept) if kept else ""


def segment(value: Any) -> str:
    """A path segment, URL-encoded (a ``/`` in it included)."""
    return urllib.parse.quote(str(value), safe="")


def percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}%"


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f} s"


def age(value: float | None) -> str:
    """A duration in seconds as ``2 d 3 h``, ``4 h 05 min``, ``12 min 30 s`` or ``42 s`` (its
    two largest units); a negative one (an event time ahead of the clock) as ``-42 s``;
    None as an em dash."""
    if value is None:
        return "—"
    sign, left = ("-" if value < 0 else ""), int(abs(value))
    parts = [(left // 86400, "d"), (left // 3600 % 24, "h"), (left // 60 % 60, "min"), (left % 60, "s")]
    first = next((i for i, (n, _) in enumerate(parts) if n), len(parts) - 1)
    shown = [f"{n:02d} {u}" if i > first else f"{n} {u}" for i, (n, u) in enumerate(parts) if i <= first + 1]
    return sign + " ".join(shown[first:first + 2])


def when(value: Any) -> str:
    """A timestamp as ``2026-12-06 20:18:07 UTC``; None as an em dash."""
    if value is None:
        return "—"
    return f"{value:%Y-%m-%d %H:%M:%S %Z}".strip()


@functools.cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("features.ui", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             finalize=visible)
    env.filters.update(text=text, num=num, ident=ident, percent=percent, seconds=seconds, when=when,
                       segment=segment, age=age)
    env.globals.update(query=query, css=markupsafe.Markup(_css()))
    return env


def _css() -> str:
    """The report's stylesheet, then the UI's own (both ours, shipped in the package)."""
    report = importlib.resources.files("features.report").joinpath("templates/report.css").read_text()
    ui = importlib.resources.files("features.ui").joinpath("templates/ui.css").read_text()
    return report + ui


def render(template: str, **context: Any) -> str:
    """The page ``templates/<template>.html.j2`` rendered with ``context``."""
    return _env().get_template(f"{template}.html.j2").render(**context)
