"""The ``aggregations:`` section: a good section parses to the expected model; every bad
one is refused with the line of the offending key, its key path and a clear reason;
fingerprints of schemas without aggregations do not move."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from features.compile.fingerprint import canonical_json, fingerprint
from features.errors import SchemaError, SchemaErrors
from features.schema import Schema, load_schema, parse_schema
from features.schema.model import Aggregation, Aggregations, Window

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
PATH = "shop.yaml"

HEAD = """\
name: shop
version: 1.0.0
entity: user_id
event_time: ts
fields:
  - name: user_id
    type: string
    constraints: {required: true}
  - name: ts
    type: timestamp(ms, UTC)
    constraints: {required: true}
  - name: kind
    type: enum
    values: [view, click, buy]
  - name: item
    type: string
  - name: qty
    type: int32
  - name: amount
    type: decimal(12,2)
  - name: score
    type: float64
  - name: flag
    type: bool
  - name: day
    type: date
  - name: badge
    type: string
    store: hot
features:
  - name: qty_log
    from: qty
    steps: [{fill_null: 0}, log1p]
    dtype: float64
    store: hot
"""

#: one windowed count, to be the target of ratios in the error cases
COUNT = """\
    - name: n_1h
      function: count
      window: 1h
      store: cold
"""


def text_of(section: str, head: str = HEAD) -> str:
    return head + "aggregations:\n" + section


def parse(section: str) -> Schema:
    return parse_schema(text_of(section), PATH)


def line_with(text: str, needle: str, nth: int = 1) -> int:
    """The 1-based line of the ``nth`` line of ``text`` that contains ``needle``."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) >= nth, f"{needle!r} occurs {len(hits)} times"
    return hits[nth - 1]


# --------------------------------------------------------------------------- good sections

GOOD = """\
  allowed_lateness: 10m
  features:
    - name: clicks_1h
      description: clicks in the last hour
      function: count
      where: {kind: click}
      window: 1h
      store: [hot, cold]
    - name: views_today
      function: count
      where: {kind: [view, buy], flag: true, qty: [1, 2, 2]}
      window: {size: 1d, type: tumbling}
      store: cold
    - name: ctr
      function: ratio
      numerator: clicks_1h
      denominator: views_today
      on_zero: 0
      store: hot
    - name: spend_7d
      function: sum
      of: amount
      window: {size: 7d}
      store: cold
    - name: items_30m
      function: count_distinct
      of: item
      window: 1800
      store: cold
"""


def test_a_good_section_parses_to_the_expected_model() -> None:
    schema = parse(GOOD)
    aggs = schema.aggregations
    assert aggs is not None
    assert aggs.allowed_lateness_s == 600
    assert [a.name for a in aggs.features] == ["clicks_1h", "views_today", "ctr", "spend_7d", "items_30m"]
    clicks, views, ctr, spend, items = aggs.features
    # A duration string is a sliding window.
    assert clicks == Aggregation(
        name="clicks_1h", function="count", store=frozenset({"hot", "cold"}), of=None,
        window=Window(size_s=3600, kind="sliding"), where=(("kind", ("click",)),),
        description="clicks in the last hour", line=line_with(text_of(GOOD), "name: clicks_1h"),
    )
    # {size, type}; where: a scalar is one value, a list several (duplicates dropped), typed as the field.
    assert views.window == Window(size_s=86400, kind="tumbling")
    assert views.where == (("kind", ("view", "buy")), ("flag", (True,)), ("qty", (1, 2)))
    assert type(views.where[2][1][0]) is int
    # A ratio has no window, no of, no where; on_zero is a float.
    assert (ctr.function, ctr.numerator, ctr.denominator) == ("ratio", "clicks_1h", "views_today")
    assert ctr.on_zero == 0.0
    assert type(ctr.on_zero) is float
    assert (ctr.window, ctr.of, ctr.where, ctr.store) == (None, None, (), frozenset({"hot"}))
    # {size} alone is sliding; a plain integer window is seconds.
    assert spend.window == Window(size_s=7 * 86400, kind="sliding") and spend.of == "amount"
    assert items.window == Window(size_s=1800)
    assert aggs.max_window_s == 7 * 86400


