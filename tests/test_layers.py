"""The layering of docs/architecture.md: a lower layer never imports a higher one, and no
module imports itself back through others (no import cycles). Walks every import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Rank of each layer (its floor in docs/architecture.md's drawing, which
# tests/test_import_paths.py holds to the code); a module may import only modules of the same
# or a lower rank.
LAYERS: list[tuple[str, int]] = [
    ("engine/types.py", 0),
    ("engine/errors.py", 0),
    ("engine/paths.py", 0),
    ("engine/prompts", 0),
    ("engine/replies.py", 0),
    ("engine/answer_text.py", 0),
    ("engine/printing.py", 0),
    ("engine/loading.py", 0),
    ("engine/backends", 1),
    ("library_store", 1),
    ("skills", 2),
    ("tools", 2),
    ("engine/library", 3),
    ("engine/runtime", 4),
    ("engine/evaluation", 5),
    ("engine/chat", 5),
    ("engine/methods", 6),
    ("engine/server", 6),
    ("engine/evolution", 7),
    ("engine/api.py", 8),
    ("engine/integrations", 9),
    ("engine/scale.py", 9),
    ("engine/commands", 10),
    ("cli.py", 11),
    ("engine/__init__.py", 11),
    ("whetstone/__init__.py", 11),
    ("whetstone/__main__.py", 11),
]
# Siblings of the same rank that must not import each other.
SIBLINGS = [("engine/backends", "library_store"), ("skills", "tools"),
            ("engine/evaluation", "engine/chat"), ("engine/methods", "engine/server")]


def layer_of(rel: str) -> tuple[str, int] | None:
    for prefix, rank in LAYERS:
        if rel == prefix or rel.startswith(prefix + "/"):
            return prefix, rank
    return None


def module_to_path(module: str) -> str | None:
    """``whetstone.engine.api`` -> ``engine/api.py``: the installed namespace maps onto the
    repository's top-level folders (whetstone/engine links to engine/); anything else is not ours."""
    if module == "whetstone.cli":
        return "cli.py"
    if not module.startswith("whetstone."):
        return None
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:n])
        if base.with_suffix(".py").exists():
            return str(base.with_suffix(".py").relative_to(REPO))
        if base.is_dir() and (base / "__init__.py").exists():
            return str((base / "__init__.py").relative_to(REPO)) if n == len(parts) else str(
                base.relative_to(REPO)) + "/__init__.py"
    return None


def our_files() -> list[Path]:
    roots = ["engine", "skills", "tools", "library_store"]
    files = [p for r in roots for p in (REPO / r).rglob("*.py")]
    # whetstone/cli.py is a link to cli.py (how cli.py installs as whetstone.cli)
    return files + [REPO / "cli.py", REPO / "whetstone" / "__init__.py",
                    REPO / "whetstone" / "__main__.py"]


def imports_of(path: Path) -> list[tuple[int, str]]:
    return imports_of_src(path.read_text(), str(path.relative_to(REPO)))


def absolute(rel: str, level: int, module: str | None) -> str:
    """The installed name an import in the file ``rel`` means: ``from ..skills import x`` in
    ``engine/api.py`` is ``whetstone.skills`` (the product's relative form, resolved by path:
    ``engine/`` and ``skills/`` are siblings, as under ``whetstone/``)."""
    if level == 0:
        return module or ""
    parts = Path(rel).parent.parts
    package = ["whetstone"] if parts[:1] == ("whetstone",) else ["whetstone", *parts]
    base = package[:len(package) - level + 1]
    return ".".join([*base, *(module.split(".") if module else [])])


def _from_names(node: ast.ImportFrom, rel: str) -> list[str]:
    """The module of ``from M import a, b`` and each ``M.a``, ``M.b`` (a name may be a module)."""
    module = absolute(rel, node.level, node.module)
    if not module:
        return []
    return [module, *(f"{module}.{a.name}" for a in node.names)]


def imports_of_src(src: str, rel: str = "engine/x.py") -> list[tuple[int, str]]:
    """(line, installed module name) for every import, relative ones resolved from ``rel``."""
    tree = ast.parse(src)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out += [(node.lineno, m) for m in _from_names(node, rel)]
    return out


