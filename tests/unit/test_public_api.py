"""The public surface (``features.__all__``) is what the docs say, under both import forms
and whatever was imported first: ``from features import X`` and ``import features;
features.X``. Each check runs in a fresh interpreter (imports are process-wide state)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import features

ROOT = Path(__file__).resolve().parents[2]

#: What each public name is: a function, a class or a string, and where it comes from.
EXPECTED = {
    "validate": ("function", "features.validation.validator"),
    "compile_schema": ("function", "features.compile"),
    "load_schema": ("function", "features.schema"),
    "parse_schema": ("function", "features.schema"),
    "FeatureStore": ("class", "features.sdk.store"),
    "ValidationResult": ("class", "features.validation"),
    "CompiledSchema": ("class", "features.compile"),
    "Schema": ("class", "features.schema"),
    "__version__": ("str", ""),
}


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _kind_check(expr: str, name: str) -> str:
    kind, module = EXPECTED.get(name, ("class", "features.errors"))
    if kind == "str":
        return f"assert isinstance({expr}, str), {expr}"
    test = "inspect.isfunction" if kind == "function" else "inspect.isclass"
    return (f"assert {test}({expr}), repr({expr}); "
            f"assert {expr}.__module__.startswith({module!r}), {expr}.__module__")


@pytest.mark.parametrize("first", [
    "", "import features.validation.convert, features.sdk.store, features.load"])
@pytest.mark.parametrize("form", ["from", "attribute"])
def test_every_public_name_is_what_the_docs_say_under_both_import_forms(first: str, form: str) -> None:
    """Every name of ``__all__`` in one fresh interpreter per (``first``, ``form``):
    ``first`` names modules imported before (a submodule of the same name as a function,
    ``features.validate`` once, must never shadow it)."""
    lines = ["import inspect", first or "pass"]
    for i, name in enumerate(sorted(features.__all__)):
        expr = f"got{i}"
        lines.append(f"from features import {name} as {expr}" if form == "from"
                     else f"import features; {expr} = features.{name}")
        lines.append(_kind_check(expr, name))
    _run("\n".join(lines))


def test_the_documented_validate_call_works() -> None:
    """The call docs/sdk.md and the README show, tried as a new user would."""
    out = _run("from features import validate, load_schema, compile_schema\n"
               "c = compile_schema(load_schema('schemas/credit_applicant.yaml'))\n"
               "r = validate([{'application_id': 'APP-42'}], c)\n"
               "print(r.counts.rejected_rows)")
    assert out == "1"
