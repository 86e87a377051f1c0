"""How rows.parquet and digests.json were made, at commit fc9ebda (the first digest
implementation). Kept for the record: running it with newer code would overwrite the
golden values with that code's output, which is exactly what they must not be."""

from __future__ import annotations

import datetime as dt
import json
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.kernels.digest import content_digests

HERE = Path(__file__).resolve().parent
rng = random.Random(4848)
n = 1200
alphabet = ["a", "b", "Z", "0", "-", " ", "é", "ß", "中", "😀", "\x00", "ü"]


def maybe(v: Any, p: float = 0.15) -> Any:
    return None if rng.random() < p else v


def text() -> str:
    r = rng.random()
    if r < 0.1:
        return ""
    length = rng.randint(60, 260) if r < 0.2 else rng.randint(1, 40)
    return "".join(rng.choice(alphabet) for _ in range(length))


def column(make: Any, t: pa.DataType | None = None) -> pa.Array:
    return pa.array([maybe(make()) for _ in range(n)], t)


def main() -> None:
    epoch = dt.datetime(1969, 12, 31, tzinfo=dt.UTC)
    cols = {
        "id": pa.array([f"APP-{rng.randrange(10**12):012d}" for _ in range(n)]),
        "s": column(text),
        "cat": column(lambda: rng.choice(["employed", "retired", "", "étudiant"])),
        "big": column(text, pa.large_string()),
        "i64": column(lambda: rng.randint(-2**63, 2**63 - 1), pa.int64()),
        "u32": column(lambda: rng.randint(0, 2**32 - 1), pa.uint32()),
        "i16": column(lambda: rng.randint(-5, 5), pa.int16()),
        "b": column(lambda: rng.random() < 0.5),
        "f64": column(lambda: rng.choice([0.0, -0.0, 1.5, -2.25e300, 1e-310, float("inf"),
                                          rng.uniform(-1e6, 1e6)])),
        "f32": column(lambda: rng.choice([0.0, -0.0, 0.1, 3.5]), pa.float32()),
        "d18": column(lambda: Decimal(rng.randint(-10**17, 10**17)).scaleb(-2), pa.decimal128(18, 2)),
        "d38": column(lambda: Decimal(rng.randint(-10**37, 10**37)).scaleb(-4), pa.decimal128(38, 4)),
        "day": column(lambda: dt.date(1900, 1, 1) + dt.timedelta(days=rng.randint(0, 60000))),
        "at": column(lambda: epoch + dt.timedelta(microseconds=rng.randint(0, 10**15)),
                     pa.timestamp("us", "UTC")),
        "ms": column(lambda: rng.randint(-10**12, 10**13), pa.timestamp("ms")),
        "xs": column(lambda: [rng.choice([1.0, -0.0, 2.5, None]) for _ in range(rng.randint(0, 6))],
                     pa.list_(pa.float64())),
        "tags": column(lambda: [maybe(text(), 0.1) for _ in range(rng.randint(0, 5))], pa.list_(pa.string())),
        "ints": column(lambda: [rng.randint(-9, 9) for _ in range(rng.randint(0, 3))], pa.list_(pa.int32())),
    }
    t = pa.table(cols)
    t = t.append_column("enc", pc.dictionary_encode(t.column("cat")))
    defaults = {"i16": 0, "cat": "employed", "u32": "7"}
    pq.write_table(t, HERE / "rows.parquet", compression="zstd")
    back = pq.read_table(HERE / "rows.parquet")
    assert back.equals(t)
    sets = {"all": back.column_names, "id_only": ["id"], "strings": ["id", "s", "cat", "big", "enc"],
            "numbers": ["i64", "u32", "i16", "b", "f64", "f32", "d18", "d38", "day", "at", "ms"],
            "lists": ["xs", "tags", "ints"]}
    out: dict[str, Any] = {"defaults": defaults, "sets": {}}
    for name, names in sets.items():
        digests = content_digests({c: back.column(c) for c in names}, back.num_rows, defaults).to_pylist()
        out["sets"][name] = {"fields": names, "digests": digests}
    (HERE / "digests.json").write_text(json.dumps(out, indent=0))


if __name__ == "__main__":
    main()
