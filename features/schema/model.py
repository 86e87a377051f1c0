"""The schema model: an immutable, typed picture of one ``schemas/*.yaml`` file.

A ``Schema`` is what the YAML says, checked for internal consistency by
``features.schema.parse``; it knows nothing of Arrow, Postgres or Redis. The
compiler (``features.compile``) turns it into artefacts.

Terms:
- a *field* is an input column, validated by its type and constraints;
- a *feature* is a stored output: a field stored as it is (``store:`` on the field)
  or a derived feature (``features:`` section) computed by transform steps;
- a schema without ``entity``/``event_time`` is *validation-only*: it compiles and
  validates, but cannot be loaded into the stores;
- a schema with ``event_time: none`` is *static* (aircraft, products, merchants): one
  row per entity, the newest load wins, read by key at any time (docs/schema.md,
  "Tables without time").
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as _field
from decimal import Decimal
from enum import StrEnum
from typing import Literal

ScalarValue = bool | int | float | str | Decimal | None


class TypeKind(StrEnum):
    """The closed set of field types a schema may declare."""

    STRING = "string"
    BOOL = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    DECIMAL = "decimal"
    DATE = "date"
    TIMESTAMP = "timestamp"
    ENUM = "enum"
    LIST = "list"


INTEGER_KINDS = frozenset({TypeKind.INT8, TypeKind.INT16, TypeKind.INT32, TypeKind.INT64})
FLOAT_KINDS = frozenset({TypeKind.FLOAT32, TypeKind.FLOAT64})
NUMERIC_KINDS = INTEGER_KINDS | FLOAT_KINDS | {TypeKind.DECIMAL}
#: The element types a ``list(...)`` field may hold.
LIST_ELEMENT_KINDS = INTEGER_KINDS | FLOAT_KINDS
#: The largest length (fixed, or the ``max=`` bound) a list type may declare.
LIST_MAX_LENGTH = 65_536
TimeUnit = Literal["s", "ms", "us", "ns"]
#: The ``event_time`` value that makes a schema static (no event time: one row per entity).
STATIC_EVENT_TIME = "none"


@dataclass(frozen=True)
class ListItems:
    """The elements of a ``list`` type: their type (a numeric kind of
    :data:`LIST_ELEMENT_KINDS`), a fixed ``length`` (``list(float32, 384)``) or a bound
    ``max_length`` (``list(int64, max=10)``: 0 to 10 elements), and whether an element may
    be null (``nullable=true``; default: a null element is a ``type`` reject)."""

    element: FieldType
    length: int | None = None
    max_length: int | None = None
    nullable: bool = False

    def __str__(self) -> str:
        size = str(self.length) if self.length is not None else f"max={self.max_length}"
        return f"list({self.element}, {size}{', nullable=true' if self.nullable else ''})"


@dataclass(frozen=True)
class FieldType:
    """A declared type. ``precision``/``scale`` only for decimal; ``unit``/``tz`` only
    for timestamp (``tz`` None means a naive timestamp; a zone such as ``UTC`` means
    values must carry a zone and are stored as instants); ``items`` only for list."""

    kind: TypeKind
    precision: int | None = None
    scale: int | None = None
    unit: TimeUnit | None = None
    tz: str | None = None
    items: ListItems | None = None

    def __str__(self) -> str:
        if self.items is not None:
            return str(self.items)
        if self.kind is TypeKind.DECIMAL:
            return f"decimal({self.precision},{self.scale})"
        if self.kind is TypeKind.TIMESTAMP:
            return f"timestamp({self.unit}, {self.tz})" if self.tz else f"timestamp({self.unit})"
        return self.kind.value


@dataclass(frozen=True)
class Constraints:
    """Rules on one field's values. None means "no such rule".

    - ``required``: the column must be present and every value non-null.
    - ``nullable``: null allowed (default True unless ``required``). NaN is never valid.
    - ``min``/``max``: inclusive bounds, typed like ``default``: Decimal (exact, from the
      YAML text, at the field's scale) for decimal fields, float for float fields, int
      for integers, ISO string for date/timestamp (a zoned timestamp's bound is in UTC,
      ``+00:00``; compared after conversion). Never set on bool/enum/string fields.
    - ``pattern``: a regex that must match the whole string (string fields).
    - ``min_length``/``max_length``: string length in characters.
    - ``default``: fills a missing column or a null value before the other rules run;
      typed like ``min`` (str for string/enum, bool for bool). ``has_default`` tells a
      ``default: null`` apart from no default.
    - ``empty_as_null``: an empty string counts as null (default False).
    """

    required: bool = False
    nullable: bool = True
    min: ScalarValue = None
    max: ScalarValue = None
    pattern: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    default: ScalarValue = None
    has_default: bool = False
    empty_as_null: bool = False

    @property
    def not_null(self) -> bool:
        """Nulls are rejected: ``required``, or not ``nullable`` (the not_null rule;
        NOT NULL on a cold column)."""
        return self.required or not self.nullable


StoreTarget = Literal["hot", "cold"]


@dataclass(frozen=True)
class Field:
    """One input column: its name, type, constraints, enum values and placement.

    ``store`` is the set of stores this field is written to as it is (empty: not
    stored, only validated). ``accept_strings``: string input such as ``"12.50"`` is
    parsed exactly into a numeric/date/timestamp/bool type (default False: a string in
    a numeric column is a type reject). ``source``: the input column (Parquet) or JSON
    key (Kafka, HTTP) the field is read from when that is not ``name`` (``Dep Delay``,
    ``depDelay``); None: the input uses ``name``. Only the edges that read input use it
    (``input_name``); everything downstream knows the field by ``name``.
    ``null_values``: texts that mean null in the input (``("", "NA", "nil")``, sorted,
    unique; empty: none): a string value equal to one of them is read as null before the
    value is converted, in every input path, then ``nullable``/``required``/``default``
    apply as to any null; values of other input types (numbers, bools) are never
    markers. Unlike ``source`` it counts in the fingerprint: it decides which rows are
    valid and what is stored for them. ``line`` is the 1-based line of the field.
    """

    name: str
    type: FieldType
    constraints: Constraints = Constraints()
    values: tuple[str, ...] = ()
    store: frozenset[StoreTarget] = frozenset()
    accept_strings: bool = False
    source: str | None = None
    description: str = ""
    line: int | None = None
    null_values: tuple[str, ...] = ()

    @property
    def input_name(self) -> str:
        """The name of this field's column or key in the input: ``source`` or ``name``."""
        return self.name if self.source is None else self.source


OpName = Literal[
    "fill_null", "clip", "log1p", "zscore", "minmax", "bucketize", "ratio",
    "time_since", "hash_bucket", "one_hot", "cast", "difference", "product",
]


@dataclass(frozen=True)
class Step:
    """One transform op with its arguments (names as in the YAML, values checked)."""

    op: OpName
    args: tuple[tuple[str, ScalarValue | tuple[ScalarValue, ...]], ...] = ()

    def arg(self, name: str) -> ScalarValue | tuple[ScalarValue, ...]:
        for key, value in self.args:
            if key == name:
                return value
        raise KeyError(name)


OnInvalid = Literal["null", "reject"]


@dataclass(frozen=True)
class Feature:
    """A derived feature: ``steps`` applied, in order, to the field ``source``.

    ``dtype`` is the declared output type (never inferred). ``on_invalid`` says what
    happens where a step would produce NaN or ±inf: the value becomes null, or the
    row is rejected with a field-level message.
    """

    name: str
    source: str
    steps: tuple[Step, ...]
    dtype: FieldType
    store: frozenset[StoreTarget]
    on_invalid: OnInvalid = "null"
    description: str = ""
    line: int | None = None


@dataclass(frozen=True)
class EvolutionRule:
    """A declared decision about one field's change (``features schema diff``)."""

    field: str
    breaking_change: bool
    description: str = ""


@dataclass(frozen=True)
class HotStore:
    """Redis placement: TTL in seconds (None: no expiry); ``refresh_after_seconds``: the
    age (since its last write) at which the SDK serves a hot value flagged stale while one
    caller refreshes it from Postgres (logical expiry, docs/sdk.md; a reader setting, not
    in the fingerprint)."""

    ttl_seconds: int | None = None
    refresh_after_seconds: int | None = None


@dataclass(frozen=True)
class Payload:
    """How stream records are encoded on Kafka."""

    format: Literal["json"] = "json"
    max_bytes: int = 1_048_576


AggFunction = Literal["count", "sum", "mean", "min", "max", "last", "count_distinct", "ratio",
                      # moments, first, last_k (issue 32)
                      "variance", "stddev", "variance_sample", "stddev_sample", "first", "last_k",
                      # sketches (issue 50)
                      "approx_count_distinct", "approx_percentile"]
WindowKind = Literal["sliding", "tumbling"]


@dataclass(frozen=True)
class Window:
    """An event-time window of ``size_s`` seconds, relative to each event's time ``t``.

    - ``sliding``: the events of the entity with time in ``(t - size, t]``;
    - ``tumbling``: the events of the entity in ``t``'s epoch-aligned bucket
      ``[floor(t / size) * size, t]`` (a running value that restarts every bucket).
    """

    size_s: int
    kind: WindowKind = "sliding"


@dataclass(frozen=True)
class Aggregation:
    """One windowed aggregation feature, computed per entity as of each event's time.

    ``function`` over the field ``of`` (None: ``count`` counts events) within
    ``window``, counting only the events whose fields match ``where`` (field ->
    allowed values; all must match). ``ratio`` divides two other aggregations
    (``numerator`` / ``denominator``, no window of its own) and is ``on_zero`` where the
    denominator is 0 or null. ``k``: how many values ``last_k`` keeps (None for the
    others). ``precision``: ``approx_count_distinct``'s HyperLogLog precision (2^p
    registers); ``q`` and ``relative_accuracy``: ``approx_percentile``'s quantile (a
    float: one value) or quantiles (a tuple: a list of values) and bucket accuracy (None
    for the others). See ``docs/aggregations.md`` for the exact semantics.
    """

    name: str
    function: AggFunction
    store: frozenset[StoreTarget]
    of: str | None = None
    window: Window | None = None
    where: tuple[tuple[str, tuple[ScalarValue, ...]], ...] = ()
    numerator: str | None = None
    denominator: str | None = None
    on_zero: float | None = None
    #: a float field's fixed point for sum, mean, variance and stddev: values are kept
    #: as integer multiples of 10^-scale (None for every other aggregation)
    scale: int | None = None
    description: str = ""
    line: int | None = None
    k: int | None = None
    precision: int | None = None
    q: float | tuple[float, ...] | None = None
    relative_accuracy: float | None = None

    @property
    def quantiles(self) -> tuple[float, ...]:
        """``q`` as a tuple (empty for every function but ``approx_percentile``)."""
        if self.q is None:
            return ()
        return self.q if isinstance(self.q, tuple) else (self.q,)


@dataclass(frozen=True)
class Aggregations:
    """The ``aggregations:`` section: the allowed lateness and the aggregation features.

    An event of an entity more than ``allowed_lateness_s`` older than the newest event of
    that entity seen before it (in arrival order) is *late*: it is still stored in the
    history table, but it updates no aggregation and goes to the rejects table.
    """

    allowed_lateness_s: int
    features: tuple[Aggregation, ...]

    @property
    def max_window_s(self) -> int:
        return max((a.window.size_s for a in self.features if a.window is not None), default=0)


OnBreach = Literal["fail", "warn"]
GateKind = Literal["max_reject_rate", "max_rule_rate", "min_rows"]


@dataclass(frozen=True)
class Gate:
    """One quality gate of a load (``quality:`` in the YAML, docs/schema.md "Quality gates").

    - ``max_reject_rate``: ``limit`` is a rate in [0, 1]; breached when the load's rejected
      rows / rows read is above it;
    - ``max_rule_rate``: the same for the rows one ``rule`` (an id of the rejects'
      ``rule`` column, such as ``income_monthly.max``) rejected;
    - ``min_rows``: ``limit`` is a row count (int); breached when the load reads fewer rows.

    ``on_breach``: ``fail`` refuses the load (nothing stored but its rejects), ``warn``
    stores it and reports the breach. ``line``: the 1-based line of the gate."""

    kind: GateKind
    limit: float | int
    on_breach: OnBreach = "fail"
    rule: str | None = None
    line: int | None = None

    @property
    def name(self) -> str:
        """How messages and metrics name the gate: ``max_reject_rate``, ``min_rows``,
        ``max_rule_rate[income_monthly.max]``."""
        return self.kind if self.rule is None else f"{self.kind}[{self.rule}]"


@dataclass(frozen=True)
class Quality:
    """The ``quality:`` section: the load gates, the freshness SLA and the owner.

    ``max_staleness_s``: the freshness SLA in seconds (the newest stored event may be at
    most this old); not a load gate (a backfill loads old events by design): the
    alerts read it. ``owner``: who answers for the data (shown in messages and reports).
    ``on_breach``: the section's default, each gate holds its own. ``window_records`` /
    ``window_min_records``: the sliding window of the stream's breaker and the HTTP ingest
    (docs/operations.md, "Quality gates"). Not in the fingerprint: a changed gate is not a
    new data version (docs/schema.md)."""

    gates: tuple[Gate, ...] = ()
    owner: str | None = None
    on_breach: OnBreach = "fail"
    max_staleness_s: int | None = None
    #: the stream's and HTTP ingest's sliding window: the last this many records (None: the
    #: default, ``features.pipeline.gates.DEFAULT_WINDOW_RECORDS``)
    window_records: int | None = None
    #: the fewest records the window must hold before a rate gate may trip (None: the
    #: default, ``features.pipeline.gates.DEFAULT_WINDOW_MIN_RECORDS``, capped at the window)
    window_min_records: int | None = None


def field_checks(f: Field) -> tuple[tuple[str, ScalarValue | tuple[str, ...]], ...]:
    """The checks of one field's type and constraints, in evaluation order: (kind, its
    parameter). The compiled rule program (``features.compile.rules``) is made of these;
    the kinds are the values of its ``ReasonCode``, and ``<field>.<kind>`` is a rule's id."""
    c = f.constraints
    out: list[tuple[str, ScalarValue | tuple[str, ...]]] = []
    if c.required:
        out.append(("missing", None))
    out.append(("type", str(f.type)))
    if not c.nullable or c.required:
        out.append(("not_null", None))
    if f.type.kind in FLOAT_KINDS or (f.type.items is not None and f.type.items.element.kind in FLOAT_KINDS):
        out.append(("nan", None))  # a list of floats: no NaN element
    if c.min is not None:
        out.append(("min", c.min))
    if c.max is not None:
        out.append(("max", c.max))
    if c.min_length is not None:
        out.append(("min_length", c.min_length))
    if c.max_length is not None:
        out.append(("max_length", c.max_length))
    if c.pattern is not None:
        out.append(("pattern", c.pattern))
    if f.type.kind is TypeKind.ENUM:
        out.append(("enum", f.values))
    return tuple(out)


def rule_ids(fields: tuple[Field, ...], features: tuple[Feature, ...]) -> tuple[str, ...]:
    """Every rule id a load's rejects can record for these fields and derived features:
    ``<field>.<kind>`` of :func:`field_checks`, then ``<feature>.transform`` for each
    feature with ``on_invalid: reject``."""
    ids = [f"{f.name}.{kind}" for f in fields for kind, _ in field_checks(f)]
    return (*ids, *(f"{f.name}.transform" for f in features if f.on_invalid == "reject"))


@dataclass(frozen=True)
class Schema:
    """One schema file, parsed and checked. Immutable; build with ``parse_schema``.

    ``version`` is semver ``(major, minor, patch)``. ``entity`` and ``event_time``
    name fields; both None for a validation-only schema. ``static`` (``event_time:
    none``): the schema has an entity and no event time (``event_time`` is None); its
    stores hold one row per entity, the newest load's (docs/schema.md).
    """

    name: str
    version: tuple[int, int, int]
    fields: tuple[Field, ...]
    entity: str | None = None
    event_time: str | None = None
    features: tuple[Feature, ...] = ()
    hot: HotStore = HotStore()
    payload: Payload = Payload()
    evolution_rules: tuple[EvolutionRule, ...] = ()
    aggregations: Aggregations | None = None
    description: str = ""
    path: str | None = None
    static: bool = False
    #: the ``quality:`` section (None: no gates); not in the fingerprint
    quality: Quality | None = None
    #: the YAML text this schema was parsed from (None when built in code): recorded with
    #: the version in ``featureline_schema_versions``, so readers and ``features migrate``
    #: can rebuild an older version's layout (docs/evolution.md). Not in the fingerprint.
    text: str | None = _field(default=None, repr=False, compare=False)

    @property
    def version_str(self) -> str:
        return ".".join(str(p) for p in self.version)

    @property
    def loadable(self) -> bool:
        """True when the schema can be written to the stores (entity + event time, or
        entity + ``event_time: none``: a static schema)."""
        return self.entity is not None and (self.event_time is not None or self.static)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def input_names(self) -> tuple[str, ...]:
        """Each field's name in the input (``Field.input_name``), in field order; unique."""
        return tuple(f.input_name for f in self.fields)

    @property
    def renames_input(self) -> bool:
        """Whether some field is read from an input name other than its own (``source``)."""
        return any(f.input_name != f.name for f in self.fields)

    def feature_columns(self, feature: Feature) -> tuple[str, ...]:
        """The stored columns of a derived feature: its name, or for ``one_hot`` one column
        per enum value of its source, ``<feature>__<value>``."""
        if any(step.op == "one_hot" for step in feature.steps):
            return tuple(f"{feature.name}__{v}" for v in self.field(feature.source).values)
        return (feature.name,)

    def stored_features(self, store: StoreTarget) -> tuple[str, ...]:
        """Every stored column of the derived features placed in ``store``, in order."""
        return tuple(col for f in self.features if store in f.store for col in self.feature_columns(f))


__all__ = [
    "FLOAT_KINDS",
    "INTEGER_KINDS",
    "NUMERIC_KINDS",
    "STATIC_EVENT_TIME",
    "AggFunction",
    "Aggregation",
    "Aggregations",
    "Constraints",
    "EvolutionRule",
    "Feature",
    "Field",
    "FieldType",
    "Gate",
    "GateKind",
    "HotStore",
    "OnBreach",
    "Payload",
    "Quality",
    "Schema",
    "Step",
    "TypeKind",
    "Window",
    "field_checks",
    "rule_ids",
]
