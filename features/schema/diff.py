"""Schema evolution: classify every change between two versions of one schema.

``diff_schemas(old, new, aggregation_type=...)`` compares two parsed schemas and
returns a :class:`SchemaDiff`: one :class:`Change` per difference that matters to
producers, readers or the stores, each classified *compatible* (old producers and
readers keep working; the stored history keeps its meaning) or *breaking*. The
``evolution_rules`` of the NEW schema then override the classification for the field,
derived feature or aggregation they name. Finally the version is gated: a breaking
change needs a new major version, and compatible changes should bump the version.

This module reads the schema model only. The DDL that migrates the stores for the
compatible changes is rendered by :mod:`features.compile.migration`
(``plan_migration(old, new)`` classifies and renders in one call).

Classification (``kind``: compatible / breaking):

=================  ==========================================================
field_added        compatible when nullable (and not required) or with a
                   default; breaking when required or not nullable without a
                   default (old producers do not send it)
field_removed      breaking (readers lose it)
field_renamed      a removed and an added field of the same type: breaking,
                   reported as ``renamed?``
type               widening (int8 < int16 < int32 < int64, float32 < float64,
                   decimal(p,s) -> decimal(p',s') with s' >= s and
                   p'-s' >= p-s): compatible; narrowing, a kind change, a
                   timestamp unit or zone change: breaking
nullable           false -> true compatible; true -> false breaking
required           removed compatible; added breaking
min, max,          loosened (min lowered or removed, max raised or removed,
min_length,        pattern removed, lengths relaxed): compatible; tightened or
max_length,        added: breaking; a changed pattern is breaking (no regex is
pattern            proven a superset of another)
enum               values only added: compatible; any value removed: breaking
default            added or changed: compatible; removed: breaking when the
                   field is not nullable, else compatible
accept_strings     false -> true compatible; true -> false breaking
null_values        markers added that the old field could not read as a value
                   (text it rejected: ``nil`` on a number): compatible; a
                   marker removed, or added where it was a value (any text of a
                   string field, an enum value, a number's text with
                   accept_strings, ``true``/``false``, an ISO date): breaking
source             the input column/key a field is read from changed: breaking
                   (producers still sending the old name are no longer read);
                   no DDL (the stored column keeps the field's name)
empty_as_null      changed either way: breaking (empty strings change meaning)
store              ``cold`` added: compatible when the column can be added (as
                   for field_added) or no cold table exists yet; ``hot``
                   added: compatible; a store removed: breaking
feature_added      compatible
feature_removed    breaking
feature_changed    source, steps, dtype or on_invalid changed: breaking (the
                   values change meaning)
aggregation_added  compatible
aggregation_       breaking
removed
aggregation_       function, of, window, where, numerator, denominator or
changed            on_zero changed, or a windowed aggregation a ratio divides:
                   breaking (the stored values were computed differently; a
                   backfill is needed)
allowed_lateness   changed: breaking, as aggregation_changed for every one
store (of an       as for derived features
aggregation)
type (of an        the output of an unchanged sum/min/max/last follows its
aggregation)       field's new type: reported when its stored type (the
                   caller's ``aggregation_type``) changes; compatible when the
                   field's type change is
entity,            changed or removed: breaking (the table key changes); set on a
event_time         validation-only schema: compatible (the table is created new);
                   timed <-> static (``event_time: none``): breaking
name               breaking (another table)
hot_ttl            compatible
payload            format changed or max_bytes lowered: breaking; max_bytes
                   raised: compatible
=================  ==========================================================

Descriptions, field order and the evolution rules themselves are not changes.

The ``quality:`` section (gates, owner, freshness SLA) is not part of the data: a
changed gate is not a new data version and needs no version bump. Its differences are
listed apart, in :attr:`SchemaDiff.quality` (one line each, :func:`quality_changes`).

Evolution rules name a field, derived feature or aggregation (a renamed field by
either name): ``breaking_change: false`` makes every change to it compatible (the
detail says so), ``breaking_change: true`` makes every change to it breaking.
Schema-level changes (``name``, ``entity``, ``event_time``, ``hot_ttl``,
``payload``, ``allowed_lateness``) are not field changes and no rule overrides them.

Why one module of this size: one ``_Differ`` compares every part of a schema with the
classification rules beside it, and the evolution-rule overrides and the version gate
work over its whole list of changes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Literal

from features.schema.model import (
    INTEGER_KINDS,
    STATIC_EVENT_TIME,
    Aggregation,
    EvolutionRule,
    Feature,
    Field,
    FieldType,
    Gate,
    Quality,
    ScalarValue,
    Schema,
    StoreTarget,
    TypeKind,
)
from features.schema.syntax import duration_text


class ChangeKind(StrEnum):
    """What changed. Constraint kinds are named after their constraint key (``min``, ...)."""

    NAME = "name"
    ENTITY = "entity"
    EVENT_TIME = "event_time"
    HOT_TTL = "hot_ttl"
    PAYLOAD = "payload"
    FIELD_ADDED = "field_added"
    FIELD_REMOVED = "field_removed"
    FIELD_RENAMED = "field_renamed"
    TYPE = "type"
    NULLABLE = "nullable"
    REQUIRED = "required"
    MIN = "min"
    MAX = "max"
    PATTERN = "pattern"
    MIN_LENGTH = "min_length"
    MAX_LENGTH = "max_length"
    ENUM = "enum"
    DEFAULT = "default"
    ACCEPT_STRINGS = "accept_strings"
    NULL_VALUES = "null_values"
    SOURCE = "source"
    EMPTY_AS_NULL = "empty_as_null"
    STORE = "store"
    FEATURE_ADDED = "feature_added"
    FEATURE_REMOVED = "feature_removed"
    FEATURE_CHANGED = "feature_changed"
    AGGREGATION_ADDED = "aggregation_added"
    AGGREGATION_REMOVED = "aggregation_removed"
    AGGREGATION_CHANGED = "aggregation_changed"
    ALLOWED_LATENESS = "allowed_lateness"


#: Kinds that concern the schema as a whole; evolution rules never override them.
SCHEMA_KINDS = frozenset(
    {ChangeKind.NAME, ChangeKind.ENTITY, ChangeKind.EVENT_TIME, ChangeKind.HOT_TTL, ChangeKind.PAYLOAD,
     ChangeKind.ALLOWED_LATENESS}
)

Scope = Literal["schema", "field", "feature", "aggregation"]

#: The name of the type an aggregation's values are stored as, given its schema:
#: aggregations whose names are equal store alike. ``diff_schemas`` compares the names
#: of an unchanged aggregation in the old and the new schema, and quotes them in the
#: change's detail. ``features.compile.migration`` passes the Postgres column type.
AggregationType = Callable[[Schema, Aggregation], str]


@dataclass(frozen=True)
class Change:
    """One classified difference between the old and the new schema.

    - ``field``: the field, derived feature or aggregation concerned (the NEW name of
      a renamed field; ``old_field`` holds the old one), or the YAML key of a
      schema-level change (``name``, ``entity``, ``event_time``, ``hot.ttl``,
      ``payload``, ``aggregations.allowed_lateness``).
    - ``compatible``: the final classification, after evolution rules;
      ``classified_compatible`` is the classification before them.
    - ``honoured_rule``: the evolution rule of the new schema that applies to this
      change (whether it confirmed or overrode the classification), else None.

    The changes of one item (field, feature, aggregation) follow one another; the
    changes to a field present in both schemas come in this order: min, max,
    min_length, max_length, pattern, enum, then required, nullable, empty_as_null,
    then type, default, accept_strings, null_values, source, then store (hot before
    cold).
    """

    field: str
    kind: ChangeKind
    compatible: bool
    detail: str
    honoured_rule: EvolutionRule | None = None
    classified_compatible: bool = True
    scope: Scope = "field"
    old_field: str | None = None

    @property
    def overridden(self) -> bool:
        """True when an evolution rule changed the classification."""
        return self.compatible != self.classified_compatible


@dataclass(frozen=True)
class SchemaDiff:
    """The classified changes from ``old`` to ``new`` and the verdict on the version.

    - ``allowed``: False only when there is a breaking change and the new major
      version is not greater than the old one; ``refusal`` then names every
      breaking change.
    - ``warnings``: problems that do not refuse the change (a compatible change
      without a version bump, a version going backwards).
    - ``quality``: the changes of the ``quality:`` section, one line each; never a data
      change (not in ``changes``, no version bump asked).
    """

    old: Schema
    new: Schema
    changes: tuple[Change, ...]
    allowed: bool
    refusal: str | None = None
    warnings: tuple[str, ...] = ()
    quality: tuple[str, ...] = ()

    @property
    def breaking(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if not c.compatible)

    @property
    def compatible(self) -> bool:
        """True when no change is breaking (an empty diff is compatible)."""
        return not self.breaking


# ------------------------------------------------------------------ comparisons

_INT_RANK = {TypeKind.INT8: 8, TypeKind.INT16: 16, TypeKind.INT32: 32, TypeKind.INT64: 64}


def _event_time(schema: Schema) -> str | None:
    """The schema's ``event_time`` as written: a field name, ``none`` (static), or None."""
    return STATIC_EVENT_TIME if schema.static else schema.event_time


