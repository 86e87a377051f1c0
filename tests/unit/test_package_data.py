"""What the CLI reads from inside the package ships in the wheel: every such file matches
a ``[tool.setuptools.package-data]`` glob of pyproject.toml (issue 22)."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from features.ops.dev import services

ROOT = Path(__file__).resolve().parents[2]


def _shipped(package: str, relative: str) -> bool:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    return any(fnmatch.fnmatch(relative, g) for g in globs.get(package, []))


def test_the_maven_poms_are_package_data() -> None:
    poms = sorted(services.POMS.glob("*/pom.xml"))
    assert [p.parent.name for p in poms] == ["flink", "kafka"]
    assert services.POMS.is_relative_to(Path(services.__file__).parent)  # inside the package
    for pom in poms:
        relative = pom.relative_to(Path(services.__file__).parent).as_posix()
        assert _shipped("features.ops.dev", relative), relative


def test_the_job_files_run_from_anywhere_as_files_and_as_modules(tmp_path: Path) -> None:
    """``flink run -py`` runs a job file as a script from any folder: the installed file
    must import the package it sits in and be the command it names, not a neighbour."""
    from features.flink import JOBS, job_file

    for name, command in JOBS.items():
        path = job_file(name)
        assert path.is_file() and path.is_relative_to(Path(services.__file__).parents[2])  # the package
        for how in ([str(path)], ["-m", f"features.jobs.{name}"]):
            out = subprocess.run([sys.executable, "-I", *how, "--help"], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            assert out.stdout.startswith(f"usage: features {command} "), out.stdout[:200]
    printed = subprocess.run([sys.executable, "-m", "features.cli", "job-file", "stream"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0 and printed.stdout.strip() == str(job_file("stream")), printed
    with pytest.raises(ValueError, match="unknown job 'flink'"):
        job_file("flink")
