"""The report's numbers: one pass over a stream of batches, memory bounded.

Each batch (a Parquet row-group slice, or a page of a server-side cursor over the
cold table) goes through:

1. the compiled validator (:func:`features.validation.validate`): row counts, reject
   rows per rule, up to :data:`EXAMPLES` examples per rule. These are the report's
   numbers for rows rejected by rule ("one truth");
2. the generated GX suite (:func:`features.compile.expectations.run_suite_detailed`,
   an ephemeral in-memory context, nothing written or sent anywhere), run on the
   same batch after the validator's own exact conversion to the declared types
   (a value that does not convert is handed to GX as null: GX cannot express the
   ``type`` rule, so it sees such a value as a null). Per expectation the batch
   results are summed: unexpected, element and missing counts add up, and an
   expectation succeeds when it succeeded on every batch (the suite uses no
   ``mostly``, so that is the same as succeeding on the whole data);
3. per-field statistics (:mod:`features.report.stats`);
4. the derived features' statistics (:class:`features.report.stats.ColumnStats`): in
   Parquet mode computed by the schema's transform program (on the CPU) over the rows
   the validator kept, as a load would; in table mode read from the cold table's
   stored feature columns (a chunk's ``features``).

The rejects mode instead reads ``<schema>__rejects`` and groups its ``errors`` by
field and rule (:class:`RejectsTally`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.compile.expectations import META_KEY, render_suite, run_suite_detailed
from features.kernels import TransformProgram, compile_transforms
from features.observe.progress import LineProgress as Progress
from features.report.stats import ColumnStats, FieldStats, jsonable
from features.validation import validate
from features.validation.convert import convert
from features.validation.ties import TieCounter

if TYPE_CHECKING:
    from features.report.drift import Side

#: Example values kept per expectation, per rule and per rejects group.
EXAMPLES = 5
#: Longest example text kept (characters); longer values are cut with an ellipsis. Wide
#: enough for any identifier (the page wraps long values; it never clips them).
EXAMPLE_CHARS = 2_000
#: Distinct run ids / origins / fingerprints listed in the lineage (the rest are counted).
LINEAGE_LIST = 20


def clip(value: Any) -> Any:
    """A JSON example value, text cut to :data:`EXAMPLE_CHARS`."""
    v = jsonable(value)
    if isinstance(v, str) and len(v) > EXAMPLE_CHARS:
        return v[:EXAMPLE_CHARS] + "…"
    return v


@dataclass(frozen=True)
class Chunk:
    """One batch of input: declared columns (as read, under the fields' names), the global
    row number of its first row, and its lineage URI for a row (0-based within the batch)."""

    data: pa.RecordBatch
    first_row: int
    source: Callable[[int], str | None]
    #: stored derived-feature columns of these rows (table mode), None when not read
    features: pa.RecordBatch | None = None


# --------------------------------------------------------------------------- tallies


@dataclass
class Group:
    """Rejects of one (field, rule): how many, and the first few examples."""

    field: str
    rule: str
    reason: str
    count: int = 0
    examples: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"field": self.field, "rule": self.rule, "reason": self.reason, "count": self.count,
                "examples": self.examples}


@dataclass
class GxTally:
    """One expectation's results summed over batches."""

    rule: str
    type: str
    kwargs: dict[str, Any]
    success: bool = True
    unexpected: int = 0
    element: int = 0
    missing: int = 0
    batches: int = 0
    skipped_batches: int = 0
    examples: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        nonmissing = self.element - self.missing
        return {
            "expectation": self.type,
            "kwargs": jsonable(self.kwargs),
            "success": self.success,
            "unexpected_count": self.unexpected,
            "element_count": self.element,
            "missing_count": self.missing,
            # GX's unexpected_percent: of the non-missing values; _total: of all rows.
            "unexpected_percent": 100.0 * self.unexpected / nonmissing if nonmissing > 0 else 0.0,
            "unexpected_percent_total": 100.0 * self.unexpected / self.element if self.element else 0.0,
            "batches": self.batches,
            "skipped_batches": self.skipped_batches,
            "examples": self.examples,
        }


class DataTally:
    """Validator counts, GX results and field statistics over every batch of a stream."""

    def __init__(self, compiled: CompiledSchema, *, run_gx: bool = True, drift: Side | None = None,
                 derived: Literal["compute", "stored"] = "compute",
                 feature_columns: Mapping[str, str] | None = None) -> None:
        """``derived``: compute the derived features with the transform program, or read the
        stored ``feature_columns`` (name -> declared type) from each chunk's ``features``."""
        self.compiled = compiled
        self.run_gx = run_gx
        #: when set, also fed every converted column (the data side of a drift comparison)
        self.drift = drift
        self.rules = list(compiled.rules)
        self.by_rule: Counter[str] = Counter()
        self.rule_examples: dict[str, list[dict[str, Any]]] = {}
        self.input_rows = 0
        self.valid_rows = 0
        self.rejected_rows = 0
        self.batches = 0
        self.fields = {f.name: FieldStats(f) for f in compiled.schema.fields}
        #: exact copies and distinct events at one instant among the valid rows (issue 48)
        self.ties = TieCounter(compiled)
        self.derived = derived
        self.program: TransformProgram | None = None
        schema = compiled.schema
        columns = dict(feature_columns or {})
        if derived == "compute" and schema.features:
            self.program = compile_transforms(schema, device="cpu")
            columns = {c: str(f.dtype) for f in schema.features for c in schema.feature_columns(f)}
        self.features = {c: ColumnStats(c, t, "feature", i) for i, (c, t) in enumerate(columns.items())}
        suite = render_suite(compiled)
        self.suite_name = str(suite["name"])
        self.not_expressible = {d["rule"]: d["reason"] for d in suite["meta"][META_KEY]["not_expressible"]}
        self.gx = {e["meta"]["rule"]: GxTally(e["meta"]["rule"], e["type"], dict(e["kwargs"]))
                   for e in suite["expectations"]}

    def add(self, chunk: Chunk) -> None:
        data = chunk.data
        n = data.num_rows
        if n == 0:
            return
        self.batches += 1
        valid = self._validate(chunk)
        self._derived(chunk, valid)
        typed = self._typed_and_stats(data)
        if self.run_gx:
            self._gx(typed, chunk)

    def _derived(self, chunk: Chunk, valid: pa.RecordBatch) -> None:
        """Account the derived features of a chunk (computed over its valid rows, or stored)."""
        if self.program is not None:
            if not valid.num_rows:
                return
            now = dt.datetime.now(dt.UTC) if self.compiled.schema.event_time is None else None
            out = self.program.run(valid, reference_time=now).features
        elif chunk.features is not None:
            out = chunk.features
        else:
            return
        for name, stats in self.features.items():
            if name in out.schema.names:
                stats.add(out.column(name))

    def _validate(self, chunk: Chunk) -> pa.RecordBatch:
        """Validate a chunk, account it, and return its valid rows."""
        result = validate(chunk.data, self.compiled)
        counts = result.counts
        self.input_rows += counts.input_rows
        self.valid_rows += counts.valid_rows
        self.rejected_rows += counts.rejected_rows
        self.by_rule.update(counts.by_rule)
        self.ties.add(result.valid)
        rejects = result.rejects
        if not rejects.num_rows:
            return result.valid
        for rule in counts.by_rule:
            have = self.rule_examples.setdefault(rule, [])
            need = EXAMPLES - len(have)
            if need <= 0:
                continue
            rows = rejects.filter(pc.equal(rejects.column("rule"), rule)).slice(0, need).to_pylist()
            for r in rows:
                have.append({"row": chunk.first_row + int(r["row"]), "source": chunk.source(int(r["row"])),
                             "value": clip(r["value"]), "message": clip(r["message"])})
        return result.valid

    def _typed_and_stats(self, data: pa.RecordBatch) -> pa.RecordBatch | pa.Table:
        """The batch for GX, and the field statistics of this batch added.

        Statistics are taken over the validator's exact conversion of each column
        (failures null, counted as type failures). GX gets a column as it is when it
        already has the declared type (GX's float ``type`` expectation then still sees
        +-inf), else the converted column (a value that does not convert is a null to GX).
        """
        n = data.num_rows
        arrow_schema = self.compiled.arrow_schema
        names = data.schema.names
        columns: dict[str, pa.Array] = {}
        drift = self.drift
        if drift is not None:
            drift.rows += n
        for f in self.compiled.schema.fields:
            stats = self.fields[f.name]
            if f.name not in names:
                stats.add(None, n)
                if drift is not None:
                    drift.add_values(f, None, n)
                continue
            col = data.column(names.index(f.name))
            target = arrow_schema.field(f.name).type
            converted = convert(col, f, target)
            stats.add(converted.values, n, len(converted.fail_rows))
            if drift is not None:
                drift.add_values(f, converted.values, n)
            columns[f.name] = col if col.type == target else converted.values
        if not columns:
            return pa.table({"__no_declared_column__": pa.nulls(n)})
        return pa.RecordBatch.from_pydict(columns)

    def _gx(self, typed: pa.RecordBatch | pa.Table, chunk: Chunk) -> None:
        run = run_suite_detailed(self.compiled, typed)
        details: dict[str, dict[str, Any]] = {}
        for r in run.gx_result.get("results", []):
            rule = r.get("expectation_config", {}).get("meta", {}).get("rule")
            if rule is not None:
                details[str(rule)] = r.get("result") or {}
        ran = set()
        for o in run.outcomes:
            tally = self.gx[o.rule]
            ran.add(o.rule)
            tally.batches += 1
            tally.success = tally.success and o.success
            tally.unexpected += o.unexpected_count
            tally.element += o.element_count if o.element_count is not None else typed.num_rows
            res = details.get(o.rule, {})
            tally.missing += int(res.get("missing_count") or 0)
            need = EXAMPLES - len(tally.examples)
            if need > 0 and o.unexpected_count:
                self._gx_examples(tally, typed, chunk, res, o.partial_unexpected_list, need)
        for rule, tally in self.gx.items():
            if rule not in ran:
                tally.skipped_batches += 1  # column absent from this batch: GX skips it

    @staticmethod
    def _gx_examples(tally: GxTally, typed: pa.RecordBatch | pa.Table, chunk: Chunk, res: dict[str, Any],
                     partial: tuple[Any, ...], need: int) -> None:
        """Up to ``need`` examples from GX's partial lists: the row GX names, and the
        value at that row of the data GX was given (GX's own rendering of a value can
        be lossy, e.g. the pairs of the ``nan`` expectation)."""
        index = [_as_row(i) for i in res.get("partial_unexpected_index_list") or []]
        column = tally.kwargs.get("column", tally.kwargs.get("column_A"))
        values: Any = typed.column(column) if column in typed.schema.names else None
        count = len(index) if index else len(partial)
        for i in range(min(count, need)):
            row = index[i] if i < len(index) else None
            if row is not None and values is not None and 0 <= row < len(values):
                value = values[row].as_py()
            else:
                value = partial[i] if i < len(partial) else None
            tally.examples.append({
                "row": None if row is None else chunk.first_row + row,
                "source": None if row is None else chunk.source(row),
                "value": clip(value),
            })

    # --- results -----------------------------------------------------------------

    @property
    def gx_failed(self) -> list[str]:
        return [rule for rule, t in self.gx.items() if not t.success] if self.run_gx else []

    def expectations_json(self) -> list[dict[str, Any]]:
        """One entry per rule, failing ones first (most rows rejected first), then the
        passing ones in the schema's order. An entry fails (``status`` fail) when the
        validator rejected a row by it, its GX expectation failed, or the two disagree."""
        out: list[dict[str, Any]] = []
        for rule in self.rules:
            validator = int(self.by_rule.get(rule.id, 0))
            tally = self.gx.get(rule.id)
            gx = tally.as_json() if tally is not None and self.run_gx else None
            out.append({
                "rule": rule.id,
                "field": rule.field,
                "kind": rule.kind.value,
                "validator_rejected_rows": validator,
                "validator_percent": 100.0 * validator / self.input_rows if self.input_rows else 0.0,
                "expectation": tally.type if tally is not None else None,
                "not_expressible": self.not_expressible.get(rule.id),
                "gx": gx,
                "agrees": None if gx is None else gx["unexpected_count"] == validator,
            })
        for e in out:
            result: dict[str, Any] | None = e["gx"]
            failing = e["validator_rejected_rows"] > 0 or e["agrees"] is False or (
                result is not None and not result["success"])
            e["status"] = "fail" if failing else "pass"
        order = {id(e): i for i, e in enumerate(out)}
        return sorted(out, key=lambda e: (e["status"] == "pass", -e["validator_rejected_rows"], order[id(e)]))

    def groups(self) -> list[Group]:
        by_id = {r.id: r for r in self.rules}
        groups = []
        for rule_id, count in self.by_rule.most_common():
            rule = by_id.get(rule_id)
            field_name, _, kind = rule_id.partition(".")
            groups.append(Group(rule.field if rule else field_name, rule_id,
                                rule.kind.value if rule else kind, count,
                                list(self.rule_examples.get(rule_id, []))))
        return groups

    def counts_json(self) -> dict[str, Any]:
        return {
            "input_rows": self.input_rows,
            "valid_rows": self.valid_rows,
            "rejected_rows": self.rejected_rows,
            "reject_count": sum(self.by_rule.values()),
            **(self.ties.counts().as_json() if self.ties.active else {}),
            "by_rule": {r.id: int(self.by_rule.get(r.id, 0)) for r in self.rules}
            | {k: int(v) for k, v in self.by_rule.items()},
        }

    def gx_json(self) -> dict[str, Any]:
        import great_expectations as gx  # heavy (~3 s to import): only the report's JSON needs it

        passed = sum(1 for t in self.gx.values() if t.success)
        return {
            "suite": self.suite_name,
            "great_expectations_version": str(gx.__version__),
            "context": "ephemeral (in memory; nothing written or sent)",
            "batches": self.batches,
            "expectations": len(self.gx),
            "passed": passed,
            "failed": len(self.gx) - passed,
            "success": passed == len(self.gx),
            "not_expressible": dict(self.not_expressible),
        }

    def fields_json(self) -> list[dict[str, Any]]:
        return [s.as_json() for s in self.fields.values()]

    def features_json(self) -> list[dict[str, Any]]:
        return [s.as_json() for s in self.features.values()]


def _as_row(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class BoundedSet:
    """Counts of up to ``limit`` distinct keys (in first-seen order), plus how many
    further distinct keys were seen (counted only while the set is not full)."""

    def __init__(self, limit: int = LINEAGE_LIST) -> None:
        self.limit = limit
        self.counts: Counter[str] = Counter()
        self.overflow_rows = 0

    def update(self, keys: Iterable[str | None]) -> None:
        for k in keys:
            if k is None:
                continue
            if k in self.counts or len(self.counts) < self.limit:
                self.counts[k] += 1
            else:
                self.overflow_rows += 1

    def as_json(self) -> dict[str, Any]:
        return {"values": dict(self.counts), "rows_not_listed": self.overflow_rows}


@dataclass
class Range:
    """The min and max of comparable values seen."""

    min: Any = None
    max: Any = None

    def update(self, values: Iterable[Any]) -> None:
        for v in values:
            if v is None:
                continue
            if self.min is None or v < self.min:
                self.min = v
            if self.max is None or v > self.max:
                self.max = v

    def as_json(self) -> dict[str, Any]:
        return {"min": jsonable(self.min), "max": jsonable(self.max)}


def origin(source: str | None) -> str | None:
    """A lineage URI without its row part (``file:///a.parquet#12`` -> the file;
    ``kafka://topic/partition/offset``, with or without `` via http://<request>#<index>``
    -> ``kafka://topic/partition``)."""
    if source is None:
        return None
    if source.startswith("kafka://"):
        source = source.split(" via ", 1)[0]
        return source.rsplit("/", 1)[0]
    if "#" in source:
        return source.rsplit("#", 1)[0]
    return source


class RejectsTally:
    """Rows of ``<schema>__rejects`` grouped by (field, rule) of their ``errors``."""

    def __init__(self) -> None:
        self.rows = 0
        self.errors = 0
        self.groups: dict[tuple[str, str], Group] = {}
        self.event_time = Range()
        self.ingested_at = Range()
        self.origins = BoundedSet()
        self.run_ids = BoundedSet()
        self.fingerprints = BoundedSet()

    def add(self, records: Iterable[dict[str, Any]]) -> None:
        """Account reject rows: dicts with ``_source``, ``row_index``, ``errors`` (a list
        of ``{field, rule, reason, message, value}``), ``event_time``, ``_ingested_at``,
        ``_run_id``, ``_schema_fingerprint``."""
        for rec in records:
            self.rows += 1
            source = rec.get("_source")
            self.event_time.update([rec.get("event_time")])
            self.ingested_at.update([rec.get("_ingested_at")])
            self.origins.update([origin(source)])
            self.run_ids.update([rec.get("_run_id")])
            self.fingerprints.update([rec.get("_schema_fingerprint")])
            errors = rec.get("errors")
            if not isinstance(errors, list):
                errors = [{"field": "_errors", "rule": "_errors.unreadable", "reason": "unreadable",
                           "message": "errors is not a JSON array", "value": None}]
            for err in errors:
                if not isinstance(err, dict):
                    err = {"field": "_errors", "rule": "_errors.unreadable", "reason": "unreadable",
                           "message": "error entry is not a JSON object", "value": err}
                self.errors += 1
                fname = str(err.get("field") or "")
                rule = str(err.get("rule") or f"{fname}.{err.get('reason') or '?'}")
                g = self.groups.get((fname, rule))
                if g is None:
                    g = self.groups[(fname, rule)] = Group(fname, rule, str(err.get("reason") or ""))
                g.count += 1
                if len(g.examples) < EXAMPLES:
                    g.examples.append({"row_index": rec.get("row_index"), "source": clip(source),
                                       "value": clip(err.get("value")), "message": clip(err.get("message")),
                                       "ingested_at": jsonable(rec.get("_ingested_at"))})

    def sorted_groups(self) -> list[Group]:
        return sorted(self.groups.values(), key=lambda g: (-g.count, g.field, g.rule))


def iso_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def iterate(chunks: Iterator[Chunk], tally: DataTally, progress: Progress) -> None:
    """Feed every chunk to ``tally``, updating ``progress``."""
    for chunk in chunks:
        tally.add(chunk)
        progress.update(tally.input_rows, tally.rejected_rows)
    progress.close(tally.input_rows, tally.rejected_rows)


__all__ = [
    "EXAMPLES",
    "BoundedSet",
    "Chunk",
    "DataTally",
    "Group",
    "GxTally",
    "Progress",
    "Range",
    "RejectsTally",
    "clip",
    "iso_now",
    "iterate",
    "origin",
]
