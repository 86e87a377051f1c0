"""The package's import graph: no cycle among features' modules (counting imports inside
functions too, not those under ``if TYPE_CHECKING``), and no import of the compiler by the
schema model (counting every import)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "features"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(id(n) for n in ast.walk(child))
    return skip


def imports_of(source: str, mods: Iterable[str], *, type_checking: bool = False) -> set[str]:
    """The modules of ``mods`` that ``source`` imports, at any depth (inside functions
    too); those under ``if TYPE_CHECKING:`` only when ``type_checking``."""
    known = set(mods)
    tree = ast.parse(source)
    skip = set() if type_checking else _type_checking_nodes(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        module = node.module if isinstance(node, ast.ImportFrom) and node.level == 0 else None
        if module is not None and module.startswith("features"):
            for alias in node.names:
                full = f"{module}.{alias.name}"
                out.add(full if full in known else module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("features"))
    return {m for m in out if m in known}


def import_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    mods = _modules()
    graph = {name: imports_of(path.read_text(), mods, type_checking=type_checking)
             for name, path in mods.items()}
    return {k: vs - {k} for k, vs in graph.items() if vs - {k}}


def imports_across(graph: dict[str, set[str]], importer: str, imported: str) -> list[str]:
    """``a -> b`` for each module ``a`` of package ``importer`` that imports a module
    ``b`` of package ``imported``."""
    def within(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return sorted(f"{a} -> {b}" for a, bs in graph.items() if within(a, importer)
                  for b in bs if within(b, imported))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_in_the_package() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_walk_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_schema_model_imports_nothing_from_the_compiler() -> None:
    """Issue 21: ``features.schema`` (YAML -> Schema) knows nothing of its artefacts; the
    compiler imports the schema, never the reverse (the migration DDL of a schema diff
    lives in ``features.compile.migration``)."""
    found = imports_across(import_graph(type_checking=True), "features.schema", "features.compile")
    assert not found, "features.schema imports the compiler: " + "; ".join(found)


def test_the_sdk_parts_do_not_import_its_facade() -> None:
    """Issue 31: ``features.sdk``'s parts (fallback, online, redis_read, historical, stored,
    columns) never import the facade ``features.sdk.store`` that imports them, not even
    for type checking (the fallback names what it needs of the store as a Protocol), and
    the SDK's old top-level modules are gone."""
    graph = import_graph(type_checking=True)
    parts = [m for m in _modules() if m.startswith("features.sdk.") and m != "features.sdk.store"]
    assert "features.sdk.fallback" in parts and "features.sdk.online" in parts
    found = [f"{m} -> features.sdk.store" for m in parts if "features.sdk.store" in graph.get(m, set())]
    assert not found, found
    old = {"features.store", "features.fallback", "features.stored", "features.prewarm", "features.asof"}
    assert not old & set(_modules())


def test_the_walk_finds_an_import_inside_a_function() -> None:
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from features.schema.model import Schema\n"
        "if TYPE_CHECKING:\n    import features.compile.rules\n"
        "def f(s: Schema) -> str:\n"
        "    from features.compile.postgres import pg_type\n"
        "    return pg_type(s.fields[0].type)\n"
    )
    mods = _modules()
    graph = {"features.schema.fake": imports_of(source, mods)}
    assert imports_across(graph, "features.schema", "features.compile") == [
        "features.schema.fake -> features.compile.postgres"]
    graph = {"features.schema.fake": imports_of(source, mods, type_checking=True)}
    assert imports_across(graph, "features.schema", "features.compile") == [
        "features.schema.fake -> features.compile.postgres", "features.schema.fake -> features.compile.rules"]
    # a package whose name only starts like features.schema is another package
    assert imports_across({"features.schemas_x": {"features.compile"}}, "features.schema",
                          "features.compile") == []


def _calls(name: str) -> dict[str, list[int]]:
    """module -> lines where ``name(...)`` is called (``name`` as written, e.g. "psycopg.connect")."""
    out: dict[str, list[int]] = {}
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == name:
                out.setdefault(module, []).append(node.lineno)
    return out


def test_postgres_connections_open_in_one_place() -> None:
    """Every Postgres connection comes from features.sinks.pg.connect (its errors mapped
    there); a second ``psycopg.connect`` would be a second error mapping to keep in step."""
    assert set(_calls("psycopg.connect")) == {"features.sinks.pg"}, _calls("psycopg.connect")


#: private members of other libraries that featureline reaches on purpose, each with why
_FOREIGN_PRIVATE = {
    ("argparse", "_SubParsersAction"),  # the subcommands' parsers (no public handle): no abbreviations
    ("parser", "_actions"),             # an argparse parser's options, walked for the same reason
    ("action", "_choices_actions"),     # the subcommands' help lines (argparse)
    ("env", "_j_stream_execution_environment"),  # PyFlink's Java environment: the job's settings
    ("conf", "_j_configuration"),  # PyFlink's Java Configuration: a remote environment is built from it
}


def test_no_module_touches_another_objects_private_members() -> None:
    """Issue 46: the SDK's parts and the commands use public interfaces (``store.run_postgres``,
    ``store.redis_pool``, ``store.use_schema``...), never ``store._pg_run``: an attribute
    starting with one underscore is read only on ``self``/``cls`` (and on the few foreign
    objects above, for a reason given)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            private = isinstance(node, ast.Attribute) and node.attr[:1] == "_" and node.attr[:2] != "__"
            if private:
                assert isinstance(node, ast.Attribute)
                base = ast.unparse(node.value)
                if base not in ("self", "cls") and (base, node.attr) not in _FOREIGN_PRIVATE:
                    found.append(f"{path.name}:{node.lineno}: {base}.{node.attr}")
    assert not found, found


def test_argparse_lives_only_in_the_command_line_package() -> None:
    """Issue 46: every command is a module of ``features/cli/``; the layers below take
    arguments, not an ``argparse.Namespace`` (the job files call the commands)."""
    found = [str(path.relative_to(ROOT)) for path in sorted(PACKAGE.rglob("*.py"))
             if "argparse" in _imported(path) and path.parent.name != "cli"]
    assert not found, found


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names
