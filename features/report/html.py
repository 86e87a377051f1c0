"""``report.html``: one self-contained page (inline CSS, no script, no external asset).

Every value that reaches the page goes through :func:`esc` (``html.escape`` with
quotes): data values are hostile until proven otherwise.
"""

from __future__ import annotations

import html
from typing import Any

_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2430;
 background:#f5f6f8}
main{max-width:1280px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d8dce3;padding-bottom:4px}
.sub{color:#5a6372}
.verdict{display:flex;align-items:center;gap:20px;margin:16px 0;padding:18px 22px;border-radius:8px;
 color:#fff}
.verdict.pass{background:#1f7a3f}.verdict.fail{background:#b3261e}
.verdict .word{font-size:40px;font-weight:800;letter-spacing:2px}
.verdict ul{margin:0;padding-left:18px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:12px 0}
.card{background:#fff;border:1px solid #d8dce3;border-radius:6px;padding:10px 14px;min-width:150px}
.card .n{font-size:20px;font-weight:700}.card .l{color:#5a6372;font-size:12px}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #d8dce3;font-size:13px}
th,td{border-bottom:1px solid #e6e9ee;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#eef0f4;font-weight:600;position:sticky;top:0}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.ok{color:#1f7a3f;font-weight:700}.bad{color:#b3261e;font-weight:700}.muted{color:#7a8291}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
ul.ex{margin:0;padding-left:16px}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;background:#fff;
 border:1px solid #d8dce3;border-radius:6px;padding:10px 14px;margin:0}
dl.kv dt{color:#5a6372}dl.kv dd{margin:0}
.warn{background:#fff4e5;border:1px solid #f0b46a;border-radius:6px;padding:10px 14px;margin:12px 0}
footer{margin:32px 0 8px;color:#7a8291;font-size:12px}
.warnt{color:#a15c00;font-weight:700}
svg.chart{display:block;background:#fafbfc;border:1px solid #e6e9ee}
.legend i{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px;vertical-align:middle}
"""


def esc(value: Any) -> str:
    """``value`` as HTML text: None as an em dash, everything else escaped."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return html.escape(str(value), quote=True)


def _num(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return esc(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}" if value and abs(value) < 0.01 else f"{value:,.2f}"
    return esc(value)


def _value(value: Any) -> str:
    """An example value, in a monospace span; strings shown quoted so blanks show."""
    if value is None:
        return '<span class="muted">null</span>'
    text = f'"{value}"' if isinstance(value, str) else str(value)
    return f'<span class="mono">{esc(text)}</span>'


def _examples(examples: list[dict[str, Any]], *, message: bool = False) -> str:
    if not examples:
        return ""
    items = []
    for ex in examples:
        where = ex.get("source") or (f"row {ex['row']}" if ex.get("row") is not None else None)
        parts = [_value(ex.get("value"))]
        if where is not None:
            parts.append(f'<span class="muted mono">{esc(where)}</span>')
        if message and ex.get("message"):
            parts.append(f'<br><span class="muted">{esc(ex["message"])}</span>')
        items.append("<li>" + " ".join(parts) + "</li>")
    return '<ul class="ex">' + "".join(items) + "</ul>"


def _table(headers: list[tuple[str, bool]], rows: list[list[str]]) -> str:
    """``headers``: (title, numeric); ``rows``: cells already escaped."""
    head = "".join(f'<th{" class=num" if num else ""}>{esc(h)}</th>' for h, num in headers)
    body = []
    for row in rows:
        cells = "".join(f'<td{" class=num" if headers[i][1] else ""}>{c}</td>' for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(headers)}" class="muted">none</td></tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _kv(pairs: list[tuple[str, str]]) -> str:
    return '<dl class="kv">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


def _card(number: str, label: str) -> str:
    return f'<div class="card"><div class="n">{number}</div><div class="l">{esc(label)}</div></div>'


def _summary(r: dict[str, Any]) -> str:
    c = r.get("counts") or {}
    cards = []
    if r["mode"] == "rejects":
        cards.append(_card(_num(c.get("reject_rows")), "rejected rows"))
        cards.append(_card(_num(c.get("errors")), "errors"))
        cards.append(_card(_num(len(r["rejects"]["groups"])), "field / rule groups"))
    else:
        n = c.get("input_rows", 0)
        share = f" ({100 * c.get('rejected_rows', 0) / n:.2f}%)" if n else ""
        cards.append(_card(_num(n), "rows checked"))
        cards.append(_card(_num(c.get("valid_rows")), "valid rows"))
        cards.append(_card(_num(c.get("rejected_rows")) + esc(share), "rejected rows (validator)"))
        gx = r.get("gx") or {}
        cards.append(_card(f"{_num(gx.get('passed'))} / {_num(gx.get('expectations'))}",
                           "GX expectations passed"))
        drift = r.get("drift")
        if drift:
            cards.append(_card(f"{_num(len(drift['failed']))} / {_num(len(drift['warned']))}",
                               "fields drifted: fail / warn"))
    return '<div class="cards">' + "".join(cards) + "</div>"


def _identity(r: dict[str, Any]) -> str:
    s, lin = r["schema"], r["lineage"]
    pairs = [("schema", esc(s["name"])), ("version", esc(s["version"])),
             ("fingerprint", f'<code>{esc(s["fingerprint"])}</code>')]
    if s.get("unchecked_fields"):
        pairs.append(("fields not checked", esc(", ".join(s["unchecked_fields"]))))
    pairs.append(("mode", esc(r["mode"])))
    if lin.get("table"):
        pairs.append(("table", f'<code>{esc(lin["table"])}</code> on {esc(lin.get("postgres"))}'))
    if lin.get("since") is not None:
        pairs.append(("ingested since", esc(lin["since"])))
    et = lin.get("event_time")
    if isinstance(et, dict):
        label = f"event time ({et['field']})" if et.get("field") else "event time"
        pairs.append((label, f"{esc(et.get('min'))} … {esc(et.get('max'))}"))
    ing = lin.get("ingested_at")
    if isinstance(ing, dict) and (ing.get("min") or ing.get("max")):
        pairs.append(("ingested at", f"{esc(ing.get('min'))} … {esc(ing.get('max'))}"))
    for key, label in (("run_ids", "runs"), ("origins", "origins"), ("schema_fingerprints", "fingerprints")):
        v = lin.get(key)
        if isinstance(v, dict) and v.get("values"):
            listed = "<br>".join(f'<code>{esc(k)}</code> ({_num(n)} rows)' for k, n in v["values"].items())
            if v.get("rows_not_listed"):
                listed += f"<br>… and {_num(v['rows_not_listed'])} rows from others"
            pairs.append((label, listed))
    if lin.get("fields_not_in_table"):
        pairs.append(("fields absent from the table", esc(", ".join(lin["fields_not_in_table"]))))
    out = "<h2>Schema and lineage</h2>" + _kv(pairs)
    files = lin.get("files")
    if files:
        rows = [[f'<code>{esc(f["uri"])}</code>', _num(f["rows"]), _num(f["row_groups"]),
                 f'<code>{esc(f["footer_digest"])}</code>'] for f in files]
        out += "<h2>Files</h2>" + _table([("file", False), ("rows", True), ("row groups", True),
                                          ("footer digest", False)], rows)
    return out


def _expectations(r: dict[str, Any]) -> str:
    rows = []
    notes: dict[str, int] = {}
    for e in r["expectations"]:
        gx = e.get("gx")
        if gx is None:
            reason = e.get("not_expressible")
            mark = notes.setdefault(reason, len(notes) + 1) if reason else None
            gx_cells = ['<span class="muted">validator only</span>', "—", "—",
                        f'<span class="muted">see note {mark}</span>' if mark else ""]
            agree = '<span class="muted">—</span>'
        else:
            status = '<span class="ok">pass</span>' if gx["success"] else '<span class="bad">fail</span>'
            gx_cells = [status, _num(gx["unexpected_count"]), _num(gx["unexpected_percent"]) + "%",
                        _examples(gx["examples"])]
            agree = '<span class="ok">yes</span>' if e["agrees"] else '<span class="bad">NO</span>'
        exp = f'<code>{esc(e["expectation"])}</code>' if e.get("expectation") else "—"
        rows.append([f'<code>{esc(e["rule"])}</code>', exp, *gx_cells[:3],
                     _num(e["validator_rejected_rows"]), agree, gx_cells[3]])
    headers = [("rule", False), ("GX expectation", False), ("GX", False), ("GX unexpected", True),
               ("GX % (non-null)", True), ("rows rejected (validator)", True), ("agree", False),
               ("GX examples", False)]
    note = ('<p class="sub">Rows rejected by rule are the compiled validator\'s counts (the one truth); '
            "GX's per-expectation result over the same data is shown next to them.</p>")
    out = "<h2>Expectations</h2>" + note
    if r.get("disagreements"):
        out += ('<div class="warn">GX and the validator disagree on: '
                + esc(", ".join(r["disagreements"])) + ". The validator's numbers are authoritative "
                "(GX sees values that fail type conversion as nulls).</div>")
    out += _table(headers, rows)
    if notes:
        out += '<ol class="sub">' + "".join(f"<li>Not expressible in GX: {esc(reason)}</li>"
                                            for reason in notes) + "</ol>"
    return out


def _fields(r: dict[str, Any]) -> str:
    rows = []
    for f in r["fields"]:
        distinct = _num(f["distinct_count"]) if f["distinct_exact"] else "≈ " + _num(f["distinct_count"])
        lo = _value(f["min"]) if f["min"] is not None else "—"
        hi = _value(f["max"]) if f["max"] is not None else "—"
        rows.append([f'<code>{esc(f["field"])}</code>', esc(f["type"]), _num(f["rows"]),
                     _num(f["null_count"]), _num(f["nan_count"]), _num(f["type_failures"]), lo, hi, distinct])
    headers = [("field", False), ("type", False), ("rows", True), ("nulls", True), ("NaN", True),
               ("type failures", True), ("min", False), ("max", False), ("distinct", True)]
    note = ('<p class="sub">Over values converted to the declared type; min, max and distinct ignore nulls '
            "and NaN. ≈: approximate (HyperLogLog) beyond a million distinct values.</p>")
    return "<h2>Fields</h2>" + note + _table(headers, rows)


def _rejects(r: dict[str, Any]) -> str:
    rj = r["rejects"]
    rows = [[f'<code>{esc(g["field"])}</code>', f'<code>{esc(g["rule"])}</code>', esc(g["reason"]),
             _num(g["count"]), _examples(g["examples"], message=True)] for g in rj["groups"]]
    headers = [("field", False), ("rule", False), ("reason", False), ("count", True), ("examples", False)]
    title = "Rejects by field and rule" + (" (rejects table)" if r["mode"] == "rejects" else " (validator)")
    return f"<h2>{esc(title)}</h2>" + _table(headers, rows)


_REF_COLOR = "#4c6ef5"
_DATA_COLOR = "#f08c00"
_W, _H = 260, 80


def _f(x: float) -> str:
    return f"{x:.1f}"


def _histogram_svg(h: dict[str, Any]) -> str:
    """Overlaid histograms (shares): reference and data bars over the same bins."""
    ref, data, edges = h.get("reference") or [], h.get("data") or [], h.get("edges") or []
    if not ref or len(edges) != len(ref) + 1:
        return ""
    top = max(max(ref), max(data), 1e-12)
    bw = _W / len(ref)
    bars = []
    for series, color in ((ref, _REF_COLOR), (data, _DATA_COLOR)):
        for i, share in enumerate(series):
            height = (_H - 14) * share / top
            if height <= 0:
                continue
            bars.append(f'<rect x="{_f(i * bw)}" y="{_f(_H - 12 - height)}" width="{_f(max(bw - 1, 0.5))}" '
                        f'height="{_f(height)}" fill="{color}" fill-opacity="0.5"/>')
    lo, hi = _num(edges[0]), _num(edges[-1])
    labels = (f'<text x="2" y="{_H - 2}" font-size="9" fill="#5a6372">{esc(lo)}</text>'
              f'<text x="{_W - 2}" y="{_H - 2}" font-size="9" fill="#5a6372" '
              f'text-anchor="end">{esc(hi)}</text>')
    return (f'<svg class="chart" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img" '
            f'aria-label="histogram: reference vs data">{"".join(bars)}{labels}</svg>')


def _categories_svg(categories: list[dict[str, Any]]) -> str:
    """Paired horizontal bars (reference above data) for the top categories."""
    cats = categories[:8]
    if not cats:
        return ""
    row, label_w = 18, 90
    height = row * len(cats) + 4
    top = max(max(c["reference_share"], c["data_share"]) for c in cats) or 1.0
    span = _W - label_w - 4
    parts = []
    for i, c in enumerate(cats):
        y = 2 + i * row
        text = str(c["value"])
        text = text if len(text) <= 14 else text[:13] + "…"
        parts.append(f'<text x="{label_w - 4}" y="{y + 12}" font-size="10" fill="#1d2430" '
                     f'text-anchor="end">{esc(text)}</text>')
        for j, (key, color) in enumerate((("reference_share", _REF_COLOR), ("data_share", _DATA_COLOR))):
            w = span * float(c[key]) / top
            parts.append(f'<rect x="{label_w}" y="{y + 1 + j * 8}" width="{_f(w)}" height="7" '
                         f'fill="{color}"/>')
    return (f'<svg class="chart" width="{_W}" height="{height}" viewBox="0 0 {_W} {height}" role="img" '
            f'aria-label="category shares: reference vs data">{"".join(parts)}</svg>')


def _drift(r: dict[str, Any]) -> str:
    d = r.get("drift")
    if not d:
        return ""
    t = d["thresholds"]
    ref = d["reference"]
    where = ref.get("table") or ", ".join(f["uri"] for f in ref.get("files") or []) or "—"
    note = (f'<p class="sub">Reference: <code>{esc(where)}</code> ({_num(d["reference_rows"])} rows) vs the '
            f'data ({_num(d["data_rows"])} rows). Fail: PSI &gt; {esc(t["psi_fail"])} or KS &gt; '
            f'{esc(t["ks_fail"])}; warn: PSI &gt; {esc(t["psi_warn"])}. KS: max |F<sub>ref</sub> &minus; '
            "F<sub>data</sub>|; PSI: Σ (q &minus; p) ln(q / p) over the reference's decile bins (numeric) "
            f"or the categories, shares floored at {esc(d['epsilon'])}; TVD: ½ Σ |q &minus; p|. Numeric "
            "values: a seeded "
            f"uniform sample of at most {_num(d['sample_size'])} per side (exact below that).</p>"
            f'<p class="legend sub"><i style="background:{_REF_COLOR}"></i>reference'
            f'<i style="background:{_DATA_COLOR}"></i>data</p>')
    rows = []
    for f in d["fields"]:
        status = f["status"]
        mark = {"ok": '<span class="ok">ok</span>', "warn": '<span class="warnt">warn</span>',
                "fail": '<span class="bad">FAIL</span>'}.get(status, '<span class="muted">skipped</span>')
        if status == "skipped":
            chart = f'<span class="muted">{esc(f.get("reason"))}</span>'
        elif f["kind"] == "numeric":
            chart = _histogram_svg(f.get("histogram") or {})
        else:
            chart = _categories_svg(f.get("categories") or [])
        ks = f.get("ks")
        shares = "—"
        if f.get("reference_null_share") is not None and f.get("data_null_share") is not None:
            shares = f'{100 * f["reference_null_share"]:.1f}% / {100 * f["data_null_share"]:.1f}%'
        sampled = " (sampled)" if f.get("sampled") else ""
        ks_cell = _num(ks) + esc(sampled) if ks is not None else "—"
        rows.append([f'<code>{esc(f["field"])}</code>', esc(f["kind"]), mark, ks_cell, _num(f.get("psi")),
                     _num(f.get("tvd")), shares, chart])
    headers = [("field", False), ("kind", False), ("drift", False), ("KS", True), ("PSI", True),
               ("TVD", True), ("nulls ref / data", True), ("reference vs data", False)]
    return "<h2>Drift against the reference</h2>" + note + _table(headers, rows)


def render_html(r: dict[str, Any]) -> str:
    """The whole page for a report dict (as written to ``report.json``)."""
    verdict = str(r["verdict"])
    cls = "pass" if verdict == "PASS" else "fail"
    reasons = r.get("verdict_reasons") or (["every check passed"] if verdict == "PASS" else [])
    s = r["schema"]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(verdict)} · {esc(s['name'])} {esc(s['version'])} · featureline report</title>",
        f"<style>{_CSS}</style></head><body><main>",
        f"<h1>Data quality report: {esc(s['name'])} <span class=\"sub\">{esc(s['version'])}</span></h1>",
        f'<div class="sub">{esc(r["mode"])} · generated {esc(r["generated_at"])} · {esc(r["generated_by"])}'
        "</div>",
        f'<section class="verdict {cls}" id="verdict"><div class="word">{esc(verdict)}</div>'
        f'<ul>{"".join(f"<li>{esc(x)}</li>" for x in reasons)}</ul></section>',
        _summary(r),
        _identity(r),
    ]
    if r["mode"] != "rejects":
        parts += [_expectations(r), _fields(r), _drift(r)]
    parts.append(_rejects(r))
    parts.append("<footer>featureline · checks ran locally (GX ephemeral context; nothing was sent "
                 "anywhere) · all numbers are in report.json</footer>")
    parts.append("</main></body></html>\n")
    return "\n".join(parts)


__all__ = ["esc", "render_html"]
