"""The stream run's summary as the terminal shows it (``features stream``, ``features demo``)."""

from __future__ import annotations

from typing import Any


def render(s: dict[str, Any], schema: str) -> str:
    """The summary lines of a stream run ``s`` (the job's summary document) of ``schema``."""
    lines = [
        f"stream run {s['run_id']}: schema {schema}, {s['subtasks']} subtask(s), "
        f"{s['batches']} micro-batches",
        f"  read {s['read']:,} = stored {s['stored']:,} + rejected {s['rejected']:,} + already present "
        f"{s['already_present']:,}  [{'adds up' if s['adds_up'] else 'DOES NOT ADD UP'}]",
        f"  consumer lag {'not measured' if s.get('lag_total') is None else format(s['lag_total'], ',')}"
        f" record(s) behind the end offsets",
        f"  dead-letter messages {s['dead_letters']:,}; produce -> stored latency p50 "
        f"{s['latency_ms']['p50']} ms, p99 {s['latency_ms']['p99']} ms",
    ]
    if (a := s.get("aggregations")) is not None:
        lines.append(f"  aggregations: {a['events']:,} events = accepted {a['accepted']:,} + "
                     f"late {a['late']:,} + duplicates {a['duplicates']:,}  "
                     f"[{'adds up' if a['adds_up'] else 'DOES NOT ADD UP'}]; "
                     f"{a.get('from_history', 0):,} earlier events read back from the stores; "
                     f"postgres rows written/changed {a['rows_written']:,}")
    if (g := s.get("gates")) is not None:
        breached = g.get("breached_batches") or {}
        lines.append(f"  quality gates over the last {g['window_records']:,} records: " + (
            ", ".join(f"{name} breached in {n:,} micro-batch(es) (worst {g['worst'][name] * 100:.4g}%)"
                      for name, n in breached.items()) if breached else "no breach"))
        if g.get("tripped"):
            lines.append("  STOPPED by a fail gate: " + g["tripped"]["message"].replace("\n", "\n  "))
    if s["by_rule"]:
        lines.append("  top reject reasons:")
        for rule, count in list(s["by_rule"].items())[:5]:
            lines.append(f"    {count:>9,}  {rule}")
    if s.get("unknown_fields"):
        lines.append("  fields not in the schema (ignored): " + ", ".join(
            f"{k} ({v:,})" for k, v in s["unknown_fields"].items()) + (
            f", other keys ({s['unknown_fields_other']:,})" if s.get("unknown_fields_other") else ""))
    return "\n".join(lines)
