"""Settings precedence and the CLI's front door."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from features.cli import COMMANDS, main
from features.config import DEFAULT_REDIS_URL, Settings, resolve_settings
from features.errors import ConfigError


def test_defaults_when_nothing_is_set(tmp_path: Path) -> None:
    s = resolve_settings(environ={}, root=tmp_path)
    assert s.redis_url == DEFAULT_REDIS_URL
    assert s.device == "auto"


def test_precedence_explicit_over_env_over_file(tmp_path: Path) -> None:
    (tmp_path / "featureline.toml").write_text('[settings]\nredis_url = "redis://file:1/0"\n'
                                               'kafka_bootstrap = "file:9"\n')
    env = {"FEATURES_REDIS_URL": "redis://env:2/0"}
    s = resolve_settings(environ=env, root=tmp_path, redis_url="redis://arg:3/0", kafka_bootstrap=None)
    assert s.redis_url == "redis://arg:3/0"          # explicit beats env
    assert s.kafka_bootstrap == "file:9"             # None argument does not beat the file
    assert resolve_settings(environ=env, root=tmp_path).redis_url == "redis://env:2/0"


def test_unknown_key_in_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "featureline.toml").write_text('[settings]\nredis_uri = "x"\n')
    with pytest.raises(ConfigError) as info:
        resolve_settings(environ={}, root=tmp_path)
    assert info.value.key == "redis_uri"
    assert str(tmp_path / "featureline.toml") in info.value.looked_in


def test_invalid_device_lists_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_settings(environ={"FEATURES_DEVICE": "tpu"}, root=tmp_path)
    assert info.value.key == "device"
    assert "FEATURES_DEVICE" in info.value.looked_in


def test_store_retry_settings_from_file_environment_and_refused_when_invalid(tmp_path: Path) -> None:
    assert (Settings().store_retries, Settings().store_backoff_s) == (5, 0.5)
    (tmp_path / "featureline.toml").write_text("[settings]\nstore_retries = 8\nstore_backoff_s = 2\n")
    s = resolve_settings(environ={}, root=tmp_path)
    assert (s.store_retries, s.store_backoff_s) == (8, 2.0)
    assert isinstance(s.store_retries, int) and isinstance(s.store_backoff_s, float)
    s = resolve_settings(environ={"FEATURES_STORE_RETRIES": "2", "FEATURES_STORE_BACKOFF_S": "0.05"},
                         root=tmp_path)
    assert (s.store_retries, s.store_backoff_s) == (2, 0.05)
    for env, key in [({"FEATURES_STORE_RETRIES": "0"}, "store_retries"),
                     ({"FEATURES_STORE_RETRIES": "2.5"}, "store_retries"),
                     ({"FEATURES_STORE_BACKOFF_S": "-1"}, "store_backoff_s"),
                     ({"FEATURES_STORE_BACKOFF_S": "nan"}, "store_backoff_s")]:
        with pytest.raises(ConfigError, match=key) as info:
            resolve_settings(environ=env, root=tmp_path)
        assert info.value.key == key and info.value.looked_in == [next(iter(env))]


def test_help_lists_every_subcommand() -> None:
    out = subprocess.run([sys.executable, "-m", "features.cli", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for name in COMMANDS:
        assert name in out


def test_unknown_subcommand_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        main(["no-such-command"])
    assert info.value.code == 2
