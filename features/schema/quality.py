"""Quality gates: the checks of the ``quality:`` section of a schema.

``QualityReader.parse_quality`` reads the section into a
:class:`~features.schema.model.Quality`, or records every problem (see
:mod:`features.schema.nodes`) and returns None:

=================  ==========================================================
key                value
=================  ==========================================================
owner              a string (a team, an address): who answers for the data
on_breach          fail (default) or warn: what every gate does when breached
max_reject_rate    a rate in [0, 1] (rejected rows / rows read)
max_rule_rate      a mapping ``<rule id>: rate``: the rows one rule rejected /
                   rows read; rule ids as the rejects record them
                   (``income_monthly.max``, ``score_log.transform``)
min_rows           an integer >= 0: the fewest rows a load may read
max_staleness      a duration (``2h``, ``1d``, seconds): the freshness SLA
window_records     an integer >= 1: the stream's and HTTP ingest's sliding
                   window (the last N records; default 1000)
window_min_records an integer >= 1, at most ``window_records``: the fewest
                   records the window holds before a rate gate may trip
                   (default 100, capped at the window)
=================  ==========================================================

A gate's value may also be a mapping ``{limit: VALUE, on_breach: warn}`` that overrides
the section's ``on_breach`` for that gate alone. A rule id must be one the schema's
rejects can record (:func:`features.schema.model.rule_ids`): a gate on a rule that
cannot fire would never breach.
"""

from __future__ import annotations

from typing import Final, cast

from yaml.nodes import MappingNode, Node, ScalarNode

from features.schema.model import Feature, Field, Gate, GateKind, OnBreach, Quality, rule_ids
from features.schema.nodes import NodeReader, YamlMap, describe, is_null, join_path, line_of

__all__ = ["QUALITY_KEYS", "QualityReader"]

QUALITY_KEYS: Final = ("owner", "on_breach", "max_reject_rate", "max_rule_rate", "min_rows", "max_staleness",
                       "window_records", "window_min_records")
#: the largest sliding window of the stream's breaker (records): its state is a few bytes a record
MAX_WINDOW_RECORDS: Final = 10_000_000
_GATE_KEYS: Final = ("limit", "on_breach")


