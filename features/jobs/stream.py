"""``features stream`` as a job file: ``flink run -py "$(features job-file stream)" ...`` or
``python -m features.jobs.stream ...``, with the flags of ``features stream``. How it finds the
package it sits in: :mod:`features.jobs`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: its folder is sys.path[0], not the package's parent
    _here = Path(__file__).resolve().parent
    sys.path[:] = [str(_here.parents[1]), *(p for p in sys.path if Path(p or ".").resolve() != _here)]

from features.cli.job_file import run

if __name__ == "__main__":
    sys.exit(run("stream"))
