"""Settings, resolved once at the edge (a job, the CLI, ``FeatureStore``), then frozen.

Precedence, highest first:

1. explicit arguments to :func:`resolve_settings`;
2. ``FEATURES_*`` environment variables (``FEATURES_POSTGRES_DSN``, ...);
3. the secrets file, if one is named (``FEATURES_SECRETS_FILE``, or ``secrets_file`` in
   ``featureline.toml``): a TOML file of connection settings only, readable by its owner
   only (see :func:`read_secrets_file`);
4. the project config file ``featureline.toml`` (table ``[settings]``) in the project
   folder (``features.home``: ``FEATURES_HOME``, else the nearest folder at or above the
   current one holding the file), if present;
5. the defaults below, which point at the local services ``features dev up`` starts.

The two Kafka property maps merge key by key across these layers (a key set higher
wins), so ``featureline.toml`` can hold ``security.protocol`` and the secrets file the
``sasl.password``.

Credentials (a password in a DSN or URL, a secret Kafka property) come from the
environment or the secrets file, never from schema YAML (no schema key can hold one)
and never from ``featureline.toml``, a project file meant to be committed: it refuses
them. :func:`redact` masks them wherever settings are shown. Unknown keys in either
file are errors. See ``docs/security.md``.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, overload
from urllib.parse import unquote

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict

from features.errors import ConfigError
from features.home import CACHE_VAR, CONFIG_FILE, project_home

Device = Literal["auto", "cpu", "gpu"]

DEFAULT_POSTGRES_DSN = "postgresql://featureline:featureline@127.0.0.1:5433/featureline"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6380/0"
DEFAULT_KAFKA_BOOTSTRAP = "127.0.0.1:9092"

#: What :func:`redact` puts in place of a secret.
MASK = "***"


@dataclass(frozen=True, repr=False)
class Settings:
    """Where the stores are and how to run. Every field maps to ``FEATURES_<NAME>``.

    ``repr()`` masks every credential (:func:`redact`), so a logged or printed Settings
    never shows one.
    """

    postgres_dsn: str = DEFAULT_POSTGRES_DSN
    """libpq DSN or URL of the cold store (and rejects table); libpq parameters such as
    ``sslmode``, ``sslrootcert``, ``sslcert`` pass through to the driver."""
    redis_url: str = DEFAULT_REDIS_URL
    """redis:// or rediss:// URL of the hot store (``rediss://user:password@host:port/db
    ?ssl_ca_certs=/path/ca.pem``; see ``docs/security.md`` for the TLS parameters), or
    ``redis+cluster://`` / ``rediss+cluster://host:port,host:port`` for a Redis Cluster
    (``docs/redis.md``)."""
    kafka_bootstrap: str = DEFAULT_KAFKA_BOOTSTRAP
    """Kafka bootstrap servers, comma separated host:port."""
    kafka_properties: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Extra librdkafka properties for every confluent-kafka client (dead-letter producer,
    lag consumer, ``features health``, the Kafka helpers): ``security.protocol``,
    ``sasl.mechanism``, ``sasl.username``, ``sasl.password``, ``ssl.ca.location``...
    ``FEATURES_KAFKA_PROPERTIES`` holds them as one JSON object."""
    kafka_java_properties: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Extra Java Kafka client properties for the Flink Kafka connector (passed as
    ``'properties.<name>'``): ``security.protocol``, ``sasl.mechanism``,
    ``sasl.jaas.config``, ``ssl.truststore.location``... The Java client spells some of
    them differently from librdkafka, so they are a separate map
    (``FEATURES_KAFKA_JAVA_PROPERTIES``, JSON)."""
    device: Device = "auto"
    """Where kernels run: ``auto`` (GPU when CuPy and a device exist), ``cpu`` or ``gpu``."""
    schemas_dir: str = "schemas"
    """Folder holding the schema YAML files."""
    views_dir: str = "views"
    """Folder holding the view YAML files (``docs/views.md``); a missing folder holds none."""
    cache_dir: str | None = None
    """Where ``features dev up`` keeps its downloads (Kafka's jars, the Flink Kafka
    connector jar, Maven's repository). None: the per-user cache shared by every project,
    ``$XDG_CACHE_HOME/featureline`` or ``~/.cache/featureline``; a relative path in
    ``featureline.toml`` is relative to the project folder (``features.home.cache_home``)."""
    secrets_file: str | None = None
    """The secrets file these settings were read with, if any (a path, not a secret)."""
    store_retries: int = 5
    """How many times a batch load or stream job tries a store write (or read) before it
    gives up with SinkUnavailable when Redis or Postgres cannot be reached (at least 1)."""
    store_backoff_s: float = 0.5
    """The wait before the second try, in seconds, doubling for each try after it (5 tries
    at 0.5 s wait 0.5 + 1 + 2 + 4 = 7.5 s in all)."""
    ingest_tokens: tuple[str, ...] = field(default=(), hash=False)
    """Bearer tokens the HTTP ingest service (``features serve``, ``docs/ingest.md``)
    accepts. Secrets: from ``FEATURES_INGEST_TOKENS`` (comma separated) or the secrets
    file (``ingest_tokens = ["...", "..."]``), never from ``featureline.toml``; shown
    only as ``***`` each."""

    def __repr__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _SECRET_BEARING:
                value = _redact_setting(f.name, value)
            parts.append(f"{f.name}={value!r}")
        return f"Settings({', '.join(parts)})"

    def for_job(self) -> Settings:
        """These settings without what a batch job's workers never use (the ingest
        tokens, the Kafka properties): what may travel inside a pickled Flink function."""
        return replace(self, ingest_tokens=(), kafka_properties={}, kafka_java_properties={},
                       secrets_file=None)

    def redacted(self) -> dict[str, Any]:
        """Every setting as plain values, credentials masked: what may be printed or logged."""
        return {f.name: (_redact_setting(f.name, getattr(self, f.name)) if f.name in _SECRET_BEARING
                         else getattr(self, f.name)) for f in fields(self)}


_FIELD_NAMES = tuple(f.name for f in fields(Settings))
_MAP_FIELDS = ("kafka_properties", "kafka_java_properties")
#: Settings that are lists of secrets, each one wholly secret (shown as ``***``).
_TOKEN_FIELDS = ("ingest_tokens",)
_SECRET_BEARING = ("postgres_dsn", "redis_url", *_MAP_FIELDS, *_TOKEN_FIELDS)
#: What a secrets file may hold: the connection settings and the ingest tokens.
SECRETS_FILE_KEYS = ("postgres_dsn", "redis_url", "kafka_bootstrap", *_MAP_FIELDS, *_TOKEN_FIELDS)
_DEVICES = ("auto", "cpu", "gpu")


def env_var(name: str) -> str:
    """The environment variable that sets the ``Settings`` field ``name``."""
    return f"FEATURES_{name.upper()}"


#: The environment variables of every secret-bearing setting: what a job's client removes
#: from its environment before a Flink JVM starts (``features.flink.env.scrub_environment``):
#: the JVM hands its environment to the Python workers, and Beam logs a worker's whole
#: environment at INFO when it closes (``DefaultJobBundleFactory``: "Closing environment").
SECRET_ENVIRONMENT = tuple(env_var(n) for n in _SECRET_BEARING)


# --------------------------------------------------------------------------- redaction

#: A parameter or property whose name contains one of these holds a secret.
_SECRET_WORDS = ("password", "passwd", "secret", "token", "jaas", "credential", "apikey", "api_key",
                 "api.key", "private")
#: ... and these exact names (key material, OAuth configuration).
_SECRET_NAMES = frozenset({"ssl.key.pem", "ssl.keystore.key", "sasl.oauthbearer.config",
                           "sslkey", "ssl_keyfile_password"})
#: libpq ``key = value`` pairs: the value is single-quoted or runs to a space, and a
#: backslash escapes the next character in both (``password=abc\ def`` is ``abc def``).
_KEYWORD_RE = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_.]*)(?P<eq>\s*=\s*)"
                         r"(?P<value>'(?:\\[\s\S]|[^'\\])*'?|(?:\\[\s\S]|\\$|[^\s\\])*)")


#: A URL (``postgresql://``, ``redis://``...): a scheme at the start. ``host=h
#: password=a://b`` is a libpq ``key=value`` DSN, as libpq reads it.
_URL_RE = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")


def is_secret_name(name: str) -> bool:
    """True when a DSN/URL parameter or a Kafka property called ``name`` holds a secret
    (``password``, ``sslpassword``, ``sasl.password``, ``sasl.jaas.config``,
    ``ssl.key.password``, ``sasl.oauthbearer.client.secret``...)."""
    low = name.lower()
    return low in _SECRET_NAMES or any(w in low for w in _SECRET_WORDS)


def _redact_url(url: str) -> str:
    """``url`` with the password of its userinfo and its secret query parameters masked.

    The userinfo runs to the *last* ``@`` of the URL. libpq ends it at the first ``@``
    (before any ``/``) and urlsplit at the last ``@`` before the first ``/?#``; a password
    holding an unencoded ``? # / @`` or a space is read differently by each, so the widest
    reading is masked: the password never shows, whichever client reads the URL (an ``@``
    in a query value masks that much more of the URL: generous, never a leak)."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, after = rest.rpartition("@")
    if at:
        user, colon, _password = userinfo.partition(":")
        userinfo = f"{user}:{MASK}" if colon else userinfo
    head, qmark, query = after.partition("?")
    if query:
        query = "&".join(
            f"{k}={MASK}" if eq and is_secret_name(unquote(k)) else f"{k}{eq}{v}"
            for k, eq, v in (p.partition("=") for p in query.split("&")))
    return f"{scheme}{sep}{userinfo}{at}{head}{qmark}{query}"