def test_allowed_lateness_defaults_to_0_and_takes_seconds_or_durations() -> None:
    def lateness(line: str) -> int:
        aggs = parse(line + "  features:\n" + COUNT).aggregations
        assert aggs is not None
        return aggs.allowed_lateness_s

    assert lateness("") == 0
    assert lateness("  allowed_lateness: 0\n") == 0
    assert lateness("  allowed_lateness: 90\n") == 90
    assert lateness("  allowed_lateness: 1d12h\n") == 36 * 3600


@pytest.mark.parametrize(("function", "of"), [
    ("count", "score"), ("count", "day"),  # count of: counts non-null values of any type
    ("sum", "qty"), ("sum", "amount"), ("mean", "qty"), ("mean", "amount"),
    ("min", "score"), ("max", "amount"), ("last", "qty"),
    ("count_distinct", "item"), ("count_distinct", "kind"), ("count_distinct", "flag"),
    ("count_distinct", "qty"),
    # issue 50: sketches
    ("approx_count_distinct", "item"), ("approx_count_distinct", "score"), ("approx_count_distinct", "day"),
    ("approx_count_distinct", "amount"), ("approx_count_distinct", "flag"),
    # issue 32: float sums in fixed point, moments, first
    ("sum", "score"), ("mean", "score"), ("variance", "qty"), ("stddev", "amount"),
    ("variance_sample", "score"), ("stddev_sample", "qty"), ("first", "score"), ("first", "amount"),
])
def test_each_function_accepts_its_field_types(function: str, of: str) -> None:
    aggs = parse(f"  features:\n    - name: a\n      function: {function}\n      of: {of}\n"
                 "      window: 1h\n      store: cold\n").aggregations
    assert aggs is not None and (aggs.features[0].function, aggs.features[0].of) == (function, of)


def test_sketches_take_their_keys_with_documented_defaults() -> None:
    aggs = parse("  features:\n"
                 "    - {name: a, function: approx_count_distinct, of: item, window: 1h, store: cold}\n"
                 "    - {name: b, function: approx_count_distinct, of: day, precision: 16, window: 1h,\n"
                 "       store: cold}\n"
                 "    - {name: c, function: approx_percentile, of: amount, q: 0.9, window: 1h, store: cold}\n"
                 "    - {name: d, function: approx_percentile, of: qty, q: [0.5, 1],\n"
                 "       relative_accuracy: 0.001, window: 1h, store: cold}\n").aggregations
    assert aggs is not None
    assert [(a.precision, a.q, a.relative_accuracy) for a in aggs.features] == [
        (12, None, None), (16, None, None), (None, 0.9, 0.01), (None, (0.5, 1.0), 0.001)]
    implicit, explicit, other = (
        fingerprint(parse(f"  features:\n    - {{name: a, function: approx_count_distinct, of: item{extra}, "
                          "window: 1h, store: cold}\n"))
        for extra in ("", ", precision: 12", ", precision: 8"))
    assert implicit == explicit != other


def test_a_float_fields_sums_and_moments_get_a_scale_default_6() -> None:
    aggs = parse("  features:\n"
                 "    - {name: a, function: sum, of: score, window: 1h, store: cold}\n"
                 "    - {name: b, function: stddev_sample, of: score, scale: 0, window: 1h, store: cold}\n"
                 "    - {name: c, function: variance, of: qty, window: 1h, store: cold}\n"
                 "    - {name: d, function: max, of: score, window: 1h, store: cold}\n").aggregations
    assert aggs is not None
    assert [a.scale for a in aggs.features] == [6, 0, None, None]
    # the default is the declared 6; another scale is another fingerprint
    implicit, explicit, other = (
        fingerprint(parse(f"  features:\n    - {{name: a, function: sum, of: score{extra}, window: 1h, "
                          "store: cold}\n")) for extra in ("", ", scale: 6", ", scale: 2"))
    assert implicit == explicit != other


def test_no_section_and_a_null_section_are_the_same() -> None:
    without = parse_schema(HEAD, PATH)
    null = parse_schema(HEAD + "aggregations:\n", PATH)
    assert without.aggregations is None and null.aggregations is None
    assert fingerprint(without) == fingerprint(null)


def test_clicks_aggregations() -> None:
    aggs = load_schema(SCHEMAS / "clicks.yaml").aggregations
    assert aggs is not None
    assert aggs.allowed_lateness_s == 3600
    by = {a.name: a for a in aggs.features}
    assert by["clicks_24h"].where == (("event_type", ("click",)),)
    assert by["spend_today"].window == Window(size_s=86400, kind="tumbling")
    assert (by["click_ratio_24h"].numerator, by["click_ratio_24h"].denominator) == ("clicks_24h", "views_24h")
    assert isinstance(aggs, Aggregations) and aggs.max_window_s == 7 * 86400