def _type_change(old: FieldType, new: FieldType) -> tuple[bool, str]:
    """(compatible, detail) for a changed type."""
    if old.kind in INTEGER_KINDS and new.kind in INTEGER_KINDS:
        if _INT_RANK[new.kind] > _INT_RANK[old.kind]:
            return True, f"type widened from {old} to {new}"
        return False, f"type narrowed from {old} to {new}"
    if old.kind is TypeKind.FLOAT32 and new.kind is TypeKind.FLOAT64:
        return True, f"type widened from {old} to {new}"
    if old.kind is TypeKind.FLOAT64 and new.kind is TypeKind.FLOAT32:
        return False, f"type narrowed from {old} to {new}"
    if old.kind is TypeKind.DECIMAL and new.kind is TypeKind.DECIMAL:
        p, s, p2, s2 = old.precision or 0, old.scale or 0, new.precision or 0, new.scale or 0
        if s2 >= s and p2 - s2 >= p - s:
            return True, f"type widened from {old} to {new}"
        return False, (
            f"type narrowed from {old} to {new} (needs scale >= {s} and "
            f"precision - scale >= {p - s})"
        )
    if old.kind is TypeKind.TIMESTAMP and new.kind is TypeKind.TIMESTAMP:
        what = []
        if old.unit != new.unit:
            what.append(f"unit {old.unit} -> {new.unit}")
        if old.tz != new.tz:
            what.append(f"zone {old.tz or 'none'} -> {new.tz or 'none'}")
        return False, f"timestamp {' and '.join(what)} (stored instants change meaning)"
    return False, f"type changed from {old} to {new}"


