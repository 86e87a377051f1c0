"""What the report's page tests share: a retail-orders schema with the shapes analysts
hit (a long order id, high-cardinality ``city`` and ``postal_code``, a derived feature),
its data with failing rows spread among passing ones, and a headless Chromium driven
by Selenium (Debian's ``chromium`` and ``chromium-driver``, installed by ``features dev up``).

Run as a script (``python tests/integration/report_pages.py OUT``), it writes the report
of that data and a screenshot of its page into OUT: that is how the "before" screenshot
of a change is taken with the code before it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ORDERS_YAML = """\
name: shop_orders
version: 1.0.0
description: retail orders, one row per order line
entity: order_id
event_time: ordered_at
fields:
  - name: order_id
    type: string
    store: [hot, cold]
    constraints:
      required: true
      pattern: ^ORD-[A-Z0-9-]{8,}$
  - name: ordered_at
    type: timestamp(us, UTC)
    store: [hot, cold]
    constraints:
      required: true
  - name: city
    type: string
    store: cold
    constraints:
      nullable: true
  - name: postal_code
    type: string
    store: cold
    constraints:
      nullable: true
  - name: segment
    type: enum
    values: [consumer, corporate, home_office]
    store: cold
  - name: quantity
    type: int32
    store: cold
    constraints:
      min: 1
      max: 1000
  - name: discount_share_of_list_price_before_tax
    type: float64
    store: cold
    constraints:
      min: 0
      max: 0.8
  - name: sales
    type: float64
    store: cold
    constraints:
      min: 0
features:
  - name: sales_log
    description: log(1 + sales)
    from: sales
    steps:
      - fill_null: 0
      - log1p
    dtype: float64
    store: cold
"""

#: an order id far wider than its table cell (the page must wrap it, not clip it)
LONG_ID = "ORD-" + "-".join(f"LONGSEGMENT{i:02d}" for i in range(14))


def write_schema(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "shop_orders.yaml").write_text(ORDERS_YAML, encoding="utf-8")
    return folder


def orders(n: int, seed: int, *, invalid_every: int = 0, long_ids: int = 0) -> pa.Table:
    """``n`` orders: every ``invalid_every``-th row breaks one rule (quantity 0, a discount
    of 0.95 or a negative sale, in turn), the first ``long_ids`` rows carry :data:`LONG_ID`
    style ids. Cities and postal codes are nearly unique per row (as in real retail data)."""
    rng = np.random.default_rng(seed)
    ids = [f"ORD-{seed:04d}-{i:08d}" for i in range(n)]
    for i in range(min(long_ids, n)):
        ids[i] = f"{LONG_ID}-{i}"
    quantity = rng.integers(1, 12, n).astype(np.int32)
    discount = np.round(rng.choice([0.0, 0.1, 0.2, 0.4], n), 2)
    sales = np.round(rng.lognormal(4.0, 1.0, n), 2)
    if invalid_every:
        for k, i in enumerate(range(invalid_every - 1, n, invalid_every)):
            if k % 3 == 0:
                quantity[i] = 0
            elif k % 3 == 1:
                discount[i] = 0.95
            else:
                sales[i] = -5.0
    start = np.datetime64("2024-03-01T00:00:00", "us")
    return pa.table({
        "order_id": pa.array(ids, pa.string()),
        "ordered_at": pa.array(start + rng.integers(0, 86_400 * 30, n).astype("timedelta64[s]"),
                               pa.timestamp("us", tz="UTC")),
        "city": pa.array([f"City {rng.integers(0, 10 * n)}" for _ in range(n)], pa.string()),
        "postal_code": pa.array([f"{rng.integers(10_000, 99_999):05d}" for _ in range(n)], pa.string()),
        "segment": pa.array(rng.choice(["consumer", "corporate", "home_office"], n, p=[0.5, 0.3, 0.2]),
                            pa.string()),
        "quantity": pa.array(quantity, pa.int32()),
        "discount_share_of_list_price_before_tax": pa.array(discount, pa.float64()),
        "sales": pa.array(sales, pa.float64()),
    })


def write_inputs(folder: Path) -> tuple[Path, Path, Path]:
    """(schemas folder, data Parquet, reference Parquet): 490 orders with 7 failing rows
    spread among them and 3 long ids; a reference of 60 orders (a small sample)."""
    schemas = write_schema(folder / "schemas")
    data, reference = folder / "orders.parquet", folder / "reference.parquet"
    pq.write_table(orders(490, 1, invalid_every=70, long_ids=3), data)
    pq.write_table(orders(60, 2), reference)
    return schemas, data, reference


def chromium_driver(width: int = 1280, height: int = 2400) -> Any:
    """A headless Chromium under Selenium, Debian's binaries (no download)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        raise RuntimeError("chromium or chromedriver is missing: run `features dev up` "
                           "(it installs Debian's chromium and chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def follow(drv: Any, element: Any) -> None:
    """Click ``element`` (a link, a form's button) in the Selenium driver ``drv`` and wait
    for the next page: a lookup made before the browser leaves the page would find an
    element of the old one (a stale reference, or old figures)."""
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    old = drv.find_element("tag name", "html")
    element.click()
    WebDriverWait(drv, 20).until(expected_conditions.staleness_of(old))


def save_page(drv: Any, path: Path, *, height_js: str = "return document.documentElement.scrollHeight",
              pad: int = 40, cap: int = 4000) -> None:
    """The page open in the Selenium driver ``drv`` as a PNG at ``path`` (an older one
    replaced): the window first grown to the page's height (``height_js`` measures it,
    plus ``pad``, kept within 600 and ``cap`` pixels); asserts the PNG is not blank."""
    height = int(drv.execute_script(height_js))
    drv.set_window_size(1280, min(max(height + pad, 600), cap))
    path.unlink(missing_ok=True)
    drv.save_screenshot(str(path))
    assert path.stat().st_size > 10_000, f"{path} looks blank"


def screenshot(page: Path, shot: Path, parts: dict[str, str] | None = None) -> dict[str, Path]:
    """A full-page PNG of ``page`` (the window grown to the page's height) at ``shot``,
    and one PNG per element of ``parts`` (file stem -> CSS selector) beside it, where
    the page has that element; returns the element shots taken."""
    from selenium.webdriver.common.by import By

    drv = chromium_driver()
    taken: dict[str, Path] = {}
    try:
        drv.get(page.resolve().as_uri())
        height = int(drv.execute_script("return document.documentElement.scrollHeight"))
        drv.set_window_size(1280, min(max(height + 40, 800), 8000))
        drv.save_screenshot(str(shot))
        for stem, selector in (parts or {}).items():
            found = drv.find_elements(By.CSS_SELECTOR, selector)
            if found:
                taken[stem] = shot.with_name(f"{shot.stem}-{stem}.png")
                found[0].screenshot(str(taken[stem]))
    finally:
        drv.quit()
    return taken


#: the page's parts worth a closer look: file stem -> CSS selector
PARTS = {"verdict": "#verdict", "expectations": "#expectations-failing", "fields": "#fields",
         "features": "#features", "drift": "table:has(tr[data-drift])"}


def main(out: Path) -> None:
    from features.cli import main as features

    schemas, data, reference = write_inputs(out)
    features(["report", "--schema", "shop_orders", "--schemas-dir", str(schemas), "--parquet", str(data),
              "--reference-parquet", str(reference), "--out", str(out / "report"), "--no-progress"])
    screenshot(out / "report" / "report.html", out / "report.png", PARTS)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
