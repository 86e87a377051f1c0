"""The ``features`` command line: one subcommand per stage.

Each subcommand is a module ``features/cli/<command>.py`` exposing
``add_parser(subparsers)`` and ``run(args)``; the work lives in the layer it belongs to
(``tests/unit/test_import_graph.py`` holds that argparse is imported nowhere else). This
table names them. Modules here import only argparse-level code at the top, so
``features --help`` stays fast; the heavy imports (pyarrow, psycopg, pyflink, ...) happen
inside the command that needs them.

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
from collections.abc import Sequence

from features import __version__
from features.errors import FeaturesError
from features.observe.logs import setup_logging, user_message

#: subcommand name -> module with ``add_parser(subparsers)``, in ``--help`` order.
COMMANDS: dict[str, str] = {
    "compile": "features.cli.compile",
    "demo": "features.cli.demo",
    "describe": "features.cli.describe",
    "dev": "features.cli.dev",
    "health": "features.cli.health",
    "historical": "features.cli.historical",
    "init": "features.cli.init",
    "job-file": "features.cli.job_file",
    "load": "features.cli.load",
    "kernels": "features.cli.kernels",
    "migrate": "features.cli.migrate",
    "prewarm": "features.cli.prewarm",
    "produce": "features.cli.produce",
    "recompute": "features.cli.recompute",
    "report": "features.cli.report",
    "rollback": "features.cli.rollback",
    "schema": "features.cli.schema",
    "serve": "features.cli.serve",
    "stream": "features.cli.stream",
    "topics": "features.cli.topics",
    "validate": "features.cli.validate",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="features", allow_abbrev=False,
        description="featureline: validated, traceable features from Kafka and Parquet "
        "into Redis and Postgres.",
    )
    parser.add_argument("--version", action="version", version=f"featureline {__version__}")
    parser.add_argument("--log-format", choices=["text", "json"], default=None, help=_LOG_FORMAT_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    _add_log_format(sub)
    _plain_help(parser)
    _no_abbreviations(parser)
    return parser


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
    parser = build_parser()
    args = parser.parse_args(argv)
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
