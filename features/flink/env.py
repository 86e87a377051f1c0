"""The PyFlink environment both jobs set up (:mod:`features.flink.stream`,
:mod:`features.flink.batch`): the client's environment scrubbed of secrets, the Python
executables of the workers and the client, and the restart strategy."""

from __future__ import annotations

import os
import sys
from typing import Any

from features.config import SECRET_ENVIRONMENT
from features.flink.cluster import flink_python_jar, split_address


def scrub_environment() -> list[str]:
    """Remove ``features.config.SECRET_ENVIRONMENT`` (every secret-bearing setting's
    variable) from ``os.environ`` (this process: the job's
    client, whose environment the local Flink JVM inherits). Returns the names removed.
    Variables libpq or other drivers read themselves (``PGPASSWORD``) are kept, since a
    worker may need them: put such credentials in the DSN or the secrets file instead."""
    removed = [name for name in SECRET_ENVIRONMENT if name in os.environ]
    for name in removed:
        del os.environ[name]
    return removed


def python_executables(env: Any) -> dict[str, str]:
    """Give ``env`` (a PyFlink ``StreamExecutionEnvironment``) this process's Python for
    its Python workers (``python.executable``) and client (``python.client.executable``)
    where the submitter chose none: ``flink run -pyexec``/``-pyclientexec`` or the
    cluster's ``config.yaml`` win. Returns the two settings in effect.

    Not set in the ``Configuration`` the environment is created with: under ``flink run``
    that one is stacked on top of the submitter's options, so it would replace ``-pyexec``
    (measured with PyFlink 2.2.1: the TaskManagers ran the client's Python instead). Flink's
    own default is ``python``, which Debian does not have."""
    # pyflink: heavy, and only a Flink job needs it (no other entry point loads it)
    from pyflink.java_gateway import get_gateway

    jvm = get_gateway().jvm
    conf = jvm.org.apache.flink.python.util.PythonConfigUtil.getEnvironmentConfig(
        env._j_stream_execution_environment)
    chosen: dict[str, str] = {}
    for key in ("python.executable", "python.client.executable"):
        if not conf.containsKey(key):
            conf.setString(key, sys.executable)
        chosen[key] = str(conf.getString(key, sys.executable))
    return chosen


def restart_strategy(conf: Any, attempts: int) -> None:
    """Set ``conf`` (a PyFlink ``Configuration``) to restart a failed task ``attempts``
    times, 2 s apart; no restart when ``attempts`` is 0 or less."""
    if attempts > 0:
        conf.set_string("restart-strategy.type", "fixed-delay")
        conf.set_string("restart-strategy.fixed-delay.attempts", str(attempts))
        conf.set_string("restart-strategy.fixed-delay.delay", "2 s")
    else:
        conf.set_string("restart-strategy.type", "none")



def environment(conf: Any, cluster: str | None) -> Any:
    """The PyFlink ``StreamExecutionEnvironment`` of ``conf`` (a PyFlink ``Configuration``):
    with ``cluster`` (the REST address ``host:port`` of a running Flink cluster:
    ``features.flink.cluster.resolve``), one that submits there (``execution.target:
    remote``), with PyFlink's ``flink-python`` jar in ``pipeline.jars`` as ``flink run`` adds
    it (a standalone cluster's ``lib/`` lacks the Python operators' Java side); without, the
    context's: a mini-cluster in this process's JVM, or the cluster ``flink run`` chose.

    Not ``get_execution_environment(conf)`` with ``execution.target: remote``: outside ``flink
    run`` that makes a local environment, which forces the target back to local (measured
    with PyFlink 2.2.1: the job started a mini-cluster on the remote's REST port)."""
    # pyflink: heavy, and only a Flink job needs it (no other entry point loads it)
    from pyflink.datastream import StreamExecutionEnvironment

    if cluster is None:
        return StreamExecutionEnvironment.get_execution_environment(conf)
    # pyflink: heavy, and only a Flink job needs it (no other entry point loads it)
    from pyflink.java_gateway import get_gateway

    host, port = split_address(cluster)
    conf.set_string("execution.target", "remote")
    conf.set_string("rest.address", host)
    conf.set_string("rest.port", str(port))
    j_env_class = get_gateway().jvm.org.apache.flink.streaming.api.environment.StreamExecutionEnvironment
    env = StreamExecutionEnvironment(j_env_class(conf._j_configuration))
    env.add_jars(flink_python_jar().as_uri())
    return env
