"""OLD view -> NEW view: every change to what a model reads, classified.

A model is trained on a view's output columns and calls it with its keys and request
fields, so (``features schema diff OLD NEW`` with two view files):

- a key added, removed or retyped: **breaking** (callers send other keys);
- an output column removed or retyped (a request field, a fetched column, a derived
  feature): **breaking** (a model reads it);
- a required request field added, or an optional one made required: **breaking**
  (callers must send it; one that leaves it out is refused);
- an output column added (an optional request field, a fetched column, a derived
  feature): compatible;
- a derived feature's steps or source changed, a source's ``max_age`` changed:
  compatible, reported (values change, types do not).

A breaking change needs a new major version (``2.0.0`` after ``1.x``); without one the
diff is refused, as for schemas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from features.schema.syntax import duration_text
from features.views.compile import CompiledView

__all__ = ["ViewChange", "ViewDiff", "diff_views"]


@dataclass(frozen=True)
class ViewChange:
    """One change: the column (or key) it concerns, its kind, whether it is compatible."""

    column: str
    kind: str
    compatible: bool
    detail: str


@dataclass(frozen=True)
class ViewDiff:
    old: CompiledView
    new: CompiledView
    changes: tuple[ViewChange, ...]

    @property
    def compatible(self) -> bool:
        return all(c.compatible for c in self.changes)

    @property
    def refusal(self) -> str | None:
        """Why the change is refused (breaking without a major version bump), or None."""
        if self.compatible or self.new.view.version[0] > self.old.view.version[0]:
            return None
        breaking = ", ".join(c.column for c in self.changes if not c.compatible)
        return (f"breaking changes ({breaking}) need a new major version: {self.old.version_str} -> "
                f"{self.new.view.version[0] + 1}.0.0 at least, got {self.new.version_str}")

    @property
    def allowed(self) -> bool:
        return self.refusal is None

    def as_json(self) -> dict[str, Any]:
        def side(cv: CompiledView) -> dict[str, Any]:
            return {"name": cv.name, "version": cv.version_str, "fingerprint": cv.fingerprint,
                    "path": cv.view.path}

        return {
            "kind": "view", "old": side(self.old), "new": side(self.new), "allowed": self.allowed,
            "compatible": self.compatible, "refusal": self.refusal,
            "changes": [{"column": c.column, "kind": c.kind, "compatible": c.compatible, "detail": c.detail}
                        for c in self.changes],
        }


def _columns(cv: CompiledView) -> dict[str, tuple[str, str]]:
    """Output column -> (declared type, origin) from the artefact (the checked-in picture)."""
    return {c["name"]: (c["type"], c["origin"]) for c in cv.artefact()["output_schema"]}


def diff_views(old: CompiledView, new: CompiledView) -> ViewDiff:
    """Classify every change from ``old`` to ``new`` (module docstring)."""
    changes: list[ViewChange] = []
    old_cols, new_cols = _columns(old), _columns(new)
    old_keys = {f.name: str(f.type) for f in old.view.keys}
    new_keys = {f.name: str(f.type) for f in new.view.keys}
    for name in dict.fromkeys([*old_keys, *new_keys]):
        a, b = old_keys.get(name), new_keys.get(name)
        if a != b:
            detail = (f"key added ({b})" if a is None else f"key removed (was {a})" if b is None
                      else f"key retyped {a} -> {b}")
            changes.append(ViewChange(name, "key_changed", False, detail))
    new_required = {f.name for f in new.view.request_fields if f.constraints.required}
    old_required = {f.name for f in old.view.request_fields if f.constraints.required}
    for name, (typ, origin) in old_cols.items():
        if name in old_keys:
            continue
        if name not in new_cols:
            changes.append(ViewChange(name, "column_removed", False, f"{origin} column removed ({typ})"))
        elif new_cols[name][0] != typ:
            changes.append(ViewChange(name, "column_retyped", False, f"retyped {typ} -> {new_cols[name][0]}"))
        elif origin == "request" and name in new_required and name not in old_required:
            changes.append(ViewChange(name, "request_field_required", False,
                                      "optional request field made required: callers must send it"))
    for name, (typ, origin) in new_cols.items():
        if name in new_keys or name in old_cols:
            continue
        if origin == "request" and name in new_required:
            changes.append(ViewChange(name, "request_field_added", False,
                                      f"required request field added ({typ}): callers must send it"))
        else:
            changes.append(ViewChange(name, "column_added", True, f"{origin} column added ({typ})"))
    old_feats = {f.name: f for f in old.view.features}
    for f in new.view.features:
        before = old_feats.get(f.name)
        if before is not None and (before.source, before.steps, before.on_invalid) != (f.source, f.steps,
                                                                                         f.on_invalid):
            changes.append(ViewChange(f.name, "definition_changed", True,
                                      "its steps, source or on_invalid changed: its values may change"))
    old_sources = {s.alias: s for s in old.sources}
    for s in new.sources:
        was = old_sources.get(s.alias)
        if was is not None and was.max_age_seconds != s.max_age_seconds:
            changes.append(ViewChange(s.alias, "max_age_changed", True,
                                      f"max_age {_age(was.max_age_seconds)} -> {_age(s.max_age_seconds)}"))
    return ViewDiff(old, new, tuple(changes))


def _age(seconds: int | None) -> str:
    return "none" if seconds is None else duration_text(seconds)
