"""Imports inside functions only for optional heavy dependencies, each with its reason
(issue 46, point 3): an AST walk over every module of ``features/`` finds each ``import``
inside a function (a method, a nested function); the only ones allowed are of the modules
listed below, and each carries a comment saying why (on its line, or the line above the
run of imports it starts). Everything else is imported at the top of its module, where the
reader (and ``lint-imports``) sees it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "features"

#: top-level module -> why it may be imported inside a function (and nowhere else at the top)
ALLOWED = {
    "pyflink": "the Flink jobs' engine: heavy, and only a Flink job needs it",
    "cupy": "the optional gpu extra (featureline[gpu]): present only where a GPU kernel runs",
    "cupyx": "part of CuPy, the optional gpu extra",
    "nvidia": "NVRTC's wheel (nvidia-cuda-nvrtc-cu12), an optional dev extra for the kernel checks",
    "great_expectations": "about 3 s to import; only running a suite needs it",
    "uvicorn": "the HTTP server: only `features serve` needs it",
}

#: (module path under features/, imported module): an import kept inside a function for a
#: structural reason, stated where it is
KEPT = {
    # features.compile is imported by the kernels, which run where only NumPy, PyArrow and
    # CuPy are installed (bench/gpu_check.sh): the YAML parser loads with find_schema only
    ("compile/__init__.py", "features.schema"): "the kernels' import footprint",
}

def _module(node: ast.Import | ast.ImportFrom) -> str:
    if isinstance(node, ast.Import):
        return node.names[0].name
    return "." * node.level + (node.module or "")


def function_imports(source: str) -> list[tuple[int, str, bool]]:
    """(line, imported module, whether a comment gives its reason) of every import inside
    a function of ``source``. The reason is a comment on the import's own lines, or on the
    line above the first of the imports that run together with it."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found: dict[int, tuple[int, str, bool]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for block in ast.walk(fn):
            for field in ("body", "orelse", "finalbody"):
                body = getattr(block, field, None)
                if not isinstance(body, list):
                    continue
                for i, node in enumerate(body):
                    if not isinstance(node, (ast.Import, ast.ImportFrom)):
                        continue
                    first = i
                    while first > 0 and isinstance(body[first - 1], (ast.Import, ast.ImportFrom)):
                        first -= 1
                    last = node.end_lineno or node.lineno
                    own = any("#" in lines[n - 1] for n in range(node.lineno, last + 1))
                    above = lines[body[first].lineno - 2].strip().startswith("#")
                    found[node.lineno] = (node.lineno, _module(node), own or above)
    return sorted(found.values())


def _path(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _offences(package: Path) -> tuple[list[str], list[str]]:
    """(imports inside functions that are not allowed, allowed ones without a reason)."""
    forbidden, unexplained = [], []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        for line, module, reasoned in function_imports(path.read_text()):
            where = f"features/{rel}:{line}: {module}"
            if module.split(".")[0] in ALLOWED or (rel, module) in KEPT:
                if not reasoned:
                    unexplained.append(where)
            else:
                forbidden.append(where)
    return forbidden, unexplained


def test_imports_inside_functions_are_only_the_optional_heavy_ones() -> None:
    forbidden, unexplained = _offences(PACKAGE)
    assert forbidden == [], "import these at the top of the module:\n" + "\n".join(forbidden)
    assert unexplained == [], "say why in a comment above the import:\n" + "\n".join(unexplained)


def test_the_lists_name_real_things() -> None:
    for rel, module in KEPT:
        imported = [m for _, m, _ in function_imports((PACKAGE / rel).read_text())]
        assert module in imported, f"{rel} no longer imports {module} in a function: drop it from KEPT"


@pytest.mark.parametrize("snippet, forbidden, unexplained", [
    ("def f():\n    import json\n    return json\n", ["features/mod.py:2: json"], []),
    ("class C:\n    def m(self) -> None:\n        if self:\n"
     "            from features.errors import SinkError\n", ["features/mod.py:4: features.errors"], []),
    ("def f():\n    async def g():\n        from . import sibling\n", ["features/mod.py:3: ."], []),
    ("def f():\n    import pyflink\n", [], ["features/mod.py:2: pyflink"]),
    ("def f():\n    # pyflink: only the Flink jobs need it\n    import pyflink\n"
     "    from pyflink.table import udf\n", [], []),
    ("def f():\n    import great_expectations as gx  # heavy: only to run a suite\n", [], []),
    ("import json\n\nif json:\n    import os\n", [], []),
])
def test_it_fails_on_an_import_put_back_in_a_function(
    tmp_path: Path, snippet: str, forbidden: list[str], unexplained: list[str],
) -> None:
    (tmp_path / "mod.py").write_text(snippet)
    assert _offences(tmp_path) == (forbidden, unexplained)


def _imported_by(statement: str) -> set[str]:
    """The top-level names of the modules loaded after running ``statement`` in a fresh
    interpreter."""
    code = f"{statement}; import sys; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120, check=True)
    return {name.split(".")[0] for name in out.stdout.split()}


def test_the_sdk_does_not_import_the_optional_heavy_ones() -> None:
    """Model code imports the SDK: neither PyFlink nor Great Expectations loads with it."""
    loaded = _imported_by("import features.sdk")
    assert "features" in loaded
    assert loaded & {"pyflink", "great_expectations", "cupy", "uvicorn"} == set()


def test_the_kernels_import_only_numpy_and_pyarrow() -> None:
    """``features.kernels`` needs only NumPy and PyArrow (docs/kernels.md): the GPU check
    (bench/gpu_check.sh) runs where nothing else is installed, with ``features.schema``
    registered without its YAML parser as tests/gpu does."""
    loaded = _imported_by(
        "import sys, types; pkg = types.ModuleType('features.schema'); "
        "pkg.__path__ = ['features/schema']; sys.modules['features.schema'] = pkg; "
        "import features.kernels, features.kernels.device, features.schema.model")
    assert "features" in loaded
    heavy = {"yaml", "pandas", "psycopg", "redis", "confluent_kafka", "great_expectations", "pyflink",
             "prometheus_client", "jinja2", "uvicorn"}
    assert loaded & heavy == set()
