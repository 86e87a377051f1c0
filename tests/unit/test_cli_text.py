"""What the command line prints for people: ``--help`` pages in plain text, and the
``next:`` line of ``features init``."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from features.cli import build_parser, main, plain_text

#: reStructuredText inline markup a docstring may hold: ``literal``, :func:`x`
_MARKUP = re.compile(r"``|:[a-z]+:`")


def _pages(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    yield " ".join(path), parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _pages(sub, (*path, name))


def test_no_help_page_shows_restructuredtext_markup() -> None:
    """Several descriptions are a module docstring's paragraph (init, demo, health,
    prewarm): their ``double backticks`` showed in ``--help``."""
    pages = dict(_pages(build_parser(), ("features",)))
    assert {"features", "features init", "features demo", "features health", "features prewarm",
            "features dev up", "features schema diff"} <= set(pages)
    shown = {name: [line for line in text.splitlines() if _MARKUP.search(line)]
             for name, text in pages.items()}
    assert {name: lines for name, lines in shown.items() if lines} == {}
    init = " ".join(pages["features init"].split())
    assert "Writes schemas/ with one commented example schema, views/ with one example view over it, " \
        "featureline.toml with every setting" in init


def test_init_help_through_main(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["init", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "Writes schemas/ with" in " ".join(out.split()) and "``" not in out


def test_plain_text() -> None:
    assert plain_text("run ``features dev up`` (:func:`~features.load.load`, :class:`features.store.X`)") == (
        "run features dev up (load, features.store.X)")
    assert plain_text("a `single` tick stays") == "a `single` tick stays"


@pytest.mark.parametrize(("arg", "next_line"), [
    (None, "next: features dev up && features compile"),
    (".", "next: features dev up && features compile"),
    ("proj", "next: cd proj && features dev up && features compile"),
    ("my project", "next: cd 'my project' && features dev up && features compile"),
])
def test_init_says_what_to_run_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str], arg: str | None,
                                    next_line: str) -> None:
    """In the current folder there is nothing to ``cd`` into (it printed ``next: cd . && ...``);
    a folder with a space is quoted for the shell."""
    monkeypatch.chdir(tmp_path)
    assert main(["init", *([arg] if arg is not None else [])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == next_line
    assert (tmp_path / (arg or ".") / "featureline.toml").is_file()


def test_init_in_the_current_folder_named_by_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["init", os.fspath(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "next: features dev up && features compile"
