"""The job files ``flink run -py`` takes, shipped in the package.

``features/jobs/stream.py`` is ``features stream`` and ``features/jobs/batch.py`` is
``features load``, with the same flags. Each also runs as a module
(``python -m features.jobs.stream ...``). ``features job-file stream`` prints the path of
the installed file (:func:`features.flink.job_file`), for ``flink run -py "$(features
job-file stream)" ...``; the repository's ``jobs/*.py`` are thin wrappers over these.

**Why here, not in** ``features/flink/``: a job file is an entry point that runs a command
(:func:`features.cli.job_file.run`), so it imports ``features.cli``, the top layer of the
import contract. Inside ``features/flink/`` it would be an arrow against the flow, and the
contract cannot name it as a layer of its own there (import-linter: "layers cannot contain
other layers"), so the job files sit in the top layer beside ``features.cli``. Their path
lookup (:func:`features.flink.job_file`, which ``features demo`` uses too) and everything
the jobs run is in ``features/flink/``.

``flink run -py`` runs a job file as a script, with its own folder (or a temporary one
linking to it) on ``sys.path`` and the package not importable from there, so each file
first puts the folder above the package first on ``sys.path`` and drops its own: the
package then imports the same way it does installed or shipped with ``-pyfs``. That fix
must run before the package can be imported, so it stays in each file; everything after
it is one function, :func:`features.cli.job_file.run`.
"""
