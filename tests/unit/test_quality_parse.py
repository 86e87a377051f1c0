"""The ``quality:`` section: parsed, checked with file/line errors, compiled, and kept out
of the fingerprint (a changed gate is not a new data version)."""

from __future__ import annotations

from pathlib import Path

import pytest

from features.compile import compile_schema, gates_text
from features.compile.fingerprint import fingerprint, gates_fingerprint
from features.compile.rules import compile_rules
from features.errors import SchemaErrors
from features.schema import parse_schema
from features.schema.model import Gate, rule_ids

BASE = (Path(__file__).resolve().parents[2] / "schemas" / "credit_applicant.yaml").read_text()

GATES = """
quality:
  owner: risk-data@example.com
  max_reject_rate: 0.05
  max_rule_rate:
    income_monthly.max: 0.01
    income_monthly.min: {limit: 0.2, on_breach: warn}
  min_rows: 1000
  max_staleness: 2h
"""


def with_quality(text: str) -> str:
    return BASE + text


def test_the_section_parses_into_gates_in_file_order() -> None:
    s = parse_schema(with_quality(GATES), "credit.yaml")
    q = s.quality
    assert q is not None
    assert (q.owner, q.on_breach, q.max_staleness_s) == ("risk-data@example.com", "fail", 7200)
    got = [(g.kind, g.rule, g.limit, g.on_breach) for g in q.gates]
    assert got == [("max_reject_rate", None, 0.05, "fail"),
                   ("max_rule_rate", "income_monthly.max", 0.01, "fail"),
                   ("max_rule_rate", "income_monthly.min", 0.2, "warn"),
                   ("min_rows", None, 1000, "fail")]
    first_line = BASE.count("\n") + 1  # the blank line GATES starts with
    assert q.gates[0].line == first_line + 3
    assert isinstance(q.gates[3].limit, int)
    assert q.gates[1].name == "max_rule_rate[income_monthly.max]"


def test_section_wide_on_breach_is_each_gates_default() -> None:
    q = parse_schema(with_quality("quality:\n  on_breach: warn\n  max_reject_rate: 0.1\n"
                                  "  min_rows: {limit: 5, on_breach: fail}\n")).quality
    assert q is not None
    assert [(g.kind, g.on_breach) for g in q.gates] == [("max_reject_rate", "warn"), ("min_rows", "fail")]


@pytest.mark.parametrize(("yaml", "reason"), [
    ("  max_reject_rate: 5\n", "a rate is a fraction of the rows read, in [0, 1], got 5 (for 5% write 0.05)"),
    ("  max_reject_rate: -0.1\n", "in [0, 1], got -0.1"),
    ("  max_reject_rate: .nan\n", "a rate must be a finite number"),
    ("  max_reject_rate: lots\n", "a rate must be a number"),
    ("  max_rule_rate:\n    income_monthly.maxx: 0.1\n",
     "unknown rule 'income_monthly.maxx' (did you mean 'income_monthly.max'?): field 'income_monthly' has "
     "the rules income_monthly.type, income_monthly.not_null, income_monthly.min, income_monthly.max"),
    ("  max_rule_rate:\n    nosuch.min: 0.1\n",
     "unknown rule 'nosuch.min': no field or derived feature of this schema is called 'nosuch'"),
    ("  max_rule_rate:\n    income_monthly.max: 1.5\n", "in [0, 1], got 1.5"),
    ("  max_rule_rate: 0.1\n", "expected rule rates (a mapping rule id: rate)"),
    ("  min_rows: -1\n", "min_rows must be >= 0, got -1"),
    ("  min_rows: 1.5\n", "expected min_rows"),
    ("  max_staleness: 2x\n", "max_staleness string '2x' is not a duration"),
    ("  max_staleness: 0\n", "max_staleness must be >= 1 seconds, got 0"),
    ("  on_breach: stop\n", "on_breach must be fail or warn, got 'stop'"),
    ("  min_rows: {limit: 3, on_breach: later}\n", "on_breach must be fail or warn, got 'later'"),
    ("  min_rows: {on_breach: warn}\n", "missing required key 'limit'"),
    ("  max_rows: 3\n", "unknown key 'max_rows' in quality gates (did you mean 'min_rows'?)"),
])
def test_bad_values_fail_with_the_line_and_the_reason(yaml: str, reason: str) -> None:
    text = with_quality("quality:\n" + yaml)
    with pytest.raises(SchemaErrors) as info:
        parse_schema(text, "credit.yaml")
    errors = info.value.errors
    assert len(errors) == 1, [str(e) for e in errors]
    err = errors[0]
    assert reason in err.reason
    assert err.path == "credit.yaml"
    assert err.key_path is not None and err.key_path.startswith("quality")
    assert err.line is not None and err.line > BASE.count("\n")