@overload
def redact(value: str) -> str: ...
@overload
def redact(value: Mapping[str, str]) -> dict[str, str]: ...
def redact(value: str | Mapping[str, str]) -> str | dict[str, str]:
    """``value`` with every credential replaced by ``***``: what may be shown.

    - a URL (``postgresql://``, ``redis://``, ``rediss://``...): the password of its
      userinfo, and every query parameter whose name says secret (``password``,
      ``sslpassword``, ``ssl_password``...);
    - a libpq ``key=value`` DSN: the values of such keys (``password='a b'``);
    - a Kafka property map: the values of secret properties (:func:`is_secret_name`:
      ``sasl.password``, ``sasl.jaas.config``, ``ssl.key.password``...).

    User names, hosts, ports and databases stay. Never raises: text it cannot parse is
    masked generously rather than shown.
    """
    if isinstance(value, Mapping):
        return {k: (MASK if is_secret_name(k) else str(v)) for k, v in value.items()}
    if _URL_RE.match(value):  # libpq reads a URL only from a scheme at the start
        return _redact_url(value)
    return _KEYWORD_RE.sub(lambda m: f"{m['key']}{m['eq']}{MASK}" if is_secret_name(m["key"]) else m[0],
                           value)


def _redact_setting(name: str, value: Any) -> Any:
    """A secret-bearing setting as it may be shown: each token ``***``, else :func:`redact`."""
    if name in _TOKEN_FIELDS:
        return tuple(MASK for _ in value)
    return redact(value)


