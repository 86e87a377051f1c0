"""Static schemas (``event_time: none``): the parse, the refusals, the compiled DDL, the
diff between timed and static, the view's refusal of ``max_age``, and the row digest
that orders one load's rows of an entity. No services."""

from __future__ import annotations

import pyarrow as pa
import pytest

from features.compile import compile_schema
from features.compile.fingerprint import fingerprint
from features.compile.migration import plan_migration
from features.errors import SchemaErrors
from features.kernels.digest import digests
from features.schema.diff import ChangeKind
from features.schema.parse import parse_schema
from features.views.parse import parse_view

FIELDS = """\
fields:
  - name: tailnum
    type: string
    constraints: {required: true}
  - name: registered
    type: timestamp(us, UTC)
    constraints: {required: true}
  - name: seats
    type: int32
    store: [hot, cold]
"""


def text(event_time: str = "none", *, version: str = "1.0.0", extra: str = "") -> str:
    return f"name: aircraft\nversion: {version}\nentity: tailnum\nevent_time: {event_time}\n" + FIELDS + extra


def test_event_time_none_makes_a_loadable_static_schema() -> None:
    s = parse_schema(text(), "aircraft.yaml")
    assert (s.static, s.event_time, s.loadable) == (True, None, True)
    timed = parse_schema(text("registered"), "aircraft.yaml")
    assert (timed.static, timed.event_time) == (False, "registered")
    assert fingerprint(s) != fingerprint(timed)


def test_a_timed_schemas_fingerprint_does_not_name_static() -> None:
    """``static`` is left out of the canonical JSON while False: every existing schema keeps
    its fingerprint (and its tables)."""
    from features.compile.fingerprint import canonical_json

    assert '"static"' not in canonical_json(parse_schema(text("registered"), "aircraft.yaml"))
    assert '"static":true' in canonical_json(parse_schema(text(), "aircraft.yaml"))


def test_aggregations_on_a_static_schema_are_refused_at_parse_time() -> None:
    extra = ("aggregations:\n  features:\n    - name: n_7d\n      function: count\n"
             "      window: 7d\n      store: [hot]\n")
    with pytest.raises(SchemaErrors) as info:
        parse_schema(text(extra=extra), "aircraft.yaml")
    errors = info.value.errors
    assert len(errors) == 1, [str(e) for e in errors]
    assert errors[0].key_path == "aggregations"
    assert "aggregations need an event time" in errors[0].reason
    assert "static schema (event_time: none)" in errors[0].reason
    assert errors[0].line == 16  # the section's mapping, as for the other refusals of it


def test_a_static_schemas_cold_table_is_keyed_by_the_entity_alone() -> None:
    ddl = compile_schema(parse_schema(text(), "aircraft.yaml")).ddl
    assert 'CONSTRAINT "aircraft__pkey" PRIMARY KEY ("tailnum")' in ddl
    assert '"_digest" text COLLATE "C" NOT NULL' in ddl
    assert '"_ingested_at" timestamptz NOT NULL' in ddl
    assert "one row per entity" in ddl
    timed = compile_schema(parse_schema(text("registered"), "aircraft.yaml")).ddl
    assert 'PRIMARY KEY ("tailnum", "registered", "_digest")' in timed
    assert '"_digest" text COLLATE "C" NOT NULL' in timed  # one digest column, the same type


@pytest.mark.parametrize(("old", "new"), [("registered", "none"), ("none", "registered")])
def test_timed_to_static_and_back_is_breaking(old: str, new: str) -> None:
    m = plan_migration(parse_schema(text(old), "aircraft.yaml"),
                       parse_schema(text(new, version="2.0.0"), "aircraft.yaml"))
    changes = [c for c in m.diff.changes if c.kind is ChangeKind.EVENT_TIME]
    assert len(changes) == 1
    assert not changes[0].compatible
    assert "becomes " + ("static" if new == "none" else "timed") in changes[0].detail


def test_a_static_schema_from_validation_only_is_compatible() -> None:
    fields = FIELDS.replace("    store: [hot, cold]\n", "")
    validation_only = parse_schema("name: aircraft\nversion: 1.0.0\n" + fields, "aircraft.yaml")
    m = plan_migration(validation_only, parse_schema(text(version="1.1.0"), "aircraft.yaml"))
    kinds = {c.kind: c.compatible for c in m.diff.changes}
    assert kinds[ChangeKind.EVENT_TIME] is True


def test_a_view_refuses_max_age_on_a_static_source() -> None:
    schemas = {"aircraft": parse_schema(text(), "aircraft.yaml")}
    view = ("name: v\nversion: 1.0.0\nrequest:\n  keys:\n    tailnum: string\nsources:\n"
            "  - schema: aircraft\n    features: [seats]\n    join: {tailnum: tailnum}\n    max_age: 1d\n")
    with pytest.raises(SchemaErrors) as info:
        parse_view(view, "v.yaml", schemas)
    assert any("is static (event_time: none)" in e.reason and e.key_path.endswith("max_age")
               for e in info.value.errors), [str(e) for e in info.value.errors]
    ok = parse_view(view.replace("    max_age: 1d\n", ""), "v.yaml", schemas)
    assert ok.sources[0].schema == "aircraft"


def test_the_row_digest_depends_on_the_content_alone() -> None:
    c = compile_schema(parse_schema(text(), "aircraft.yaml"))
    t = pa.table({"tailnum": ["N1", "N1", "N2", "N1"],
                  "registered": pa.array([0, 0, 0, 0], pa.timestamp("us", "UTC")),
                  "seats": pa.array([100, 120, 100, None], pa.int32())})
    d = digests(t, c.schema).to_pylist()  # the digest of every stored event (issue 48)
    assert all(len(x) == 16 and int(x, 16) >= 0 and x == x.lower() for x in d)
    assert len(set(d)) == 4  # a null differs from every value
    assert digests(t.take([3, 2, 1, 0]), c.schema).to_pylist() == d[::-1]  # row order plays no part
    # lineage is not content: the same values from another source have the same digest
    assert digests(t.append_column("_source", pa.array(["a", "b", "c", "d"])), c.schema).to_pylist() == d