# --------------------------------------------------------------------------- bad sections


def one(*lines: str, name: str = "a") -> str:
    """A section of one aggregation ``name`` whose keys are ``lines`` (``key: value``)."""
    return f"  features:\n    - name: {name}\n" + "".join(f"      {line}\n" for line in lines)


def ratio(*lines: str, name: str = "r") -> str:
    """A section of the count ``n_1h`` and then the aggregation ``name`` of ``lines``."""
    return "  features:\n" + COUNT + f"    - name: {name}\n" + "".join(f"      {line}\n" for line in lines)


W, S = "window: 1h", "store: cold"
RATIO = ("function: ratio", "numerator: n_1h", "denominator: n_1h")

# (id, the aggregations section, key path under `aggregations.`, the text on the offending line,
#  fragments of the reason)
BAD: list[tuple[str, str, str, str, tuple[str, ...]]] = [
    ("unknown_function", one("function: cnt", W, S), "features[0].function", "function: cnt",
     ("unknown aggregation function 'cnt'", "(did you mean 'count'?)")),
    ("unknown_function_lists_the_choices", one("function: p99", W, S),
     "features[0].function", "function: p99",
     ("unknown aggregation function 'p99'; expected one of: count, sum, mean, min, max, last, "
      "count_distinct, ratio, variance, stddev, variance_sample, stddev_sample, first",)),
    ("missing_window", one("function: count", S, name="lonely"), "features[0].window",
     "name: lonely", ("a windowed aggregation needs window",)),
    ("window_on_a_ratio", ratio(*RATIO, "on_zero: 0", "window: 2h", S), "features[1].window",
     "window: 2h", ("window does not apply to function ratio", "a ratio divides two other aggregations")),
    ("of_on_a_ratio", ratio(*RATIO, "on_zero: 0", "of: qty", S), "features[1].of", "of: qty",
     ("of does not apply to function ratio",)),
    ("ratio_without_on_zero", ratio(*RATIO, S, name="no_zero"), "features[1].on_zero",
     "name: no_zero", ("a ratio needs on_zero",)),
    ("ratio_without_numerator", ratio("function: ratio", "denominator: n_1h", "on_zero: 0", S, name="no_num"),
     "features[1].numerator", "name: no_num", ("a ratio needs numerator",)),
    ("ratio_of_a_missing_aggregation",
     ratio("function: ratio", "numerator: n_1h", "denominator: n_2h", "on_zero: 0", S),
     "features[1].denominator", "denominator: n_2h",
     ("denominator 'n_2h' is not a windowed aggregation of this schema", "(did you mean 'n_1h'?)")),
    ("ratio_of_a_ratio",
     ratio(*RATIO, "on_zero: 0", S)
     + "    - {name: r2, function: ratio, numerator: r, denominator: n_1h, on_zero: 0, store: cold}\n",
     "features[2].numerator", "{name: r2", ("numerator 'r' is a ratio", "not another ratio")),
    ("numerator_on_a_count", one("function: count", "numerator: b", W, S),
     "features[0].numerator", "numerator: b",
     ("numerator does not apply to function count", "belongs to ratio aggregations only")),
    ("scale_on_an_integer_sum", one("function: sum", "of: qty", "scale: 2", W, S), "features[0].scale",
     "scale: 2", ("scale applies to a float field only: sum of an integer or decimal field is exact",)),
    ("scale_on_first", one("function: first", "of: score", "scale: 2", W, S), "features[0].scale",
     "scale: 2", ("scale does not apply to function first", "sum, mean, variance, stddev")),
    ("scale_too_large", one("function: stddev", "of: score", "scale: 19", W, S), "features[0].scale",
     "scale: 19", ("scale (decimal digits kept) must be <= 18, got 19",)),
    ("scale_not_an_integer", one("function: mean", "of: score", "scale: 2.5", W, S), "features[0].scale",
     "scale: 2.5", ("expected scale (decimal digits kept)",)),
    ("variance_over_a_string", one("function: variance", "of: item", W, S), "features[0].of", "of: item",
     ("variance of field 'item' (string): variance needs a numeric field",)),
    ("min_over_a_string", one("function: min", "of: item", W, S), "features[0].of", "of: item",
     ("min of field 'item' (string): min needs a numeric field",)),
    ("count_distinct_over_a_float", one("function: count_distinct", "of: score", W, S),
     "features[0].of", "of: score",
     ("count_distinct of field 'score' (float64)", "a string, enum, bool or integer field")),
    ("of_an_unknown_field", one("function: max", "of: qtty", W, S), "features[0].of", "of: qtty",
     ("of 'qtty' is not a field of this schema (did you mean 'qty'?)",)),
    ("sum_without_of", one("function: sum", W, S, name="lonely"), "features[0].of",
     "name: lonely", ("sum needs of: the field it aggregates",)),
    ("where_on_an_unknown_field", one("function: count", "where: {knd: click}", W, S),
     "features[0].where.knd", "where: {knd",
     ("where on 'knd': it is not a field of this schema (did you mean 'kind'?)",)),
    ("where_value_not_in_the_enum", one("function: count", "where:", "  kind: [view, clik]", W, S),
     "features[0].where.kind[1]", "kind: [view, clik]",
     ("'clik' is not one of the values of enum field 'kind' (did you mean 'click'?)",)),
    ("where_on_a_float", one("function: count", "where:", "  score: 1.5", W, S),
     "features[0].where.score", "score: 1.5",
     ("where on field 'score' (float64): only string, enum, bool and integer fields can be filtered",)),
    ("where_value_of_the_wrong_type", one("function: count", "where:", "  qty: [1, two]", W, S),
     "features[0].where.qty[1]", "qty: [1, two]", ("where value for 'qty' must be a number",)),
    ("where_null", one("function: count", "where:", "  item: null", W, S),
     "features[0].where.item", "item: null", ("where values must not be null",)),
    ("where_empty_list", one("function: count", "where:", "  kind: []", W, S),
     "features[0].where.kind", "kind: []", ("where needs at least one allowed value",)),
    ("of_a_field_not_stored_cold", one("function: count_distinct", "of: badge", W, S), "features[0].of",
     "of: badge", ("field 'badge' is read by an aggregation, so it must be stored cold",
                   "windows are computed over the history table")),
    ("where_on_a_field_not_stored_cold", one("function: count", "where: {badge: gold}", W, S),
     "features[0].where.badge", "where: {badge", ("field 'badge' is read by an aggregation",)),
    ("where_empty", one("function: count", "where: {}", W, S), "features[0].where", "where: {}",
     ("where must name at least one field",)),
    ("duplicate_aggregation_name",
     "  features:\n" + COUNT + "    - {name: n_1h, function: count, window: 2h, store: cold}\n",
     "features[1].name", "{name: n_1h", ("duplicate aggregation name 'n_1h' (first at line 38)",)),
    ("name_clashes_with_a_field",
     "  features:\n    - {name: qty, function: count, window: 1h, store: cold}\n",
     "features[0].name", "{name: qty,", ("aggregation name 'qty' clashes with the field 'qty'",)),
    ("name_clashes_with_a_feature",
     "  features:\n    - {name: qty_log, function: count, window: 1h, store: cold}\n",
     "features[0].name", "{name: qty_log,",
     ("aggregation name 'qty_log' clashes with the feature 'qty_log'",)),
    ("invalid_name", one("function: count", W, S, name="Clicks"), "features[0].name",
     "name: Clicks", ("invalid aggregation name 'Clicks'",)),
    ("negative_allowed_lateness", "  allowed_lateness: -5\n  features:\n" + COUNT,
     "allowed_lateness", "allowed_lateness", ("allowed_lateness must be >= 0 seconds, got -5",)),
    ("invalid_allowed_lateness", "  allowed_lateness: soon\n  features:\n" + COUNT,
     "allowed_lateness", "allowed_lateness", ("allowed_lateness string 'soon' is not a duration",)),
    ("window_0", one("function: count", "window: 0", S), "features[0].window", "window: 0",
     ("window must be >= 1 seconds, got 0",)),
    ("window_size_0", one("function: count", "window: {size: 0s, type: tumbling}", S),
     "features[0].window.size", "window: {size: 0s", ("window size must be >= 1 seconds, got 0s",)),
    ("window_not_a_duration", one("function: count", "window: 1w", S), "features[0].window",
     "window: 1w", ("window string '1w' is not a duration",)),
    ("window_type_unknown", one("function: count", "window:", "  size: 1h", "  type: hopping", S),
     "features[0].window.type", "type: hopping",
     ("window type must be sliding or tumbling, got 'hopping'",)),
    ("empty_features", "  features: []\n", "features", "features: []",
     ("aggregations.features must list at least one aggregation",)),
    ("missing_features", "  allowed_lateness: 1h\n", "features", "allowed_lateness",
     ("missing required key 'features' in the aggregations section",)),
    ("unknown_key_in_an_aggregation", one("function: count", W, "stor: cold", S),
     "features[0].stor", "stor: cold",
     ("unknown key 'stor' in an aggregation (did you mean 'store'?)",)),
    ("unknown_key_in_the_section", "  lateness: 1h\n  features:\n" + COUNT, "lateness", "lateness: 1h",
     ("unknown key 'lateness' in the aggregations section", "(did you mean 'allowed_lateness'?)")),
    ("missing_store", one("function: count", W, name="lonely"), "features[0].store",
     "name: lonely", ("missing required key 'store' in an aggregation",)),
    ("store_none", one("function: count", W, "store: none"), "features[0].store", "store: none",
     ("must be stored: hot, cold or [hot, cold]",)),
    # sketches (issue 50)
    ("precision_out_of_range", one("function: approx_count_distinct", "of: item", "precision: 3", W, S),
     "features[0].precision", "precision: 3", ("precision (HyperLogLog", "4..18")),
    ("precision_on_another_function", one("function: count_distinct", "of: item", "precision: 12", W, S),
     "features[0].precision", "precision: 12",
     ("precision does not apply to function count_distinct: it belongs to approx_count_distinct",)),
    ("approx_count_distinct_of_nothing", one("function: approx_count_distinct", W, S, name="lonely"),
     "features[0].of", "name: lonely", ("approx_count_distinct needs of",)),
    ("percentile_without_q", one("function: approx_percentile", "of: score", W, S, name="lonely"),
     "features[0].q", "name: lonely", ("approx_percentile needs q",)),
    ("percentile_q_above_1", one("function: approx_percentile", "of: score", "q: 1.5", W, S),
     "features[0].q", "q: 1.5", ("q (a quantile) 1.5 is out of range: 0.0..1.0",)),
    ("percentile_q_list_bad_item", one("function: approx_percentile", "of: score", "q: [0.5, -0.1]", W, S),
     "features[0].q[1]", "q: [0.5, -0.1]", ("q (a quantile) -0.1 is out of range",)),
    ("percentile_q_empty_list", one("function: approx_percentile", "of: score", "q: []", W, S),
     "features[0].q", "q: []", ("q lists no quantile",)),
    ("percentile_of_a_string", one("function: approx_percentile", "of: item", "q: 0.5", W, S),
     "features[0].of", "of: item", ("approx_percentile needs a numeric field",)),
    ("relative_accuracy_out_of_range",
     one("function: approx_percentile", "of: score", "q: 0.5", "relative_accuracy: 0.5", W, S),
     "features[0].relative_accuracy", "relative_accuracy: 0.5", ("relative_accuracy 0.5 is out of range",)),
    ("q_on_another_function", one("function: max", "of: score", "q: 0.5", W, S), "features[0].q", "q: 0.5",
     ("q does not apply to function max: it belongs to approx_percentile",)),
]


