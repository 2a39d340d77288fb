"""The core holds only what more than one part uses (issue 38): a record, step kind, option or
exit code that exactly one method package uses, and no other core module, belongs in that
method's package. And an import inside a function is there for a reason its line says: an
optional or heavy dependency, a real cycle, or the command line's start-up time."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
METHODS = REPO / "engine" / "methods"
# The modules whose public names the core offers every part (records, errors and exit codes,
# the step kinds, the shared command-line options, the command kit), and the two the methods
# are reached through: the registry (what a ``MethodSpec`` may declare) and ``Engine``.
DEFINITIONS = ("engine/types.py", "engine/errors.py", "engine/commands/common.py",
               "engine/commands/kit.py", "engine/methods/registry.py", "engine/api.py")
# Of these, the modules whose classes' public members count too: a field of ``MethodSpec`` or
# a method of ``Engine`` that one method alone uses is a hook for that method in the core.
MEMBERS = ("engine/methods/registry.py", "engine/api.py")
CORE_ROOTS = ("engine", "library_store", "skills", "tools", "cli.py", "whetstone/__init__.py")


def method_of(path: Path, repo: Path = REPO) -> str | None:
    """``engine/methods/<name>/...`` -> ``<name>``; None outside every method package."""
    rel = path.relative_to(repo).parts
    if rel[:2] == ("engine", "methods") and len(rel) > 3:
        return rel[2]
    return None


def product_files(repo: Path = REPO) -> list[Path]:
    """Every Python file of the package (the links in ``whetstone/`` are not followed)."""
    files: list[Path] = []
    for entry in CORE_ROOTS:
        p = repo / entry
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return files


def public_names(tree: ast.Module, members: bool = False) -> set[str]:
    """The names a module defines at its top level and does not mark private; with
    ``members``, its classes' public methods and fields too."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        if members and isinstance(node, ast.ClassDef):
            names |= public_names(ast.Module(body=node.body, type_ignores=[]))
    return {n for n in names if not n.startswith("_")}


def step_kinds(types_tree: ast.Module) -> set[str]:
    """The values of ``RUNTIME_STEP_KINDS``."""
    for node in types_tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "RUNTIME_STEP_KINDS" and node.value:
            return set(ast.literal_eval(node.value))
    raise AssertionError("engine/types.py defines no RUNTIME_STEP_KINDS")


