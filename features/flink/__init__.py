"""Featureline on Apache Flink (PyFlink): the environment both jobs set up
(:mod:`features.flink.env`: secrets scrubbed, the Python executables, restarts), the Kafka
connector jar the stream loads (:mod:`features.flink.connector`), the stream job
(:mod:`features.flink.stream`: Kafka -> micro-batches -> the stream processor), the batch
job (:mod:`features.flink.batch`: ``features load --engine flink``) and where the job files
``flink run -py`` takes are (:func:`job_file`; the files themselves are entry points in
the top layer: :mod:`features.jobs` says why).

Imports only the pipeline and what lies below it; PyFlink itself is imported inside the
functions that need it (an optional heavy dependency, about 1 s to import).
"""

from __future__ import annotations

from pathlib import Path

#: job name -> the ``features`` subcommand its job file runs.
JOBS = {"stream": "stream", "batch": "load"}


def job_file(name: str) -> Path:
    """The installed job file for ``name`` (``stream`` or ``batch``): ``features/jobs/NAME.py``."""
    if name not in JOBS:
        raise ValueError(f"unknown job {name!r}: expected one of {', '.join(JOBS)}")
    return Path(__file__).resolve().parents[1] / "jobs" / f"{name}.py"
