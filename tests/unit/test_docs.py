"""Docs that quote code must quote it as it is."""

from __future__ import annotations

from pathlib import Path

from features.sinks.redis import NEWEST_WINS

ROOT = Path(__file__).resolve().parents[2]


def test_redis_doc_quotes_the_newest_wins_script_verbatim() -> None:
    assert NEWEST_WINS.strip() in (ROOT / "docs" / "redis.md").read_text()


def test_every_file_the_docs_name_exists() -> None:
    """A path to a file of this repository named in README.md or docs/ (``tests/...py``,
    ``features/...py``, ``bench/...py``, ``jobs/...py``, ``docs/...md``, ``schemas/...yaml``)
    exists: a renamed or removed file leaves no reference behind."""
    import re

    pattern = re.compile(r"(?<![\w/.-])((?:tests|features|bench|jobs|docs|schemas|sql|expectations|fuzz)"
                         r"/[\w/.-]*\.(?:py|md|yaml|sql|json|sh))\b")
    from features.init import EXAMPLE_SCHEMA

    # an illustrative file in an example of compile errors; the file `features init` writes
    examples = {"schemas/x.yaml", EXAMPLE_SCHEMA}
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in pattern.finditer(doc.read_text()):
            if m.group(1) not in examples and not (ROOT / m.group(1)).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {m.group(1)}")
    assert not missing, "\n".join(missing)


def test_dev_status_exit_codes_are_documented_as_the_code_returns_them() -> None:
    """Every exit code of `features dev status` / `up` (services.EXIT_CODES) is in their
    --help and in the README's "Local services", and no other code is."""
    import re

    from features.cli import build_parser
    from features.dev import cli as dev_cli
    from features.dev.services import EXIT_CODES

    documented = {int(c) for c in re.findall(r"(?:^|; )(\d) ", dev_cli._EXIT_HELP.split(": ", 1)[1])}
    assert documented == set(EXIT_CODES)
    dev = build_parser()._subparsers._group_actions[0].choices["dev"]  # type: ignore[union-attr]
    verbs = dev._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for verb in ("up", "status"):
        assert dev_cli._EXIT_HELP in " ".join(verbs[verb].description.split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert {int(c) for c in re.findall(r"\*\*(\d)\*\* ", readme)} == set(EXIT_CODES)
