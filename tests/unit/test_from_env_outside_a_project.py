"""``FeatureStore.from_env()`` outside a project (issue 47): the error names the folder it
looked in, why it looked there, and FEATURES_HOME, not ``[Errno 2] ... 'schemas'``."""

from __future__ import annotations

from pathlib import Path

import pytest

from features import FeatureStore
from features.errors import ConfigError


def test_outside_a_project_the_error_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.chdir(tmp_path)
    for var in ("FEATURES_HOME", "FEATURES_SCHEMAS_DIR", "FEATURES_VIEWS_DIR"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError) as exc:
        FeatureStore.from_env()
    text = str(exc.value)
    assert exc.value.key == "schemas_dir"
    assert f"no schemas folder at {tmp_path / 'schemas'}" in text
    assert "FEATURES_HOME is not set" in text and "featureline.toml" in text
    home = tmp_path / "elsewhere"
    home.mkdir()
    monkeypatch.setenv("FEATURES_HOME", str(home))
    with pytest.raises(ConfigError, match=f"no schemas folder at {home / 'schemas'} \\(FEATURES_HOME names"):
        FeatureStore.from_env()
