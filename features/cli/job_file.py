"""``features job-file NAME``: the path of an installed job file, and what a job file runs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from features.cli import COMMANDS, main
from features.flink import JOBS, job_file


def run(name: str) -> int:
    """Job ``name`` with this process's arguments: what its job file runs
    (:mod:`features.flink.jobs`)."""
    return main([JOBS[name], *sys.argv[1:]])


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "job-file", help=COMMANDS["job-file"].summary,
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
