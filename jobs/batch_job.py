"""Batch job entry point: ``python jobs/batch_job.py --schema NAME PATH...``.

A thin wrapper over ``features load`` (same arguments, same code path).
"""

from __future__ import annotations

import sys

from features.cli import main

if __name__ == "__main__":
    sys.exit(main(["load", *sys.argv[1:]]))