def runtime_imports_of_src(src: str, rel: str = "engine/x.py") -> list[tuple[int, str]]:
    """Like ``imports_of_src``, without imports under ``if TYPE_CHECKING:`` (they never run;
    a type-only import back is how two modules name each other's types without a cycle)."""
    tree = ast.parse(src)
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.orelse:
                    visit_stmt(stmt)
                continue
            visit_stmt(child)

    def visit_stmt(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.extend((node.lineno, m) for m in _from_names(node, rel))
        visit(node)

    visit(tree)
    return out


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """File -> the files it imports at run time (at module level or inside functions)."""
    graph: dict[str, set[str]] = {}
    for rel, src in sources.items():
        targets = set()
        for _, module in runtime_imports_of_src(src, rel):
            target = module_to_path(module)
            if target is not None and target != rel:
                targets.add(target)
        graph[rel] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one file (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def violations() -> list[str]:
    bad: list[str] = []
    for path in our_files():
        rel = str(path.relative_to(REPO))
        mine = layer_of(rel)
        if mine is None:
            bad.append(f"{rel}: not in any layer of docs/architecture.md; add it to LAYERS")
            continue
        for lineno, module in imports_of(path):
            target = module_to_path(module)
            if target is None:
                continue
            theirs = layer_of(target)
            if theirs is None:
                continue
            if theirs[1] > mine[1]:
                bad.append(f"{rel}:{lineno} imports {module} (layer {theirs[0]} is above {mine[0]})")
            for a, b in SIBLINGS:
                if {mine[0], theirs[0]} == {a, b}:
                    bad.append(f"{rel}:{lineno} imports sibling {module}")
    return sorted(set(bad))


def test_no_lower_layer_imports_a_higher_one() -> None:
    assert violations() == []


# --- a method package is removable ------------------------------------------------------------

METHODS = "engine/methods"
# The framework beside the method packages, which every method may import.
FRAMEWORK = {f"{METHODS}/{name}.py" for name in ("base", "registry", "analyst", "__init__")}


def method_of(rel: str) -> str | None:
    """``engine/methods/<name>/...`` -> ``<name>``; None for a file outside every method
    package (the framework files beside them included)."""
    parts = rel.split("/")
    if rel.startswith(METHODS + "/") and len(parts) > 3:
        return parts[2]
    return None


def method_import_problem(rel: str, target: str) -> str | None:
    """Why the method file ``rel`` may not import ``target`` (None: it may). A method imports
    the core (every layer below engine/methods), the framework (``FRAMEWORK``) and its own
    package: never a face or the evolve path above it, nor another method."""
    mine = method_of(rel)
    if mine is None:
        return None
    theirs = method_of(target)
    if theirs is not None:
        return None if theirs == mine else f"another method's package ({theirs})"
    if target.startswith(METHODS + "/"):
        return None if target in FRAMEWORK else "a framework file that is not base, " \
            "registry or analyst"
    layer = layer_of(target)
    if layer is not None and layer[1] > dict(LAYERS)[METHODS]:
        return f"a layer above the methods ({layer[0]})"
    return None


def method_violations(sources: dict[str, str]) -> list[str]:
    """Every import (type-only ones too: a deleted package must not break a type checker
    either) of a method file that ``method_import_problem`` refuses."""
    bad: dict[tuple[str, int, str], str] = {}
    for rel, src in sources.items():
        for lineno, module in imports_of_src(src, rel):  # a module, then each name from it
            target = module_to_path(module)
            why = target and method_import_problem(rel, target)
            if why:
                bad.setdefault((rel, lineno, why), module)
    return [f"{rel}:{lineno} imports {module}: {why}"
            for (rel, lineno, why), module in sorted(bad.items())]


def test_a_method_imports_only_the_core_the_framework_and_itself() -> None:
    sources = {str(p.relative_to(REPO)): p.read_text() for p in our_files()
               if method_of(str(p.relative_to(REPO)))}
    if not list((REPO / METHODS).glob("*/__init__.py")):
        pytest.skip("no method package in this tree (the removal test's core copy)")
    assert sources  # the walk found the method packages
    assert method_violations(sources) == []


def test_the_method_import_rule_can_fail() -> None:
    # two of the method packages on disk, whichever they are (the trees of
    # tests/test_method_removal.py run this test too)
    packages = sorted(p.parent.name for p in (REPO / METHODS).glob("*/__init__.py"))
    if len(packages) < 2:
        pytest.skip("needs two method packages on disk (the removal test's core copy has none)")
    mine, theirs = packages[:2]
    rel = f"engine/methods/{mine}/verifier.py"
    bad = {rel: f"from whetstone.engine.methods.{theirs} import METHOD\n"
                "from whetstone.engine.commands.common import handle_errors\n"
                "def f() -> None:\n    from whetstone.engine.api import Engine\n"
                "from whetstone.engine.evolution.pipeline import evolve\n"}
    found = method_violations(bad)
    assert [f.split(": ", 1)[1] for f in found] == [
        f"another method's package ({theirs})", "a layer above the methods (engine/commands)",
        "a layer above the methods (engine/api.py)",
        "a layer above the methods (engine/evolution)"]
    ok = {rel: f"from whetstone.engine.methods.{mine} import METHOD\n"
               "from whetstone.engine.methods.analyst import ask_parsed\n"
               "from whetstone.engine.runtime.plugins import Plugin\n"
               "from whetstone.library_store.corpus import Corpus\n"}
    assert method_violations(ok) == []
    # the framework is the three files: anything else beside the packages is refused
    assert method_import_problem(rel, "engine/methods/evolve.py")


def test_there_is_no_import_cycle() -> None:
    sources = {str(p.relative_to(REPO)): p.read_text() for p in our_files()}
    assert cycles(import_graph(sources)) == []


def test_the_cycle_check_catches_a_cycle_and_ignores_type_only_imports() -> None:
    # Two real modules made to import each other: one at top level, one inside a function.
    a, b = "library_store/store.py", "library_store/candidates.py"
    lazy = "def f() -> None:\n    from whetstone.library_store.store import Library\n"
    assert cycles(import_graph({a: "import whetstone.library_store.candidates\n", b: lazy})) == [[b, a]]
    type_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n" \
                "    from whetstone.library_store.store import Library\n"
    assert cycles(import_graph({a: "import whetstone.library_store.candidates\n", b: type_only})) == []


def test_the_check_catches_a_violation() -> None:
    # names, not uses: march
    # A bad import placed in the lowest layer must be reported (the check can fail).
    src = "from whetstone.engine.runtime import graph\n"
    assert imports_of_src(src) == [(1, "whetstone.engine.runtime"), (1, "whetstone.engine.runtime.graph")]
    mine = layer_of("engine/types.py")
    theirs = layer_of("engine/runtime/graph.py")
    assert mine and theirs and theirs[1] > mine[1]
    # the product's relative form names the same modules, resolved from the file's folder
    assert imports_of_src("from .runtime import graph\n", "engine/types.py") == [
        (1, "whetstone.engine.runtime"), (1, "whetstone.engine.runtime.graph")]
    assert imports_of_src("from ...skills import loader\n", "engine/methods/base.py") == [
        (1, "whetstone.skills"), (1, "whetstone.skills.loader")]
    assert imports_of_src("from . import METHOD\n", "engine/methods/march/plugin.py") == [
        (1, "whetstone.engine.methods.march"), (1, "whetstone.engine.methods.march.METHOD")]


def test_heavy_libraries_are_imported_lazily() -> None:
    # torch/transformers/vllm/chromadb only inside functions, never at module top level.
    heavy = {"torch", "transformers", "vllm", "chromadb", "llama_cpp", "ray", "matplotlib"}
    bad = []
    for path in our_files():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                if n.split(".")[0] in heavy:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno} imports {n} at top level")
    assert bad == []


def _function_lengths(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((f"{path.relative_to(REPO)}:{node.lineno} {node.name}",
                        (node.end_lineno or node.lineno) - node.lineno + 1))
    return out


def test_no_file_is_a_god_file() -> None:
    long = [f"{p.relative_to(REPO)}: {n} lines" for p in our_files()
            if (n := len(p.read_text().splitlines())) > 600]
    assert long == []


def test_the_serving_package_has_no_long_functions() -> None:
    long = [f"{name}: {n} lines" for folder in ("server", "chat")
            for p in (REPO / "engine" / folder).rglob("*.py")
            for name, n in _function_lengths(p) if n > 80]
    assert long == []


def test_the_package_does_not_import_the_benchmarks() -> None:
    """The scoreboard harness lives in benchmarks/, outside the installed package."""
    bad = [f"{p.relative_to(REPO)}:{line} imports {m}" for p in our_files()
           for line, m in imports_of(p) if m.split(".")[0] in ("benchmarks", "scoreboard_harness")]
    assert bad == []
