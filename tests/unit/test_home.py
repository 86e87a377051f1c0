"""Where featureline keeps things (features.home, issue 22): the project folder holds
``.dev/`` and is found like git finds a repository; downloads go to a per-user cache
unless the environment or the project file says otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from features.config import cache_home, resolve_settings
from features.errors import ConfigError
from features.home import project_home, state_home


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """tmp/proj holding featureline.toml, with a nested folder proj/a/b."""
    root = tmp_path / "proj"
    (root / "a" / "b").mkdir(parents=True)
    (root / "featureline.toml").write_text("[settings]\n")
    return root


def test_the_project_is_the_nearest_folder_up_holding_featureline_toml(project: Path, tmp_path: Path) -> None:
    assert project_home({}, project) == project
    assert project_home({}, project / "a" / "b") == project
    assert state_home({}, project / "a") == project / ".dev"
    (tmp_path / "elsewhere").mkdir()
    assert project_home({}, tmp_path / "elsewhere") == tmp_path / "elsewhere"  # none: the current folder
    # a nested project wins over the outer one
    (project / "a" / "featureline.toml").write_text("")
    assert project_home({}, project / "a" / "b") == project / "a"


def test_features_home_overrides_and_must_be_a_folder(project: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    assert project_home({"FEATURES_HOME": str(other)}, project / "a") == other
    assert project_home({"FEATURES_HOME": "../.."}, project / "a" / "b") == project  # relative to cwd
    with pytest.raises(ConfigError, match=r"FEATURES_HOME=.*missing is not a folder"):
        project_home({"FEATURES_HOME": str(tmp_path / "missing")}, project)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a folder"):
        project_home({"FEATURES_HOME": str(tmp_path / "file")}, project)


def test_the_cache_precedence(project: Path, tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path / "user")}
    per_user = tmp_path / "user" / ".cache" / "featureline"
    assert cache_home(home, project) == per_user
    xdg = {**home, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert cache_home(xdg, project) == tmp_path / "xdg" / "featureline"
    # the XDG spec: a relative XDG_CACHE_HOME is invalid and ignored
    assert cache_home({**home, "XDG_CACHE_HOME": "rel"}, project) == per_user
    (project / "featureline.toml").write_text('[settings]\ncache_dir = "jars"\n')
    assert cache_home(xdg, project / "a") == project / "jars"  # relative to the project, not the cwd
    assert cache_home({**xdg, "FEATURES_CACHE_DIR": "c"}, project / "a") == project / "a" / "c"
    # the project file is checked as settings are: a typo is an error, not a silent default
    (project / "featureline.toml").write_text('[settings]\ncache_dri = "jars"\n')
    with pytest.raises(ConfigError, match=r"unknown key.*cache_dri"):
        cache_home(xdg, project)


def test_settings_are_read_from_the_project_file_above_the_current_folder(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (project / "featureline.toml").write_text('[settings]\nredis_url = "redis://10.0.0.9:6379/2"\n')
    monkeypatch.chdir(project / "a" / "b")
    got = resolve_settings(environ={})
    assert got.redis_url == "redis://10.0.0.9:6379/2"
    assert got.schemas_dir == os.path.join("..", "..", "schemas")  # the project's schemas/
    assert resolve_settings(environ={}, schemas_dir="mine").schemas_dir == "mine"  # a flag: as given
    monkeypatch.chdir(project)
    assert resolve_settings(environ={}).schemas_dir == "schemas"


def test_this_checkout_is_a_project_keeping_its_downloads_in_dot_cache() -> None:
    root = Path(__file__).resolve().parents[2]
    assert project_home({}, root / "features" / "dev") == root
    assert cache_home({"HOME": "/nonexistent"}, root) == root / ".cache"
