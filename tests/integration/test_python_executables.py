"""``python_executables``: a job gives its Python workers this process's interpreter only
where the submitter chose none (``flink run -pyexec`` must win; it once did not)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.flink

# One JVM for the three cases: an environment as a job makes it, with what `flink run
# -pyexec/-pyclientexec` (or a cluster's config.yaml) would have put in its configuration.
SCRIPT = """
import json, sys
from pyflink.common import Configuration
from pyflink.datastream import StreamExecutionEnvironment
from features.flink.env import python_executables

out = {}
both = {"python.executable": "/opt/w/python", "python.client.executable": "/opt/c/python"}
for label, given in [("none", {}), ("pyexec", {"python.executable": "/opt/cluster/bin/python3"}),
                     ("both", both)]:
    conf = Configuration()
    for k, v in given.items():
        conf.set_string(k, v)
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    out[label] = python_executables(env)
print(json.dumps({"sys": sys.executable, **out}))
"""


def test_the_submitters_choice_wins_and_this_python_fills_the_gaps() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    me = got["sys"]
    assert got["none"] == {"python.executable": me, "python.client.executable": me}
    assert got["pyexec"] == {"python.executable": "/opt/cluster/bin/python3", "python.client.executable": me}
    assert got["both"] == {"python.executable": "/opt/w/python", "python.client.executable": "/opt/c/python"}