def _carries_secret(name: str, value: str | Mapping[str, str] | tuple[str, ...]) -> list[str]:
    """What in ``value`` is a credential (for refusing it in the project file)."""
    if name in _TOKEN_FIELDS:
        return [name] if value else []
    if isinstance(value, tuple):
        return []
    if isinstance(value, Mapping):
        return [f"{name}.{k}" for k in value if is_secret_name(k)]
    return [name] if redact(value) != value else []


# --------------------------------------------------------------------------- reading


def _property_map(value: object, where: str, name: str) -> dict[str, str]:
    """A property table/object: string keys, scalar values (as librdkafka and Java take
    them: ``true``/``false`` for booleans). Never shows a value in its errors."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {name} must be a table/object of property names to values",
                          key=name, looked_in=[where])
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(v, bool):
            out[str(k)] = "true" if v else "false"
        elif isinstance(v, str | int | float):
            out[str(k)] = str(v)
        else:
            raise ConfigError(f"{where}: {name}.{k} must be a string, number or boolean",
                              key=name, looked_in=[where])
    if "bootstrap.servers" in out:
        raise ConfigError(f"{where}: {name} must not set bootstrap.servers; use kafka_bootstrap "
                          f"({env_var('kafka_bootstrap')})", key=name, looked_in=[where])
    return out


def _token_list(value: object, where: str, name: str) -> tuple[str, ...]:
    """A list of non-empty tokens (a string: comma separated). Never shows a value."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not all(isinstance(t, str) for t in items):
        raise ConfigError(f"{where}: {name} must be a list of strings", key=name, looked_in=[where])
    tokens = tuple(t.strip() for t in items if t.strip())
    if any(c.isspace() or c == "," for t in tokens for c in t):
        raise ConfigError(f"{where}: {name}: a token must not hold whitespace or commas", key=name,
                          looked_in=[where])
    return tokens