def test_bad_case_ids_are_unique() -> None:
    assert len({case[0] for case in BAD}) == len(BAD)


@pytest.mark.parametrize(("section", "key_path", "needle", "fragments"), [c[1:] for c in BAD],
                         ids=[c[0] for c in BAD])
def test_bad_section_is_refused_with_line_key_path_and_reason(
    section: str, key_path: str, needle: str, fragments: tuple[str, ...],
) -> None:
    text = text_of(section)
    with pytest.raises(SchemaErrors) as info:
        parse_schema(text, PATH)
    errors = info.value.errors
    assert len(errors) == 1, [str(e) for e in errors]
    error = errors[0]
    expected_line = line_with(text, needle)
    key_path = f"aggregations.{key_path}"
    assert (error.path, error.line, error.key_path) == (PATH, expected_line, key_path)
    for fragment in fragments:
        assert fragment in error.reason
    assert str(info.value) == f"{PATH}:{expected_line}: {key_path}: {error.reason}"


def test_aggregations_on_a_validation_only_schema_are_refused() -> None:
    text = (
        "version: 1.0.0\nname: v\nfields:\n  - name: a\n    type: int32\n"
        "aggregations:\n  features:\n    - name: n\n      function: count\n      window: 1h\n"
        "      store: cold\n"
    )
    with pytest.raises(SchemaErrors) as info:
        parse_schema(text, "v.yaml")
    [error] = info.value.errors
    assert (error.line, error.key_path) == (7, "aggregations")
    assert "aggregations need a loadable schema: add entity and event_time" in error.reason


