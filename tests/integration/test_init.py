"""``features init``: a project folder outside the checkout that the CLI works in.

- the files: the example schema compiles, ``featureline.toml`` parses with every setting
  commented out (the defaults) and with every setting line uncommented;
- a second init refuses, exit 2, naming the files, and changes nothing;
- from the project folder (not the checkout): ``features compile`` and a ``features load``
  of a small Parquet file with the example schema into the real Postgres and Redis, whose
  counts add up and whose rows are in both stores.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from conftest import cli_environment

from features.config import Settings, resolve_settings
from features.ops.init import EXAMPLE_SCHEMA, files

pytestmark = pytest.mark.services

REDIS_DB = 13  # this file's own database, flushed before and after


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "features.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture()
def project_env(settings: Settings, pg_schema: str) -> Iterator[dict[str, str]]:
    with cli_environment(settings, pg_schema, REDIS_DB) as env:
        yield env


def test_init_writes_a_project_whose_settings_parse(tmp_path: Path) -> None:
    proc = _cli("init", str(tmp_path / "proj"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proj = tmp_path / "proj"
    assert sorted(str(p.relative_to(proj)) for p in proj.rglob("*") if p.is_file()) == sorted(files())
    # everything commented: the defaults
    assert resolve_settings(environ={}, root=proj) == resolve_settings(environ={}, root=tmp_path)
    # every setting line uncommented: still valid (no credential, known keys, right types)
    toml = (proj / "featureline.toml").read_text()
    opened = re.sub(r"^# (\[settings\.\w+\]|\"?[\w.]+\"? = .*)$", r"\1", toml, flags=re.MULTILINE)
    assert opened != toml
    (proj / "featureline.toml").write_text(opened)
    secrets = proj / "secrets.toml"  # the file the uncommented secrets_file names
    secrets.write_text('kafka_bootstrap = "127.0.0.1:9092"\n')
    secrets.chmod(0o600)
    got = resolve_settings(environ={}, root=proj)
    assert got.kafka_properties == {"security.protocol": "SASL_SSL"} and got.schemas_dir == "schemas"
    assert got.secrets_file is not None and got.secrets_file.endswith("secrets.toml")


def test_a_second_init_refuses_and_changes_nothing(tmp_path: Path) -> None:
    assert _cli("init", cwd=tmp_path).returncode == 0
    (tmp_path / EXAMPLE_SCHEMA).write_text("# mine\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    proc = _cli("init", ".", cwd=tmp_path)
    assert proc.returncode == 2
    assert "refusing to overwrite" in proc.stderr and "orders.yaml" in proc.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_compile_and_load_from_the_project_folder(tmp_path: Path, project_env: dict[str, str],
                                                  settings: Settings, pg_schema: str) -> None:
    import psycopg
    from psycopg import sql

    proj = tmp_path / "proj"
    assert _cli("init", str(proj), cwd=tmp_path, env=project_env).returncode == 0
    proc = _cli("compile", cwd=proj, env=project_env)
    assert proc.returncode == 0, proc.stderr
    assert (proj / "sql" / "orders.sql").is_file() and (proj / "expectations" / "orders.json").is_file()
    t0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    rows = pa.table({
        "order_id": [f"ORD-{i:08d}" for i in range(40)] + ["bad-id", "ORD-00000099"],
        "placed_at": pa.array([t0 + dt.timedelta(minutes=i) for i in range(42)], pa.timestamp("us", "UTC")),
        "amount": pa.array([Decimal(f"{i + 1}.25") for i in range(41)] + [Decimal("0.00")],
                           pa.decimal128(12, 2)),
        "country": ["DE"] * 41 + ["FR"],
    })
    pq.write_table(rows, proj / "orders.parquet")
    proc = _cli("load", "--schema", "orders", "orders.parquet", "--json", "--no-progress", cwd=proj,
                env=project_env)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["read"], summary["stored"], summary["rejected"]) == (42, 40, 2)
    assert summary["read"] == summary["stored"] + summary["rejected"] + summary["already_present"]
    with psycopg.connect(settings.postgres_dsn) as conn:
        stored = conn.execute(sql.SQL("SELECT count(*), sum(amount) FROM {}.{}").format(
            sql.Identifier(pg_schema), sql.Identifier("orders"))).fetchone()
    assert stored == (40, sum(Decimal(f"{i + 1}.25") for i in range(40)))
    hot = redis.Redis.from_url(project_env["FEATURES_REDIS_URL"])
    try:
        assert hot.hget("features:orders:{ORD-00000007}", "amount") == b"8.25"
    finally:
        hot.close()
    # the example view (views/order_scoring.yaml) compiled and reads the loaded order
    assert (proj / "views" / "compiled" / "order_scoring.json").is_file()
    from features import FeatureStore

    with FeatureStore(redis_url=project_env["FEATURES_REDIS_URL"], postgres_dsn=settings.postgres_dsn,
                      schemas=proj / "schemas", views=proj / "views", search_path=pg_schema,
                      clock=lambda: (t0 + dt.timedelta(hours=1)).timestamp()) as fs:
        rows = [{"order_id": "ORD-00000007", "refund_amount": Decimal("2.00")},
                {"order_id": "ORD-00000404", "refund_amount": Decimal("1.00")}]
        for got in (fs.online_view_dicts("order_scoring", rows),
                    fs.historical_view("order_scoring", pa.Table.from_pylist(
                        [{**r, "timestamp": t0 + dt.timedelta(hours=1)} for r in rows])).to_pylist()):
            assert got[0]["amount"] == Decimal("8.25") and got[0]["refund_share"] == 2 / 8.25, got
            assert got[1]["amount"] is None and got[1]["refund_share"] is None and not got[1]["orders._found"]
