"""featureline as a user gets it: a wheel built from this checkout and fresh virtual
environments outside it (issue 22). Used by the session fixtures ``featureline_wheel``,
``deps_venv`` and ``installed_venv`` in conftest.py.

The wheel is built from a copy of the sources (pyproject.toml, README.md, features/) in a
temporary folder, so nothing is written into the checkout. The first environment gets the
locked dependencies (requirements.lock) from pip's cache or PyPI, about a minute; a second
one made with ``deps_from`` gets a hard-linked copy of that environment's freshly installed
packages (the same files pip wrote, each script's ``#!`` line pointing at its own Python, as
pip writes it) in a few seconds, then the wheel from pip like the first.
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


def make_venv(path: Path, *, wheel: Path | None, deps_from: Path | None = None) -> Path:
    """A fresh virtual environment at ``path`` with the locked dependencies and, when
    ``wheel`` is given, featureline installed from it (``--no-deps``: the lock decides).
    The dependencies are pip's install of requirements.lock, or, with ``deps_from`` (the
    Python of an environment ``make_venv`` made without a wheel), a copy of
    that one's (:func:`_copy_packages`). Returns its Python."""
    if deps_from is None:
        _run([sys.executable, "-m", "venv", str(path)], "creating a virtual environment")
        python = path / "bin" / "python"
        _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
              str(ROOT / "requirements.lock")], "installing the locked dependencies")
    else:
        _run([sys.executable, "-m", "venv", "--without-pip", str(path)], "creating a virtual environment")
        python = path / "bin" / "python"
        _copy_packages(deps_from, python)
    if wheel is not None:
        _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
              str(wheel)], "installing the featureline wheel")
    return python


def _copy_packages(source: Path, python: Path) -> None:
    """Every package of the environment of ``source`` (pip included) into the new, empty
    environment of ``python``: ``site-packages`` and the data folders beside ``bin/``
    hard-linked (pip and Python write a file anew, never in place, so a change in one
    environment is never seen in the other), the scripts of ``bin/`` copied with
    their ``#!`` line naming this environment's ``bin/`` as pip would have written them
    there (only the hashes of those scripts in the packages' ``RECORD`` files stay the
    source's)."""
    src_site, dst_site = site_packages(source), site_packages(python)
    if dst_site.exists() and any(dst_site.iterdir()):
        raise RuntimeError(f"{dst_site} is not empty")
    if dst_site.exists():
        dst_site.rmdir()
    _run(["cp", "-a", "--link", str(src_site), str(dst_site)], "copying the locked dependencies")
    for data in source.parents[1].iterdir():  # a package's data files (py4j's share/py4j/*.jar)
        if not (python.parents[1] / data.name).exists():
            _run(["cp", "-a", "--link", str(data), str(python.parents[1] / data.name)],
                 "copying the packages' data files")
    old, new = f"#!{source.parent}/".encode(), f"#!{python.parent}/".encode()
    for script in source.parent.iterdir():
        target = python.parent / script.name
        if target.exists() or target.is_symlink():
            continue  # the new environment's own python and activate scripts
        if script.is_dir():
            _run(["cp", "-a", "--link", str(script), str(target)], "copying the scripts' bytecode")
            continue
        body = script.read_bytes()
        if body.startswith(old):
            body = new + body[len(old):]
        target.write_bytes(body)
        target.chmod(script.stat().st_mode)


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
