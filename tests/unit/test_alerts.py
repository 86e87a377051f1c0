"""Generated Prometheus rules and Grafana dashboards (``features.compile.alerts``,
``features compile``): thresholds and labels from the ``quality:`` gates, every metric and
label a rule reads is one the code registers, deterministic bytes, ``--check``. No
services; promtool and a real Prometheus run in tests/integration/test_alerts_prometheus.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from features.cli import main
from features.compile.alerts import (
    DEFAULT_REJECT_RATE,
    render_dashboard,
    render_rules,
    render_service_rules,
    rule_groups,
    service_rule_groups,
)
from features.observe.metrics import Registry, RunMetrics, SdkMetrics
from features.schema import load_schema, parse_schema
from features.schema.model import Schema
from features.serve.app import IngestMetrics

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
QUALITY = """quality:
  owner: risk-data
  on_breach: warn
  max_reject_rate: {limit: 0.1, on_breach: fail}
  max_rule_rate:
    income_monthly.min: 0.02
    age.min: {limit: 0.25, on_breach: fail}
  min_rows: 10
  max_staleness: 2h
"""


def gated_schema() -> Schema:
    return parse_schema((SCHEMAS / "credit_applicant.yaml").read_text() + QUALITY)


def registered() -> dict[str, set[str]]:
    """Every series name the code exports (histograms with their ``_bucket``, ``_count``
    and ``_sum``) -> its label names: the stream job's, the SDK's and HTTP ingest's families."""
    registry = Registry()
    RunMetrics(registry, "x", stream=True)
    SdkMetrics(registry)
    IngestMetrics(registry)
    out: dict[str, set[str]] = {}
    for name, (kind, labels) in registry.families().items():
        if kind in ("histogram", "batch_histogram"):
            out.update({f"{name}_bucket": {*labels, "le"}, f"{name}_count": set(labels),
                        f"{name}_sum": set(labels)})
        else:
            out[name] = set(labels)
    return out


_METRIC = re.compile(r"\b(featureline_[a-z_]+)(\{[^}]*\})?")
_MATCHER = re.compile(r'([a-zA-Z_]+)\s*(=~|!~|!=|=)\s*"')
_BY = re.compile(r"\bby\s*\(([^)]*)\)")


def problems(expr: str, known: dict[str, set[str]]) -> list[str]:
    """What in ``expr`` the code does not export: unknown series names, matchers on a label
    the series lacks, ``by`` labels none of the expression's series has."""
    out = []
    names: list[str] = []
    for m in _METRIC.finditer(expr):
        name = m.group(1)
        names.append(name)
        if name not in known:
            out.append(f"unknown metric {name}")
            continue
        for label, _ in _MATCHER.findall(m.group(2) or ""):
            if label not in known[name]:
                out.append(f"{name} has no label {label}")
    have = set().union(*(known.get(n, set()) for n in names))
    for group in _BY.findall(expr):
        for label in (x.strip() for x in group.split(",") if x.strip()):
            if label not in have:
                out.append(f"by ({label}): none of {sorted(set(names))} has it")
    return out


def all_rules(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in data["groups"] for r in g["rules"]]


def every_generated_rule() -> list[dict[str, Any]]:
    schemas = [load_schema(p) for p in sorted(SCHEMAS.glob("*.yaml"))] + [gated_schema()]
    return [r for s in schemas for r in all_rules(rule_groups(s))] + all_rules(service_rule_groups())


