"""Argument types and arguments that several commands share.

A command module imports what its command runs at its top, so one command module never
imports another (``features topics --help`` would import what ``features serve`` runs):
what two commands share lives here, and this module imports nothing heavy (argparse, the
errors, the Flink cluster's address lookup, which is the standard library only).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket

from features.errors import ConfigError
from features.flink.cluster import resolve as resolve_cluster

#: seconds to wait for the broker's answer (``--timeout`` of ``topics`` and ``produce``)
DEFAULT_KAFKA_TIMEOUT_S = 10.0
#: The exit code of a load or a stream a breached ``fail`` quality gate refused or stopped
#: (and of ``features load --check-gates`` when one is breached): apart from 1 (counts that
#: do not add up: a bug) and 2 (usage, schema, source or store errors), so a scheduler can
#: tell "the data was refused" (call its owner) from a failure of the pipeline.
EXIT_GATE_REFUSED = 3


def _integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {what} {text!r}") from None


def port_number(text: str) -> int:
    """A TCP port, 0 (a free one) to 65535."""
    port = _integer(text, "port")
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is not in 0..65535")
    return port


def positive_count(text: str) -> int:
    """A whole number, at least 1."""
    n = _integer(text, "count")
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def positive_seconds(text: str) -> float:
    """Seconds, more than 0."""
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seconds {text!r}") from None
    if not s > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return s


def add_cluster_argument(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """``--cluster [ADDRESS]``: submit the Flink job to a running cluster (``features load
    --engine flink``, ``features stream``)."""
    p.add_argument("--cluster", nargs="?", const="project", default=None, metavar="ADDRESS",
                   help=f"{prefix}submit the Flink job to a running Flink cluster instead of a mini-cluster "
                   "in this process: alone, this project's (`features dev up --flink-cluster`, its address "
                   "in .dev/flink/cluster.json); or the REST address HOST:PORT (the web UI's) of another, "
                   "whose TaskManagers run this Python (python.executable) at the same path, with "
                   "featureline installed; for a real cluster see `flink run` in docs/streaming.md. Not "
                   "under `flink run` (its -m chooses)")


def flink_cluster(arg: str | None) -> str | None:
    """``--cluster``'s REST address (``features.flink.cluster.resolve``); refused under ``flink
    run``, whose client already talks to a cluster."""
    if arg is not None and "PYFLINK_GATEWAY_PORT" in os.environ:
        raise ConfigError("--cluster does not apply under `flink run` (its -m chooses the cluster)",
                          key="cluster")
    return resolve_cluster(arg)


def add_metrics_arguments(p: argparse.ArgumentParser, when: str, end: str) -> None:
    """``--metrics-port``, ``--metrics-host``, ``--metrics-linger-s`` (the loader's and the stream's)."""
    p.add_argument("--metrics-port", type=port_number, default=None, metavar="PORT",
                   help=f"serve Prometheus metrics on http://HOST:PORT/metrics {when} (docs/operations.md)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address the metrics endpoint listens on (default 127.0.0.1, this machine only; "
                   "0.0.0.0 for every interface)")
    p.add_argument("--metrics-linger-s", type=float, default=0.0, metavar="SECONDS",
                   help=f"keep serving the metrics this many seconds {end}, so a scraper sees the final "
                   "values (default 0)")


def add_kafka_arguments(p: argparse.ArgumentParser) -> None:
    """``--schemas-dir``, ``--bootstrap`` and ``--timeout`` (``topics`` and ``produce``)."""
    p.add_argument("--schemas-dir", default=None, help="folder of schema YAML files (default: schemas)")
    p.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: the settings' "
                   "kafka_bootstrap, FEATURES_KAFKA_BOOTSTRAP)")
    p.add_argument("--timeout", type=positive_seconds, default=DEFAULT_KAFKA_TIMEOUT_S, metavar="SECONDS",
                   help=f"how long to wait for the broker to answer before exit 2 (default "
                   f"{DEFAULT_KAFKA_TIMEOUT_S:g})")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one), inheritable by worker
    processes; ConfigError naming the address when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}", key="port") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
