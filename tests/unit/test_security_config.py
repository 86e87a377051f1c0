"""Credentials and quoting without services: where settings may come from, what is
masked, what a schema can never carry, how names and literals reach SQL.

The end-to-end proofs (real stores, a password-protected role and Redis user, the
stream job's Flink logs, hostile names loaded and read back) are in
``tests/integration/test_security.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from features.compile.postgres import quote_ident, quote_literal
from features.config import MASK, Settings, is_secret_name, read_secrets_file, redact, resolve_settings
from features.errors import CompileError, ConfigError, SchemaError, SchemaErrors
from features.flink.stream import StreamConfig, redacted, source_options
from features.schema import parse_schema
from features.schema.syntax import identifier_problem
from features.sinks.redis_wire import RedisEndpoint

SECRET = "S3cr3t-xyzzy"


# --------------------------------------------------------------------------- redact


@pytest.mark.parametrize(("value", "want"), [
    ("postgresql://app:S3cr3t-xyzzy@db:5432/features?sslmode=verify-full&sslrootcert=/ca.pem",
     "postgresql://app:***@db:5432/features?sslmode=verify-full&sslrootcert=/ca.pem"),
    ("postgresql://app@db/features?password=S3cr3t-xyzzy&sslpassword=S3cr3t-xyzzy",
     "postgresql://app@db/features?password=***&sslpassword=***"),
    ("host=db user=app password='S3cr3t-xyzzy with \\' quote' dbname=f sslmode=require",
     "host=db user=app password=*** dbname=f sslmode=require"),
    ("host=db password=S3cr3t-xyzzy", "host=db password=***"),
    ("rediss://app:S3cr3t-xyzzy@cache:6380/0?ssl_ca_certs=/ca.pem&ssl_password=S3cr3t-xyzzy",
     "rediss://app:***@cache:6380/0?ssl_ca_certs=/ca.pem&ssl_password=***"),
    ("redis://:S3cr3t-xyzzy@cache:6380/0", "redis://:***@cache:6380/0"),
    # an unencoded '@' in the password: masked up to the last '@', as urlsplit reads it
    ("postgresql://app:S3cr3t@xyzzy@db/f", "postgresql://app:***@db/f"),
    ("redis://127.0.0.1:6380/0", "redis://127.0.0.1:6380/0"),
    ("postgresql://app@db/f", "postgresql://app@db/f"),
])
def test_redact_masks_the_password_of_urls_and_dsns(value: str, want: str) -> None:
    assert redact(value) == want
    assert "xyzzy" not in redact(value)


def test_redact_masks_secret_kafka_properties_only() -> None:
    props = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "app",
             "sasl.password": SECRET, "ssl.key.password": SECRET, "ssl.ca.location": "/ca.pem",
             "sasl.jaas.config": f'PlainLoginModule required username="app" password="{SECRET}";',
             "sasl.oauthbearer.client.secret": SECRET, "ssl.keystore.password": SECRET}
    out = redact(props)
    assert SECRET not in json.dumps(out)
    assert out["security.protocol"] == "SASL_SSL" and out["sasl.username"] == "app"
    assert out["ssl.ca.location"] == "/ca.pem" and out["sasl.password"] == MASK
    assert not is_secret_name("ssl.ca.location") and is_secret_name("sslpassword")


def test_settings_and_stream_config_never_show_a_credential() -> None:
    s = Settings(postgres_dsn=f"postgresql://app:{SECRET}@db/f", redis_url=f"redis://:{SECRET}@c:1/0",
                 kafka_properties={"sasl.password": SECRET},
                 kafka_java_properties={"sasl.jaas.config": f'x password="{SECRET}";'})
    cfg = StreamConfig(schema_path="s.yaml", topic="t", bootstrap="k:9092", postgres_dsn=s.postgres_dsn,
                       redis_url=s.redis_url, kafka_properties=s.kafka_properties,
                       kafka_java_properties=s.kafka_java_properties)
    endpoint = RedisEndpoint.from_url(f"rediss://u:{SECRET}@c:1/0?ssl_password={SECRET}")
    for text in (repr(s), str(s), json.dumps(s.redacted()), repr(cfg), json.dumps(redacted(cfg)),
                 repr(endpoint)):
        assert SECRET not in text
    assert "db/f" in repr(s) and "app" in json.dumps(redacted(cfg))  # the rest stays visible
    assert endpoint.password == SECRET and endpoint.key_password == SECRET  # still usable


def test_every_secret_setting_is_scrubbed_from_a_flink_clients_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29, item 8: the ingest tokens too (they were left in the environment the
    Flink JVM hands to its Python workers)."""
    from features.config import SECRET_ENVIRONMENT
    from features.flink.env import scrub_environment

    names = ["FEATURES_POSTGRES_DSN", "FEATURES_REDIS_URL", "FEATURES_KAFKA_PROPERTIES",
             "FEATURES_KAFKA_JAVA_PROPERTIES", "FEATURES_INGEST_TOKENS"]
    for name in names:
        monkeypatch.setenv(name, SECRET)
    monkeypatch.setenv("FEATURES_DEVICE", "cpu")
    assert sorted(scrub_environment()) == sorted(names) == sorted(SECRET_ENVIRONMENT)
    assert not any(SECRET in v for v in os.environ.values()) and os.environ["FEATURES_DEVICE"] == "cpu"


