"""A password never shows, whatever characters it holds (issue 29, item 5): in
``redact()``'s output, ``Settings`` and ``StreamConfig`` as they are printed, the
``stream: submitting`` log line (text and JSON), and the errors that quote a URL.

Passwords are drawn over the characters that separate URL parts (``? # & @ / \\ :``),
quotes and spaces, and written the ways a user writes them: raw in a URL (what libpq and
urlsplit read differently), percent-encoded, and in libpq ``key=value`` form (quoted
with backslash escapes, or unquoted with a backslash before each space).
"""

from __future__ import annotations

import json
import logging
from urllib.parse import quote

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from features.config import Settings, redact
from features.errors import ConfigError
from features.flink.stream import StreamConfig, redacted
from features.observe.logs import JsonFormatter, TextFormatter, fields
from features.sinks.redis_wire import RedisEndpoint

#: the characters that end a URL part somewhere, quotes, spaces, and some plain ones
_ALPHABET = "?#&@/\\: '\"=%aZ9-_."
PASSWORDS = st.text(alphabet=_ALPHABET, min_size=6, max_size=24).filter(lambda p: p.strip() == p)


def _forms(password: str) -> list[str]:
    """``password`` in every DSN and URL form a user may write it."""
    escaped = password.replace("\\", "\\\\").replace("'", "\\'")
    unquoted = "".join(f"\\{c}" if c in " \\'" else c for c in password)
    return [
        f"postgresql://app:{password}@db:5432/f",
        f"postgresql://app:{password}@db:5432/f?sslmode=require&application_name=x",
        f"postgresql://app:{quote(password, safe='')}@db/f",
        f"postgresql://app@db/f?password={quote(password, safe='')}&sslmode=require",
        f"redis://:{password}@cache:6379/0",
        f"rediss://user:{password}@cache:6380/0?ssl_ca_certs=/ca.pem",
        f"host=db user=app password='{escaped}' dbname=f",
        f"host=db password = '{escaped}'",
        f"host=db user=app password={unquoted} dbname=f",
        f"host=db user=app password='x://{escaped}' dbname=f",
    ]


def _shown(password: str) -> list[str]:
    """``password`` as it would appear if leaked: raw, and inside a JSON string."""
    return [password, json.dumps(password)[1:-1]]


def _leaks(password: str, text: str) -> bool:
    return any(form in text for form in _shown(password))


@settings(max_examples=300, deadline=None)
@given(PASSWORDS)
def test_redact_never_shows_the_password(password: str) -> None:
    for dsn in _forms(password):
        assume(not _leaks(password, dsn.replace(password, "").replace(quote(password, safe=""), "")))
        assert not _leaks(password, redact(dsn)), (dsn, redact(dsn))


@settings(max_examples=150, deadline=None)
@given(PASSWORDS)
def test_settings_config_and_the_submitting_line_never_show_it(password: str) -> None:
    dsn = f"postgresql://app:{password}@db:5432/f"
    url = f"redis://:{password}@cache:6379/0"
    s = Settings(postgres_dsn=dsn, redis_url=url)
    cfg = StreamConfig(schema_path="s.yaml", topic="t", bootstrap="k:9092", postgres_dsn=dsn, redis_url=url)
    record = logging.LogRecord("features.stream", logging.INFO, __file__, 1, "stream: submitting", (), None)
    for k, v in fields(redacted(cfg)).items():
        setattr(record, k, v)
    record.run_id = "r"
    texts = [repr(s), str(s), json.dumps(s.redacted()), repr(cfg),
             JsonFormatter().format(record), TextFormatter().format(record)]
    for text in texts:
        assert not _leaks(password, text), text


@settings(max_examples=100, deadline=None)
@given(PASSWORDS)
def test_errors_that_quote_a_redis_url_never_show_it(password: str) -> None:
    """Every URL here is refused, so every example reads an error that quotes the URL: the
    password percent-encoded (any password), and raw where it holds none of ``? # /``
    (those end the URL's user part early: the URL then names another host, no error)."""
    urls = [f"redis://:{quote(password, safe='')}@cache:notaport/0",
            f"redis+cluster://:{quote(password, safe='')}@h:1/3"]
    if not set("?#/") & set(password):
        urls += [f"redis://:{password}@cache:notaport/0", f"redis+cluster://:{password}@h:1/3"]
    for url in urls:
        with pytest.raises(ConfigError) as info:
            RedisEndpoint.from_url(url)
        assert ":***@" in str(info.value), str(info.value)  # it quotes the URL, redacted
        assert not _leaks(password, str(info.value)), str(info.value)
        assert quote(password, safe="") not in str(info.value), str(info.value)


@pytest.mark.parametrize(("value", "want"), [
    # issue 29's three reproductions
    ("postgresql://app:s3cr?t@db:5432/f", "postgresql://app:***@db:5432/f"),
    ("redis://:p?w@h:6379/0", "redis://:***@h:6379/0"),
    ("host=db password=abc\\ def dbname=f", "host=db password=*** dbname=f"),
    ("postgresql://app:a#b/c d@db/f?sslmode=require", "postgresql://app:***@db/f?sslmode=require"),
    ("postgresql://app@db/f?sslmode=require", "postgresql://app@db/f?sslmode=require"),
    # a key=value DSN whose password holds '://' (libpq reads it as key=value, not a URL)
    ("host=h password=a://b@c dbname=f", "host=h password=*** dbname=f"),
    ("host=h password='x://y' dbname=f", "host=h password=*** dbname=f"),
])
def test_the_reported_cases(value: str, want: str) -> None:
    assert redact(value) == want
