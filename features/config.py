"""Settings, resolved once at the edge (a job, the CLI, ``FeatureStore``), then frozen.

Precedence, highest first:

1. explicit arguments to :func:`resolve_settings`;
2. ``FEATURES_*`` environment variables (``FEATURES_POSTGRES_DSN``, ...);
3. the project config file ``featureline.toml`` (table ``[settings]``), if present;
4. the defaults below, which point at the local services ``features dev up`` starts.

Secrets (passwords in DSNs/URLs) belong in the environment, never in schema YAML.
Unknown keys in the config file are errors.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from features.errors import ConfigError

Device = Literal["auto", "cpu", "gpu"]

DEFAULT_POSTGRES_DSN = "postgresql://featureline:featureline@127.0.0.1:5433/featureline"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6380/0"
DEFAULT_KAFKA_BOOTSTRAP = "127.0.0.1:9092"

CONFIG_FILE = "featureline.toml"


@dataclass(frozen=True)
class Settings:
    """Where the stores are and how to run. Every field maps to ``FEATURES_<NAME>``."""

    postgres_dsn: str = DEFAULT_POSTGRES_DSN
    """libpq DSN or URL of the cold store (and rejects table)."""
    redis_url: str = DEFAULT_REDIS_URL
    """redis:// or rediss:// URL of the hot store."""
    kafka_bootstrap: str = DEFAULT_KAFKA_BOOTSTRAP
    """Kafka bootstrap servers, comma separated host:port."""
    device: Device = "auto"
    """Where kernels run: ``auto`` (GPU when CuPy and a device exist), ``cpu`` or ``gpu``."""
    schemas_dir: str = "schemas"
    """Folder holding the schema YAML files."""


_FIELD_NAMES = tuple(f.name for f in fields(Settings))
_DEVICES = ("auto", "cpu", "gpu")


def env_var(name: str) -> str:
    """The environment variable that sets the ``Settings`` field ``name``."""
    return f"FEATURES_{name.upper()}"


def _from_file(root: Path) -> dict[str, str]:
    path = root / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}", looked_in=[str(path)]) from exc
    table = data.get("settings", {})
    unknown = sorted(set(data) - {"settings"}) + sorted(set(table) - set(_FIELD_NAMES))
    if unknown:
        raise ConfigError(
            f"{path}: unknown key(s) {', '.join(unknown)}; known settings: {', '.join(_FIELD_NAMES)}",
            key=unknown[0], looked_in=[str(path)],
        )
    return {k: str(v) for k, v in table.items()}


def resolve_settings(
    *, environ: Mapping[str, str] | None = None, root: Path | str = ".", **explicit: str | None,
) -> Settings:
    """Resolve settings from ``explicit`` > environment > ``featureline.toml`` > defaults.

    ``explicit`` values that are None are treated as not given, so a CLI flag left
    unset never beats the environment. Raises ConfigError for an unknown setting
    name or an invalid value; never reads anything but ``environ`` and the file.
    """
    env = os.environ if environ is None else environ
    unknown = sorted(set(explicit) - set(_FIELD_NAMES))
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}", key=unknown[0])
    values: dict[str, str] = {}
    values.update(_from_file(Path(root)))
    for name in _FIELD_NAMES:
        if env.get(env_var(name)):
            values[name] = env[env_var(name)]
    values.update({k: v for k, v in explicit.items() if v is not None})
    device = values.get("device", "auto")
    if device not in _DEVICES:
        raise ConfigError(
            f"invalid device {device!r}: expected one of {', '.join(_DEVICES)}",
            key="device", looked_in=["arguments", env_var("device"), CONFIG_FILE],
        )
    return Settings(**values)  # type: ignore[arg-type]  # keys checked above