def test_a_flink_load_ships_the_store_credentials_and_no_ingest_token() -> None:
    """Issue 29, item 8: ``load --engine flink`` pickles its map function (with the
    settings it carries) into the job graph; the ingest tokens must not be in it."""
    import cloudpickle  # what PyFlink pickles a Python function with (DataStream.map)

    from features.compile import compile_schema
    from features.flink.batch import _shard_load
    from features.schema import load_schema

    token = "ingest-token-xyzzy"
    settings = Settings(postgres_dsn=f"postgresql://app:{SECRET}@db/f", ingest_tokens=(token,),
                        kafka_properties={"sasl.password": "kafka-xyzzy"})
    compiled = compile_schema(load_schema(Path(__file__).parents[2] / "schemas" / "clicks.yaml"))
    graph = cloudpickle.dumps(_shard_load(compiled, ["/x.parquet"], settings, 1, {"run_id": "r"}))
    assert token.encode() not in graph and b"kafka-xyzzy" not in graph
    assert SECRET.encode() in graph  # the workers still get the store credentials


# --------------------------------------------------------------------------- secrets file


def _secrets(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "secrets.toml"
    path.write_text(text)
    path.chmod(mode)
    return path


SECRETS_TOML = f'''
postgres_dsn = "postgresql://app:{SECRET}@db:5432/features?sslmode=require"
redis_url = "rediss://app:{SECRET}@cache:6380/0"

[kafka_properties]
"sasl.username" = "app"
"sasl.password" = "{SECRET}"

[kafka_java_properties]
"sasl.jaas.config" = 'ScramLoginModule required username="app" password="{SECRET}";'
'''


def test_secrets_file_sits_between_the_environment_and_the_project_file(tmp_path: Path) -> None:
    path = _secrets(tmp_path, SECRETS_TOML)
    (tmp_path / "featureline.toml").write_text(
        '[settings]\nredis_url = "redis://file:1/0"\nkafka_bootstrap = "file:9093"\n'
        '[settings.kafka_properties]\n"security.protocol" = "SASL_SSL"\n"sasl.username" = "file"\n'
        '[settings.kafka_java_properties]\n"security.protocol" = "SASL_SSL"\n')
    env = {"FEATURES_SECRETS_FILE": str(path),
           "FEATURES_KAFKA_PROPERTIES": '{"sasl.mechanism": "SCRAM-SHA-512"}'}
    s = resolve_settings(environ=env, root=tmp_path)
    assert s.postgres_dsn.startswith("postgresql://app:") and s.redis_url.startswith("rediss://app:")
    assert s.kafka_bootstrap == "file:9093"                       # only in the project file
    assert dict(s.kafka_properties) == {"security.protocol": "SASL_SSL", "sasl.username": "app",
                                        "sasl.password": SECRET, "sasl.mechanism": "SCRAM-SHA-512"}
    assert set(s.kafka_java_properties) == {"security.protocol", "sasl.jaas.config"}
    assert s.secrets_file == str(path)
    # the environment beats the secrets file; explicit arguments beat both
    env["FEATURES_REDIS_URL"] = "redis://env:2/0"
    assert resolve_settings(environ=env, root=tmp_path).redis_url == "redis://env:2/0"
    assert resolve_settings(environ=env, root=tmp_path, redis_url="redis://arg:3/0").redis_url == \
        "redis://arg:3/0"


def test_secrets_file_named_in_the_project_file_relative_to_the_root(tmp_path: Path) -> None:
    _secrets(tmp_path, 'postgres_dsn = "host=db password=x"\n')
    (tmp_path / "featureline.toml").write_text('[settings]\nsecrets_file = "secrets.toml"\n')
    assert resolve_settings(environ={}, root=tmp_path).postgres_dsn == "host=db password=x"


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o660, 0o620, 0o601])
def test_a_secrets_file_others_or_its_group_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = _secrets(tmp_path, SECRETS_TOML, mode)
    with pytest.raises(ConfigError) as info:
        resolve_settings(environ={"FEATURES_SECRETS_FILE": str(path)}, root=tmp_path)
    assert info.value.key == "secrets_file"
    assert f"{mode:04o}" in str(info.value) and "chmod 600" in str(info.value)
    assert SECRET not in str(info.value)


