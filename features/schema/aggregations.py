"""Windowed aggregations: the checks of the ``aggregations:`` section of a schema.

``AggregationReader.parse_aggregations`` reads ``allowed_lateness`` and the list of
aggregation features, each checked against the schema's fields (and the names its
fields and derived features take), and returns an :class:`~features.schema.model.Aggregations`,
or None after recording every problem (see :mod:`features.schema.nodes`).

==============  ================================  ==============================
function        of (the field it aggregates)      other keys
==============  ================================  ==============================
count           none (counts events) or any       window, where
                field (counts non-null values)
sum, mean       a numeric field                   window, where, scale (float
                                                  fields)
min, max, last  a numeric field                   window, where
count_distinct  a string, enum, bool or integer   window, where
                field
first           a numeric field                   window, where
variance,       a numeric field                   window, where, scale (float
stddev (and                                       fields)
their _sample)
last_k          an integer or float field         window, where, k (1..64)
approx_count_   any scalar field (NaN refused)    window, where, precision
distinct                                          (4..18, default 12)
approx_         a numeric field                   window, where, q (one
percentile                                        quantile or a list, each in
                                                  [0, 1]), relative_accuracy
                                                  (0.001..0.25, default 0.01)
ratio           -                                 numerator, denominator (two
                                                  windowed aggregations), on_zero
==============  ================================  ==============================

A field an aggregation reads (``of``, ``where``) must be stored cold: windows are
computed over the history table. ``where`` filters on string, enum, bool and integer
fields, by listed values (never null). ``docs/aggregations.md`` gives the semantics.

``scale`` (float fields only, sum/mean/variance/stddev; default 6, 0..18): float values
are summed in fixed point, each rounded half to even to an integer multiple of
10^-scale, so that the result cannot depend on the order of addition.
"""

from __future__ import annotations

from typing import Final, cast

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from features.schema.model import (
    FLOAT_KINDS,
    INTEGER_KINDS,
    NUMERIC_KINDS,
    AggFunction,
    Aggregation,
    Aggregations,
    Feature,
    Field,
    ScalarValue,
    TypeKind,
    Window,
    WindowKind,
)
from features.schema.nodes import Invalid, NodeReader, YamlMap, is_null, join_path, line_of

_AGG_SECTION_KEYS: Final = ("allowed_lateness", "features")
_AGG_KEYS: Final = ("name", "function", "of", "window", "where", "numerator", "denominator", "on_zero",
                    "scale", "store", "description", "k", "precision", "q", "relative_accuracy")
_AGG_FUNCTIONS: Final = ("count", "sum", "mean", "min", "max", "last", "count_distinct", "ratio",
                         "variance", "stddev", "variance_sample", "stddev_sample", "first", "last_k",
                         "approx_count_distinct", "approx_percentile")
#: functions that add values: over a float field they take ``scale`` (fixed point)
_SCALED: Final = ("sum", "mean", "variance", "stddev", "variance_sample", "stddev_sample")
DEFAULT_SCALE: Final = 6
MAX_SCALE: Final = 18
#: the largest ``k`` of ``last_k``
LAST_K_MAX: Final = 64
#: approx_count_distinct's HyperLogLog precision (2^p registers): default and bounds
PRECISION_DEFAULT: Final = 12
PRECISION_MIN: Final = 4
PRECISION_MAX: Final = 18
#: approx_percentile's relative accuracy: default and bounds
ACCURACY_DEFAULT: Final = 0.01
ACCURACY_MIN: Final = 0.001
ACCURACY_MAX: Final = 0.25
#: the most quantiles one ``approx_percentile`` lists
QUANTILES_MAX: Final = 16
#: the keys that belong to one function only (key -> function)
_OWN_KEYS: Final = {"precision": "approx_count_distinct", "q": "approx_percentile",
                    "relative_accuracy": "approx_percentile"}