def used_words(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(identifiers, whole string constants) a module's code uses: names, attributes, keyword
    arguments and imported names; strings that are whole words (a step kind is written as its string)."""
    names: set[str] = set()
    strings: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.keyword) and node.arg:  # a field given by name
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(r"[a-z_]+", node.value):
            strings.add(node.value)
    return names, strings


def single_method_names(files: Iterable[Path], repo: Path = REPO) -> dict[str, str]:
    """``definition:name`` -> the one method package that uses it, for each public name of
    ``DEFINITIONS`` (and each runtime step kind) no other core module uses."""
    trees = {p: ast.parse(p.read_text(encoding="utf-8")) for p in files}
    words = {p: used_words(t) for p, t in trees.items()}
    offered: list[tuple[Path, str, bool]] = []  # (defining file, name, is a string)
    for rel in DEFINITIONS:
        path = repo / rel
        offered += [(path, n, False) for n in sorted(public_names(trees[path],
                                                                 members=rel in MEMBERS))]
    offered += [(repo / "engine/types.py", k, True) for k in sorted(step_kinds(
        trees[repo / "engine/types.py"]))]
    found: dict[str, str] = {}
    for home, name, is_string in offered:
        methods, core = set(), set()
        for path, (names, strings) in words.items():
            if path == home or name not in (strings if is_string else names):
                continue
            owner = method_of(path, repo)
            (methods.add(owner) if owner else core.add(path))
        if len(methods) == 1 and not core:
            found[f"{home.relative_to(repo)}:{name}"] = methods.pop()
    return found


def test_no_core_name_has_exactly_one_method_user() -> None:
    assert single_method_names(product_files()) == {}


def test_the_guard_finds_a_name_only_one_method_uses(tmp_path: Path) -> None:
    """A copy of the definitions and two users: a record only ``march`` uses is found; one a
    core module uses too, or two methods use, is not."""
    # names, not uses: march, nlpg
    for rel in DEFINITIONS:
        dst = tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text((REPO / rel).read_text(encoding="utf-8"), encoding="utf-8")
    types = tmp_path / "engine/types.py"
    types.write_text(types.read_text(encoding="utf-8")
                     + "\n\nclass Verdict:\n    pass\n\n\nclass Shared:\n    pass\n")
    users = {"engine/methods/march/verifier.py":
             "from whetstone.engine.types import Shared, Verdict\nx = 'observe'\n",
             "engine/methods/nlpg/plugin.py": "from whetstone.engine.types import Shared\n"}
    for rel, text in users.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    files = [tmp_path / rel for rel in (*DEFINITIONS, *users)]
    found = single_method_names(files, tmp_path)
    assert found["engine/types.py:Verdict"] == "march"
    assert found["engine/types.py:observe"] == "march"  # a step kind only march writes
    assert "engine/types.py:Shared" not in found
    # a core module using it too takes it off the list
    core = tmp_path / "engine/runtime/graph.py"
    core.parent.mkdir(parents=True)
    core.write_text("from whetstone.engine.types import Verdict\n")
    assert "engine/types.py:Verdict" not in single_method_names([*files, core], tmp_path)


def test_the_guard_covers_the_registry_and_engine_members(tmp_path: Path) -> None:
    """A ``MethodSpec`` field or an ``Engine`` method only one method uses is a hook for it in
    the core (as ``MethodSpec.verify`` and ``Engine.verify_report`` were for MARCH)."""
    # names, not uses: march
    for rel in DEFINITIONS:
        dst = tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text((REPO / rel).read_text(encoding="utf-8"), encoding="utf-8")
    registry = tmp_path / "engine/methods/registry.py"
    registry.write_text(registry.read_text(encoding="utf-8").replace(
        "    prompts: Prompts | None = None\n",
        "    prompts: Prompts | None = None\n    hallucination_check: str | None = None\n"))
    api = tmp_path / "engine/api.py"
    api.write_text(api.read_text(encoding="utf-8").replace(
        "    def close(self) -> None:\n",
        "    def claims_report(self) -> None:\n        pass\n\n    def close(self) -> None:\n"))
    user = tmp_path / "engine/methods/march/__init__.py"
    user.parent.mkdir(parents=True)
    user.write_text("METHOD = MethodSpec('march', hallucination_check='x')\n"
                    "def f(engine):\n    return engine.claims_report()\n")
    found = single_method_names([*(tmp_path / r for r in DEFINITIONS), user], tmp_path)
    assert found["engine/methods/registry.py:hallucination_check"] == "march"
    assert found["engine/api.py:claims_report"] == "march"


# --- imports inside functions ------------------------------------------------------------

# What a reason says: the dependency is heavy or optional, the import keeps a module (or the
# command line's start) light, or it breaks a real cycle.
REASON = re.compile(r"#\s*(heavy|optional|lazy|lazily|cycle)\b")


def function_imports(tree: ast.Module) -> list[tuple[ast.stmt, list[ast.stmt]]]:
    """Each import inside a function (a lambda, a method) with the statement list it sits in."""
    out: list[tuple[ast.stmt, list[ast.stmt]]] = []

    def walk(node: ast.AST, inside: bool) -> None:
        for name in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, name, None)
            if isinstance(block, list):
                for stmt in block:
                    if inside and isinstance(stmt, ast.Import | ast.ImportFrom):
                        out.append((stmt, block))
        for child in ast.iter_child_nodes(node):
            walk(child, inside or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    walk(tree, False)
    return out


def unexplained_imports(src: str) -> list[int]:
    """The lines of imports inside functions with no reason: none on the statement's lines,
    none on the comment line just above it or above the run of imports it ends."""
    lines = src.splitlines()
    bad = []
    for stmt, block in function_imports(ast.parse(src)):
        first = stmt
        i = block.index(stmt)
        while i > 0 and isinstance(block[i - 1], ast.Import | ast.ImportFrom) \
                and (block[i - 1].end_lineno or 0) + 1 == first.lineno:
            i -= 1
            first = block[i]
        own = lines[stmt.lineno - 1:stmt.end_lineno]
        above = lines[first.lineno - 2] if first.lineno > 1 else ""
        if not any(REASON.search(line) for line in own) and not (
                above.strip().startswith("#") and REASON.search(above)):
            bad.append(stmt.lineno)
    return bad


def test_every_import_inside_a_function_says_why() -> None:
    found: dict[str, list[int]] = {}
    for path in product_files():
        rel = str(path.relative_to(REPO))
        lines = unexplained_imports(path.read_text(encoding="utf-8"))
        if lines:
            found[rel] = lines
    assert found == {}, "give each import inside a function a reason (or move it up): " \
                        f"{found}"


def test_the_import_reason_check_can_fail() -> None:
    src = ("import json\n\n\ndef f() -> None:\n"
           "    import torch  # heavy: torch\n"
           "    # lazy: the runtime pulls in langgraph\n"
           "    from whetstone.engine.runtime import Agent\n"
           "    from whetstone.engine.runtime.graph import build\n\n"
           "    import yaml\n"
           "    # a comment that gives no reason\n"
           "    import numpy\n"
           "    g = lambda: __import__('os')  # noqa: E731 (not an import statement)\n\n\n"
           "def h() -> None:\n    from os import path\n")
    assert unexplained_imports(src) == [10, 12, 17]
