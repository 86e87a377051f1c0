"""Transform steps of derived features: the op table and the checks of each step.

A feature's ``steps`` are checked in order against the *value class* flowing through
them: ``number`` (int, float, decimal), ``bool``, ``string``, ``enum`` or
``temporal`` (date, timestamp). Each op accepts some classes and produces one, so
``log1p`` on a string field or ``hash_bucket`` on an int is reported at its step,
and a chain must end in a number or bool (the feature's declared ``dtype``).

=============  ====================================  ===========  ===========================
op             arguments                             input        checks
=============  ====================================  ===========  ===========================
fill_null      value (shorthand ``fill_null: 0``)    number/bool  value of the input's class;
                                                     string/enum  an enum value for enums
clip           lo, hi (at least one)                 number       lo <= hi
log1p          -                                     number
zscore         mean, std                             number       std > 0
minmax         lo, hi                                number       lo < hi
bucketize      boundaries (shorthand: the list)      number       non-empty, strictly increasing
ratio          denominator (a field), on_zero        number       denominator numeric field;
                                                                  on_zero a number or null
time_since     unit (ms s minutes hours days weeks)  temporal     not the event_time field itself
hash_bucket    n (shorthand ``hash_bucket: 64``)     string/enum  n >= 1
one_hot        -                                     enum         <= 32 values; the last step
cast           dtype (shorthand ``cast: int32``)     number/bool  int*/float*/bool
difference     other (a field; shorthand: its name)  number       other a numeric field;
               on_null (optional)                                 on_null a number
product        other (a field; shorthand: its name)  number       other a numeric field;
               on_null (optional)                                 on_null a number
=============  ====================================  ===========  ===========================

``difference`` and ``product`` combine the value with another column of the same row
(``x - other``, ``x * other``): a null on either side gives null, or ``on_null`` where
one is given (the op then also fills a null value flowing in, as ``fill_null`` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, cast, get_args

from yaml.nodes import MappingNode, Node, ScalarNode

from features.schema.model import (
    FLOAT_KINDS,
    INTEGER_KINDS,
    NUMERIC_KINDS,
    Field,
    FieldType,
    OpName,
    ScalarValue,
    Step,
    TypeKind,
)
from features.schema.nodes import NodeReader, describe, is_null, join_path
from features.schema.syntax import parse_type

_MAX_ONE_HOT: Final = 32
_TIME_SINCE_UNITS: Final = ("ms", "s", "minutes", "hours", "days", "weeks")
_DTYPE_KINDS: Final = INTEGER_KINDS | FLOAT_KINDS | {TypeKind.BOOL}


@dataclass(frozen=True)
class _OpSpec:
    """One transform op: argument names (in canonical order), which are required, the
    argument a scalar shorthand (``hash_bucket: 64``) fills, accepted input classes and
    the output class (None: same as the input)."""

    args: tuple[str, ...]
    required: tuple[str, ...]
    shorthand: str | None
    accepts: tuple[str, ...]
    output: str | None


_NUM: Final = ("number",)
_OPS: Final[dict[str, _OpSpec]] = {
    "fill_null": _OpSpec(("value",), ("value",), "value", ("number", "bool", "string", "enum"), None),
    "clip": _OpSpec(("lo", "hi"), (), None, _NUM, "number"),
    "log1p": _OpSpec((), (), None, _NUM, "number"),
    "zscore": _OpSpec(("mean", "std"), ("mean", "std"), None, _NUM, "number"),
    "minmax": _OpSpec(("lo", "hi"), ("lo", "hi"), None, _NUM, "number"),
    "bucketize": _OpSpec(("boundaries",), ("boundaries",), "boundaries", _NUM, "number"),
    "ratio": _OpSpec(("denominator", "on_zero"), ("denominator", "on_zero"), None, _NUM, "number"),
    "time_since": _OpSpec(("unit",), ("unit",), "unit", ("temporal",), "number"),
    "hash_bucket": _OpSpec(("n",), ("n",), "n", ("string", "enum"), "number"),
    "one_hot": _OpSpec((), (), None, ("enum",), "number"),
    "cast": _OpSpec(("dtype",), ("dtype",), "dtype", ("number", "bool"), "number"),
    "difference": _OpSpec(("other", "on_null"), ("other",), "other", _NUM, "number"),
    "product": _OpSpec(("other", "on_null"), ("other",), "other", _NUM, "number"),
}
#: the ops that read a second column of the row, and the argument naming it
OPERAND_ARGS: Final = {"ratio": "denominator", "difference": "other", "product": "other"}
assert set(get_args(OpName)) == set(_OPS), "the op table and model.OpName must list the same ops"
_CLASS_NAMES: Final = {
    "number": "numeric", "bool": "bool", "string": "string", "enum": "enum", "temporal": "timestamp/date",
    "list": "list",
}


def _value_class(kind: TypeKind) -> str:
    if kind is TypeKind.LIST:
        return "list"  # refused where a feature reads it (parse.py), no op takes it
    if kind in NUMERIC_KINDS:
        return "number"
    if kind in (TypeKind.DATE, TypeKind.TIMESTAMP):
        return "temporal"
    return {TypeKind.BOOL: "bool", TypeKind.ENUM: "enum"}.get(kind, "string")


class StepReader(NodeReader):
    """NodeReader plus the checks of feature dtypes and steps."""

    def parse_dtype(self, node: Node, kp: str) -> FieldType | None:
        text = self.string(node, kp, "a dtype")
        if text is None:
            return None
        dtype, reason = parse_type(text)
        if reason is not None:
            self.error(node, kp, reason)
            return None
        assert dtype is not None
        if dtype.kind not in _DTYPE_KINDS:
            self.error(node, kp, f"dtype must be an integer, float or bool type, got {dtype}")
            return None
        return dtype

    def parse_steps(
        self, node: Node, kp: str, source: Field | None, fields: dict[str, Field] | None,
        event_time: str | None,
    ) -> tuple[Step, ...] | None:
        items = self.sequence(node, kp, "the list of steps")
        if items is None:
            return None
        if not items:
            self.error(node, kp, "steps must list at least one step (a field stored as it is uses "
                                 "store: on the field)")
            return None
        # What flows between steps: number, bool, string, enum or temporal; None while
        # unknown (no source, or after a step that did not parse), when a step's input is
        # not checked but its arguments are, and an op with a fixed output makes it known again.
        current: str | None = None if source is None else _value_class(source.type.kind)
        producer = "" if source is None else f"field '{source.name}'"
        steps: list[Step] = []
        ok = source is not None
        after_one_hot = False
        for i, item in enumerate(items):
            skp = join_path(kp, i)
            parsed = self.parse_step(item, skp)
            if parsed is None:
                ok, current = False, None
                continue
            op, step_node, arg_nodes = parsed
            if after_one_hot:
                self.error(step_node, skp, "one_hot must be the last step")
                ok = False
            after_one_hot = after_one_hot or op == "one_hot"
            current, step = self.check_step(op, step_node, skp, arg_nodes, current, producer, source,
                                            fields, event_time)
            producer = f"the output of {op}"
            if step is None:
                ok = False
            else:
                steps.append(step)
        if ok and current in ("string", "enum", "temporal"):
            self.error(node, kp, f"the steps end with a {current} value; a feature is numeric or bool "
                                 "(add hash_bucket, one_hot or time_since)")
            ok = False
        return tuple(steps) if ok else None

    def parse_step(self, node: Node, kp: str) -> tuple[OpName, Node, dict[str, Node]] | None:
        """One step's op and raw arguments; argument values are checked in ``check_step``."""
        if isinstance(node, ScalarNode):
            op_text = self.string(node, kp, "an op name")
            if op_text is None:
                return None
            op_node: Node = node
            arg_node: Node | None = None
        elif isinstance(node, MappingNode):
            if len(node.value) != 1:
                self.error(node, kp, "a step is one op: write each op as its own list item")
                return None
            op_node, arg_node = node.value[0]
            op_text = self.string(op_node, kp, "an op name")
            if op_text is None:
                return None
        else:
            self.error(node, kp, f"expected a step (an op name or {{op: args}}), got {describe(node)}")
            return None
        spec = _OPS.get(op_text)
        if spec is None:
            self.error(op_node, kp, f"unknown op '{op_text}'{self.suggest(op_text, _OPS)}; "
                                    f"expected one of: {', '.join(_OPS)}")
            return None
        akp = join_path(kp, op_text)
        args: dict[str, Node] = {}
        if arg_node is None or (is_null(arg_node) and not spec.args):
            pass
        elif isinstance(arg_node, MappingNode):
            m = self.mapping(arg_node, akp, spec.args, (), f"the arguments of {op_text}")
            if m is None:
                return None
            args = {k: v for k, (_, v) in m.entries.items()}
        elif spec.shorthand is not None:
            args = {spec.shorthand: arg_node}
        elif not spec.args:
            self.error(arg_node, akp, f"{op_text} takes no arguments")
            return None
        else:
            self.error(arg_node, akp, f"{op_text} takes named arguments: {{{', '.join(spec.args)}}}")
            return None
        missing = [a for a in spec.required if a not in args]
        if op_text == "clip" and not args:
            missing = ["lo or hi"]
        if missing:
            self.error(node, akp, f"{op_text} is missing argument {', '.join(repr(a) for a in missing)}")
            return None
        return cast(OpName, op_text), node, args

    def check_step(
        self, op: OpName, node: Node, kp: str, arg_nodes: dict[str, Node], current: str | None,
        producer: str, source: Field | None, fields: dict[str, Field] | None, event_time: str | None,
    ) -> tuple[str | None, Step | None]:
        """Check one step against the value class flowing into it (``current``; None when
        unknown: then only the arguments that do not depend on it are checked) and convert
        its arguments. Returns (the class it produces or None when unknown, the Step or
        None after recording an error)."""
        spec = _OPS[op]
        akp = join_path(kp, op)
        ok = True
        if current is not None and current not in spec.accepts:
            need = " or ".join(_CLASS_NAMES[c] for c in spec.accepts)
            self.error(node, kp, f"{op} needs {need} input, got {_CLASS_NAMES[current]} ({producer})")
            ok, current = False, None  # the arguments are still checked
        args: dict[str, ScalarValue | tuple[ScalarValue, ...]] = {}

        def num(name: str) -> int | float | None:
            nonlocal ok
            value = self.plain_number(arg_nodes[name], join_path(akp, name), f"{op} {name}")
            ok = ok and value is not None
            return value

        output = spec.output or current
        if op == "fill_null":
            value_node = arg_nodes["value"]
            if current is None or source is None:
                ok = False  # the value's class is the input's: nothing to check it against
            elif current == "number":
                args["value"] = num("value")
            elif current == "bool":
                args["value"] = b = self.boolean(value_node, join_path(akp, "value"))
                ok = ok and b is not None
            else:
                args["value"] = s = self.string(value_node, join_path(akp, "value"), "a string fill value")
                ok = ok and s is not None
                if s is not None and current == "enum" and s not in source.values:
                    allowed = ", ".join(source.values)
                    self.error(value_node, join_path(akp, "value"),
                               f"fill_null value '{s}' is not one of the enum values: {allowed}")
                    ok = False
        elif op in ("clip", "minmax"):
            for a in ("lo", "hi"):
                if a in arg_nodes:
                    args[a] = num(a)
            lo, hi = args.get("lo"), args.get("hi")
            if ok and isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
                if op == "clip" and lo > hi:
                    self.error(node, akp, f"clip lo {lo} is greater than hi {hi}")
                    ok = False
                if op == "minmax" and lo >= hi:
                    self.error(node, akp, f"minmax lo {lo} must be less than hi {hi}")
                    ok = False
        elif op == "zscore":
            args["mean"], args["std"] = num("mean"), num("std")
            std = args["std"]
            if isinstance(std, (int, float)) and std <= 0:
                self.error(arg_nodes["std"], join_path(akp, "std"), f"zscore std must be > 0, got {std}")
                ok = False
        elif op == "bucketize":
            bounds = self.parse_boundaries(arg_nodes["boundaries"], join_path(akp, "boundaries"))
            ok = ok and bounds is not None
            args["boundaries"] = bounds
        elif op == "ratio":
            den_kp = join_path(akp, "denominator")
            args["denominator"] = self.check_operand(arg_nodes["denominator"], den_kp, fields, op,
                                                     "denominator")
            ok = ok and args["denominator"] is not None
            on_zero = arg_nodes["on_zero"]
            if is_null(on_zero):
                args["on_zero"] = None
            else:
                args["on_zero"] = num("on_zero")
        elif op in ("difference", "product"):
            other_kp = join_path(akp, "other")
            args["other"] = self.check_operand(arg_nodes["other"], other_kp, fields, op, "other")
            ok = ok and args["other"] is not None
            if (on_null := arg_nodes.get("on_null")) is not None and not is_null(on_null):
                args["on_null"] = num("on_null")
        elif op == "time_since":
            unit = self.string(arg_nodes["unit"], join_path(akp, "unit"), "a time unit")
            if unit is not None and unit not in _TIME_SINCE_UNITS:
                self.error(arg_nodes["unit"], join_path(akp, "unit"),
                           f"unknown time_since unit '{unit}' (expected {', '.join(_TIME_SINCE_UNITS)})")
                unit = None
            ok = ok and unit is not None
            args["unit"] = unit
            if source is not None and source.name == event_time and producer == f"field '{source.name}'":
                self.error(node, kp, f"time_since on the event_time field '{source.name}' itself is always 0")
                ok = False
        elif op == "hash_bucket":
            n = self.integer(arg_nodes["n"], join_path(akp, "n"), "hash_bucket n", 1)
            ok = ok and n is not None
            args["n"] = n
        elif op == "one_hot":
            if current is None or source is None:
                ok = False  # the enum's values are unknown
            elif len(source.values) > _MAX_ONE_HOT:
                self.error(node, kp, f"one_hot supports enum fields with at most {_MAX_ONE_HOT} values; "
                                     f"'{source.name}' has {len(source.values)}")
                ok = False
        elif op == "cast":
            dtype = self.parse_dtype(arg_nodes["dtype"], join_path(akp, "dtype"))
            ok = ok and dtype is not None
            args["dtype"] = None if dtype is None else str(dtype)
            output = None if dtype is None else "bool" if dtype.kind is TypeKind.BOOL else "number"
        if not ok:
            return output, None
        return output, Step(op=op, args=tuple((a, args[a]) for a in spec.args if a in args))

    def parse_boundaries(self, node: Node, kp: str) -> tuple[ScalarValue, ...] | None:
        items = self.sequence(node, kp, "bucketize boundaries")
        if items is None:
            return None
        if not items:
            self.error(node, kp, "bucketize boundaries must not be empty")
            return None
        values: list[int | float] = []
        for i, item in enumerate(items):
            v = self.plain_number(item, join_path(kp, i), "bucketize boundary")
            if v is None:
                return None
            if values and v <= values[-1]:
                self.error(item, join_path(kp, i),
                           f"bucketize boundaries must be strictly increasing: {v} follows {values[-1]}")
                return None
            values.append(v)
        return tuple(values)

    #: how an error names the place the operand columns come from (a view says "of this view")
    SCOPE: str = "of this schema"

    def check_operand(
        self, node: Node, kp: str, fields: dict[str, Field] | None, op: str, arg: str,
    ) -> str | None:
        """The column a ``ratio``/``difference``/``product`` reads besides its input: a
        numeric field of ``fields``; None after recording a problem (or when unknown)."""
        name = self.string(node, kp, "a field name")
        if name is None or fields is None or name in self.unparsed_fields:
            return None
        field = fields.get(name)
        if field is None:
            self.error(node, kp, f"{op} {arg} '{name}' is not a field {self.SCOPE}"
                                 f"{self.suggest(name, fields)}")
            return None
        if field.type.kind not in NUMERIC_KINDS:
            self.error(node, kp, f"{op} {arg} '{name}' is a {field.type} field, expected a number")
            return None
        return name
