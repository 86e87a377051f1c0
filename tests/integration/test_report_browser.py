"""``report.html`` opened in a real headless Chromium (Debian's package, installed by
``features dev up``): the rendered page shows the verdict and the key counts, each
found by its element (``#verdict``, the ``card-*`` cards, each rule's ``tr[data-rule]``),
and a screenshot, kept as a test artifact in ``test-artifacts/``, shows the verdict
banner in its colour."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from features.cli import main
from features.ops.examples import applicants

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


def _chromium() -> str:
    binary = shutil.which("chromium")
    if binary is None:
        pytest.fail("chromium is not installed: run `features dev up` (it installs Debian's chromium)")
    return binary


def _browser(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("invalid_share", [0.02, 0.0], ids=["fail", "pass"])
def test_report_renders_verdict_and_counts_in_chromium(tmp_path: Path, invalid_share: float) -> None:
    data = tmp_path / "applicants.parquet"
    pq.write_table(applicants(3_000, seed=5, invalid_share=invalid_share), data)
    out = tmp_path / "report"
    code = main(["report", "--schema", "credit_applicant", "--schemas-dir", str(ROOT / "schemas"),
                 "--parquet", str(data), "--out", str(out), "--no-progress"])
    numbers = json.loads((out / "report.json").read_text())
    assert code == (1 if numbers["verdict"] == "FAIL" else 0)
    assert numbers["verdict"] == ("FAIL" if invalid_share else "PASS")

    page = (out / "report.html").resolve().as_uri()
    dom = _browser("--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    root = parse_dom(dom.stdout)
    # The verdict: its element, its colour class and its word (not any "FAIL" on the page:
    # a drift row's status span says FAIL too).
    verdict = one(root, id="verdict")
    assert verdict.tag == "section"
    assert verdict.classes == {"verdict", numbers["verdict"].lower()}
    assert one(verdict, cls="word").text() == numbers["verdict"]
    assert [li.text() for li in find(verdict, tag="li")] == (numbers.get("verdict_reasons")
                                                              or ["every check passed"])
    # The figures, each in its own card.
    counts = numbers["counts"]
    n, rejected = counts["input_rows"], counts["rejected_rows"]
    shown = {card: one(one(root, id=card), cls="n").text()
             for card in ("card-input-rows", "card-valid-rows", "card-rejected-rows")}
    assert shown == {"card-input-rows": f"{n:,}", "card-valid-rows": f"{counts['valid_rows']:,}",
                     "card-rejected-rows": f"{rejected:,} ({100 * rejected / n:.2f}%)"}
    # Rows rejected per rule, in that rule's row of the expectations table.
    rows = {tr.attrs["data-rule"]: tr for tr in find(root, tag="tr") if "data-rule" in tr.attrs}
    assert set(counts["by_rule"]) <= set(rows), "a rule of the report has no row on the page"
    for rule, count in counts["by_rule"].items():
        assert one(rows[rule], cls="rejected").text() == f"{count:,}", rule
    assert any(counts["by_rule"].values()) == bool(invalid_share)

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"report-{numbers['verdict'].lower()}.png"
    shot.unlink(missing_ok=True)
    taken = _browser(f"--screenshot={shot}", "--window-size=1280,2000", page)
    assert taken.returncode == 0, taken.stderr[-2000:]
    # A rendered page, not a blank image: the PNG is 1280 x 2000 and the verdict banner
    # near the top is drawn in its colour (green for PASS, red for FAIL), the other not.
    width, height, colors = banner_colors(shot, 60)
    assert (width, height) == (1280, 2000)
    assert colors == {VERDICT_COLORS[numbers["verdict"]]}


# --------------------------------------------------------------------------- the page's DOM


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        parts = [c if isinstance(c, str) else c.text() for c in self.children]
        return re.sub(r"\s+", " ", "".join(parts)).strip()


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.open = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.open[-1].children.append(element)
        if tag not in VOID:
            self.open.append(element)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.open) - 1, 0, -1):
            if self.open[i].tag == tag:
                del self.open[i:]
                return

    def handle_data(self, data: str) -> None:
        if self.open[-1].tag not in ("style", "script"):
            self.open[-1].children.append(data)


def parse_dom(html: str) -> Element:
    tree = _Tree()
    tree.feed(html)
    tree.close()
    return tree.root


def find(under: Element, *, tag: str | None = None, id: str | None = None, cls: str | None = None
         ) -> list[Element]:
    """The elements below ``under`` with that tag, id and class, in document order."""
    out = []
    for child in under.children:
        if isinstance(child, Element):
            if ((tag is None or child.tag == tag) and (id is None or child.attrs.get("id") == id)
                    and (cls is None or cls in child.classes)):
                out.append(child)
            out.extend(find(child, tag=tag, id=id, cls=cls))
    return out


def one(under: Element, **how: str) -> Element:
    hits = find(under, **how)
    assert len(hits) == 1, f"{len(hits)} elements with {how}"
    return hits[0]


# --------------------------------------------------------------------------- the screenshot

#: the verdict banner's background (features/report/templates/report.css)
VERDICT_COLORS = {"PASS": (0x1F, 0x7A, 0x3F), "FAIL": (0xB3, 0x26, 0x1E)}


def png_left_strip(path: Path, columns: int, rows: int) -> tuple[int, int, list[bytes]]:
    """Width, height and the RGB of the first ``columns`` pixels of the first ``rows`` rows
    of an 8-bit RGB or RGBA, non-interlaced PNG (the PNG filters of a pixel depend on the
    pixels left of and above it only, so the rest of each row is not decoded)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + size]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + size
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 3 if color == 2 else 4
    stride = width * bpp
    raw = zlib.decompressobj().decompress(idat, (stride + 1) * rows)
    n = columns * bpp
    out: list[bytes] = []
    prev = bytearray(n)
    for y in range(min(rows, height)):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:y * (stride + 1) + 1 + n])
        for x in range(n):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 0xFF
            elif f == 2:
                line[x] = (line[x] + b) & 0xFF
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                da, db, dc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if da <= db and da <= dc else b if db <= dc else c)) & 0xFF
        out.append(bytes(line[i] for x in range(columns) for i in range(x * bpp, x * bpp + 3)))
        prev = line
    return width, height, out


def banner_colors(path: Path, x: int) -> tuple[int, int, set[tuple[int, ...]]]:
    """Width, height and the verdict colours found at column ``x`` of the top 600 rows."""
    width, height, rows = png_left_strip(path, x + 1, 600)
    seen = {tuple(row[x * 3:x * 3 + 3]) for row in rows}
    return width, height, seen & set(VERDICT_COLORS.values())
