"""featureline as a user gets it: a wheel built from this checkout and fresh virtual
environments outside it (issue 22). Used by the session fixtures ``featureline_wheel``,
``deps_venv`` and ``installed_venv`` in conftest.py.

The wheel is built from a copy of the sources (pyproject.toml, README.md, features/) in a
temporary folder, so nothing is written into the checkout. The environments get the
locked dependencies (requirements.lock) from pip's cache or PyPI, about a minute each.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], what: str, timeout: float = 900) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {out.returncode}): {' '.join(cmd)}\n"
                           f"{out.stdout[-2000:]}\n{out.stderr[-4000:]}")


def build_wheel(out: Path) -> Path:
    """``pip wheel --no-deps`` of a copy of the package's sources; the path of the wheel."""
    src = out / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "features", src / "features",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
         "building the wheel")
    wheels = sorted(out.glob("featureline-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one featureline wheel in {out}, found {wheels}")
    return wheels[0]


def make_venv(path: Path, *, wheel: Path | None) -> Path:
    """A fresh virtual environment at ``path`` with the locked dependencies and, when
    ``wheel`` is given, featureline installed from it (``--no-deps``: the lock decides).
    Returns its Python."""
    _run([sys.executable, "-m", "venv", str(path)], "creating a virtual environment")
    python = path / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
          str(ROOT / "requirements.lock")], "installing the locked dependencies")
    if wheel is not None:
        _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
              str(wheel)], "installing the featureline wheel")
    return python


def users_shell(env: Mapping[str, str], python: Path) -> dict[str, str]:
    """``env`` as a user's shell with the environment of ``python`` activated: its ``bin/``
    first on PATH, no PYTHONPATH, FEATURES_HOME or VIRTUAL_ENV (nothing of this checkout is
    importable), and the download cache this checkout's ``features dev up`` filled (a
    per-user cache every project shares: the Kafka connector jar)."""
    shell = {k: v for k, v in env.items()
             if k not in ("PYTHONPATH", "FEATURES_HOME") and not k.startswith("VIRTUAL_ENV")}
    shell["PATH"] = f"{python.parent}{os.pathsep}{shell.get('PATH', '')}"
    shell["FEATURES_CACHE_DIR"] = str(ROOT / ".cache")
    return shell


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=60)
    return Path(out.stdout.strip())
