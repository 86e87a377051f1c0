"""Redis Cluster key slots (vectorised vs the spec's scalar definition) and cluster URLs."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from features.compile.layout import key_slot, key_slots
from features.errors import ConfigError
from features.sinks.redis_wire import RedisEndpoint


def test_slots_of_the_specs_examples() -> None:
    # CRC16-XMODEM("123456789") = 0x31C3 (the Redis Cluster spec's check value)
    assert key_slot("123456789") == 0x31C3 % 16384
    # a hash tag: only the text between the first { and the next } is hashed
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers") == key_slot("user1000")
    assert key_slot("foo{}{bar}") == key_slot(b"foo{}{bar}")  # empty tag: the whole key
    assert key_slot("foo{{bar}}zap") == key_slot("{bar")
    assert key_slot("foo{bar}{zap}") == key_slot("bar")


keys = st.lists(st.text(alphabet=st.sampled_from("ab{}:é\x00z"), max_size=12)
                | st.builds(lambda e: f"features:s:{{{e}}}", st.text(max_size=20)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(keys)
def test_vectorised_slots_equal_the_scalar_definition(values: list[str]) -> None:
    arr = pa.array(values, pa.string())
    assert key_slots(arr).tolist() == [key_slot(v) for v in values]
    if len(values) > 3:  # sliced arrays (an offset into the buffers) too
        assert key_slots(arr.slice(2)).tolist() == [key_slot(v) for v in values[2:]]
        chunked = pa.chunked_array([arr.slice(0, 2), arr.slice(2)])
        assert key_slots(chunked).tolist() == [key_slot(v) for v in values]


def test_cluster_urls_parse_with_every_seed_and_keep_credentials_out_of_repr() -> None:
    e = RedisEndpoint.from_url("redis+cluster://app:s3cret@10.0.0.1:7001,10.0.0.2:7002,10.0.0.3")
    assert e.cluster and e.seeds == (("10.0.0.1", 7001), ("10.0.0.2", 7002), ("10.0.0.3", 6379))
    assert (e.host, e.port, e.username, e.password, e.tls) == ("10.0.0.1", 7001, "app", "s3cret", False)
    assert "s3cret" not in repr(e)
    tls = RedisEndpoint.from_url("rediss+cluster://h1:7001,h2:7002?ssl_ca_certs=/ca.pem")
    assert tls.tls and tls.ca_certs == "/ca.pem" and tls.seeds == (("h1", 7001), ("h2", 7002))
    assert not RedisEndpoint.from_url("redis://127.0.0.1:6380/0").cluster


@pytest.mark.parametrize("url, message", [
    ("redis+cluster://h1:7001/3", "only database 0"),
    ("redis+cluster://h1:x", "invalid port"),
    ("redis+cluster://", "no cluster node"),
    ("memcached://h1:11211", "expected redis://"),
])
def test_bad_cluster_urls_are_config_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RedisEndpoint.from_url(url)


def test_a_script_refused_a_migrating_key_is_retried_and_other_errors_are_not() -> None:
    """Mid-migration, Redis 7.0 answers a script whose DEL + HSET meets a key that left
    the slot with this -ERR instead of -ASK; it must be retried like -TRYAGAIN (a full
    suite once failed a reshard-mid-load test on it), and no other -ERR may be."""
    from features.sinks.redis_cluster import retry_later
    from features.sinks.redis_wire import ReplyError

    moving = ReplyError("ERR Script attempted to access a non local key in a cluster node script: "
                        "f_1234abcd (call to f_1234abcd): @user_script:11: ...")
    assert retry_later(moving)
    assert retry_later(ReplyError("TRYAGAIN Multiple keys request during rehashing of slot"))
    assert retry_later(ReplyError("CLUSTERDOWN The cluster is down"))
    assert not retry_later(ReplyError("ERR wrong number of arguments for 'hset' command"))
    assert not retry_later(ReplyError("WRONGTYPE Operation against a key holding the wrong kind of value"))
    assert not retry_later(ReplyError("CROSSSLOT Keys in request don't hash to the same slot"))


long_keys = st.lists(st.binary(max_size=6)
                     | st.builds(lambda a, tag, b: a + tag + b,
                                 st.binary(max_size=3000),
                                 st.sampled_from([b"{", b"}", b"{}", b"{x}", b"}{"]),
                                 st.binary(max_size=3000)), max_size=30)


@settings(max_examples=150, deadline=None)
@given(long_keys)
def test_vectorised_slots_of_ragged_binary_keys_equal_the_scalar_definition(values: list[bytes]) -> None:
    """Keys of very different lengths (a few KB beside empty ones), any bytes, braces
    anywhere: each key's slot is still the spec's."""
    arr = pa.array(values, pa.binary())
    assert key_slots(arr).tolist() == [key_slot(v) for v in values]


_PEAK = """
import resource, sys
import pyarrow as pa
from features.compile.layout import key_slots
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a regression fails, not the machine
n, long_len, with_long = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
keys = [f"features:s:{{APP-{i:012d}}}" for i in range(n)]
if with_long:
    keys[n // 2] = "x" * long_len
slots = key_slots(pa.array(keys, pa.string()))
assert len(slots) == n
# VmHWM: this image's own peak (ru_maxrss keeps the forking pytest's across exec, which
# would hide the difference once pytest is larger than both children)
print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def _peak_kib(n: int, long_len: int, with_long: bool) -> int:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", _PEAK, str(n), str(long_len), "1" if with_long else "0"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout.split()[-1])


@pytest.mark.parametrize("n, long_len", [(2_000, 20_000), (131_072, 100_000)])
def test_one_long_key_costs_memory_for_its_own_bytes_only(n: int, long_len: int) -> None:
    """Peak RSS of a child computing the slots, with one long key among short ones,
    against the same keys without it: the long key adds about its own size (was: rows times
    the longest key, 773 MB for one 20 KB key among 2,000)."""
    extra_mib = (_peak_kib(n, long_len, True) - _peak_kib(n, long_len, False)) / 1024
    assert extra_mib < 32, f"one {long_len}-byte key among {n} added {extra_mib:.0f} MiB of peak memory"