def _typed(table: Mapping[str, object], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        if k in _MAP_FIELDS:
            out[k] = _property_map(v, where, k)
        elif k in _TOKEN_FIELDS:
            out[k] = _token_list(v, where, k)
        elif isinstance(v, str | int | float | bool):
            out[k] = str(v)
        else:
            raise ConfigError(f"{where}: {k} must be a string", key=k, looked_in=[where])
    return out


def read_project_file(root: Path) -> dict[str, Any]:
    """The ``[settings]`` of ``root/featureline.toml`` ({} when there is none), checked:
    unknown keys, wrong types and credentials are refused with ConfigError."""
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
    values = _typed(table, str(path))
    secrets = [s for k, v in values.items() if k in _SECRET_BEARING for s in _carries_secret(k, v)]
    if secrets:
        raise ConfigError(
            f"{path}: {', '.join(secrets)} carries a credential; {CONFIG_FILE} is a project file, "
            "meant to be committed: put credentials in the environment "
            f"({env_var(secrets[0].split('.')[0])}) or in the secrets file ({env_var('secrets_file')}); "
            "see docs/security.md",
            key=secrets[0], looked_in=[str(path)])
    return values


def cache_home(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """The download cache (absolute): ``FEATURES_CACHE_DIR`` (relative to the current
    folder), else the project file's ``cache_dir`` (relative to the project folder), else
    ``$XDG_CACHE_HOME/featureline`` (an absolute XDG_CACHE_HOME only, as the XDG spec
    says), else ``~/.cache/featureline``."""
    env = os.environ if environ is None else environ
    here = (cwd or Path.cwd()).absolute()
    named = env.get(CACHE_VAR)
    if named:
        return Path(os.path.normpath(here / Path(named).expanduser()))
    project = project_home(env, here)
    in_file = read_project_file(project).get("cache_dir")
    if in_file:
        return Path(os.path.normpath(project / Path(str(in_file)).expanduser()))
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "featureline"
    return Path(env.get("HOME") or Path.home()) / ".cache" / "featureline"


def read_secrets_file(path: Path) -> dict[str, Any]:
    """The settings in secrets file ``path``: a TOML file with top-level keys among
    :data:`SECRETS_FILE_KEYS` (``kafka_properties`` and ``kafka_java_properties`` are tables).

    Refused with ConfigError (which never quotes the file's content): a missing file,
    one that others can access (any permission bit for "others"), one that its group can
    access (allowed only as read-only for a root-owned file, ``0640``, the way libpq treats
    key files), invalid TOML, an unknown key or a value of the wrong type.
    """
    where = f"secrets file {path}"
    try:
        st = path.stat()  # follows symlinks: the target's permissions count
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror}", key="secrets_file",
                          looked_in=[env_var("secrets_file"), CONFIG_FILE]) from exc
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{where} is not a regular file", key="secrets_file")
    mode = stat.S_IMODE(st.st_mode)
    group_ok = (mode & 0o070) == 0 or (st.st_uid == 0 and (mode & 0o070) == 0o040)
    if mode & 0o007 or not group_ok:
        raise ConfigError(
            f"{where} has permissions {mode:04o}: it must not be accessible by group or others "
            f"(chmod 600 {path}; a root-owned file may be group-readable, 0640)", key="secrets_file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        # TOMLDecodeError messages name a position, never the content
        raise ConfigError(f"{where}: invalid TOML: {exc}", key="secrets_file") from None
    unknown = sorted(set(data) - set(SECRETS_FILE_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; a secrets file holds only "
                          f"{', '.join(SECRETS_FILE_KEYS)}", key=unknown[0])
    return _typed(data, where)


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in _FIELD_NAMES:
        raw = env.get(env_var(name))
        if not raw:
            continue
        if name in _MAP_FIELDS:
            try:
                parsed = json.loads(raw)
            except ValueError as exc:
                # the message names a position only; the text may hold a password
                raise ConfigError(f"{env_var(name)} is not valid JSON (expected an object such as "
                                  f'{{"security.protocol": "SASL_SSL"}}; error at character '
                                  f"{getattr(exc, 'pos', '?')})", key=name,
                                  looked_in=[env_var(name)]) from None
            values[name] = _property_map(parsed, env_var(name), name)
        elif name in _TOKEN_FIELDS:
            values[name] = _token_list(raw, env_var(name), name)
        else:
            values[name] = raw
    return values


def _number(raw: object, kind: type[int] | type[float], least: float, name: str,
            origin: str) -> int | float:
    """``raw`` (a string from the environment or a file, or a number) as ``kind``, at
    least ``least``; ConfigError naming the setting and where it came from otherwise."""
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = kind(str(raw))
    except (TypeError, ValueError):
        value = None
    if value is None or value != value or value < least:
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"{name} must be {what} >= {least:g}, got {raw!r} (from {origin})",
                          key=name, looked_in=[origin])
    return value


def _check_dsn(dsn: str, origin: str) -> None:
    """A DSN libpq cannot parse is refused here, without psycopg's message: it quotes
    the offending part, which may be the password (``invalid percent-encoded token``)."""
    if dsn == DEFAULT_POSTGRES_DSN:
        return

    try:
        conninfo_to_dict(dsn)
    except ProgrammingError:
        raise ConfigError(f"postgres_dsn ({origin}) is not a valid libpq connection string or URL "
                          f"({redact(dsn)}); libpq's own message is withheld because it may quote the "
                          "password", key="postgres_dsn", looked_in=[origin]) from None


def resolve_settings(
    *, environ: Mapping[str, str] | None = None, root: Path | str | None = None,
    **explicit: str | Mapping[str, str] | Sequence[str] | None,
) -> Settings:
    """Resolve settings from ``explicit`` > environment > secrets file > ``featureline.toml``
    > defaults (the Kafka property maps merge key by key).

    ``explicit`` values that are None are treated as not given, so a CLI flag left
    unset never beats the environment. ``root`` is the project folder holding
    ``featureline.toml``; by default it is found as :func:`features.home.project_home`
    says (``FEATURES_HOME``, else the nearest folder at or above the current one holding
    the file), and when that is above the current folder a relative ``schemas_dir`` (and ``views_dir``) from
    the file or the default is made relative to it. A relative ``secrets_file`` is
    relative to ``root``. Raises ConfigError for an unknown setting name, an invalid value, a credential in
    ``featureline.toml``, or a secrets file that is unreadable, too widely readable or
    malformed; its messages never quote a credential. Reads nothing but ``environ``, the
    project file and the secrets file.
    """
    env = os.environ if environ is None else environ
    unknown = sorted(set(explicit) - set(_FIELD_NAMES))
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}", key=unknown[0])
    discovered = root is None
    root = project_home(env) if root is None else Path(root)
    given = {k: v for k, v in explicit.items() if v is not None}
    for name in _MAP_FIELDS:
        if name in given:
            given[name] = _property_map(given[name], "arguments", name)
    for name in _TOKEN_FIELDS:
        if name in given:
            given[name] = _token_list(given[name], "arguments", name)
    project = read_project_file(root)
    from_env = _from_env(env)
    secrets_path = given.get("secrets_file") or from_env.get("secrets_file") or project.get("secrets_file")
    layers: list[tuple[str, dict[str, Any]]] = [(str(Path(root) / CONFIG_FILE), project)]
    if secrets_path:
        path = Path(str(secrets_path))
        path = path if path.is_absolute() else Path(root) / path
        layers.append((f"secrets file {path}", read_secrets_file(path)))
    layers += [("environment", from_env), ("arguments", given)]
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for label, layer in layers:
        for k, v in layer.items():
            values[k] = {**values.get(k, {}), **v} if k in _MAP_FIELDS else v
            origin[k] = env_var(k) if label == "environment" else label
    device = values.get("device", "auto")
    if device not in _DEVICES:
        raise ConfigError(
            f"invalid device {device!r}: expected one of {', '.join(_DEVICES)}",
            key="device", looked_in=["arguments", env_var("device"), CONFIG_FILE],
        )
    for key, kind, least in (("store_retries", int, 1), ("store_backoff_s", float, 0.0)):
        if key in values:
            values[key] = _number(values[key], kind, least, key, origin[key])
    if "postgres_dsn" in values:
        _check_dsn(str(values["postgres_dsn"]), origin["postgres_dsn"])
    for key in ("schemas_dir", "views_dir"):
        folder = Path(str(values.get(key, getattr(Settings, key))))
        if (discovered and root != Path.cwd().absolute() and not folder.is_absolute()
                and origin.get(key) not in ("arguments", env_var(key))):
            # run from below the project folder: its schemas_dir/views_dir is relative to the project
            values[key] = os.path.relpath(root / folder)
    return Settings(**values)
