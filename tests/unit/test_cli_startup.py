"""The command line's start-up (issue 46): a command module imports what its command runs
at its top, so ``features`` imports the one command module its arguments name and none for
``features --help``; every other subcommand is its line of ``--help`` from ``COMMANDS``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from features.cli import COMMANDS, build_parser, command_named

#: what a command module may import without running its command (features.cli.arguments)
_LIGHT = {"features.cli", "features.cli.arguments"}


def _imported_after(argv: list[str]) -> list[str]:
    """The modules of ``features.cli`` and the heavy libraries a fresh interpreter holds after
    ``main(argv)``."""
    code = ("import json, sys\nfrom features.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('features.cli') "
            "or m in ('pyarrow', 'pandas', 'psycopg', 'redis', 'confluent_kafka'))))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    names: list[str] = json.loads(out.stdout.splitlines()[-1])
    return names


def test_features_help_imports_no_command_module() -> None:
    assert set(_imported_after(["--help"])) <= _LIGHT


@pytest.mark.parametrize(("argv", "module"), [
    (["load", "--help"], "features.cli.load"),
    (["--log-format", "json", "topics", "create", "--help"], "features.cli.topics"),
    (["describe", "--help"], "features.cli.describe"),
])
def test_a_command_imports_its_own_module_only(argv: list[str], module: str) -> None:
    assert set(_imported_after(argv)) - {"pyarrow", "pandas", "psycopg", "redis", "confluent_kafka"} <= (
        _LIGHT | {module})
    assert module in _imported_after(argv)


def _runs(parser: argparse.ArgumentParser) -> set[str]:
    """The modules of the ``func`` defaults of ``parser`` and of its subcommands, at any depth
    (``features schema`` has none of its own: ``schema diff`` has)."""
    out = {parser.get_default("func").__module__} if parser.get_default("func") is not None else set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _runs(sub)
    return out


def test_every_subcommand_is_in_the_table_with_its_module_and_summary() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(COMMANDS)
    assert {c.dest: c.help for c in sub._choices_actions} == {n: c.summary for n, c in COMMANDS.items()}
    for name, command in COMMANDS.items():
        assert _runs(sub.choices[name]) == {command.module}, name


def test_only_the_named_command_is_built_in_full() -> None:
    sub = next(a for a in build_parser(["report"])._actions if isinstance(a, argparse._SubParsersAction))
    full = {name for name, p in sub.choices.items() if _runs(p)}
    assert full == {"report"}
    assert [c.dest for c in sub._choices_actions] == list(COMMANDS)


@pytest.mark.parametrize(("argv", "name"), [
    (["load", "--schema", "s", "x.parquet"], "load"),
    (["--log-format", "json", "serve", "--help"], "serve"),
    (["--log-format=json", "list"], "list"),
    (["--", "validate"], "validate"),
    (["-h"], None),
    ([], None),
    (["no-such-command"], None),
    (["--log-format", "load"], None),  # "load" is the option's value here
])
def test_command_named(argv: list[str], name: str | None) -> None:
    assert command_named(argv) == name