def test_every_metric_and_label_a_rule_reads_is_one_the_code_registers() -> None:
    known = registered()
    assert {"featureline_rows_read_total", "featureline_rejects_total", "featureline_consumer_lag",
            "featureline_sdk_fallback_total", "featureline_ingest_requests_total"} <= set(known)
    assert known["featureline_rejects_total"] == {"schema", "field", "rule"}
    rules = every_generated_rule()
    assert len(rules) > 20
    found = {r["alert"]: problems(r["expr"], known) for r in rules}
    assert all(not p for p in found.values()), found
    # the check can fail: a label the counter does not have, a metric nobody registers
    assert problems('sum(rate(featureline_rejects_total{schema="x",reason="min"}[5m]))', known) == [
        "featureline_rejects_total has no label reason"]
    assert problems("featureline_rows_dropped_total", known) == [
        "unknown metric featureline_rows_dropped_total"]
    assert problems("sum by (route) (featureline_consumer_lag)", known) == [
        "by (route): none of ['featureline_consumer_lag'] has it"]


def test_gates_set_thresholds_severity_and_labels() -> None:
    rules = all_rules(rule_groups(gated_schema()))
    by = {(r["alert"], r["labels"].get("rule")): r for r in rules}
    reject = by[("FeaturelineRejectRate", None)]
    assert reject["expr"].endswith("> 0.1")
    assert reject["labels"] == {"severity": "critical", "schema": "credit_applicant", "owner": "risk-data",
                                "gate": "max_reject_rate"}
    assert "max_reject_rate (10%)" in reject["annotations"]["description"]
    assert "{{ $value | humanizePercentage }}" in reject["annotations"]["summary"]
    income = by[("FeaturelineRuleRejectRate", "income_monthly.min")]
    assert income["labels"]["severity"] == "warning"  # the section's on_breach: warn
    assert income["labels"]["gate"] == "max_rule_rate[income_monthly.min]"
    assert 'rule="income_monthly.min"' in income["expr"] and income["expr"].endswith("> 0.02")
    age = by[("FeaturelineRuleRejectRate", "age.min")]
    assert age["labels"]["severity"] == "critical" and age["expr"].endswith("> 0.25")
    stale = by[("FeaturelineStale", None)]
    assert stale["expr"] == 'min(featureline_freshness_seconds{schema="credit_applicant"}) > 7200'
    assert stale["labels"]["severity"] == "warning" and "2h" in stale["annotations"]["summary"]
    assert by[("FeaturelineIngestRejectRate", None)]["expr"].endswith("> 0.1")
    assert {a for a, _ in by} == {"FeaturelineRejectRate", "FeaturelineRuleRejectRate",
                                  "FeaturelineIngestRejectRate", "FeaturelineStale", "FeaturelineConsumerLag",
                                  "FeaturelineStreamStalled", "FeaturelineSdkFallbackRate",
                                  "FeaturelineSdkMissRate"}


def test_a_schema_without_quality_gets_the_defaults_and_no_freshness_alert() -> None:
    rules = all_rules(rule_groups(load_schema(SCHEMAS / "credit_applicant.yaml")))
    alerts = [r["alert"] for r in rules]
    assert "FeaturelineStale" not in alerts and "FeaturelineRuleRejectRate" not in alerts
    assert {"FeaturelineRejectRate", "FeaturelineConsumerLag", "FeaturelineStreamStalled",
            "FeaturelineSdkFallbackRate", "FeaturelineSdkMissRate"} <= set(alerts)
    reject = next(r for r in rules if r["alert"] == "FeaturelineRejectRate")
    assert reject["expr"].endswith(f"> {DEFAULT_REJECT_RATE:g}")
    assert reject["labels"] == {"severity": "warning", "schema": "credit_applicant", "gate": "default"}


