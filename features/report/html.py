"""``report.html``: one self-contained page (inline CSS and SVG, no script, no external asset).

The page is the Jinja2 template ``templates/report.html.j2`` (its CSS beside it in
``report.css``), loaded from the installed package and rendered with autoescape on:
every value from the report dict (schema, field and rule names, data values, file
paths) is HTML-escaped on output, and markup comes only from the template. Data values
are hostile until proven otherwise, so nothing derived from them is marked safe.

What stays in Python is what a template reads badly: number formatting (the ``num``
and ``text`` filters), identifiers with line-break opportunities only between their
words (the ``ident`` filter: a rule name such as ``discount_share.max`` may wrap after
``_`` or ``.``, never inside a word) and the charts' geometry (:func:`histogram_chart`,
:func:`sparkline`, :func:`category_chart`).
"""

from __future__ import annotations

import functools
import re
from typing import Any

import jinja2
import markupsafe

_W, _H = 260, 80  # a chart's size in CSS pixels


def text(value: Any) -> str:
    """``value`` as page text, before escaping: None as an em dash, bools as yes/no."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def num(value: Any) -> str:
    """A count or measure as page text: ints with thousands separators, floats with 2
    decimals (4 significant digits below 0.01), anything else as :func:`text`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}" if value and abs(value) < 0.01 else f"{value:,.2f}"
    return text(value)


def ident(value: Any) -> markupsafe.Markup:
    """An identifier (a rule, field or column name) escaped, with a ``<wbr>`` break
    opportunity after each ``_``, ``.``, ``-`` and ``/``: it wraps between its words when
    its cell is narrow, never inside one. The text is escaped before the tags are added."""
    escaped = str(markupsafe.escape(text(value)))
    return markupsafe.Markup(re.sub(r"([_./-])", r"\1<wbr>", escaped))


def _px(x: float) -> str:
    """A chart coordinate as SVG text: 0.1 px is finer than any screen shows."""
    return f"{x:.1f}"


def histogram_chart(h: dict[str, Any]) -> dict[str, Any] | None:
    """Overlaid histograms (shares): the bars of the reference and of the data over the
    same bins, scaled to the tallest (coordinates as SVG text); None when the bins are
    missing or inconsistent."""
    ref, data, edges = h.get("reference") or [], h.get("data") or [], h.get("edges") or []
    if not ref or len(edges) != len(ref) + 1:
        return None
    top = max(max(ref), max(data), 1e-12)
    bw = _W / len(ref)
    bars = []
    for series, shares in (("reference", ref), ("data", data)):
        for i, share in enumerate(shares):
            height = (_H - 14) * share / top  # 12 px below for the axis labels, 2 above
            if height > 0:
                bars.append({"series": series, "x": _px(i * bw), "y": _px(_H - 12 - height),
                             "width": _px(max(bw - 1, 0.5)), "height": _px(height)})
    return {"width": _W, "height": _H, "bars": bars, "low": edges[0], "high": edges[-1]}


def sparkline(h: dict[str, Any] | None, width: int = 120, height: int = 28) -> dict[str, Any] | None:
    """One series' histogram (``edges`` and ``shares``) as bars scaled to the tallest
    (coordinates as SVG text); None when there is none."""
    shares, edges = (h or {}).get("shares") or [], (h or {}).get("edges") or []
    if not shares or len(edges) != len(shares) + 1:
        return None
    top = max(max(shares), 1e-12)
    bw = width / len(shares)
    bars = [{"x": _px(i * bw), "y": _px(height - (height - 2) * v / top), "width": _px(max(bw - 1, 0.5)),
             "height": _px((height - 2) * v / top)} for i, v in enumerate(shares) if v > 0]
    return {"width": width, "height": height, "bars": bars, "low": edges[0], "high": edges[-1]}


def category_chart(categories: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Paired bars (reference above data) for the first 8 categories, as HTML rows: the
    whole category text (it wraps; never cut) and each bar's width in percent of the
    largest share; None when there is no category."""
    cats = categories[:8]
    if not cats:
        return None
    top = max(max(c["reference_share"], c["data_share"]) for c in cats) or 1.0
    return [{"label": str(c["value"]),
             "bars": [{"series": series, "percent": f"{100 * float(c[f'{series}_share']) / top:.1f}",
                       "share": float(c[f"{series}_share"])} for series in ("reference", "data")]}
            for c in cats]


@functools.cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("features.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a key the page needs but the report lacks is an error
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(text=text, num=num, ident=ident)
    env.globals.update(histogram_chart=histogram_chart, category_chart=category_chart, sparkline=sparkline)
    return env.get_template("report.html.j2")


def render_html(r: dict[str, Any]) -> str:
    """The whole page for a report dict (as written to ``report.json``).

    Raises ``jinja2.UndefinedError`` when ``r`` lacks a key the page shows (a report
    from :mod:`features.report.build` never does)."""
    # The reasons rules have no GX expectation, once each, numbered by first appearance.
    notes = list(dict.fromkeys(e["not_expressible"] for e in r.get("expectations") or []
                               if e.get("gx") is None and e.get("not_expressible")))
    return _template().render(r=r, notes=notes)


__all__ = ["category_chart", "histogram_chart", "ident", "num", "render_html", "sparkline", "text"]
