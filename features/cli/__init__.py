"""The ``features`` command line: one subcommand per stage.

Each subcommand is a module ``features/cli/<command>.py`` exposing
``add_parser(subparsers)`` and ``run(args)``; the work lives in the layer it belongs to
(``tests/unit/test_import_graph.py`` holds that argparse is imported nowhere else). The
table :data:`COMMANDS` names each subcommand's module and its one line in ``features
--help`` (the module's ``add_parser`` passes that line as its ``help``).

Start-up: a command module imports what its command runs at its top (pyarrow, psycopg,
the stores, ...), so :func:`main` imports one command module only: the one the command
line names (:func:`command_named`). Every other subcommand is a name and its line of
``--help``, without its module, so ``features --help`` imports none and ``features load
--help`` only ``features.cli.load``. Argument types and arguments several commands share
are in :mod:`features.cli.arguments`, which imports nothing heavy: a command module
imports no other command module. :func:`build_parser` without arguments builds every
subcommand in full (the tests and the docs read the whole command line).

Exit codes: 0 success, 1 the command ran and found a problem (rejected rows, a stale
file, a failing check), 2 usage or configuration errors. ``features dev status`` and
``up`` also say which part is missing: 3 the stream's (the servers are healthy), 4 only
Chromium's (``features dev status --help``).

``--log-format text|json`` (before or after the subcommand; default
``FEATURES_LOG_FORMAT`` or text) sets how every subcommand's log lines on stderr look
(``features.observe.logs``, docs/operations.md).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from features import __version__
from features.errors import FeaturesError
from features.observe.logs import setup_logging, user_message


@dataclass(frozen=True)
class Command:
    """A subcommand: the module whose ``add_parser(subparsers)`` adds it (and whose ``run``
    runs it), and its one line in ``features --help``."""

    module: str
    summary: str


#: subcommand name -> its module and its line in ``features --help``, in ``--help`` order. One
#: module may add several subcommands (``features.cli.describe``: ``list`` and ``describe``).
COMMANDS: dict[str, Command] = {
    "compile": Command("features.cli.compile",
                       "generate sql/*.sql and expectations/*.json from the schemas (or --check them)"),
    "demo": Command("features.cli.demo",
                    "run the demo pipeline end to end (services, compile, example data, load, summary)"),
    "list": Command("features.cli.describe",
                    "list the project's schemas and views (version, fingerprint, entity, counts, readers)"),
    "describe": Command("features.cli.describe",
                        "describe one schema, view or feature (SCHEMA.FEATURE) in full"),
    "dev": Command("features.cli.dev",
                   "start, stop or check the local services (Postgres, Redis, Kafka, Flink jars)"),
    "health": Command("features.cli.health",
                      "check every configured store and each schema's recorded fingerprint"),
    "historical": Command("features.cli.historical",
                          "write a point-in-time-correct training set (Parquet) for an entity frame"),
    "init": Command("features.cli.init",
                    "start a project: schemas/ with an example, featureline.toml, a README"),
    "job-file": Command("features.cli.job_file",
                        "print the path of an installed job file, for `flink run -py`"),
    "load": Command("features.cli.load",
                    "load Parquet files into Redis (hot) and Postgres (cold), with rejects and lineage"),
    "kernels": Command("features.cli.kernels",
                       "show a schema's transform program (features, dtypes, device, kernel source)"),
    "migrate": Command("features.cli.migrate",
                       "bring Postgres and Redis to a compatible new version of a schema "
                       "(a dry run unless --apply)"),
    "prewarm": Command("features.cli.prewarm",
                       "fill Redis with each entity's newest row from Postgres (deploys, a Redis loss)"),
    "produce": Command("features.cli.produce",
                       "send a JSONL, JSON or Parquet file's records to a schema's Kafka topic, "
                       "keyed by entity"),
    "recompute": Command("features.cli.recompute",
                         "compute a schema's aggregations and derived features again over the stored "
                         "history (after adding one)"),
    "report": Command("features.cli.report",
                      "data-quality report (GX suite + validator) as JSON and one HTML page"),
    "rollback": Command("features.cli.rollback",
                        "undo a bad load (or stream run) in both stores, by its run id"),
    "schema": Command("features.cli.schema",
                      "inspect schema files (diff two versions)"),
    "serve": Command("features.cli.serve",
                     "HTTP ingest service: validate posted events and produce them to the schema's topic"),
    "stream": Command("features.cli.stream",
                      "run the PyFlink job: Kafka topic -> validate -> transform -> Redis + Postgres"),
    "topics": Command("features.cli.topics",
                      "create a schema's Kafka topic and its dead-letter topic, or list the topics"),
    "ui": Command("features.cli.ui",
                  "read-only web pages: the schema registry, the runs and their rejects, drift (docs/ui.md)"),
    "validate": Command("features.cli.validate",
                        "validate Parquet files against a schema (counts and top reject reasons)"),
}


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The ``features`` parser, with the subcommands of ``commands`` in full (their modules
    imported) and every other one as its name and its line of ``--help`` only; ``None``:
    every subcommand in full."""
    parser = argparse.ArgumentParser(
        prog="features", allow_abbrev=False,
        description="featureline: validated, traceable features from Kafka and Parquet "
        "into Redis and Postgres.",
    )
    parser.add_argument("--version", action="version", version=f"featureline {__version__}")
    parser.add_argument("--log-format", choices=["text", "json"], default=None, help=_LOG_FORMAT_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    full = {COMMANDS[name].module for name in (COMMANDS if commands is None else commands)}
    added: set[str] = set()
    for name, command in COMMANDS.items():
        if command.module not in full:
            sub.add_parser(name, help=command.summary)
        elif command.module not in added:  # adds each of its subcommands (describe: list and describe)
            importlib.import_module(command.module).add_parser(sub)
            added.add(command.module)
    _add_log_format(sub)
    _plain_help(parser)
    _no_abbreviations(parser)
    return parser


def command_named(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` runs: its first argument that is no option of ``features``
    itself (nor the value of ``--log-format``); None when there is none or it names no
    subcommand (argparse then says what is wrong, with the list of subcommands)."""
    rest = iter(argv)
    for arg in rest:
        if arg == "--log-format":
            next(rest, None)
        elif arg == "--" or not arg.startswith("-"):
            name = next(rest, "") if arg == "--" else arg
            return name if name in COMMANDS else None
    return None


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """No option of any command may be abbreviated: argparse's prefix matching took
    ``features health --schema x`` for ``--schemas-dir x``. A misspelt or shortened option
    is an error that names it (argparse reads ``allow_abbrev`` when it parses)."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                _no_abbreviations(sub)


#: reStructuredText inline markup of the docstrings some descriptions are taken from:
#: ``literal``, :role:`target` (``~a.b.c`` shows ``c``)
_RST_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_RST_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+?)`")


def plain_text(text: str) -> str:
    """``text`` with the reStructuredText inline markup of a docstring removed, for a
    terminal: ````x```` and ``:func:`x``` become ``x`` (``:func:`~a.b.c``` becomes ``c``)."""
    text = _RST_ROLE.sub(lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], text)
    return _RST_LITERAL.sub(r"\1", text)


def _plain_help(parser: argparse.ArgumentParser) -> None:
    """Every description, epilog and argument help of ``parser`` and its subcommands as
    :func:`plain_text` (descriptions are often a module docstring's paragraph)."""
    for attr in ("description", "epilog"):
        if text := getattr(parser, attr):
            setattr(parser, attr, plain_text(text))
    for action in parser._actions:
        if isinstance(action.help, str) and action.help is not argparse.SUPPRESS:
            action.help = plain_text(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:  # the COMMAND list's one-line helps
                if isinstance(choice.help, str):
                    choice.help = plain_text(choice.help)
            for sub in set(action.choices.values()):
                _plain_help(sub)


_LOG_FORMAT_HELP = ("log lines on stderr as text or as JSON objects, one per line, each with the run id; "
                    "applies to every subcommand (default: $FEATURES_LOG_FORMAT, else text)")


def _add_log_format(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``--log-format`` after any subcommand too (``features load --log-format json``).
    SUPPRESS: a subcommand that is not given it keeps the value given before it."""
    for parser in sub.choices.values():
        parser.add_argument("--log-format", choices=["text", "json"], default=argparse.SUPPRESS,
                            help=_LOG_FORMAT_HELP)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _add_log_format(action)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    name = command_named(argv)
    args = build_parser([] if name is None else [name]).parse_args(argv)
    try:
        setup_logging(args.log_format)
    except FeaturesError as exc:  # a bad FEATURES_LOG_FORMAT
        print(f"features {args.command}: error: {exc}", file=sys.stderr)
        return 2
    try:
        code: int = args.func(args)
    except FeaturesError as exc:
        user_message(f"features {args.command}: error: {exc}", level=logging.ERROR, command=args.command,
                     error=type(exc).__name__)
        return 2
    except KeyboardInterrupt:
        user_message(f"features {args.command}: interrupted", level=logging.ERROR, command=args.command)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
