"""The layers contract (pyproject.toml ``[tool.importlinter]``, docs/architecture.md) holds,
and it can fail: one forbidden import added to a copy of the package breaks it, naming the
import (issue 46)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=120)


def test_the_layers_contract_is_kept() -> None:
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "KEPT" in out.stdout


def test_a_forbidden_import_breaks_it(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "features", tmp_path / "features",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / "features" / "sources" / "records.py"
    if not target.exists():
        target = tmp_path / "features" / "sources" / "__init__.py"
    # inside a function, as most of the knot was: counted all the same
    reach_up = "\n\ndef _reach_up() -> None:\n    import features.sdk.store  # noqa\n"
    target.write_text(target.read_text() + reach_up)
    out = _lint(tmp_path)
    assert out.returncode == 1, out.stdout[-3000:]
    assert "BROKEN" in out.stdout and "features.sources is not allowed to import features.sdk" in out.stdout


def test_no_arrow_against_the_flow_is_ignored() -> None:
    """Issue 46 step f removed the last ``ignore_imports`` line (the SDK borrowing the
    migration's Upgrader): every import points down."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert all(not c.get("ignore_imports") for c in config["contracts"])
