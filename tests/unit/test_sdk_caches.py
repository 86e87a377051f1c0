"""The SDK's per-process caches stay bounded and cost O(1) per call whatever callers ask:
the fallback's negative cache (``features.sdk.fallback.NegativeCache``) and the schema
look-up of ``FeatureStore.schema`` (an unknown name parses no YAML again). Work is
counted (hash calls, YAML parses), never timed. No service is reached."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import features.schema.parse as parse
from features import FeatureStore
from features.errors import ConfigError, SchemaError
from features.sdk.fallback import NegativeCache
from features.sdk.store import UNKNOWN_SCHEMA

ROOT = Path(__file__).resolve().parents[2]


class Key:
    """A cache key that counts how often any key is hashed: the work a dict does on it."""

    hashed = 0

    def __init__(self, n: int) -> None:
        self.n = n

    def __hash__(self) -> int:
        Key.hashed += 1
        return hash(self.n)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and other.n == self.n


def test_a_full_negative_cache_adds_in_constant_work_and_stays_bounded() -> None:
    cache = NegativeCache(ttl_s=60.0)
    live = 100_001  # past the old rebuild threshold: every add then re-hashed every entry
    cache.add((Key(i) for i in range(live)), now=0.0)
    Key.hashed = 0
    adds = 20
    for i in range(adds):
        cache.add([Key(live + i)], now=1.0 + i)  # nothing has expired: all entries are live
    assert Key.hashed <= 4 * adds  # O(1) per add (the old cache: ~2,000,000)
    assert len(cache) <= NegativeCache.MAX_ENTRIES
    assert cache.absent(Key(live + adds - 1), 30.0)  # the newest are kept
    assert not cache.absent(Key(0), 30.0)  # the oldest made room


def test_the_negative_cache_evicts_the_oldest_and_forgets_the_expired() -> None:
    cache = NegativeCache(ttl_s=10.0, max_entries=3)
    cache.add(["a", "b", "c"], now=0.0)
    cache.add(["d"], now=1.0)  # full: the oldest ("a") makes room
    assert cache.evicted == 1 and len(cache) == 3
    assert [k for k in "abcd" if cache.absent(k, 2.0)] == ["b", "c", "d"]
    cache.add(["b"], now=5.0)  # re-added: now the newest, expiring at 15
    cache.add(["e"], now=10.5)  # "c" (10) expired and is dropped, not evicted; "d" (11) is live
    assert cache.evicted == 1 and len(cache) == 3
    assert [k for k in "bcde" if cache.absent(k, 10.5)] == ["b", "d", "e"]
    assert not cache.absent("d", 11.0) and len(cache) == 2  # expired: forgotten on look-up
    off = NegativeCache(ttl_s=0.0)
    off.add(["a"], now=0.0)
    assert len(off) == 0 and not off.absent("a", 0.0)


@pytest.fixture()
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths of every schema file parsed (``features.schema.parse._parse``) from now on."""
    seen: list[str] = []
    real = parse._parse

    def counting(text: str, path: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(path)
        return real(text, path, *args, **kwargs)

    monkeypatch.setattr(parse, "_parse", counting)
    yield seen


def store(schemas: Path) -> FeatureStore:
    # Nothing here reaches a service: the schema look-up reads files only.
    return FeatureStore(redis_url="redis://127.0.0.1:1/0", postgres_dsn="postgresql://u@127.0.0.1:1/d",
                        schemas=schemas)


def test_unknown_schema_names_parse_no_yaml_again(tmp_path: Path, parses: list[str]) -> None:
    schemas = tmp_path / "schemas"
    shutil.copytree(ROOT / "schemas", schemas)
    files = len(list(schemas.glob("*.yaml")))
    with store(schemas) as fs:
        for i in range(50):
            with pytest.raises(ConfigError) as err:
                fs.schema(f"no_such_schema_{i}")
            assert err.value.key == "schema" and "clicks" in str(err.value)  # names the known ones
        fs.schema("clicks")
        fs.schema("credit_applicant")
        assert len(parses) == files  # every file once, for 50 unknown names and two known ones
        # A file added to the folder (its mtime changes) is found without a new store.
        (schemas / "extra.yaml").write_text((schemas / "clicks.yaml").read_text().replace(
            "name: clicks", "name: extra", 1))
        assert fs.schema("extra").name == "extra"
        assert len(parses) == 2 * files + 1
        with pytest.raises(ConfigError):
            fs.schema("still_unknown")
        assert len(parses) == 2 * files + 1


def test_a_broken_schema_folder_is_parsed_once_and_its_error_raised_each_time(
        tmp_path: Path, parses: list[str]) -> None:
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "bad.yaml").write_text("name: bad\nversion: 1.0.0\nfields: 3\n")
    with store(schemas) as fs:
        for _ in range(5):
            with pytest.raises(SchemaError) as err:
                fs.schema("bad")
            assert "bad.yaml" in str(err.value)
    assert len(parses) == 1


def test_calls_for_unknown_schemas_count_under_one_label(tmp_path: Path) -> None:
    """Each unknown schema name a caller sends must not become a metrics series of its
    own (the registry would grow for the process's life)."""
    from features.observe.metrics import parse_exposition, sample_value

    with store(ROOT / "schemas") as fs:
        for i in range(200):
            with pytest.raises(ConfigError):
                fs.online(f"no_such_schema_{i}", ["x"])
            with pytest.raises(ConfigError):
                fs.historical(f"no_such_schema_{i}", None)
        samples = [s for s in parse_exposition(fs.metrics()) if s.name == "featureline_sdk_errors_total"]
        assert {s.labels["schema"] for s in samples} == {UNKNOWN_SCHEMA}
        assert sample_value(samples, "featureline_sdk_errors_total", method="online") == 200
        assert sample_value(samples, "featureline_sdk_errors_total", method="historical") == 200
