"""featureline as a user gets it (issue 22): the wheel, installed with the locked
dependencies into a fresh virtual environment outside this checkout, used from a project
folder that ``features init`` made.

The README's "Use it in your own project" block is the script: every ``features`` and
``python`` line runs, in order, with the installed environment's executables, from the
folder the block's ``cd`` names, against the local servers (this test's own Postgres
schema, Redis database and Kafka topic: the block's topic ``orders`` is renamed, nothing
else changes). Its first three lines (venv, wheel, install) are what the
``installed_venv`` fixture does. Then the stores must hold what the load and the stream
were given, every count must add up, the project folder must hold ``.dev/`` (the stream's
checkpoints), and nothing may have been written inside ``site-packages``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from confluent_kafka.admin import AdminClient
from conftest import ROOT, cli_environment, demo_counts
from installed_env import site_packages, users_shell

from features.config import Settings
from features.ops.init import files
from features.stream.kafka import entity_keys, produce

#: serial: builds the cached deps venv (pip) that test_stream_cluster shares.
pytestmark = [pytest.mark.services, pytest.mark.flink, pytest.mark.slow, pytest.mark.serial]

REDIS_DB = 7  # this file's own database, flushed before and after (8-15 belong to other tests)
#: The block's lines the fixtures do instead (a venv, the wheel, its installation).
SETUP_LINES = ("python3.11 -m venv", ". .venv/bin/activate", "pip wheel", "pip install")
T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def _command(line: str) -> str:
    """A shell line without its trailing comment (two spaces or more, then ``#``)."""
    return re.sub(r"\s{2,}#.*$", "", line).strip()


def readme_block() -> list[str]:
    """The command lines of the README's "Use it in your own project" bash block."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it in your own project", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [_command(line) for line in block.splitlines() if line.strip()]


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


@pytest.fixture()
def user_env(settings: Settings, pg_schema: str, installed_venv: Path) -> Iterator[dict[str, str]]:
    """A user's shell (``installed_env.users_shell``) with the stores of this test."""
    with cli_environment(settings, pg_schema, REDIS_DB) as env:
        yield users_shell(env, installed_venv)


def _orders(first: int, n: int, bad: int) -> list[dict[str, object]]:
    """``n`` valid orders from ORD-<first> on, then ``bad`` invalid ones (id pattern, amount)."""
    rows: list[dict[str, object]] = [
        {"order_id": f"ORD-{first + i:08d}", "placed_at": T0 + dt.timedelta(minutes=i),
         "amount": Decimal(f"{i + 1}.25"), "country": "DE"} for i in range(n)]
    for i in range(bad):
        rows.append({"order_id": f"bad-{first + i}" if i % 2 == 0 else f"ORD-{first + n + i:08d}",
                     "placed_at": T0, "amount": Decimal("0.00"), "country": "FR"})
    return rows


def test_the_readme_block_from_an_installed_wheel(tmp_path: Path, user_env: dict[str, str],
                                                  settings: Settings, pg_schema: str, stream_topic: str,
                                                  installed_venv: Path) -> None:
    import psycopg
    from psycopg import sql

    lines = readme_block()
    commands = [part.strip() for line in lines for part in line.split("&&")]
    assert [c for c in commands if c.startswith(SETUP_LINES)] == [
        c for c in commands if not c.startswith(("features ", "python ", "cd "))], commands
    # the project's own README (features init) shows no command this test does not run
    shown = {c for c in commands if c.startswith("features ")}
    init_readme = files()["README.md"].split("```bash\n", 1)[1].split("```", 1)[0]
    for line in init_readme.splitlines():
        command = _command(line)
        assert command in shown, f"features init's README shows {command!r}, which the README block does not"

    site = site_packages(installed_venv)
    assert not site.is_relative_to(ROOT) and not tmp_path.is_relative_to(ROOT)
    site_before = _tree(site)
    venv_root = installed_venv.parents[1]
    top_before = sorted(p.name for p in venv_root.iterdir())

    loaded = _orders(0, 40, bad=2)
    streamed = _orders(1_000, 30, bad=3)
    cwd = tmp_path
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    for command in commands:
        if command.startswith(SETUP_LINES):
            continue
        if command.startswith("cd "):
            cwd = cwd / command[3:].strip()
            continue
        args = shlex.split(command)
        if "--topic" in args:
            args[args.index("--topic") + 1] = stream_topic
        if "orders.parquet" in args:
            pq.write_table(pa.Table.from_pylist(loaded, schema=pa.schema([
                ("order_id", pa.string()), ("placed_at", pa.timestamp("us", "UTC")),
                ("amount", pa.decimal128(12, 2)), ("country", pa.string())])), cwd / "orders.parquet")
        if args[:2] == ["features", "stream"]:
            values = [json.dumps({**r, "placed_at": r["placed_at"].isoformat(),  # type: ignore[attr-defined]
                                  "amount": str(r["amount"])}).encode() for r in streamed]
            produce(settings.kafka_bootstrap, stream_topic, values, keys=entity_keys(values, "order_id"))
        exe = venv_root / "bin" / args[0]
        assert exe.is_file(), f"{args[0]} is not in the installed environment"
        proc = subprocess.run([str(exe), *args[1:]], cwd=cwd, env=user_env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, (f"`{command}` exited {proc.returncode} in {cwd}:\n"
                                      f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        outputs[" ".join(args[:2])] = proc

    project = tmp_path / "my-project"
    assert cwd == project
    # dev status: every service up, Postgres and Redis shown as this test's (external) stores
    status = outputs["features dev"].stdout
    assert all(re.search(rf"^{name}\s+healthy", status, re.MULTILINE)
               for name in ("postgres", "redis", "kafka", "flink-connector")), status
    assert (project / "sql" / "orders.sql").is_file() and (project / "expectations" / "orders.json").is_file()
    report = json.loads((project / "report" / "report.json").read_text())
    assert report["verdict"] == "PASS" and report["disagreements"] == []
    assert (report["counts"]["input_rows"], report["counts"]["rejected_rows"]) == (40 + 30, 0)

    # the stores: the valid orders of both paths, each exactly once; the invalid ones rejected
    with psycopg.connect(settings.postgres_dsn) as conn:
        cold = conn.execute(sql.SQL("SELECT order_id, amount FROM {}.{} ORDER BY order_id").format(
            sql.Identifier(pg_schema), sql.Identifier("orders"))).fetchall()
        rejected = conn.execute(sql.SQL("SELECT count(*) FROM {}.{}").format(
            sql.Identifier(pg_schema), sql.Identifier("orders__rejects"))).fetchone()
    valid = [r for r in loaded + streamed if r["amount"] != Decimal("0.00")]
    assert cold == sorted((r["order_id"], r["amount"]) for r in valid)
    assert rejected == (2 + 3,)
    hot = redis.Redis.from_url(user_env["FEATURES_REDIS_URL"])
    try:
        assert len(hot.keys("features:orders:{*}")) == len(valid)
        assert hot.hget("features:orders:{ORD-00001007}", "amount") == b"8.25"
    finally:
        hot.close()
    # the SDK line printed ORD-00000001's features, read back from Redis
    sdk = outputs["python -c"].stdout
    assert "'order_id': 'ORD-00000001'" in sdk and "2.25" in sdk and "'_from': 'redis'" in sdk, sdk

    # the demo, installed: the example schemas the package ships, its data in the project folder
    demo_topic = f"{stream_topic}_demo"
    try:
        demo = subprocess.run([str(venv_root / "bin" / "features"), "demo", "--no-services", "--rows", "3000",
                               "--files", "2", "--events", "400", "--topic", demo_topic], cwd=project,
                              env=user_env, capture_output=True, text=True, timeout=600)
    finally:
        AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).delete_topics(
            [demo_topic, f"{demo_topic}.rejects"])
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    counts = demo_counts(demo.stdout)
    assert counts["batch"][0] == 3000 and counts["stream"][0] > 400, demo.stdout[-3000:]
    for read, stored, rejected, present in counts.values():
        assert read == stored + rejected + present and stored > 0 and rejected > 0
    assert "example_schemas/" in demo.stdout and "redis    HGETALL" in demo.stdout, demo.stdout[-3000:]
    assert len(list((project / "data" / "demo").glob("applicants-*.parquet"))) == 2

    # state in the project folder, nothing inside the installed package or beside it
    assert (project / ".dev" / "stream" / "orders").is_dir()
    assert _tree(site) == site_before, sorted(set(_tree(site)) ^ set(site_before))[:20]
    assert sorted(p.name for p in venv_root.iterdir()) == top_before
