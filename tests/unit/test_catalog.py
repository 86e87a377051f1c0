"""``features list`` and ``features describe`` (issue 47 item 5) over the project's own
schemas and views: counts and readers as the files define them, a schema, a view and a
feature in full, and the errors for an unknown or ambiguous name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from features.cli import main
from features.errors import ConfigError
from features.ops.catalog import describe, read_catalog
from features.schema import load_schemas

ROOT = Path(__file__).resolve().parents[2]


def _catalog() -> object:
    return read_catalog(ROOT / "schemas", ROOT / "views")


def test_list_counts_what_the_files_define(capsys: pytest.CaptureFixture[str]) -> None:
    schemas = load_schemas(ROOT / "schemas")
    assert main(["list", "--schemas-dir", str(ROOT / "schemas"), "--views-dir", str(ROOT / "views"),
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    by_name = {s["name"]: s for s in got["schemas"]}
    assert set(by_name) == set(schemas)
    clicks = schemas["clicks"]
    listed = by_name["clicks"]
    assert listed["fields"] == len(clicks.fields) and listed["derived"] == len(clicks.features)
    assert clicks.aggregations is not None and listed["aggregations"] == len(clicks.aggregations.features)
    assert by_name["clicks"]["views"] == ["application_scoring"] and by_name["design_example"]["views"] == []
    assert [v["name"] for v in got["views"]] == ["application_scoring"]
    assert got["views"][0]["sources"] == ["credit_applicant", "clicks"]
    assert got["views"][0]["request_time"] == 3
    assert main(["list", "--schemas-dir", str(ROOT / "schemas"), "--views-dir", str(ROOT / "views")]) == 0
    text = capsys.readouterr().out
    assert "clicks" in text and "read by application_scoring" in text and "views (1)" in text


def test_describe_a_schema_a_view_and_a_feature(capsys: pytest.CaptureFixture[str]) -> None:
    catalog = _catalog()
    clicks = describe(catalog, "clicks")  # type: ignore[arg-type]
    assert clicks["kind"] == "schema" and clicks["hot_ttl"] == "1d"
    spend = next(a for a in clicks["aggregations"] if a["name"] == "spend_today")
    assert spend["window"] == "1d tumbling" and spend["where"] == {"event_type": ["purchase"]}
    user = next(f for f in clicks["fields"] if f["name"] == "user_id")
    assert user["store"] == "hot+cold" and "required" in user["constraints"]
    view = describe(catalog, "application_scoring")  # type: ignore[arg-type]
    assert view["kind"] == "view" and [s["max_age"] for s in view["sources"]] == ["30d", "1d"]
    assert view["sources"][1]["features"]["clicks_24h"] == "user_clicks_24h"
    score = describe(catalog, "credit_score")  # type: ignore[arg-type]
    assert (score["kind"], score["schema"], score["store"], score["views"]) == (
        "field", "credit_applicant", "cold", ["application_scoring"])
    assert describe(catalog, "clicks.items_7d")["views"] == []  # type: ignore[arg-type]
    assert main(["describe", "clicks.dwell_log", "--schemas-dir", str(ROOT / "schemas")]) == 0
    assert "derived feature clicks.dwell_log" in capsys.readouterr().out


def test_unknown_and_ambiguous_names_say_what_exists(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no schema, view or feature 'nope'; schemas: clicks, "):
        describe(_catalog(), "nope")  # type: ignore[arg-type]
    # dwell_ms is a field of two schemas (copies of clicks): name the schema
    source = (ROOT / "schemas" / "clicks.yaml").read_text()
    for name in ("a", "b"):
        text = source.replace("name: clicks", f"name: clicks_{name}", 1)
        (tmp_path / f"{name}.yaml").write_text(text)
    both = r"defined by several schemas: clicks_a\.dwell_ms, clicks_b\.dwell_ms"
    with pytest.raises(ConfigError, match=both):
        describe(read_catalog(tmp_path, None), "dwell_ms")
    assert describe(read_catalog(tmp_path, None), "clicks_b.dwell_ms")["schema"] == "clicks_b"
