"""featureline as a user gets it: a wheel built from this checkout and fresh virtual
environments outside it (issue 22). Used by the session fixtures ``featureline_wheel``,
``deps_venv`` and ``installed_venv`` in conftest.py.

The wheel is built from a copy of the sources (pyproject.toml, README.md, features/) in a
temporary folder, so nothing is written into the checkout. The first environment gets the
locked dependencies (requirements.lock) from pip's cache or PyPI, about a minute, unless this
session's own environment holds exactly the lock (as the one ``make`` made does:
:func:`_session_has_the_lock`): then it gets a hard-linked copy of that one's packages without
featureline (:func:`_copy_session_packages`), in a few seconds. A second one made with
``deps_from`` gets a hard-linked copy of that environment's freshly installed
packages (the same files pip wrote, each script's ``#!`` line pointing at its own Python, as
pip writes it) in a few seconds, then the wheel from pip like the first.

The first environment (``deps_venv``: the locked dependencies, no featureline) is kept
between test sessions (:func:`cached_deps_venv`): pip's install of requirements.lock takes
about a minute on 2 cores and gives the same files each time the lock, the interpreter and
this module are unchanged. The cache is ``$FEATURES_TEST_VENV_CACHE`` (default
``featureline-test-venvs-<uid>`` in the temporary folder, outside any checkout, on the same
file system as pytest's temporary folders so that the second environment's hard links
work); ``FEATURES_TEST_VENV_CACHE=off`` makes a fresh one in every session. The second
environment (the wheel installed) is always made fresh.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
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
    if deps_from is None and _session_has_the_lock():
        _run([sys.executable, "-m", "venv", "--without-pip", str(path)], "creating a virtual environment")
        python = path / "bin" / "python"
        _copy_session_packages(python)
    elif deps_from is None:
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


#: The file :func:`cached_deps_venv` writes last into a finished environment: its key.
DONE = "featureline-deps-done"
#: Another key's cached environment unused for this long (seconds) is removed.
STALE_S = 2 * 24 * 3600


def deps_cache_root() -> Path | None:
    """The folder of the cached dependency environments (``FEATURES_TEST_VENV_CACHE``,
    default ``<tmp>/featureline-test-venvs-<uid>``); None when that variable is ``off``."""
    value = os.environ.get("FEATURES_TEST_VENV_CACHE", "")
    if value.lower() in ("off", "0", "no", "false"):
        return None
    return Path(value) if value else Path(tempfile.gettempdir()) / f"featureline-test-venvs-{os.getuid()}"


def deps_key() -> str:
    """What the cached environment depends on: requirements.lock, the interpreter that makes
    it (its version and path) and this module's code (how it is made)."""
    digest = hashlib.sha256()
    for part in ((ROOT / "requirements.lock").read_bytes(), sys.version.encode(),
                 os.path.realpath(sys.executable).encode(), Path(__file__).read_bytes()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:20]


def cached_deps_venv(root: Path) -> Path:
    """The Python of ``root/deps-<deps_key()>/venv``, :func:`make_venv` without a wheel,
    made there once (under a lock file: one session makes it while the others wait) and
    reused while its key holds. Under that lock no environment is being made, so one without
    its :data:`DONE` file (a session killed while making it) is removed and made again;
    other keys' environments (another checkout's lock) are removed when unused for
    ``STALE_S``."""
    key = deps_key()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder = root / f"deps-{key}"
    python = folder / "venv" / "bin" / "python"
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for other in root.glob("deps-*"):
            done = other / DONE
            if other != folder and (not done.is_file() or time.time() - done.stat().st_mtime > STALE_S):
                shutil.rmtree(other)
        if (folder / DONE).is_file() and (folder / DONE).read_text() == key and python.exists():
            (folder / DONE).touch()  # in use: not stale for another checkout's session
            return python
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir()
        make_venv(folder / "venv", wheel=None)
        (folder / DONE).write_text(key)
        return python


def _locked(lines: str) -> set[str]:
    return {line.strip() for line in lines.splitlines()
            if line.strip() and not line.startswith(("#", "-e"))}


def _session_has_the_lock() -> bool:
    """Whether this session's Python is a virtual environment whose packages, featureline's
    editable install aside, are exactly requirements.lock (``pip freeze``, as ``make lock``
    writes the lock): pip's install of the lock would give the same files again."""
    if sys.prefix == sys.base_prefix:
        return False
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable",
                             "--disable-pip-version-check"], capture_output=True, text=True, timeout=120)
    lock = _locked((ROOT / "requirements.lock").read_text())
    return freeze.returncode == 0 and bool(lock) and _locked(freeze.stdout) == lock


def _copy_session_packages(python: Path) -> None:
    """This session's environment's packages into the new, empty environment of ``python``
    (:func:`_copy_packages`), then without featureline: every file of its installation
    (the editable install's ``.pth`` and finder, the ``features`` script, its
    ``dist-info``) removed from the copy. Fails when the copy can still import
    ``features`` (nothing of this checkout may reach the environment)."""
    from importlib.metadata import PackageNotFoundError, distribution

    source_root = Path(os.path.realpath(sys.prefix))
    _copy_packages(source_root / "bin" / "python", python)
    for prefix in {sys.prefix, str(source_root)}:  # a script whose #! names the venv by another path
        old = f"#!{prefix}/bin/".encode()
        for script in python.parent.iterdir():
            if script.is_file() and not script.is_symlink() and script.read_bytes().startswith(old):
                body = script.read_bytes()
                script.unlink()  # a hard link's other name keeps its own #! line
                script.write_bytes(f"#!{python.parent}/".encode() + body[len(old):])
                script.chmod(0o755)
    try:
        dist = distribution("featureline")
    except PackageNotFoundError:
        dist = None
    if dist is not None:
        new_root = python.parents[1]
        ours = [Path(str(dist.locate_file(f))).resolve() for f in dist.files or []]
        info = {p.parent for p in ours if p.parent.name.endswith(".dist-info")}
        for path in ours:
            if path.is_relative_to(source_root):
                (new_root / path.relative_to(source_root)).unlink(missing_ok=True)
        for folder in info:
            if folder.is_relative_to(source_root):
                shutil.rmtree(new_root / folder.relative_to(source_root), ignore_errors=True)
    probe = subprocess.run([str(python), "-c", "import features"], capture_output=True, text=True,
                           timeout=120, cwd=python.parents[1], env=users_shell(os.environ, python))
    if probe.returncode == 0:
        raise RuntimeError(f"{python}: featureline still importable after removing its installation")


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
