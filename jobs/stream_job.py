"""Stream job entry point: ``python jobs/stream_job.py --schema NAME --topic T ...``.

The same code and flags as ``features stream`` (``--help`` lists them). On a Flink
cluster: ``<pyflink>/bin/flink run -py jobs/stream_job.py -pyexec .venv/bin/python
-pyclientexec .venv/bin/python --schema NAME --topic T --detach``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `flink run -py` starts this file with the repository root not on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from features.cli.job_file import run

if __name__ == "__main__":
    sys.exit(run("stream"))
