"""The class-data-sharing archive the test session gives PyFlink's JVMs (``tests/jvm_archive.py``):
it fits the local gateway's class path, and a JVM it does not fit runs without it, silently."""

from __future__ import annotations

import os
import subprocess

import pytest
from jvm_archive import QUIET, gateway_class_path, java_executable, pyflink_archive

pytestmark = [pytest.mark.flink]


def _java(*args: str) -> subprocess.CompletedProcess[str]:
    java = java_executable()
    assert java is not None, "no java: PyFlink needs one (JAVA_HOME or PATH)"
    return subprocess.run([str(java), *args, "-version"], capture_output=True, text=True, timeout=120)


def test_the_archive_maps_into_the_gateways_jvm_and_a_jvm_it_does_not_fit_says_nothing() -> None:
    archive = pyflink_archive(os.environ["JVM_ARGS"])
    assert archive is not None and archive.stat().st_size > 10_000_000, archive
    if "SharedArchiveFile" in os.environ["JVM_ARGS"]:  # the session's JVMs get this archive
        assert f"-XX:SharedArchiveFile={archive}" in os.environ["JVM_ARGS"].split()
    cp = gateway_class_path()
    # -Xshare:on: a JVM that cannot map the archive exits with an error instead of going on
    fits = _java("-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", cp)
    assert fits.returncode == 0 and "sharing" in fits.stderr, fits.stderr[-2000:]
    other = os.pathsep.join(cp.split(os.pathsep)[1:])  # another class path: the archive does not fit
    refused = _java("-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", other)
    assert refused.returncode != 0, refused.stderr[-2000:]
    quiet = _java(f"-XX:SharedArchiveFile={archive}", *QUIET, "-cp", other)
    assert quiet.returncode == 0 and quiet.stdout == "" and "cds" not in quiet.stderr, quiet.stderr[-2000:]
    assert quiet.stderr.startswith("openjdk version") or "version" in quiet.stderr.splitlines()[0]