def test_every_problem_of_a_section_is_reported_at_once() -> None:
    section = (
        "  allowed_lateness: -1\n"
        "  features:\n"
        "    - name: a\n      function: sum\n      of: item\n      window: 1h\n      store: cold\n"
        "    - name: b\n      function: mode\n      window: 1h\n      store: cold\n"
        "    - {name: c, function: count, where: {kind: clik}, window: 0, store: cold}\n"
    )
    text = text_of(section)
    with pytest.raises(SchemaErrors) as info:
        parse_schema(text, PATH)
    found = [(e.line, e.key_path) for e in info.value.errors]
    assert found == [
        (line_with(text, "allowed_lateness"), "aggregations.allowed_lateness"),
        (line_with(text, "of: item"), "aggregations.features[0].of"),
        (line_with(text, "function: mode"), "aggregations.features[1].function"),
        (line_with(text, "{name: c,"), "aggregations.features[2].window"),
        (line_with(text, "{name: c,"), "aggregations.features[2].where.kind"),
    ]


def test_broken_fields_add_no_second_hand_where_errors() -> None:
    # The field list fails (an unknown type): a where on a field is not reported as unknown.
    head = HEAD.replace("type: int32", "type: int128")
    text = text_of("  features:\n    - name: a\n      function: count\n      where: {kind: click}\n"
                   "      window: 1h\n      store: cold\n", head)
    with pytest.raises(SchemaErrors) as info:
        parse_schema(text, PATH)
    assert [e.key_path for e in info.value.errors] == ["fields[4].type"]


