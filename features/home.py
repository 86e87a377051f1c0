"""Where featureline keeps things on disk: the project folder and the per-user cache.

- The **project folder** holds ``featureline.toml``, ``schemas/`` and ``.dev/`` (the local
  servers' data and pid files that ``features dev up`` starts, the stream job's
  checkpoints): ``FEATURES_HOME`` when set, else the nearest folder at or above the
  current one that holds ``featureline.toml`` (like git finds its repository), else the
  current folder.
- The **cache** (:func:`features.config.cache_home`, which reads the project file) holds
  what ``features dev up`` downloads (Kafka's jars, the Flink Kafka connector jar,
  Maven's local repository), shared by every project of the user:
  ``FEATURES_CACHE_DIR`` when set, else the ``cache_dir`` setting of the project's
  ``featureline.toml``, else ``$XDG_CACHE_HOME/featureline``, else
  ``~/.cache/featureline``. This repository is a project whose ``featureline.toml`` says
  ``cache_dir = ".cache"``, so a checkout keeps its downloads in its ignored ``.cache/``.

Nothing is ever written inside the installed package.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from features.errors import ConfigError

HOME_VAR = "FEATURES_HOME"
CACHE_VAR = "FEATURES_CACHE_DIR"
CONFIG_FILE = "featureline.toml"


def project_home(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """The project folder (absolute): ``FEATURES_HOME``, else the nearest folder at or
    above ``cwd`` holding ``featureline.toml``, else ``cwd``. Raises ConfigError when
    ``FEATURES_HOME`` names something that is not a folder."""
    env = os.environ if environ is None else environ
    here = (cwd or Path.cwd()).absolute()
    named = env.get(HOME_VAR)
    if named:
        home = Path(os.path.normpath(here / Path(named).expanduser()))
        if not home.is_dir():
            raise ConfigError(f"{HOME_VAR}={named} is not a folder (it names the project folder, the "
                              f"one holding {CONFIG_FILE}, schemas/ and .dev/)", key="home",
                              looked_in=[HOME_VAR])
        return home
    for folder in (here, *here.parents):
        if (folder / CONFIG_FILE).is_file():
            return folder
    return here


def state_home(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """``<project>/.dev``: local servers' data and pid files, stream checkpoints."""
    return project_home(environ, cwd) / ".dev"


def shown(path: Path) -> str:
    """``path`` relative to the current folder when it lies below it, else absolute:
    how messages name a file."""
    try:
        return str(path.relative_to(Path.cwd().absolute()))
    except ValueError:
        return str(path)


__all__ = ["CACHE_VAR", "CONFIG_FILE", "HOME_VAR", "project_home", "shown", "state_home"]