def test_rules_and_dashboard_are_byte_identical_across_processes() -> None:
    code = ("import sys; from features.schema import parse_schema; from features.compile.alerts import "
            "render_rules, render_dashboard; s = parse_schema(sys.stdin.read()); "
            "sys.stdout.write(render_rules(s) + render_dashboard(s))")
    text = (SCHEMAS / "credit_applicant.yaml").read_text() + QUALITY
    runs = {subprocess.run([sys.executable, "-c", code], input=text, capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin"}, cwd=ROOT).stdout
            for seed in ("1", "2")}
    schema = gated_schema()
    assert runs == {render_rules(schema) + render_dashboard(schema)}
    assert yaml.safe_load(render_rules(schema)) == rule_groups(schema)
    assert yaml.safe_load(render_service_rules()) == service_rule_groups()


def test_dashboard_draws_the_gates_and_reads_registered_metrics() -> None:
    board = json.loads(render_dashboard(gated_schema()))
    assert board["uid"] == "featureline-credit_applicant" and board["description"].startswith("Generated by")
    panels = {p["title"]: p for p in board["panels"]}
    steps = panels["Reject rate"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1] == {"color": "red", "value": 0.1}
    assert panels["Freshness"]["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]["value"] == 7200
    known = registered()
    exprs = [t["expr"].replace("$__rate_interval", "5m") for p in board["panels"] for t in p["targets"]]
    assert all(not problems(e, known) for e in exprs), {e: problems(e, known) for e in exprs}
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


def _compile(project: Path, *extra: str) -> int:
    return main(["compile", "--schemas-dir", str(project / "schemas"), "--sql-dir", str(project / "sql"),
                 "--expectations-dir", str(project / "expectations"), *extra])


def test_compile_writes_checks_and_removes_rules_and_dashboards(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "schemas").mkdir()
    shutil.copy(SCHEMAS / "design_example.yaml", tmp_path / "schemas")
    (tmp_path / "schemas" / "credit_applicant.yaml").write_text(
        (SCHEMAS / "credit_applicant.yaml").read_text() + QUALITY)
    assert _compile(tmp_path) == 0
    alerts, boards = tmp_path / "alerts", tmp_path / "dashboards"  # beside sql/ by default
    assert sorted(p.name for p in alerts.iterdir()) == ["_serve.rules.yml", "credit_applicant.rules.yml",
                                                        "design_example.rules.yml"]
    assert sorted(p.name for p in boards.iterdir()) == ["credit_applicant.json", "design_example.json"]
    assert (alerts / "credit_applicant.rules.yml").read_text() == render_rules(gated_schema())
    assert _compile(tmp_path, "--check") == 0

    rules = alerts / "credit_applicant.rules.yml"
    rules.write_text(rules.read_text().replace("> 0.1", "> 0.2"))
    (boards / "design_example.json").unlink()
    shutil.copy(alerts / "design_example.rules.yml", alerts / "gone.rules.yml")
    shutil.copy(boards / "credit_applicant.json", boards / "gone.json")
    (alerts / "mine.rules.yml").write_text("groups: []\n")  # hand-written: never touched
    (boards / "mine.json").write_text('{"title": "mine"}\n')
    capsys.readouterr()
    assert _compile(tmp_path, "--check") == 1
    err = capsys.readouterr().err
    assert f"stale: {rules}" in err and f"missing: {boards / 'design_example.json'}" in err
    assert f"extra: {alerts / 'gone.rules.yml'}" in err and f"extra: {boards / 'gone.json'}" in err
    assert "mine" not in err and "_serve" not in err
    assert _compile(tmp_path) == 0
    assert not (alerts / "gone.rules.yml").exists() and not (boards / "gone.json").exists()
    assert (alerts / "mine.rules.yml").exists() and (boards / "mine.json").exists()
    assert _compile(tmp_path, "--check") == 0


def test_checked_in_rules_and_dashboards_are_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["compile", "--check", "--schemas-dir", str(SCHEMAS), "--sql-dir", str(ROOT / "sql"),
                 "--expectations-dir", str(ROOT / "expectations"), "--alerts-dir", str(ROOT / "alerts"),
                 "--dashboards-dir", str(ROOT / "dashboards")])
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in (ROOT / "alerts").iterdir()) == [
        "_serve.rules.yml", *(f"{p.stem}.rules.yml" for p in sorted(SCHEMAS.glob("*.yaml")))]