#: the field types each function accepts for ``of`` (why, in the error, for the others)
_AGG_OF_KINDS: Final = {
    "count": None,  # any type: counts non-null values
    "sum": (NUMERIC_KINDS, "a numeric field"),
    "mean": (NUMERIC_KINDS, "a numeric field"),
    "min": (NUMERIC_KINDS, "a numeric field"),
    "max": (NUMERIC_KINDS, "a numeric field"),
    "last": (NUMERIC_KINDS, "a numeric field"),
    "count_distinct": (INTEGER_KINDS | {TypeKind.STRING, TypeKind.ENUM, TypeKind.BOOL},
                       "a string, enum, bool or integer field"),
    # moments and first (issue 32)
    "variance": (NUMERIC_KINDS, "a numeric field"),
    "stddev": (NUMERIC_KINDS, "a numeric field"),
    "variance_sample": (NUMERIC_KINDS, "a numeric field"),
    "stddev_sample": (NUMERIC_KINDS, "a numeric field"),
    "first": (NUMERIC_KINDS, "a numeric field"),
    # last_k: a list of the field's type (list elements: integers and floats)
    "last_k": (INTEGER_KINDS | FLOAT_KINDS, "an integer or float field (its values make a list)"),
    # sketches (issue 50): any scalar value hashes; percentiles bucket numbers
    "approx_count_distinct": (NUMERIC_KINDS | {TypeKind.STRING, TypeKind.ENUM, TypeKind.BOOL, TypeKind.DATE,
                                               TypeKind.TIMESTAMP}, "a scalar field (not a list)"),
    "approx_percentile": (NUMERIC_KINDS, "a numeric field"),
}
_WHERE_KINDS: Final = INTEGER_KINDS | {TypeKind.STRING, TypeKind.ENUM, TypeKind.BOOL}


