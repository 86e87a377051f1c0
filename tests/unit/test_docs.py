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
    from features.ops.init import EXAMPLE_SCHEMA

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
    from features.cli import dev as dev_cli
    from features.ops.dev.services import EXIT_CODES

    documented = {int(c) for c in re.findall(r"(?:^|; )(\d) ", dev_cli._EXIT_HELP.split(": ", 1)[1])}
    assert documented == set(EXIT_CODES)
    dev = build_parser()._subparsers._group_actions[0].choices["dev"]  # type: ignore[union-attr]
    verbs = dev._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for verb in ("up", "status"):
        assert dev_cli._EXIT_HELP in " ".join(verbs[verb].description.split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert {int(c) for c in re.findall(r"\*\*(\d)\*\* ", readme)} == set(EXIT_CODES)


def test_the_naive_timestamp_rule_in_docs_types_is_what_the_code_does() -> None:
    """docs/types.md "Naive timestamps": its examples are the validator's and the stream's
    own output, and every link to a section of docs/types.md finds its heading."""
    import datetime as dt
    import json
    import re

    import numpy as np
    import pyarrow as pa

    from features.aggregate.engine import AggSpec
    from features.aggregate.writer import late_rejects
    from features.compile import CompiledSchema, compile_schema
    from features.lineage import RunContext
    from features.schema.parse import parse_schema
    from features.validation import validate

    doc = (ROOT / "docs" / "types.md").read_text()
    assert "\n## Naive timestamps: UTC wall-clock times\n" in doc
    headings = re.findall(r"^#+ (.+)$", doc, re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
    links = {(page.name, a) for page in (ROOT / "docs").glob("*.md")
             for a in re.findall(r"types\.md#([\w-]+)", page.read_text())}
    assert ("sdk.md", "naive-timestamps-utc-wall-clock-times") in links
    assert not [link for link in links if link[1] not in slugs]

    def compiled(event_type: str) -> CompiledSchema:
        return compile_schema(parse_schema(
            "name: n\nversion: 1.0.0\nentity: k\nevent_time: t\nfields:\n"
            "  - {name: k, type: string, constraints: {required: true}}\n"
            f"  - {{name: t, type: '{event_type}', constraints: {{required: true}}}}\n"
            "aggregations:\n  allowed_lateness: 15m\n  features:\n"
            "    - {name: n_1h, function: count, window: 1h, store: [hot, cold]}\n"))

    # validation: text with an offset, and a zoned value, into a naive field
    naive = compiled("timestamp(s)")
    paris = dt.timezone(dt.timedelta(hours=2))
    got = validate([{"k": "a", "t": "2024-01-01T10:00:00+02:00"},
                    {"k": "a", "t": dt.datetime(2024, 6, 1, 14, 30, tzinfo=paris)}], naive)
    assert got.valid.column("t").cast(pa.string()).to_pylist() == ["2024-01-01 08:00:00",
                                                                   "2024-06-01 12:30:00"]
    assert '(`"2024-01-01T10:00:00+02:00"` is `2024-01-01 08:00:00`)' in doc
    assert "`datetime`, or text) becomes `2024-06-01 12:30:00`" in doc

    # the stream's lateness message, for a naive and a zoned event time
    def message(c: CompiledSchema) -> str:
        spec = AggSpec.of(c.schema)
        assert spec is not None
        at = int(dt.datetime(2024, 7, 1, 10, 5, tzinfo=dt.UTC).timestamp()) * 1_000_000
        ctx = RunContext("n", "1.0.0", c.fingerprint, "run", dt.datetime.now(dt.UTC))
        table = late_rejects(spec, ctx, pa.array(["a"]), np.array([at]), pa.array(["file:///x#0"]),
                             np.array([at + 30 * 60_000_000]))
        return str(json.loads(table.column("errors")[0].as_py())[0]["message"])

    assert "got 2024-07-01T10:05:00, expected >= 2024-07-01T10:20:00 (" in message(naive)
    assert "`got 2024-07-01T10:05:00, expected >= 2024-07-01T10:20:00 (...)`" in doc
    assert "got 2024-07-01T10:05:00+00:00, " in message(compiled("timestamp(s, UTC)"))
    assert "`got 2024-07-01T10:05:00+00:00, ...`" in doc


def test_the_evolution_table_lists_every_change_kind_the_diff_emits() -> None:
    """docs/evolution.md's classification table has a row for each ChangeKind (a row may
    name several kinds: `min`, `max`, ...), and names no kind the code does not have."""
    import re

    from features.schema.diff import ChangeKind

    text = (ROOT / "docs" / "evolution.md").read_text()
    table = text[text.index("| kind | compatible"):text.index("\n\n", text.index("| kind | compatible"))]
    named = {k for line in table.splitlines()[2:] for k in re.findall(r"`([a-z_]+)`", line.split("|")[1])}
    assert named == {k.value for k in ChangeKind}


def test_redis_doc_quotes_the_migration_rewrite_script_verbatim() -> None:
    from features.sinks.redis import RESTAMP

    assert RESTAMP.strip() in (ROOT / "docs" / "redis.md").read_text()
