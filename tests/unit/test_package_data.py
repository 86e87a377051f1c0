"""What the CLI reads from inside the package ships in the wheel: every such file matches
a ``[tool.setuptools.package-data]`` glob of pyproject.toml (issue 22)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from features.dev import services

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
        assert _shipped("features.dev", relative), relative