class AggregationReader(NodeReader):
    """NodeReader plus the checks of the aggregations section."""

    @staticmethod
    def _value_node(node: Node, key: str) -> Node:
        """The value of ``key`` in the mapping ``node`` (for an error's line), else ``node``."""
        if isinstance(node, MappingNode):
            for knode, vnode in node.value:
                if isinstance(knode, ScalarNode) and knode.value == key:
                    return cast(Node, vnode)
        return node

    def parse_aggregations(
        self, top: YamlMap, fields: list[tuple[Field, Node]] | None, loadable: bool,
        features: tuple[Feature, ...] | None,
    ) -> Aggregations | None:
        """The ``aggregations:`` section of ``top``: None when it is absent, or after
        recording every problem in it. ``fields`` and ``features`` are those of the
        schema that parsed (``fields`` None when the section did not: references to
        fields are then not checked); an aggregation needs a ``loadable`` schema (the
        section is checked either way)."""
        node = top.get("aggregations")
        if node is None or is_null(node):
            return None
        if not loadable:
            # the section is still checked: adding entity and event_time should not reveal more
            self.error(node, "aggregations", "aggregations need a loadable schema: add entity and event_time")
        m = self.mapping(node, "aggregations", _AGG_SECTION_KEYS, ("features",), "the aggregations section")
        if m is None:
            return None
        lateness = 0
        if (late_node := m.get("allowed_lateness")) is not None:
            lateness = self.duration(late_node, m.at("allowed_lateness"), "allowed_lateness", minimum=0) or 0
        items = None if (f_node := m.get("features")) is None else self.sequence(
            f_node, m.at("features"), "the list of aggregation features")
        if items is None:
            return None
        if not items:
            self.error(f_node, m.at("features"), "aggregations.features must list at least one aggregation")
            return None
        by_field = None if fields is None else {f.name: f for f, _ in fields}
        taken = {f.name: "field" for f, _ in fields or ()}
        taken.update({f.name: "feature" for f in features or ()})
        first_line: dict[str, int | None] = {}
        out: list[tuple[int, Aggregation]] = []  # (index in the list, aggregation)
        #: names of aggregations with an error: a ratio naming one is not checked further
        unparsed: set[str] = set()
        ok = True
        for i, item in enumerate(items):
            kp = join_path(m.at("features"), i)
            agg = self.parse_aggregation(item, kp, by_field)
            if agg is None:
                if (declared := self.declared_name(item)) is not None:
                    unparsed.add(declared)
                ok = False
                continue
            name_node = self._value_node(item, "name")
            if agg.name in first_line:
                self.error(name_node, join_path(kp, "name"),
                           f"duplicate aggregation name '{agg.name}' (first at line {first_line[agg.name]})")
                unparsed.add(agg.name)
                ok = False
                continue
            if agg.name in taken:
                self.error(name_node, join_path(kp, "name"),
                           f"aggregation name '{agg.name}' clashes with the {taken[agg.name]} '{agg.name}' "
                           "(fields, features and aggregations share one set of names)")
                unparsed.add(agg.name)
                ok = False
                continue
            first_line[agg.name] = line_of(name_node)
            out.append((i, agg))
        # the ratios' references, also when some aggregation has an error (those naming it
        # are skipped: whether it is windowed is unknown)
        windowed = {a.name: a for _, a in out if a.function != "ratio"}
        for i, agg in out:
            if agg.function != "ratio":
                continue
            kp = join_path(m.at("features"), i)
            for role, ref in (("numerator", agg.numerator), ("denominator", agg.denominator)):
                if ref in windowed or ref in unparsed:
                    continue
                if ref in first_line:
                    reason = (f"{role} '{ref}' is a ratio: a ratio divides two windowed aggregations "
                              "(every function but ratio), not another ratio")
                else:
                    reason = (f"{role} '{ref}' is not a windowed aggregation of this schema"
                              + self.suggest(str(ref), windowed))
                self.error(self._value_node(items[i], role), join_path(kp, role), reason)
                ok = False
        if not ok or not loadable:
            return None
        return Aggregations(allowed_lateness_s=lateness, features=tuple(a for _, a in out))

    def parse_window(self, node: Node, kp: str) -> Window | None:
        if isinstance(node, MappingNode):
            m = self.mapping(node, kp, ("size", "type"), ("size",), "a window")
            if m is None or (size_node := m.get("size")) is None:
                return None
            size = self.duration(size_node, m.at("size"), "window size", minimum=1)
            kind = "sliding"
            if (type_node := m.get("type")) is not None:
                text = self.string(type_node, m.at("type"), "sliding or tumbling")
                if text is None:
                    return None
                if text not in ("sliding", "tumbling"):
                    self.error(type_node, m.at("type"),
                               f"window type must be sliding or tumbling, got '{text}'"
                               + self.suggest(text, ("sliding", "tumbling")))
                    return None
                kind = text
            return None if size is None else Window(size_s=size, kind=cast(WindowKind, kind))
        size = self.duration(node, kp, "window", minimum=1)
        return None if size is None else Window(size_s=size)

    def parse_where(self, node: Node, kp: str, fields: dict[str, Field] | None
                    ) -> tuple[tuple[str, tuple[ScalarValue, ...]], ...] | None:
        # Every key is taken here and checked against the fields below, so that an unknown
        # one reads as "not a field" rather than as an unknown key of some fixed set.
        keys = [str(k.value) for k, _ in node.value if isinstance(k, ScalarNode)] \
            if isinstance(node, MappingNode) else []
        m = self.mapping(node, kp, keys, (), "a where filter (field: [values])")
        if m is None:
            return None
        if not m.entries:
            if not keys:
                self.error(node, kp, "where must name at least one field")
            return None
        if fields is None:
            return None  # the fields section did not parse: its errors are reported already
        out: list[tuple[str, tuple[ScalarValue, ...]]] = []
        ok = True
        for name, (knode, vnode) in m.entries.items():
            values = self.where_values(name, knode, vnode, m.at(name), fields)
            if values is None:
                ok = False
            else:
                out.append((name, values))
        return tuple(out) if ok else None

    def where_values(self, name: str, knode: Node, vnode: Node, vkp: str, fields: dict[str, Field]
                     ) -> tuple[ScalarValue, ...] | None:
        """The allowed values of one ``where`` entry (each entry is checked on its own);
        None after recording a problem, or when ``name`` is a field that did not parse."""
        if (field := fields.get(name)) is None:
            if name not in self.unparsed_fields:
                self.error(knode, vkp, f"where on '{name}': it is not a field of this schema"
                                       + self.suggest(name, fields))
            return None
        if "cold" not in field.store:
            self.error(knode, vkp, _not_cold(name))
            return None
        if field.type.kind not in _WHERE_KINDS:
            self.error(vnode, vkp, f"where on field '{name}' ({field.type}): only string, enum, bool and "
                                   "integer fields can be filtered")
            return None
        items = self.sequence(vnode, vkp, "the allowed values") if isinstance(vnode, SequenceNode) \
            else [vnode]
        if items is None:
            return None
        if not items:
            self.error(vnode, vkp, "where needs at least one allowed value")
            return None
        values: list[ScalarValue] = []
        seen: set[ScalarValue] = set()
        ok = True
        for j, item in enumerate(items):
            ikp = vkp if item is vnode else join_path(vkp, j)
            if is_null(item):
                self.error(item, ikp, f"where values must not be null (a filter on '{name}' keeps "
                                      "the events with one of the listed values; null matches none)")
                ok = False
                continue
            value = self.typed_value(item, ikp, field.type, f"where value for '{name}'")
            if isinstance(value, Invalid):
                ok = False
                continue
            if field.type.kind is TypeKind.ENUM and value not in field.values:
                self.error(item, ikp, f"'{value}' is not one of the values of enum field '{name}'"
                                      + self.suggest(str(value), field.values))
                ok = False
                continue
            if value not in seen:
                seen.add(value)
                values.append(value)
        return tuple(values) if ok else None

    def parse_aggregation(self, node: Node, kp: str, fields: dict[str, Field] | None) -> Aggregation | None:
        m = self.mapping(node, kp, _AGG_KEYS, ("name", "function", "store"), "an aggregation")
        if m is None:
            return None
        name = self.parse_identifier(m, "aggregation")
        function: str | None = None
        if (fn_node := m.get("function")) is not None:
            function = self.string(fn_node, m.at("function"), "an aggregation function")
            if function is not None and function not in _AGG_FUNCTIONS:
                hint = self.suggest(function, _AGG_FUNCTIONS) \
                    or f"; expected one of: {', '.join(_AGG_FUNCTIONS)}"
                self.error(fn_node, m.at("function"), f"unknown aggregation function '{function}'{hint}")
                function = None
        store = None
        if (store_node := m.get("store")) is not None:
            store = self.parse_store(store_node, m.at("store"), allow_none=False)
        description = self.optional_string(m, "description") or ""
        # The rest is checked even when the name, function or store is wrong (an unknown
        # function: whichever keys are given, as far as they do not depend on it).
        ok = name is not None and function is not None and store is not None
        is_ratio = function == "ratio"
        allowed = {"numerator", "denominator", "on_zero"} if is_ratio else {"of", "window", "where"}
        if function in _SCALED:
            allowed.add("scale")
        if function is None:
            allowed = set(_AGG_KEYS)
        for key in ("of", "window", "where", "numerator", "denominator", "on_zero", "scale"):
            if m.get(key) is not None and key not in allowed:
                reason = "a ratio divides two other aggregations: it has numerator, denominator and on_zero" \
                    if is_ratio else f"{key} belongs to ratio aggregations only"
                if key == "scale" and not is_ratio:
                    reason = f"scale applies to {', '.join(_SCALED)} of a float field only"
                self.error(m.get(key), m.at(key), f"{key} does not apply to function {function}: {reason}")
                ok = False
        if is_ratio and (k_node := m.get("k")) is not None:
            self.error(k_node, m.at("k"), "k does not apply to function ratio: it belongs to last_k")
            ok = False
        if is_ratio:
            refs: list[str | None] = []
            for key in ("numerator", "denominator"):
                ref_node = m.get(key)
                if ref_node is None:
                    self.error(m.node, m.at(key), f"a ratio needs {key}: the name of another aggregation")
                    ok = False
                    refs.append(None)
                else:
                    ref = self.string(ref_node, m.at(key), "an aggregation name")
                    ok = ok and ref is not None
                    refs.append(ref)
            on_zero = None
            if (oz_node := m.get("on_zero")) is None:
                self.error(m.node, m.at("on_zero"),
                           "a ratio needs on_zero: its value where the denominator is 0")
                ok = False
            else:
                number = self.plain_number(oz_node, m.at("on_zero"), "on_zero")
                on_zero = None if number is None else float(number)
                ok = ok and number is not None
            if not ok or name is None or store is None or None in refs:
                return None
            return Aggregation(name=name, function="ratio", store=store, numerator=refs[0],
                               denominator=refs[1], on_zero=on_zero, description=description,
                               line=line_of(node))
        of: str | None = None
        if (of_node := m.get("of")) is not None:
            of = self.string(of_node, m.at("of"), "a field name")
            field = None if of is None or fields is None else fields.get(of)
            if of is not None and fields is not None and field is None and of not in self.unparsed_fields:
                self.error(of_node, m.at("of"),
                           f"of '{of}' is not a field of this schema{self.suggest(of, fields)}")
                ok = False
            if field is not None and "cold" not in field.store:
                self.error(of_node, m.at("of"), _not_cold(field.name))
                ok = False
            rule = None if function is None else _AGG_OF_KINDS.get(function)
            if field is not None and rule is not None and field.type.kind not in rule[0]:
                self.error(of_node, m.at("of"), f"{function} of field '{of}' ({field.type}): "
                                                f"{function} needs {rule[1]}")
                ok = False
            ok = ok and of is not None
        elif function not in (None, "count"):
            self.error(m.node, m.at("of"), f"{function} needs of: the field it aggregates")
            ok = False
        # ---- scale: the fixed point of a float field's sum, mean, variance, stddev
        scale = None
        if function in _SCALED and field_kind(fields, of) in FLOAT_KINDS:
            scale = DEFAULT_SCALE
            if (scale_node := m.get("scale")) is not None:
                scale = self.integer(scale_node, m.at("scale"), "scale (decimal digits kept)", 0, MAX_SCALE)
                ok = ok and scale is not None
        elif (scale_node := m.get("scale")) is not None and function in _SCALED \
                and field_kind(fields, of) is not None:
            self.error(scale_node, m.at("scale"), f"scale applies to a float field only: {function} of "
                                                  f"an integer or decimal field is exact")
            ok = False
        window = None
        if (w_node := m.get("window")) is None:
            if function is not None:
                self.error(m.node, m.at("window"), "a windowed aggregation needs window: e.g. 24h, "
                                                   "or {size: 1d, type: tumbling}")
            ok = False
        else:
            window = self.parse_window(w_node, m.at("window"))
            ok = ok and window is not None
        where: tuple[tuple[str, tuple[ScalarValue, ...]], ...] = ()
        if (where_node := m.get("where")) is not None:
            parsed_where = self.parse_where(where_node, m.at("where"), fields)
            ok = ok and parsed_where is not None
            where = parsed_where or ()
        k = self.parse_k(m, function)
        ok = ok and (k is not None or function != "last_k")
        sketch = self.parse_sketch(m, function)
        ok = ok and sketch is not None
        if not ok or name is None or store is None or sketch is None:
            return None
        precision, q, accuracy = sketch
        return Aggregation(name=name, function=cast(AggFunction, function), store=store, of=of, window=window,
                           where=where, scale=scale, description=description, line=line_of(node), k=k,
                           precision=precision, q=q, relative_accuracy=accuracy)

    def parse_sketch(self, m: YamlMap, function: str | None
                     ) -> tuple[int | None, float | tuple[float, ...] | None, float | None] | None:
        """``precision`` (approx_count_distinct), ``q`` and ``relative_accuracy``
        (approx_percentile), with their defaults; refused on the other functions. None
        after an error."""
        ok = True
        for key, owner in _OWN_KEYS.items():
            node = m.get(key)
            if node is not None and function is not None and function != owner:
                self.error(node, m.at(key),
                           f"{key} does not apply to function {function}: it belongs to {owner}")
                ok = False
        precision: int | None = None
        if function == "approx_count_distinct":
            precision = PRECISION_DEFAULT
            if (node := m.get("precision")) is not None:
                precision = self.integer(node, m.at("precision"),
                                         f"precision (HyperLogLog: 2^precision registers, "
                                         f"{PRECISION_MIN}..{PRECISION_MAX})", PRECISION_MIN, PRECISION_MAX)
                ok = ok and precision is not None
        q: float | tuple[float, ...] | None = None
        accuracy: float | None = None
        if function == "approx_percentile":
            accuracy = ACCURACY_DEFAULT
            if (node := m.get("relative_accuracy")) is not None:
                accuracy = self._fraction(node, m.at("relative_accuracy"), "relative_accuracy",
                                          ACCURACY_MIN, ACCURACY_MAX)
                ok = ok and accuracy is not None
            q = self._quantiles(m)
            ok = ok and q is not None
        return (precision, q, accuracy) if ok else None

    def _fraction(self, node: Node, kp: str, what: str, lo: float, hi: float) -> float | None:
        value = self.plain_number(node, kp, what)
        if value is None:
            return None
        if not lo <= value <= hi:
            self.error(node, kp, f"{what} {value} is out of range: {lo}..{hi}")
            return None
        return float(value)

    def _quantiles(self, m: YamlMap) -> float | tuple[float, ...] | None:
        """``q``: one quantile (a number) or a list of 1..QUANTILES_MAX, each in [0, 1]."""
        node = m.get("q")
        if node is None:
            self.error(m.node, m.at("q"), "approx_percentile needs q: the quantile (e.g. 0.9) or a list "
                                          "of them (e.g. [0.5, 0.9, 0.99])")
            return None
        if not isinstance(node, SequenceNode):
            return self._fraction(node, m.at("q"), "q (a quantile)", 0.0, 1.0)
        items = self.nonempty_sequence(node, m.at("q"), "a list of quantiles", "q lists no quantile")
        if items is None:
            return None
        if len(items) > QUANTILES_MAX:
            self.error(node, m.at("q"), f"q lists {len(items)} quantiles: at most {QUANTILES_MAX}")
            return None
        values = [self._fraction(item, join_path(m.at("q"), i), "q (a quantile)", 0.0, 1.0)
                  for i, item in enumerate(items)]
        if any(v is None for v in values):
            return None
        return tuple(float(v) for v in values if v is not None)

    def parse_k(self, m: YamlMap, function: str | None) -> int | None:
        """``k`` of ``last_k`` (1..LAST_K_MAX): required there, refused elsewhere."""
        node = m.get("k")
        if function is None:
            return None
        if function != "last_k":
            if node is not None:
                self.error(node, m.at("k"), f"k does not apply to function {function}: it belongs to last_k")
            return None
        if node is None:
            self.error(m.node, m.at("k"), f"last_k needs k: how many values it keeps (1..{LAST_K_MAX})")
            return None
        return self.integer(node, m.at("k"), f"k (1..{LAST_K_MAX})", 1, LAST_K_MAX)


def field_kind(fields: dict[str, Field] | None, name: str | None) -> TypeKind | None:
    """The kind of field ``name`` (None: unknown, or no such field)."""
    field = None if fields is None or name is None else fields.get(name)
    return None if field is None else field.type.kind


def _not_cold(name: str) -> str:
    return (f"field '{name}' is read by an aggregation, so it must be stored cold (store: cold or "
            "[hot, cold]): windows are computed over the history table, which holds only cold fields")