class QualityReader(NodeReader):
    """Reads the ``quality:`` section (mixed into ``features.schema.parse.SchemaParser``)."""

    def parse_quality(self, top: YamlMap, fields: list[tuple[Field, Node]] | None,
                      features: tuple[Feature, ...] | None) -> Quality | None:
        """The section, None when it is absent or has a problem (recorded). ``fields``
        and ``features``: those that parsed (rule ids are checked against them; a rule
        of a part that did not parse is not checked: its own error is reported)."""
        node = top.get("quality")
        if node is None or is_null(node):
            return None
        m = self.mapping(node, "quality", QUALITY_KEYS, (), "quality gates")
        if m is None:
            return None
        errors = len(self.errors)
        owner = self.optional_string(m, "owner")
        default: OnBreach = "fail"
        if (n := m.get("on_breach")) is not None:
            default = self.on_breach(n, m.at("on_breach")) or "fail"
        gates: list[Gate] = []
        if (n := m.get("max_reject_rate")) is not None:
            gates.extend(self.gate(n, m.at("max_reject_rate"), "max_reject_rate", default))
        if (n := m.get("max_rule_rate")) is not None:
            gates.extend(self.rule_gates(n, m.at("max_rule_rate"), default, fields, features))
        if (n := m.get("min_rows")) is not None:
            gates.extend(self.gate(n, m.at("min_rows"), "min_rows", default))
        staleness = None
        if (n := m.get("max_staleness")) is not None:
            staleness = self.staleness(n, m.at("max_staleness"))
        window = least = None
        if (n := m.get("window_records")) is not None:
            window = self.integer(n, m.at("window_records"), "window_records", 1, MAX_WINDOW_RECORDS)
        if (n := m.get("window_min_records")) is not None:
            least = self.integer(n, m.at("window_min_records"), "window_min_records", 1, MAX_WINDOW_RECORDS)
            if least is not None and window is not None and least > window:
                self.error(n, m.at("window_min_records"),
                           f"window_min_records ({least}) is more than window_records ({window}): the "
                           "window never holds that many records, so its gates could never trip")
        if len(self.errors) > errors:
            return None
        return Quality(gates=tuple(gates), owner=owner, on_breach=default, max_staleness_s=staleness,
                       window_records=window, window_min_records=least)

    def on_breach(self, node: Node, kp: str) -> OnBreach | None:
        value = self.string(node, kp, "fail or warn")
        if value is None:
            return None
        if value not in ("fail", "warn"):
            self.error(node, kp, f"on_breach must be fail or warn, got '{value}'")
            return None
        return cast(OnBreach, value)

    def gate(self, node: Node, kp: str, kind: GateKind, default: OnBreach,
             rule: str | None = None) -> list[Gate]:
        """One gate: a value, or ``{limit: VALUE, on_breach: ...}``; [] after an error."""
        on_breach = default
        value_node, value_kp = node, kp
        if isinstance(node, MappingNode):
            m = self.mapping(node, kp, _GATE_KEYS, ("limit",), f"the gate {kp}")
            limit_node = None if m is None else m.get("limit")
            if m is None or limit_node is None:
                return []
            value_node, value_kp = limit_node, m.at("limit")
            if (n := m.get("on_breach")) is not None:
                parsed = self.on_breach(n, m.at("on_breach"))
                if parsed is None:
                    return []
                on_breach = parsed
        limit: float | int | None
        if kind == "min_rows":
            limit = self.integer(value_node, value_kp, "min_rows", 0)
        else:
            limit = self.rate(value_node, value_kp)
        if limit is None:
            return []
        return [Gate(kind=kind, limit=limit, on_breach=on_breach, rule=rule, line=line_of(node))]

    def rate(self, node: Node, kp: str) -> float | None:
        """A rate: a number in [0, 1] (``0.05``, ``5e-2``; a percentage is refused)."""
        value = self.number(node, kp, "a rate")
        if value is None:
            return None
        if not 0 <= value <= 1:
            self.error(node, kp, f"a rate is a fraction of the rows read, in [0, 1], got {node.value}"
                                 + (f" (for {value}% write {value / 100})" if 1 < value <= 100 else ""))
            return None
        return float(value)

    def rule_gates(self, node: Node, kp: str, default: OnBreach, fields: list[tuple[Field, Node]] | None,
                   features: tuple[Feature, ...] | None) -> list[Gate]:
        """``max_rule_rate``: ``<rule id>: rate`` for each rule, checked against the rule ids."""
        known: tuple[str, ...] | None = None
        if fields is not None and features is not None:
            known = rule_ids(tuple(f for f, _ in fields), features)
        if is_null(node):
            return []
        keys = self.rule_keys(node, kp)
        if keys is None:
            return []
        m = self.mapping(node, kp, keys, (), "rule rates (rule id: rate)")
        if m is None:
            return []
        out: list[Gate] = []
        for rule in keys:
            value = m.get(rule)
            assert value is not None
            field = rule.rsplit(".", 1)[0]
            if known is not None and rule not in known and field not in self.unparsed_fields:
                ids = [r for r in known if r.startswith(f"{field}.")]
                why = (f"field '{field}' has the rules {', '.join(ids)}" if ids
                       else f"no field or derived feature of this schema is called '{field}'")
                hint = self.suggest(rule, known)
                self.error(m.entries[rule][0], join_path(kp, rule),
                           f"unknown rule '{rule}'{hint}: {why} (a rule id is <field>.<kind> as the rejects "
                           "record it; <feature>.transform for a feature with on_invalid: reject)")
                continue
            out.extend(self.gate(value, join_path(kp, rule), "max_rule_rate", default, rule=rule))
        return out

    def rule_keys(self, node: Node, kp: str) -> tuple[str, ...] | None:
        """The keys of the ``max_rule_rate`` mapping as written (each is a rule id; the
        mapping check reports keys that are not plain names)."""
        if not isinstance(node, MappingNode):
            self.error(node, kp, f"expected rule rates (a mapping rule id: rate), got {describe(node)}")
            return None
        return tuple(str(k.value) for k, _ in node.value if isinstance(k, ScalarNode))

    def staleness(self, node: Node, kp: str) -> int | None:
        """``max_staleness``: a duration in seconds (>= 1, at most 100 years)."""
        return self.duration(node, kp, "max_staleness", minimum=1)
