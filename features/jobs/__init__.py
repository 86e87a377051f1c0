"""The job files ``flink run -py`` takes, shipped in the package.

``features/jobs/stream.py`` is ``features stream`` and ``features/jobs/batch.py`` is
``features load``, with the same flags. Each also runs as a module
(``python -m features.jobs.stream ...``). ``features job-file stream`` prints the path of
the installed file, for ``flink run -py "$(features job-file stream)" ...``; the
repository's ``jobs/*.py`` are thin wrappers over these.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

#: job name -> the ``features`` subcommand it runs.
JOBS = {"stream": "stream", "batch": "load"}


def run(name: str) -> int:
    """Job ``name`` with this process's arguments: what its job file runs."""
    from features.cli import main

    return main([JOBS[name], *sys.argv[1:]])


def job_file(name: str) -> Path:
    """The installed job file for ``name`` (``stream`` or ``batch``)."""
    if name not in JOBS:
        raise ValueError(f"unknown job {name!r}: expected one of {', '.join(JOBS)}")
    return Path(__file__).resolve().parent / f"{name}.py"


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "job-file", help="print the path of an installed job file, for `flink run -py`",
        description="Print the absolute path of the job file that `flink run -py` submits: "
        "`stream` runs `features stream`, `batch` runs `features load`, with the same flags. "
        "Example: flink run -py \"$(features job-file stream)\" -pyfs <featureline wheel> "
        "--schema NAME --topic T --detach (docs/streaming.md, \"On a Flink cluster\").",
    )
    p.add_argument("job", choices=sorted(JOBS), help="which job")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    print(job_file(args.job))
    return 0
