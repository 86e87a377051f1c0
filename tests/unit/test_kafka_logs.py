"""librdkafka's own log lines go through featureline's logging (issue 29, item 15).

Without a ``logger`` in a confluent-kafka client's configuration, librdkafka writes its
lines to stderr itself, raw (``%3|1714567890.123|FAIL|rdkafka#producer-1| ...``): a
``--log-format json`` run is then no longer JSON, and a normal run shows its info lines.
Every client featureline creates takes its configuration from
``features.stream.kafka.client_config``, which routes them to the ``features.kafka``
logger at their syslog levels, info and notice lines at DEBUG.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: A raw librdkafka line: "%<syslog level>|<time>|<facility>|<client>| <text>".
RAW = re.compile(r"%\d\|")

#: Creates each kind of client through featureline against a broker that is not there
#: (a free port), polls it briefly and closes it.
SCRIPT = r"""
import socket, sys
from features.observe.logs import setup_logging
setup_logging(sys.argv[1])
from confluent_kafka import Producer
from features.stream.kafka import client_config, ensure_topic, topic_max_message_bytes, topic_size
s = socket.socket(); s.bind(("127.0.0.1", 0)); bootstrap = "127.0.0.1:%d" % s.getsockname()[1]; s.close()
for call in (lambda: topic_size(bootstrap, "t", timeout_s=1.0),
             lambda: ensure_topic(bootstrap, "t", timeout_s=1.0)):
    try:
        call()
    except Exception:
        pass
topic_max_message_bytes(bootstrap, "t", timeout_s=0.5)
p = Producer(client_config(bootstrap, **{"enable.idempotence": True}))
p.produce("t", b"x")
p.poll(1.0)
p.flush(0.5)
del p
"""


def _run(fmt: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, fmt], capture_output=True, text=True, env=env,
                          timeout=120, check=True)
    return [line for line in done.stderr.splitlines() if line]


def test_json_mode_stays_json_with_librdkafka_lines_in_it() -> None:
    lines = _run("json")
    raw = [line for line in lines if RAW.search(line)]
    assert raw == []
    records = [json.loads(line) for line in lines]
    assert all(isinstance(r, dict) for r in records)
    kafka = [r for r in records if r["logger"].startswith("features.kafka")]
    # the refused connections, at librdkafka's level for them (LOG_ERR)
    assert any(r["level"] == "ERROR" and "Connect to" in r["message"] for r in kafka), lines[:5]


def test_text_mode_shows_no_raw_librdkafka_lines() -> None:
    lines = _run("text")
    assert [line for line in lines if RAW.search(line)] == []
    assert any(" ERROR features.kafka" in line and "Connect to" in line for line in lines), lines[:5]


@pytest.mark.parametrize(("given", "logged"), [
    (logging.CRITICAL, logging.CRITICAL), (logging.ERROR, logging.ERROR), (logging.WARNING, logging.WARNING),
    (logging.INFO, logging.DEBUG), (logging.DEBUG, logging.DEBUG)])
def test_librdkafka_info_lines_are_debug(given: int, logged: int, caplog: pytest.LogCaptureFixture) -> None:
    """confluent-kafka calls the logger's ``log`` with syslog levels mapped to logging's
    (notice and info both INFO): info becomes DEBUG, so a normal run is quiet."""
    from features.stream.kafka import client_config

    logger = client_config("127.0.0.1:1")["logger"]
    with caplog.at_level(logging.DEBUG, logger="features.kafka"):
        logger.log(given, "%s [%s] %s", "BGQUEUE", "rdkafka#producer-3", "Purging 1 unserved events")
    [record] = [r for r in caplog.records if r.name.startswith("features.kafka")]
    assert record.levelno == logged
    assert record.getMessage() == "BGQUEUE [rdkafka#producer-3] Purging 1 unserved events"
