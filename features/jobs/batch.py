"""``features load`` as a job file: ``flink run -py "$(features job-file batch)" ...`` or
``python -m features.jobs.batch ...``, with the flags of ``features load``.

``flink run -py`` runs this file as a script, with its own folder (not the one holding
the package) first on ``sys.path``; the folder above the package is put first so the
package imports the same way it does installed or shipped with ``-pyfs``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: its folder is sys.path[0], not the package's parent
    _here = Path(__file__).resolve().parent
    sys.path[:] = [str(_here.parents[1]), *(p for p in sys.path if Path(p or ".").resolve() != _here)]

from features.jobs import run

if __name__ == "__main__":
    sys.exit(run("batch"))