def test_a_bad_section_error_is_a_schema_error() -> None:
    with pytest.raises(SchemaError):
        parse("  features: []\n")


# --------------------------------------------------------------------------- fingerprints


def test_credit_applicant_fingerprint_is_the_one_in_its_generated_sql() -> None:
    header = (ROOT / "sql" / "credit_applicant.sql").read_text(encoding="utf-8")
    match = re.search(r"^-- fingerprint: ([0-9a-f]{64})$", header, re.MULTILINE)
    assert match is not None
    schema = load_schema(SCHEMAS / "credit_applicant.yaml")
    assert schema.aggregations is None
    assert '"aggregations"' not in canonical_json(schema)
    assert fingerprint(schema) == match[1]


def test_clicks_fingerprint_follows_its_aggregations() -> None:
    text = (SCHEMAS / "clicks.yaml").read_text(encoding="utf-8")
    base = fingerprint(parse_schema(text))
    assert '"aggregations"' in canonical_json(parse_schema(text))

    def changed(old: str, new: str) -> str:
        assert text.count(old) == 1, old
        return fingerprint(parse_schema(text.replace(old, new)))

    window = "      of: dwell_ms\n      window: 1h\n      store: [hot, cold]"
    assert changed(window, window.replace("1h", "2h")) != base
    assert changed(window, window.replace("1h", "{size: 1h, type: tumbling}")) != base
    assert changed(window, window.replace("1h", "3600")) == base  # the same window spelled in seconds
    assert changed("allowed_lateness: 1h", "allowed_lateness: 2h") != base
    assert changed("      on_zero: 0.0\n", "      on_zero: 1.0\n") != base
    assert changed("where: {event_type: click}", "where: {event_type: [click, view]}") != base
    assert changed("clicks in the 24 hours", "clicks over a day") == base  # descriptions never count



def test_the_schema_doc_example_parses_against_the_clicks_fields() -> None:
    doc = (ROOT / "docs" / "schema.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Aggregations\n"):]
    body = section.index("```yaml\n") + len("```yaml\n")
    example = section[body:section.index("```\n", body)]
    assert example.startswith("aggregations:\n")
    clicks = (SCHEMAS / "clicks.yaml").read_text(encoding="utf-8")
    start, end = clicks.index("aggregations:\n"), clicks.index("evolution_rules:\n")
    aggs = parse_schema(clicks[:start] + example + clicks[end:], "doc.yaml").aggregations
    assert aggs is not None
    assert [a.name for a in aggs.features] == ["clicks_24h", "views_24h", "click_ratio_24h", "spend_today"]
