"""Rewrite every product import of ``whetstone.X`` into the relative form (idempotent).

The product's files live in the repository's top-level folders (``engine/``, ``skills/``,
``tools/``, ``library_store/``, ``cli.py``) and install as the one package ``whetstone``
(``whetstone/engine`` is a link to ``../engine``). An absolute ``from whetstone.skills import
x`` resolves only through that link; ``from ..skills import x`` in ``engine/api.py`` names the
folder ``../skills`` by path, which a tool that reads files (an editor, a structure drawer)
finds without following a link, and still imports ``whetstone.skills`` when installed
(docs/architecture.md, "One namespace").

    .venv/bin/python scripts/relative_imports.py          # rewrite in place, list the files
    .venv/bin/python scripts/relative_imports.py --check  # exit 1 if any file would change
    .venv/bin/python scripts/relative_imports.py --absolute  # the reverse, for a move (below)

Moving a module: ``--absolute`` writes every product import as ``whetstone.*``, so one
``sed s/whetstone.engine.old/whetstone.engine.new/`` over the tree (tests and docs included)
renames it everywhere; ``git mv`` the file; then run this script again.

Only the module part of an import statement changes (``from whetstone.a.b import`` becomes
``from ..b import``); the names, their layout and every comment stay as written, so a lazy
import keeps the reason beside it. ``import whetstone.a.b as c`` becomes ``from ..a import b
as c``. The rewritten files' import blocks are then sorted by ruff's isort rule (I001), as
the project's lint wants them (relative imports after the others). Tests, benchmarks and the two files of ``whetstone/`` (the namespace's door) keep the
installed names. Run it again after a merge: files already relative are left alone.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "whetstone"
# The product's top-level folders and files: each is installed as whetstone.<name>.
ROOTS = ("engine", "skills", "tools", "library_store", "cli.py")
_FROM = re.compile(r"from(\s+)(whetstone(?:\s*\.\s*\w+)*)(\s+)import\b")
_IMPORT = re.compile(r"import\s+(whetstone(?:\.\w+)+)\s+as\s+(\w+)\s*$")


def product_files(repo: Path = REPO) -> list[Path]:
    """Every ``.py`` file of the product, found without following a link."""
    out: list[Path] = []
    for root in ROOTS:
        path = repo / root
        if path.is_file():
            out.append(path)
            continue
        for folder, dirs, files in os.walk(path, followlinks=False):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            out += [Path(folder) / f for f in sorted(files) if f.endswith(".py")]
    return out


def package_of(path: Path, repo: Path = REPO) -> list[str]:
    """The installed package a file's relative imports start from (``engine/api.py`` ->
    ``["whetstone", "engine"]``; ``engine/runtime/__init__.py`` -> its own package)."""
    return [PACKAGE, *path.relative_to(repo).parent.parts]


def relative(package: list[str], target: str) -> tuple[str, str]:
    """(dots, rest) naming ``target`` from ``package``: ``whetstone.skills.loader`` from
    ``whetstone.engine`` is ``("..", "skills.loader")``."""
    want = target.split(".")
    common = 0
    while common < min(len(package), len(want)) and package[common] == want[common]:
        common += 1
    if common == 0:
        raise ValueError(f"{target} is not under {PACKAGE}")
    return "." * (len(package) - common + 1), ".".join(want[common:])


def rewrite(src: str, package: list[str]) -> str:
    """``src`` with its ``whetstone.*`` imports made relative to ``package``."""
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    edits: list[tuple[int, int, int, str]] = []  # (line index, start col, end col, text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == PACKAGE or node.module.startswith(PACKAGE + ".")):
            line = lines[node.lineno - 1]
            m = _FROM.match(line, _col(line, node.col_offset))
            if m is None:
                raise ValueError(f"line {node.lineno}: cannot find the module of "
                                 f"'from {node.module} import' on its first line")
            dots, rest = relative(package, node.module)
            edits.append((node.lineno - 1, m.start(2), m.end(2), dots + rest))
        elif isinstance(node, ast.Import) and any(
                a.name == PACKAGE or a.name.startswith(PACKAGE + ".") for a in node.names):
            text = "".join(lines[node.lineno - 1:node.end_lineno])
            start = _col(lines[node.lineno - 1], node.col_offset)
            m = _IMPORT.match(text[start:].split("#")[0].rstrip("\n"))
            if len(node.names) != 1 or node.end_lineno != node.lineno or m is None:
                raise ValueError(f"line {node.lineno}: write 'import {PACKAGE}.a.b as c' "
                                 "(one name, with as) or 'from ... import' to rewrite it")
            parent, _, leaf = m.group(1).rpartition(".")
            dots, rest = relative(package, parent)
            new = f"from {dots}{rest} import {leaf} as {m.group(2)}"
            edits.append((node.lineno - 1, start, start + m.end(2), new))
    for index, start, end, text in sorted(edits, reverse=True):
        line = lines[index]
        lines[index] = line[:start] + text + line[end:]
    return "".join(lines)


_REL = re.compile(r"from(\s+)(\.+\s*(?:\w+(?:\s*\.\s*\w+)*)?)(\s+)import\b")


def absolutize(src: str, package: list[str]) -> str:
    """``src`` with its relative imports written as installed names (``--absolute``)."""
    lines = src.splitlines(keepends=True)
    edits: list[tuple[int, int, int, str]] = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ImportFrom) and node.level:
            line = lines[node.lineno - 1]
            m = _REL.match(line, _col(line, node.col_offset))
            if m is None:
                raise ValueError(f"line {node.lineno}: cannot find the relative module")
            base = package[:len(package) - node.level + 1]
            name = ".".join([*base, *([node.module] if node.module else [])])
            edits.append((node.lineno - 1, m.start(2), m.end(2), name))
    for index, start, end, text in sorted(edits, reverse=True):
        lines[index] = lines[index][:start] + text + lines[index][end:]
    return "".join(lines)


def _col(line: str, col_offset: int) -> int:
    """ast's byte offset as a character index into ``line``."""
    return len(line.encode("utf-8")[:col_offset].decode("utf-8"))


def sort_imports(files: list[Path], repo: Path) -> None:
    """ruff's isort fix over ``files`` (the relative imports move below the others)."""
    ruff = Path(sys.executable).parent / "ruff"
    exe = str(ruff) if ruff.exists() else shutil.which("ruff")
    if exe is None:
        print("ruff is not installed: run `ruff check --select I001 --fix` on the files above",
              file=sys.stderr)
        return
    subprocess.run([exe, "check", "--select", "I001", "--fix", "--quiet",
                    *map(str, files)], cwd=repo, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when a file still has an absolute import")
    parser.add_argument("--absolute", action="store_true",
                        help="the reverse: write every product import as whetstone.*")
    parser.add_argument("--repo", type=Path, default=REPO)
    args = parser.parse_args(argv)
    changed = []
    convert = absolutize if args.absolute else rewrite
    for path in product_files(args.repo):
        src = path.read_text(encoding="utf-8")
        new = convert(src, package_of(path, args.repo))
        if new != src:
            ast.parse(new)  # still Python
            changed.append(path.relative_to(args.repo))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for rel in changed:
        print(rel)
    if changed and not args.check:
        sort_imports([args.repo / rel for rel in changed], args.repo)
    verb = "would change" if args.check else "changed"
    print(f"{len(changed)} files {verb}", file=sys.stderr)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