def _show(value: object) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _ordered(value: ScalarValue) -> Decimal | dt.date | dt.datetime | None:
    """A bound as an orderable value, or None when it cannot be ordered."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | Decimal):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    for parse in (dt.date.fromisoformat, dt.datetime.fromisoformat):
        try:
            return parse(value)
        except ValueError:
            continue
    try:
        return Decimal(value)
    except InvalidOperation:
        return None


def _lower(a: ScalarValue, b: ScalarValue) -> bool | None:
    """True when ``b < a``, False when ``b > a``, None when they cannot be ordered."""
    x, y = _ordered(a), _ordered(b)
    if isinstance(x, Decimal) and isinstance(y, Decimal):
        return y < x
    # datetime is a date subclass: compare only values of the very same class.
    if isinstance(x, dt.datetime) and isinstance(y, dt.datetime):
        try:
            return y < x
        except TypeError:  # a naive and an aware timestamp cannot be ordered
            return None
    if type(x) is dt.date and type(y) is dt.date:
        return y < x
    return None


def _same(a: ScalarValue, b: ScalarValue) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def _bound_change(
    kind: ChangeKind, old: ScalarValue, new: ScalarValue, loosen_down: bool
) -> tuple[bool, str] | None:
    """(compatible, detail) for a bound; ``loosen_down``: lowering loosens (min)."""
    if _same(old, new):
        return None
    name = kind.value
    if new is None:
        return True, f"{name} removed (was {_show(old)})"
    if old is None:
        return False, f"{name} added: {_show(new)}"
    lower = _lower(old, new)
    if lower is None:
        return False, f"{name} changed from {_show(old)} to {_show(new)} (not comparable)"
    verb = "lowered" if lower else "raised"
    return lower == loosen_down, f"{name} {verb} from {_show(old)} to {_show(new)}"


_RECOMPUTED = "the values already stored were computed differently (a backfill is needed)"


def _window(agg: Aggregation) -> str:
    return "none" if agg.window is None else f"{duration_text(agg.window.size_s)} {agg.window.kind}"


def _where(agg: Aggregation) -> dict[str, frozenset[ScalarValue]]:
    """The filter as field -> allowed values (the order of values does not matter)."""
    return {name: frozenset(values) for name, values in agg.where}


def _where_text(agg: Aggregation) -> str:
    if not agg.where:
        return "none"
    return ", ".join(f"{name} in ({', '.join(_show(v) for v in values)})" for name, values in agg.where)


def _agg_summary(agg: Aggregation) -> str:
    if agg.function == "ratio":
        return f"ratio {agg.numerator} / {agg.denominator}, {agg.on_zero} on zero"
    text = agg.function + (f" of {agg.of}" if agg.of is not None else "") + f" over {_window(agg)}"
    text += f" at scale {agg.scale}" if agg.scale is not None else ""
    return text + (f" where {_where_text(agg)}" if agg.where else "")


def _agg_redefined(old: Aggregation, new: Aggregation) -> list[str]:
    """What changed in the definition of an aggregation (empty: its values do not change)."""
    what = []
    if old.function != new.function:
        what.append(f"function {old.function} -> {new.function}")
    if old.of != new.of:
        what.append(f"of {old.of or 'none'} -> {new.of or 'none'}")
    if old.window != new.window:
        what.append(f"window {_window(old)} -> {_window(new)}")
    if _where(old) != _where(new):
        what.append(f"where {_where_text(old)} -> {_where_text(new)}")
    if old.scale != new.scale:
        what.append(f"scale {old.scale} -> {new.scale}")
    for key, a, b in (("numerator", old.numerator, new.numerator),
                      ("denominator", old.denominator, new.denominator),
                      ("on_zero", old.on_zero, new.on_zero), ("k", old.k, new.k),
                      ("precision", old.precision, new.precision), ("q", old.q, new.q),
                      ("relative_accuracy", old.relative_accuracy, new.relative_accuracy)):
        if a != b:
            what.append(f"{key} {a} -> {b}")
    return what


#: text that a numeric field with accept_strings may read as a number (a superset of the
#: validator's decimal literals: a marker matching it counts as a possible value)
_NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: text that a date or timestamp field may read as one (the start of an ISO date)
_DATE_TEXT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def _text_is_value(f: Field, text: str) -> bool:
    """Whether input text ``text`` may be a valid value of ``f`` (not a reject, not
    null), so that reading it as null changes its meaning. Conservative: True whenever
    it might be (a string field's pattern or lengths are not tried); False only when
    ``f`` is sure to refuse it: a non-string field that takes no text (date and timestamp
    fields always take ISO text: JSON has no other), or text its type cannot parse."""
    if f.constraints.empty_as_null and text == "":
        return False  # null already
    kind = f.type.kind
    if kind is TypeKind.STRING:
        return True
    if kind is TypeKind.ENUM:
        return text in f.values
    if kind in (TypeKind.DATE, TypeKind.TIMESTAMP):
        return _DATE_TEXT.match(text) is not None
    if not f.accept_strings:
        return False
    if kind is TypeKind.BOOL:
        return text in ("true", "false")
    return _NUMBER_TEXT.fullmatch(text) is not None


def _null_values_change(old: Field, new: Field) -> tuple[bool, str] | None:
    """(compatible, detail) for changed ``null_values``, None when unchanged. Markers
    added are compatible when the old field rejected them all (rows that were rejects
    are now nulls); a marker that was a value, or one removed (text that was null is
    read again), is breaking."""
    if old.null_values == new.null_values:
        return None
    gained = [m for m in new.null_values if m not in old.null_values]
    lost = [m for m in old.null_values if m not in new.null_values]
    valued = [m for m in gained if _text_is_value(old, m)]
    # "" stays null without its marker when the new field has empty_as_null
    revived = [m for m in lost if not (m == "" and new.constraints.empty_as_null)]
    parts = []
    if gained:
        parts.append("markers added: " + ", ".join(map(repr, gained)))
    if lost:
        parts.append("markers removed: " + ", ".join(map(repr, lost)))
    if revived:
        why = f"input {', '.join(map(repr, revived))} is no longer read as null"
    elif valued:
        why = f"input {', '.join(map(repr, valued))} was a value, now read as null"
    elif gained:
        why = "input the old schema rejected is now read as null"
    else:
        why = "the input read as null does not change"
    return not revived and not valued, f"null_values {'; '.join(parts)}: {why}"


def _addable(f: Field) -> bool:
    """Whether old producers (and history rows) can do without the new field ``f``:
    it has a default, or nulls are allowed."""
    return f.constraints.has_default or not f.constraints.not_null


def _renames(old: Schema, new: Schema) -> dict[str, Field]:
    """The fields reported as ``renamed?``: new name -> the old field. A field removed
    from ``old`` pairs with the first field added in ``new`` (in declared order) that
    has the same type and is not paired yet."""
    old_names, new_names = set(old.field_names), set(new.field_names)
    added = [f for f in new.fields if f.name not in old_names]
    renames: dict[str, Field] = {}
    for gone in old.fields:
        if gone.name in new_names:
            continue
        for f in added:
            if f.name not in renames and f.type == gone.type:
                renames[f.name] = gone
                break
    return renames


# ----------------------------------------------------------------------- differ


class _Differ:
    """Collects the changes of one diff, in order."""

    def __init__(self, old: Schema, new: Schema, aggregation_type: AggregationType) -> None:
        self.old, self.new = old, new
        self.aggregation_type = aggregation_type
        self.rules = {r.field: r for r in new.evolution_rules}
        self.changes: list[Change] = []
        #: whether a cold table exists that the new schema's rows go on to
        self.same_table = old.loadable and new.loadable and old.name == new.name

    # -- recording ------------------------------------------------------------

    def add(
        self, name: str, kind: ChangeKind, compatible: bool, detail: str, *,
        scope: Scope = "field", old_name: str | None = None,
    ) -> None:
        rule = None
        if scope != "schema":
            rule = self.rules.get(name) or (self.rules.get(old_name) if old_name else None)
        final = compatible if rule is None else not rule.breaking_change
        if rule is not None and final != compatible:
            why = f": {rule.description}" if rule.description else ""
            verdict = "compatible" if final else "breaking"
            detail = f"{detail} [declared {verdict} by evolution rule for {rule.field}{why}]"
        self.changes.append(Change(name, kind, final, detail, rule, compatible, scope, old_name))

    # -- schema level -----------------------------------------------------------

    def schema_level(self) -> None:
        old, new = self.old, self.new
        if old.name != new.name:
            self.add("name", ChangeKind.NAME, False,
                     f"schema renamed from {old.name!r} to {new.name!r} (another table)", scope="schema")
        for kind, a, b in (
            (ChangeKind.ENTITY, old.entity, new.entity),
            (ChangeKind.EVENT_TIME, _event_time(old), _event_time(new)),
        ):
            if a == b:
                continue
            if kind is ChangeKind.EVENT_TIME and None not in (a, b) and STATIC_EVENT_TIME in (a, b):
                self.add(kind.value, kind, False,
                         f"event_time changed from {a!r} to {b!r}: the schema becomes "
                         f"{'static' if b == STATIC_EVENT_TIME else 'timed'} (the cold table's key and the "
                         "meaning of its rows change: a history of events or one row per entity); "
                         "load it into a new table or namespace", scope="schema")
            elif a is None:
                self.add(kind.value, kind, True,
                         f"{kind.value} set to {b!r}: the schema becomes loadable (its tables are "
                         "created new by `features compile`)", scope="schema")
            elif b is None:
                self.add(kind.value, kind, False,
                         f"{kind.value} {a!r} removed: the schema is no longer loadable", scope="schema")
            else:
                self.add(kind.value, kind, False,
                         f"{kind.value} changed from {a!r} to {b!r} (the table key changes)", scope="schema")
        if old.hot.ttl_seconds != new.hot.ttl_seconds:
            def ttl(s: int | None) -> str:
                return "no expiry" if s is None else duration_text(s)
            self.add("hot.ttl", ChangeKind.HOT_TTL, True,
                     f"hot ttl changed from {ttl(old.hot.ttl_seconds)} to {ttl(new.hot.ttl_seconds)}",
                     scope="schema")
        if old.payload.format != new.payload.format:
            self.add("payload", ChangeKind.PAYLOAD, False,
                     f"payload format changed from {old.payload.format} to {new.payload.format}",
                     scope="schema")
        a_max, b_max = old.payload.max_bytes, new.payload.max_bytes
        if a_max != b_max:
            self.add("payload", ChangeKind.PAYLOAD, b_max > a_max,
                     f"payload max_bytes {'raised' if b_max > a_max else 'lowered'} from {a_max} to {b_max}",
                     scope="schema")

    # -- fields -----------------------------------------------------------------

    def fields(self) -> None:
        old_by = {f.name: f for f in self.old.fields}
        renames = _renames(self.old, self.new)
        for f in self.new.fields:
            if f.name in renames:
                self.renamed(renames[f.name], f)
            elif f.name in old_by:
                self.modified(old_by[f.name], f)
            else:
                self.field_added(f)
        renamed_old = {f.name for f in renames.values()}
        new_names = set(self.new.field_names)
        for f in self.old.fields:
            if f.name not in new_names and f.name not in renamed_old:
                self.field_removed(f)

    def field_added(self, f: Field) -> None:
        where = f" (stored {', '.join(sorted(f.store))})" if f.store else ""
        if _addable(f):
            detail = f"field added as {f.type}{where}, " + (
                f"default {_show(f.constraints.default)}" if f.constraints.has_default else "nullable"
            )
            self.add(f.name, ChangeKind.FIELD_ADDED, True, detail)
        else:
            what = "required" if f.constraints.required else "not nullable"
            self.add(f.name, ChangeKind.FIELD_ADDED, False,
                     f"field added as {f.type}{where}, {what} without a default: "
                     "old producers do not send it")

    def field_removed(self, f: Field) -> None:
        self.add(f.name, ChangeKind.FIELD_REMOVED, False,
                 f"field {f.name} ({f.type}) removed: readers lose it")

    def renamed(self, old: Field, new: Field) -> None:
        self.add(new.name, ChangeKind.FIELD_RENAMED, False,
                 f"renamed? field {old.name} removed and {new.name} added with the same type "
                 f"{new.type}: readers of {old.name} break", old_name=old.name)
        # Whatever else differs is compared under the new name.
        self.modified(dataclasses.replace(old, name=new.name), new, old_name=old.name)

    def modified(self, old: Field, new: Field, old_name: str | None = None) -> None:
        """Changes to a field present in both schemas (under ``new``'s name), in the
        order :class:`Change` states."""
        name = new.name
        a, b = old.constraints, new.constraints

        def add(kind: ChangeKind, compatible: bool, detail: str) -> None:
            self.add(name, kind, compatible, detail, old_name=old_name)

        # Bounds and lengths, enum values.
        for kind, x, y, down in (
            (ChangeKind.MIN, a.min, b.min, True),
            (ChangeKind.MAX, a.max, b.max, False),
            (ChangeKind.MIN_LENGTH, a.min_length, b.min_length, True),
            (ChangeKind.MAX_LENGTH, a.max_length, b.max_length, False),
        ):
            verdict = _bound_change(kind, x, y, down)
            if verdict is not None:
                add(kind, verdict[0], verdict[1])
        if a.pattern != b.pattern:
            if b.pattern is None:
                verdict = True, f"pattern removed (was {a.pattern!r})"
            elif a.pattern is None:
                verdict = False, f"pattern added: {b.pattern!r}"
            else:
                verdict = False, f"pattern changed from {a.pattern!r} to {b.pattern!r}"
            add(ChangeKind.PATTERN, verdict[0], verdict[1])
        if old.type.kind is TypeKind.ENUM and new.type.kind is TypeKind.ENUM and old.values != new.values:
            gained = [v for v in new.values if v not in old.values]
            lost = [v for v in old.values if v not in new.values]
            parts = []
            if gained:
                parts.append("values added: " + ", ".join(map(repr, gained)))
            if lost:
                parts.append("values removed: " + ", ".join(map(repr, lost)))
            add(ChangeKind.ENUM, not lost, "enum " + ("; ".join(parts) or "values reordered"))

        # Nulls: `required` and `nullable` are reported apart.
        if a.required != b.required:
            add(ChangeKind.REQUIRED, not b.required,
                "required removed" if a.required else "required added: the column must now be present")
        # `required` implies not nullable: a nullable change that only follows it is no news.
        follows_required = a.required != b.required and b.nullable != b.required
        if a.nullable != b.nullable and not follows_required:
            add(ChangeKind.NULLABLE, b.nullable,
                "nullable false -> true: nulls now accepted" if b.nullable
                else "nullable true -> false: nulls now rejected")
        if a.empty_as_null != b.empty_as_null:
            add(ChangeKind.EMPTY_AS_NULL, False,
                f"empty_as_null {_show(a.empty_as_null)} -> {_show(b.empty_as_null)}: "
                "empty strings change meaning")

        if old.type != new.type:
            add(ChangeKind.TYPE, *_type_change(old.type, new.type))

        if a.has_default != b.has_default or not _same(a.default, b.default):
            if not a.has_default:
                verdict = True, f"default added: {_show(b.default)}"
            elif b.has_default:
                verdict = True, f"default changed from {_show(a.default)} to {_show(b.default)}"
            elif b.not_null:
                verdict = False, f"default removed (was {_show(a.default)}): missing values are now rejected"
            else:
                verdict = True, f"default removed (was {_show(a.default)}): missing values stay null"
            add(ChangeKind.DEFAULT, verdict[0], verdict[1])

        if old.accept_strings != new.accept_strings:
            add(ChangeKind.ACCEPT_STRINGS, new.accept_strings,
                "accept_strings false -> true: string input now parsed" if new.accept_strings
                else "accept_strings true -> false: string input now rejected")

        if (markers := _null_values_change(old, new)) is not None:
            add(ChangeKind.NULL_VALUES, *markers)

        # (a rename without any source: the input name follows the field's, the rename says so)
        old_input = old.source if old.source is not None else (old_name or old.name)
        if old_input != new.input_name and (old.source, new.source) != (None, None):
            add(ChangeKind.SOURCE, False,
                f"source '{old_input}' -> '{new.input_name}': read from input column/key "
                f"'{new.input_name}' now; producers still sending '{old_input}' are no longer read")

        self.stores(old, new, _addable(new))

    def stores(self, old: Field | Feature | Aggregation, new: Field | Feature | Aggregation,
               addable: bool) -> None:
        scope: Scope = "field" if isinstance(new, Field) else (
            "aggregation" if isinstance(new, Aggregation) else "feature")
        for target, added in store_changes(old, new):
            if added:
                # Without a cold table yet (the schema just became loadable) there is
                # no history to fill.
                ok = addable or target == "hot" or not self.same_table
                why = "" if ok else " (not nullable without a default: history rows have no value)"
                self.add(new.name, ChangeKind.STORE, ok, f"now stored {target}{why}", scope=scope)
            else:
                self.add(new.name, ChangeKind.STORE, False, f"no longer stored {target}: readers lose it",
                         scope=scope)

    # -- derived features -------------------------------------------------------

    def features(self) -> None:
        old_by = {f.name: f for f in self.old.features}
        new_names = {f.name for f in self.new.features}
        for feat in self.new.features:
            before = old_by.get(feat.name)
            if before is None:
                self.add(feat.name, ChangeKind.FEATURE_ADDED, True,
                         f"derived feature added ({feat.dtype} from {feat.source}, stored "
                         f"{', '.join(sorted(feat.store))})", scope="feature")
                continue
            what = []
            if before.source != feat.source:
                what.append(f"source {before.source} -> {feat.source}")
            if before.steps != feat.steps:
                what.append("steps changed")
            if before.dtype != feat.dtype:
                what.append(f"dtype {before.dtype} -> {feat.dtype}")
            if before.on_invalid != feat.on_invalid:
                what.append(f"on_invalid {before.on_invalid} -> {feat.on_invalid}")
            if what:
                self.add(feat.name, ChangeKind.FEATURE_CHANGED, False,
                         f"derived feature {', '.join(what)}: its values change meaning", scope="feature")
            self.stores(before, feat, True)
        for before in self.old.features:
            if before.name not in new_names:
                self.add(before.name, ChangeKind.FEATURE_REMOVED, False,
                         "derived feature removed: readers lose it", scope="feature")

    # -- aggregations -----------------------------------------------------------

    def aggregations(self) -> None:
        old_section, new_section = self.old.aggregations, self.new.aggregations
        if old_section is not None and new_section is not None:
            a, b = old_section.allowed_lateness_s, new_section.allowed_lateness_s
            if a != b:
                self.add("aggregations.allowed_lateness", ChangeKind.ALLOWED_LATENESS, False,
                         f"allowed_lateness changed from {a}s to {b}s: other events count as late, so "
                         f"{_RECOMPUTED}", scope="schema")
        old_by = {a.name: a for a in (old_section.features if old_section is not None else ())}
        new_aggs = new_section.features if new_section is not None else ()
        new_names = {a.name for a in new_aggs}
        # Windowed aggregations whose values change: the ratios over them change too.
        redefined = {a.name for a in new_aggs if a.name in old_by and _agg_redefined(old_by[a.name], a)}
        for agg in new_aggs:
            before = old_by.get(agg.name)
            if before is None:
                self.add(agg.name, ChangeKind.AGGREGATION_ADDED, True,
                         f"aggregation added ({_agg_summary(agg)}, stored {', '.join(sorted(agg.store))})",
                         scope="aggregation")
                continue
            what = _agg_redefined(before, agg)
            for role, ref, was in (("numerator", agg.numerator, before.numerator),
                                   ("denominator", agg.denominator, before.denominator)):
                if ref is not None and ref == was and ref in redefined:
                    what.append(f"its {role} {ref} changed")
            if what:
                self.add(agg.name, ChangeKind.AGGREGATION_CHANGED, False,
                         f"aggregation {', '.join(what)}: {_RECOMPUTED}", scope="aggregation")
            else:
                self.aggregation_output(before, agg)
            self.stores(before, agg, True)
        for before in old_by.values():
            if before.name not in new_names:
                self.add(before.name, ChangeKind.AGGREGATION_REMOVED, False,
                         "aggregation removed: readers lose it", scope="aggregation")

    def aggregation_output(self, old: Aggregation, new: Aggregation) -> None:
        """An unchanged sum/min/max/last whose stored type follows its field's new type."""
        before, after = self.aggregation_type(self.old, old), self.aggregation_type(self.new, new)
        if before == after or new.of is None:
            return
        old_type, new_type = self.old.field(new.of).type, self.new.field(new.of).type
        compatible, _ = _type_change(old_type, new_type)
        self.add(new.name, ChangeKind.TYPE, compatible,
                 f"output type {before} -> {after}, following field {new.of} ({old_type} -> {new_type})",
                 scope="aggregation")


# ------------------------------------------------------------------ public API


def store_changes(
    old: Field | Feature | Aggregation, new: Field | Feature | Aggregation
) -> list[tuple[StoreTarget, bool]]:
    """The stores ``new`` gained (True) or lost (False) against ``old``, hot before cold:
    the order of its ``store`` changes."""
    out: list[tuple[StoreTarget, bool]] = []
    targets: tuple[StoreTarget, ...] = ("hot", "cold")
    for target in targets:
        if (target in new.store) != (target in old.store):
            out.append((target, target in new.store))
    return out


def _gate_text(gate: Gate) -> str:
    return f"{gate.limit} ({gate.on_breach})"


def quality_changes(old: Quality | None, new: Quality | None) -> tuple[str, ...]:
    """The differences between two ``quality:`` sections, one line each (gates by name,
    in the new section's order, then the removed ones; the other keys by name). The line
    a gate was declared on is not a difference."""
    a, b = old or Quality(), new or Quality()
    out: list[str] = []
    if (old is None) != (new is None):
        out.append("quality section " + ("added" if old is None else "removed"))
    old_gates = {g.name: g for g in a.gates}
    new_gates = {g.name: g for g in b.gates}
    for name, gate in new_gates.items():
        before = old_gates.get(name)
        if before is None:
            out.append(f"gate {name} added: {_gate_text(gate)}")
        elif (before.limit, before.on_breach) != (gate.limit, gate.on_breach):
            out.append(f"gate {name} changed: {_gate_text(before)} -> {_gate_text(gate)}")
    out.extend(f"gate {name} removed (was {_gate_text(gate)})"
               for name, gate in old_gates.items() if name not in new_gates)
    for f in dataclasses.fields(Quality):
        if f.name == "gates":
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x != y:
            seconds = f.name.endswith("_s")
            out.append(f"{f.name.removesuffix('_s') if seconds else f.name}: "
                       f"{_show_setting(x, seconds)} -> {_show_setting(y, seconds)}")
    return tuple(out)


def _show_setting(value: object, seconds: bool) -> str:
    if value is None:
        return "none"
    return duration_text(value) if seconds and isinstance(value, int) else str(value)


def _version_verdict(old: Schema, new: Schema, changes: Sequence[Change]) -> tuple[str | None, list[str]]:
    """(refusal, warnings) for the version step between ``old`` and ``new``."""
    warnings: list[str] = []
    breaking = [c for c in changes if not c.compatible]
    if breaking and new.version[0] <= old.version[0]:
        lines = "\n".join(f"  - {c.field}: {c.detail}" for c in breaking)
        return (
            f"{len(breaking)} breaking change(s) need a new major version, but {old.name} goes "
            f"from {old.version_str} to {new.version_str} (expected {old.version[0] + 1}.0.0 or "
            f"later):\n{lines}"
        ), warnings
    if new.version < old.version:
        warnings.append(f"version goes backwards: {old.version_str} -> {new.version_str}")
    elif changes and new.version == old.version:
        warnings.append(
            f"version not bumped: {len(changes)} change(s) but {new.name} stays at {new.version_str} "
            f"(compatible changes need a minor or patch bump)"
        )
    return None, warnings


def diff_schemas(old: Schema, new: Schema, *, aggregation_type: AggregationType) -> SchemaDiff:
    """Classify every change from ``old`` to ``new`` and gate the version.

    ``aggregation_type`` names the stored type of an aggregation (see
    :data:`AggregationType`); it is the one thing the classification asks of the
    stores. Pure: reads only the two schemas and calls ``aggregation_type``. Never
    raises for a refused change: the result says ``allowed=False`` with a
    ``refusal`` message.
    """
    differ = _Differ(old, new, aggregation_type)
    differ.schema_level()
    differ.fields()
    differ.features()
    differ.aggregations()
    changes = tuple(differ.changes)
    refusal, warnings = _version_verdict(old, new, changes)
    return SchemaDiff(
        old=old, new=new, changes=changes, allowed=refusal is None, refusal=refusal, warnings=tuple(warnings),
        quality=quality_changes(old.quality, new.quality),
    )


__all__ = [
    "SCHEMA_KINDS", "AggregationType", "Change", "ChangeKind", "SchemaDiff", "diff_schemas",
    "quality_changes", "store_changes",
]
