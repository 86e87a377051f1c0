"""No command takes an abbreviated option (issue 47: `features health --schema x` was read as
`--schemas-dir x`, argparse's prefix matching), and `features health --schema NAME` checks one
schema."""

from __future__ import annotations

import argparse

import pytest

from features.cli import build_parser


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                out += _parsers(sub)
    return out


def test_no_parser_allows_abbreviations() -> None:
    parsers = _parsers(build_parser())
    assert len(parsers) > 17
    assert [p.prog for p in parsers if p.allow_abbrev] == []


@pytest.mark.parametrize("argv", [
    ["health", "--schemas", "schemas"],            # a prefix of --schemas-dir
    ["load", "--schema", "s", "--schemas-d", "x", "f.parquet"],
    ["serve", "--schemas", "schemas", "--max-view", "5"],
])
def test_an_abbreviated_option_is_an_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_health_takes_one_schema_by_name() -> None:
    args = build_parser().parse_args(["health", "--schema", "cgm_readings"])
    assert args.schema == "cgm_readings" and args.schemas_dir is None
