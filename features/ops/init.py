"""``features init [DIR]``: start a project that uses featureline.

Writes ``schemas/`` with one commented example schema, ``views/`` with one example view
over it, ``featureline.toml`` with every
setting and its default commented out, and a short README of the commands. Refuses to
overwrite: when any of those files exists nothing is written (exit 2, naming them).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from features.config import (
    DEFAULT_KAFKA_BOOTSTRAP,
    DEFAULT_POSTGRES_DSN,
    DEFAULT_REDIS_URL,
    env_var,
)
from features.errors import ConfigError
from features.home import CONFIG_FILE

EXAMPLE_SCHEMA = "schemas/orders.yaml"
EXAMPLE_VIEW = "views/order_scoring.yaml"

_VIEW = """\
# An example view: what a model reads when it scores an order at request time; edit it or
# replace it with your own. Every key is described in featureline's docs/views.md.
name: order_scoring
version: 1.0.0
description: an order's stored features and one computed from the request
request:
  keys:
    order_id: string          # joins the orders schema's entity
  fields:
    - name: refund_amount     # sent with each request, checked like a schema field
      type: decimal(12,2)
      constraints: {required: true, min: 0}
sources:
  - schema: orders
    features: [amount, country, placed_at]
    join: {order_id: order_id}
    max_age: 30d              # an older order's features read as null
features:
  - name: refund_share
    description: the refund asked for over the order's amount (0 for a zero amount; null for an unknown order)
    from: refund_amount
    steps: [{ratio: {denominator: amount, on_zero: 0}}]
    dtype: float64
"""

_SCHEMA = """\
# An example schema: one row per order; edit it or replace it with your own.
# Every key is described in featureline's docs/schema.md.
name: orders
version: 1.0.0
description: orders as placed, with the features a model reads
entity: order_id          # the key of the hot (Redis) and cold (Postgres) rows
event_time: placed_at     # newest wins per entity; windows and point-in-time reads use it
hot:
  ttl: 7d                 # how long Redis keeps an order's hot features
fields:
  - name: order_id
    type: string
    store: [hot, cold]
    constraints:
      required: true
      pattern: ^ORD-[0-9]{8}$
  - name: placed_at
    type: timestamp(us, UTC)
    store: [hot, cold]
    constraints:
      required: true
  - name: amount
    type: decimal(12,2)   # exact: never a float
    store: [hot, cold]
    accept_strings: true  # "12.50" in JSON is read exactly
    constraints:
      min: 0.01
      nullable: false
  - name: country
    type: string
    # source: "Country Code"   # the input column / JSON key when it differs from the name
    constraints:
      min_length: 2
      max_length: 2
      nullable: true
features:
  - name: amount_log
    description: log(1 + amount)
    from: amount
    steps:
      - log1p
    dtype: float64
    store: hot
"""

_README = """\
# A featureline project

Schemas live in `schemas/` (one YAML file each; see featureline's docs/schema.md), views
(what a model reads per request, from one or several schemas; docs/views.md) in `views/`;
settings in `featureline.toml` (credentials never: use the environment or a secrets file).
The local servers keep their data in `.dev/` here; downloads go to `~/.cache/featureline`.

```bash
features dev up                                   # local Postgres, Redis and Kafka (loopback)
features dev status
features compile                                  # -> sql/, expectations/, alerts/, dashboards/
features load --schema orders orders.parquet      # validate + store; rejects kept in Postgres
features stream --schema orders --topic orders --bounded
features report --schema orders --table --out report    # report.html + report.json
features health
```

From Python:

```python
from features import FeatureStore

with FeatureStore.from_env() as fs:  # the settings above: FEATURES_* and featureline.toml
    print(fs.online("orders", ["ORD-00000001"]))
    print(fs.online_view_dicts("order_scoring", [{"order_id": "ORD-00000001", "refund_amount": 5}]))
```
"""


def _config() -> str:
    lines = [
        "# featureline settings for this project. Every setting is shown with its default,",
        "# commented out. Precedence: command-line arguments > FEATURES_* environment variables",
        "# > the secrets file > this file > the defaults. This file is meant to be committed:",
        "# it refuses credentials (a password in a DSN or URL, a secret Kafka property); put",
        f"# those in the environment ({env_var('postgres_dsn')}, ...) or a secrets file.",
        "",
        "[settings]",
        "# where the stores are (the defaults point at what `features dev up` starts;",
        "# the default DSN carries the dev server's password, so it comes from the defaults,",
        "# not from this file)",
        f"# postgres_dsn = \"{DEFAULT_POSTGRES_DSN.replace(':featureline@', '@')}\"",
        f"# redis_url = \"{DEFAULT_REDIS_URL}\"",
        f"# kafka_bootstrap = \"{DEFAULT_KAFKA_BOOTSTRAP}\"",
        "# where the kernels run: auto (a GPU when CuPy finds one), cpu or gpu",
        "# device = \"auto\"",
        "# the folder of schema YAML files",
        "# schemas_dir = \"schemas\"",
        "# the folder of view YAML files (what a model reads per request; docs/views.md)",
        "# views_dir = \"views\"",
        "# where `features dev up` keeps its downloads (default: the per-user cache,",
        "# $XDG_CACHE_HOME/featureline or ~/.cache/featureline, shared by every project)",
        "# cache_dir = \".cache\"",
        "# a TOML file of credentials, readable by its owner only",
        "# secrets_file = \"secrets.toml\"",
        "",
        "# extra librdkafka properties (confluent-kafka clients)",
        "# [settings.kafka_properties]",
        "# \"security.protocol\" = \"SASL_SSL\"",
        "",
        "# extra Java Kafka client properties (the Flink Kafka connector)",
        "# [settings.kafka_java_properties]",
        "# \"security.protocol\" = \"SASL_SSL\"",
        "",
    ]
    return "\n".join(lines)


def files() -> dict[str, str]:
    """Relative path -> content of what ``features init`` writes."""
    return {EXAMPLE_SCHEMA: _SCHEMA, EXAMPLE_VIEW: _VIEW, CONFIG_FILE: _config(),
            "README.md": _README}


def init(directory: Path | str) -> list[Path]:
    """Write the project files under ``directory`` (created when missing); the paths
    written. ConfigError, writing nothing, when any of them exists."""
    root = Path(directory)
    planned = {root / rel: text for rel, text in files().items()}
    present = [str(p) for p in planned if p.exists()]
    if present:
        raise ConfigError(f"refusing to overwrite {', '.join(present)}: features init starts a new "
                          "project (move those files away, or pick another folder)", key="init")
    for path, text in planned.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return list(planned)


def next_steps(directory: Path | str) -> str:
    """The commands to run after ``features init directory``: ``features dev up && features
    compile``, behind a ``cd`` into the project folder unless it is the current one (the
    folder quoted for the shell)."""
    steps = "features dev up && features compile"
    if Path(directory).resolve() == Path.cwd().resolve():
        return steps
    return f"cd {shlex.quote(str(directory))} && {steps}"


__all__ = ["EXAMPLE_SCHEMA", "files", "init", "next_steps"]
