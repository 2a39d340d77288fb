"""Give every test that uses a built-in method that method's pytest marker (idempotent).

    .venv/bin/python scripts/mark_method_tests.py          # add the missing markers
    .venv/bin/python scripts/mark_method_tests.py --check  # exit 1 when one is missing

Which methods a test uses is ``tests/method_marks.py``'s reading (imports of the method's
package, the name where a method is chosen, the name as a word in a string). A file whose every
test uses a method gets it in its module ``pytestmark``; any other test gets
``@pytest.mark.<method>`` above it. Run it after a merge that adds tests; the removal test
(tests/test_method_removal.py) fails on a test that lacks a marker it needs.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import method_marks


def apply(path: Path, lacking: dict[str, list[str]], all_tests: list[str]) -> None:
    """Add ``lacking`` (test -> methods) to ``path``: shared by every test -> pytestmark."""
    src = path.read_text(encoding="utf-8")
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    common = set.intersection(*(set(lacking.get(t, [])) for t in all_tests)) \
        if all_tests and len(lacking) == len(all_tests) and len(all_tests) > 3 else set()
    inserts: list[tuple[int, str]] = []  # (line index, text)
    for test, methods in lacking.items():
        own = [m for m in methods if m not in common]
        if not own:
            continue
        node = _node(tree, test)
        first = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
        indent = re.match(r"\s*", lines[first]).group(0)
        inserts.append((first, "".join(f"{indent}@pytest.mark.{m}\n" for m in sorted(own))))
    if common:
        marks = ", ".join(f"pytest.mark.{m}" for m in sorted(common))
        existing = next((n for n in tree.body if isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)), None)
        if existing is not None:
            value = existing.value
            old = ast.get_source_segment(src, value) or ""
            inner = old[1:-1] if isinstance(value, ast.List) else old
            start, end = existing.lineno - 1, existing.end_lineno or existing.lineno
            lines[start:end] = [f"pytestmark = [{inner}, {marks}]\n"]
        else:
            at = _after_imports(tree)
            inserts.append((at, f"\npytestmark = [{marks}]  # every test here uses it\n"))
    for index, text in sorted(inserts, reverse=True):
        lines.insert(index, text)
    out = "".join(lines)
    if not re.search(r"^import pytest$", out, re.MULTILINE):
        out = out.replace("from __future__ import annotations\n",
                          "from __future__ import annotations\n\nimport pytest\n", 1)
    path.write_text(out, encoding="utf-8")


def _node(tree: ast.Module, test: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    cls, _, name = test.rpartition("::")
    for node in tree.body:
        if not cls and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                node.name == name:
            return node
        if cls and isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and \
                        item.name == name:
                    return item
    raise KeyError(test)


def _after_imports(tree: ast.Module) -> int:
    """The line index after the module's leading imports (and ``sys.path`` lines)."""
    last = 0
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom) or (
                isinstance(node, ast.Expr) and last == 0 and isinstance(node.value,
                                                                        ast.Constant)):
            last = node.end_lineno or node.lineno
        else:
            break
    return last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; report")
    args = parser.parse_args(argv)
    missing = method_marks.missing_marks()
    by_file: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for key, methods in missing.items():
        name, test = key.split("::", 1)
        by_file[name][test] = methods
    for name, lacking in sorted(by_file.items()):
        print(f"{name}: {len(lacking)} test(s) lack " + ", ".join(
            sorted({m for ms in lacking.values() for m in ms})))
        if not args.check:
            path = REPO / "tests" / name
            methods = method_marks.builtin_methods()
            every = list(method_marks.ModuleUses(path, methods).tests())
            apply(path, lacking, every)
    ruff = Path(sys.executable).parent / "ruff"
    exe = str(ruff) if ruff.exists() else shutil.which("ruff")
    if by_file and not args.check and exe:  # `import pytest` where ruff's isort wants it
        subprocess.run([exe, "check", "--select", "I001", "--fix", "--quiet",
                        *(str(REPO / "tests" / n) for n in by_file)], cwd=REPO, check=False)
    return 1 if args.check and missing else 0


if __name__ == "__main__":
    sys.exit(main())
