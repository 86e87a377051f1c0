"""Batch job entry point: ``python jobs/batch_job.py --schema NAME PATH...``.

The same arguments and code path as ``features load`` (``--help`` lists them). On a
Flink cluster: ``<pyflink>/bin/flink run -py jobs/batch_job.py -pyexec .venv/bin/python
-pyclientexec .venv/bin/python --schema NAME --parallelism N PATH...`` runs the load as a
Flink BATCH job there (``--engine flink`` is the default under ``flink run``; the files
must be at the same paths on every TaskManager). See docs/loading.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `flink run -py` starts this file with the repository root not on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from features.cli.job_file import run

if __name__ == "__main__":
    sys.exit(run("batch"))