def test_owner_only_secrets_files_are_read(tmp_path: Path) -> None:
    for mode in (0o600, 0o400):
        path = _secrets(tmp_path, SECRETS_TOML, mode)
        assert read_secrets_file(path)["kafka_properties"]["sasl.password"] == SECRET
    path = _secrets(tmp_path, SECRETS_TOML, 0o640)
    if os.geteuid() == 0:  # a root-owned file may be group-readable (as libpq allows for key files)
        assert read_secrets_file(path)["redis_url"]
    else:
        with pytest.raises(ConfigError):
            read_secrets_file(path)


@pytest.mark.parametrize(("text", "fragment"), [
    (f'device = "gpu"\npostgres_dsn = "postgresql://a:{SECRET}@h/d"\n', "unknown key(s) device"),
    (f'postgres_dsn = "postgresql://a:{SECRET}@h/d\n', "invalid TOML"),          # unterminated
    (f'kafka_properties = "sasl.password={SECRET}"\n', "must be a table"),
    (f'[kafka_properties]\n"bootstrap.servers" = "h:1"\n"sasl.password" = "{SECRET}"\n',
     "must not set bootstrap.servers"),
])
def test_malformed_secrets_files_are_refused_without_quoting_them(tmp_path: Path, text: str,
                                                                  fragment: str) -> None:
    path = _secrets(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        resolve_settings(environ={"FEATURES_SECRETS_FILE": str(path)}, root=tmp_path)
    assert fragment in str(info.value)
    assert SECRET not in str(info.value)


def test_a_missing_secrets_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_settings(environ={"FEATURES_SECRETS_FILE": str(tmp_path / "nope.toml")}, root=tmp_path)
    assert "nope.toml" in str(info.value) and info.value.key == "secrets_file"


@pytest.mark.parametrize("table", [
    f'postgres_dsn = "postgresql://app:{SECRET}@db/f"',
    f'postgres_dsn = "host=db password={SECRET}"',
    f'redis_url = "redis://:{SECRET}@cache:6380/0"',
    f'[settings.kafka_properties]\n"sasl.password" = "{SECRET}"',
    f'[settings.kafka_java_properties]\n"sasl.jaas.config" = "x password={SECRET}"',
])
def test_the_project_file_refuses_credentials(tmp_path: Path, table: str) -> None:
    (tmp_path / "featureline.toml").write_text(f"[settings]\n{table}\n")
    with pytest.raises(ConfigError) as info:
        resolve_settings(environ={}, root=tmp_path)
    assert "carries a credential" in str(info.value) and "FEATURES_SECRETS_FILE" in str(info.value)
    assert SECRET not in str(info.value)


def test_kafka_properties_from_the_environment_are_a_json_object(tmp_path: Path) -> None:
    env = {"FEATURES_KAFKA_PROPERTIES": json.dumps({"security.protocol": "SSL", "enable.ssl.certificate"
                                                    ".verification": False, "socket.timeout.ms": 5000})}
    s = resolve_settings(environ=env, root=tmp_path)
    assert dict(s.kafka_properties) == {"security.protocol": "SSL",
                                        "enable.ssl.certificate.verification": "false",
                                        "socket.timeout.ms": "5000"}
    for bad, fragment in ((f'{{"sasl.password": "{SECRET}"', "not valid JSON"),
                          (f'["sasl.password", "{SECRET}"]', "must be a table/object"),
                          (f'{{"sasl.password": ["{SECRET}"]}}', "must be a string, number or boolean")):
        with pytest.raises(ConfigError) as info:
            resolve_settings(environ={"FEATURES_KAFKA_PROPERTIES": bad}, root=tmp_path)
        assert fragment in str(info.value) and SECRET not in str(info.value)


def test_an_unparsable_dsn_is_refused_without_libpq_quoting_the_password(tmp_path: Path) -> None:
    # libpq's own message here is 'invalid percent-encoded token: "S3cr3t%zz"'
    env = {"FEATURES_POSTGRES_DSN": f"postgresql://app:{SECRET}%zz@db/f"}
    with pytest.raises(ConfigError) as info:
        resolve_settings(environ=env, root=tmp_path)
    assert "FEATURES_POSTGRES_DSN" in str(info.value) and "not a valid libpq" in str(info.value)
    assert SECRET not in str(info.value)


# --------------------------------------------------------------------------- schema YAML


def test_a_schema_has_no_key_that_could_hold_a_credential() -> None:
    text = f"""name: s
version: 1.0.0
postgres_dsn: postgresql://app:{SECRET}@db/f
password: {SECRET}
fields:
  - name: a
    type: int32
    password: {SECRET}
    constraints:
      secret: {SECRET}
"""
    with pytest.raises(SchemaErrors) as info:
        parse_schema(text, "s.yaml")
    keys = {e.key_path for e in info.value.errors}
    assert keys == {"postgres_dsn", "password", "fields[0].password", "fields[0].constraints.secret"}
    assert all("unknown key" in e.reason for e in info.value.errors)
    assert SECRET not in str(info.value)


# --------------------------------------------------------------------------- quoting


@pytest.mark.parametrize("name", [
    'a"b', "a;b", "x'); DROP TABLE t; --", "Amount", "amount ", "a-b", "a$b", "é", "a\x00b", "",
    "_source", "select", "user", "x" * 64,
])
def test_identifiers_outside_the_safe_set_are_refused(name: str) -> None:
    assert identifier_problem(name) is not None


def test_quote_ident_and_quote_literal() -> None:
    assert quote_ident("values") == '"values"'
    assert quote_ident('a"b') == '"a""b"'
    assert quote_literal("x'); DROP TABLE t; --") == "'x''); DROP TABLE t; --'"
    assert quote_literal("C:\\dir\\") == "E'C:\\\\dir\\\\'"
    assert quote_literal("$$") == "'$$'"
    for bad in ("a\x00b", "a\nb", 'x' * 64):
        with pytest.raises(CompileError):
            quote_ident(bad)
    with pytest.raises(CompileError):
        quote_literal("a\x00b")


def test_a_nul_in_an_enum_value_never_reaches_sql() -> None:
    from features.compile import compile_schema

    text = 'name: s\nversion: 1.0.0\nfields:\n  - {name: a, type: enum, values: ["ok", "a\\0b"]}\n'
    # refused by the parser, or else by the DDL renderer (quote_literal): never sent to Postgres
    with pytest.raises((SchemaError, CompileError)) as info:
        _ = compile_schema(parse_schema(text, "s.yaml")).ddl
    if isinstance(info.value, CompileError):
        assert "NUL" in str(info.value)
    else:
        assert "values" in str(info.value)


# --------------------------------------------------------------------------- TLS and Kafka options


def test_redis_tls_parameters() -> None:
    e = RedisEndpoint.from_url("rediss://app:pw@cache:6390/2?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem"
                               "&ssl_keyfile=/k.pem&ssl_check_hostname=false")
    assert (e.tls, e.host, e.port, e.db, e.username, e.password) == (True, "cache", 6390, 2, "app", "pw")
    assert (e.ca_certs, e.certfile, e.keyfile, e.check_hostname) == ("/ca.pem", "/c.pem", "/k.pem", False)
    assert e.redis_py_options() == {"ssl_check_hostname": False}
    assert RedisEndpoint.from_url("redis://h:1/0").redis_py_options() == {}
    with pytest.raises(ConfigError) as info:
        RedisEndpoint.from_url(f"redis://:{SECRET}@h:1/0?ssl_ca_certs=/ca.pem")
    assert "rediss://" in str(info.value) and SECRET not in str(info.value)
    with pytest.raises(ConfigError):
        RedisEndpoint.from_url("rediss://h:1/0?ssl_cert_reqs=maybe")


def test_flink_source_gets_the_java_properties_and_keeps_its_own() -> None:
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="app" '
            f'password="{SECRET}";')
    java = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "group.id": "hijack",
            "sasl.jaas.config": jaas}
    cfg = StreamConfig(schema_path="schemas/clicks.yaml", topic="t", bootstrap="k:9093", postgres_dsn="",
                       redis_url="", kafka_properties={"security.protocol": "SASL_SSL"},
                       kafka_java_properties=java)
    cfg.check()
    opts = source_options(cfg)
    assert opts["properties.security.protocol"] == "SASL_SSL"
    # the SQL connector jar relocates the Kafka client: the login module's class follows
    assert opts["properties.sasl.jaas.config"] == "org.apache.flink.kafka.shaded." + jaas
    assert opts["properties.group.id"] == cfg.group != "hijack"  # the job's own setting wins
    assert opts["properties.bootstrap.servers"] == "k:9093"