def test_every_problem_of_the_section_is_reported_at_once() -> None:
    text = with_quality("quality:\n  on_breach: stop\n  max_reject_rate: 2\n  min_rows: -3\n")
    with pytest.raises(SchemaErrors) as info:
        parse_schema(text)
    assert [e.key_path for e in info.value.errors] == ["quality.on_breach", "quality.max_reject_rate",
                                                       "quality.min_rows"]


def test_rule_ids_are_the_ids_the_compiled_rules_record() -> None:
    s = parse_schema(BASE)
    assert rule_ids(s.fields, ())[:len(compile_rules(s))] == tuple(r.id for r in compile_rules(s))
    transform = [f"{f.name}.transform" for f in s.features if f.on_invalid == "reject"]
    assert list(rule_ids(s.fields, s.features)[len(compile_rules(s)):]) == transform


def test_a_feature_transform_rule_may_be_gated_only_when_it_rejects() -> None:
    s = parse_schema(BASE)
    rejecting = [f.name for f in s.features if f.on_invalid == "reject"]
    other = [f.name for f in s.features if f.on_invalid != "reject"]
    if rejecting:
        gate = f"quality:\n  max_rule_rate:\n    {rejecting[0]}.transform: 0.1\n"
        q = parse_schema(with_quality(gate)).quality
        assert q is not None and q.gates[0].rule == f"{rejecting[0]}.transform"
    assert other, "the example schema has a feature that nulls invalid values"
    with pytest.raises(SchemaErrors, match=f"unknown rule '{other[0]}.transform'"):
        parse_schema(with_quality(f"quality:\n  max_rule_rate:\n    {other[0]}.transform: 0.1\n"))


def test_a_gate_change_is_not_a_new_data_version() -> None:
    plain = parse_schema(BASE)
    gated = parse_schema(with_quality(GATES))
    raised = parse_schema(with_quality(GATES.replace("0.05", "0.5").replace("owner: risk", "owner: ops")))
    # the data version: the fingerprint every store records and the ledger is keyed by
    assert fingerprint(plain) == fingerprint(gated) == fingerprint(raised)
    assert compile_schema(gated).fingerprint == compile_schema(plain).fingerprint
    # the gates are fingerprinted on their own
    assert gates_fingerprint(plain) is None
    g1, g2 = gates_fingerprint(gated), gates_fingerprint(raised)
    assert g1 is not None and g2 is not None and len(g1) == 64 and g1 != g2
    assert compile_schema(gated).gates_fingerprint == g1
    # deterministic, and lines do not count
    assert gates_fingerprint(parse_schema(with_quality("\n\n" + GATES))) == g1
    # the data part still counts as before: a changed bound is a new fingerprint
    narrower = parse_schema(BASE.replace("max: 99999999.99", "max: 9999999.99"))
    assert fingerprint(narrower) != fingerprint(plain)


def test_the_compiled_schema_lists_the_gates_and_a_summary_line() -> None:
    c = compile_schema(parse_schema(with_quality(GATES)))
    assert all(isinstance(g, Gate) for g in c.gates) and len(c.gates) == 4
    assert compile_schema(parse_schema(BASE)).gates == ()
    assert gates_text(c.schema) == (
        "max_reject_rate 0.05 (fail), max_rule_rate[income_monthly.max] 0.01 (fail), "
        "max_rule_rate[income_monthly.min] 0.2 (warn), min_rows 1000 (fail); "
        "max staleness 2h; owner risk-data@example.com")


def test_compile_and_describe_show_the_gates_under_the_same_fingerprint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from features.cli import main
    from features.ops.catalog import Catalog, describe, render_describe

    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "credit_applicant.yaml").write_text(BASE)
    args = ["compile", "--schemas-dir", str(schemas), "--sql-dir", str(tmp_path / "sql"),
            "--expectations-dir", str(tmp_path / "expectations")]
    assert main(args) == 0
    before = capsys.readouterr().out
    assert "quality gates" not in before
    (schemas / "credit_applicant.yaml").write_text(with_quality(GATES))
    # the suite holds no gate; the DDL records the YAML text beside the fingerprint (as it
    # does a description), so it is rewritten, under the same fingerprint
    assert main(args) == 0
    out = capsys.readouterr().out
    gated = compile_schema(parse_schema(with_quality(GATES)))
    assert before.split()[:3] == out.split()[:3] == ["credit_applicant", "3.2.1", gated.fingerprint[:12]]
    assert "credit_applicant.json (unchanged)" in out
    assert gated.gates_fingerprint is not None
    assert (f"  quality gates {gated.gates_fingerprint[:12]}: max_reject_rate 0.05 (fail), "
            "max_rule_rate[income_monthly.max] 0.01 (fail)") in out
    d = describe(Catalog(schemas={"credit_applicant": gated.schema}, views={}), "credit_applicant")
    assert d["owner"] == "risk-data@example.com"
    assert f"  quality gates: {gates_text(gated.schema)}" in render_describe(d).splitlines()
