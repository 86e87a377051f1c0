"""``features serve --delivery-timeout``: seconds, at least 0.1, 15 by default (librdkafka's
``delivery.timeout.ms``; the broker-down 503 itself: ``test_serve.py``)."""

from __future__ import annotations

import argparse

import pytest

from features.cli.serve import ServeOptions, _delivery_seconds
from features.serve.producer import DELIVERY_TIMEOUT_MS


def test_delivery_timeout_takes_seconds_of_at_least_a_tenth() -> None:
    assert _delivery_seconds("2") == 2.0 and _delivery_seconds("0.1") == 0.1
    for bad in ("0", "0.05", "-1", "soon"):
        with pytest.raises(argparse.ArgumentTypeError):
            _delivery_seconds(bad)


def test_the_default_is_15_s() -> None:
    assert DELIVERY_TIMEOUT_MS == 15_000
    options = ServeOptions("schemas", ("s",), "{schema}", "", 1, False, None, True, "run", None)
    assert options.delivery_timeout_s * 1000 == DELIVERY_TIMEOUT_MS