def test_confluent_kafka_clients_get_the_properties_and_keep_their_own() -> None:
    from features.stream.kafka import LIBRDKAFKA_LOG, client_config

    props = {"security.protocol": "SSL", "ssl.ca.location": "/ca.pem", "group.id": "hijack"}
    conf = client_config("k:9093", props, **{"group.id": "featureline-lag-r1", "enable.auto.commit": False})
    assert conf == {"bootstrap.servers": "k:9093", "logger": LIBRDKAFKA_LOG, "security.protocol": "SSL",
                    "ssl.ca.location": "/ca.pem", "group.id": "featureline-lag-r1",
                    "enable.auto.commit": False}


def test_secured_kafka_clients_need_java_properties_for_flink() -> None:
    cfg = StreamConfig(schema_path="s.yaml", topic="t", bootstrap="k:9093", postgres_dsn="", redis_url="",
                       kafka_properties={"security.protocol": "SASL_SSL", "sasl.password": SECRET})
    with pytest.raises(ConfigError) as info:
        cfg.check()
    assert info.value.key == "kafka_java_properties" and "FEATURES_KAFKA_JAVA_PROPERTIES" in str(info.value)
    assert SECRET not in str(info.value)


def test_the_default_consumer_group_is_one_per_project_schema_and_topic(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 47: ``featureline-<schema>`` ignored the topic and the project, so two projects on
    one broker shared offsets."""
    from features.flink.stream import default_group_id

    groups = {}
    for project in ("a", "b"):
        (tmp_path / project / "schemas").mkdir(parents=True)
        (tmp_path / project / "featureline.toml").write_text("")
        schema = str(tmp_path / project / "schemas" / "clicks.yaml")
        for topic in ("clicks", "clicks-replay"):
            groups[project, topic] = default_group_id(schema, topic)
    assert len(set(groups.values())) == 4
    first = groups["a", "clicks"]
    assert first.startswith("featureline-a-") and first.endswith("-clicks-clicks")
    # the same project, schema and topic: the same group, whatever the current folder
    monkeypatch.chdir(tmp_path / "b")
    assert default_group_id(str(tmp_path / "a" / "schemas" / "clicks.yaml"), "clicks") == first
