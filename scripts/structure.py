"""What a tool that reads files sees of the product's structure (no link followed).

    .venv/bin/python scripts/structure.py                  # arrows, floors, unplaced imports
    .venv/bin/python scripts/structure.py --strip-prefix   # as if 'whetstone.' were not there
    .venv/bin/python scripts/structure.py --floors         # each part and the floor it is on

It reads every ``.py`` file of the checkout outside tests/, benchmarks/, docs/ and scripts/,
walking folders without entering a link, and places each import the way an editor or a
structure drawer does: a relative one (``from ..skills import x``) from the file's folder, an
absolute one (``engine.api``) from the repository's root, each step a real folder or file, never
a link. ``whetstone.engine.api`` lands on the link ``whetstone/engine`` and stays unplaced
(docs/architecture.md, "One namespace"). An arrow is one file importing another, at run time
(imports under ``if TYPE_CHECKING:`` never run and are not drawn); a part is what the layer
drawing of docs/architecture.md names (``engine/api.py``, ``engine/server``, ``skills`` ...);
a part's floor is the longest chain of arrows below it (0: it imports no other part).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTSIDE = {"tests", "benchmarks", "docs", "scripts", "build", "dist"}
OURS = ("whetstone", "engine", "skills", "tools", "library_store", "cli")


def source_files(repo: Path = REPO) -> list[Path]:
    """Every ``.py`` file of the product as a file-reading tool finds it (links not entered)."""
    out: list[Path] = []
    for folder, dirs, files in os.walk(repo, followlinks=False):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__"
                         and not (here == repo and d in OUTSIDE)
                         and not (here / d).is_symlink())
        out += [here / f for f in sorted(files)
                if f.endswith(".py") and not (here / f).is_symlink()]
    return out


def _no_link(repo: Path, path: Path) -> bool:
    """Whether every step from ``repo`` to ``path`` is a real folder or file."""
    cur = repo
    for part in path.relative_to(repo).parts:
        cur = cur / part
        if cur.is_symlink():
            return False
    return True


def _module_file(repo: Path, folder: Path, parts: list[str]) -> Path | None:
    """``folder/a/b.py`` or ``folder/a/b/__init__.py`` for ``parts`` ``[a, b]``, by path."""
    base = folder.joinpath(*parts)
    for cand in (base.with_suffix(".py") if parts else None, base / "__init__.py"):
        if cand is not None and cand.is_file() and _no_link(repo, cand):
            return cand
    return None


def runtime_imports(tree: ast.Module) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement, with whether it runs (False under ``if TYPE_CHECKING:``)."""
    def walk(node: ast.AST, runs: bool) -> Iterator[tuple[ast.stmt, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, runs
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), False)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), runs)
            else:
                yield from walk(child, runs)
    yield from walk(tree, True)


def targets(path: Path, node: ast.Import | ast.ImportFrom, repo: Path = REPO,
            strip_prefix: bool = False) -> list[tuple[str, Path | None]]:
    """(what the statement names, the file it lands on or None) for each module it imports:
    ``from a import b`` lands on ``a/b.py`` when that is a module, else on ``a``."""
    def absolute(name: str) -> list[str]:
        parts = name.split(".")
        if strip_prefix and parts[0] == "whetstone" and len(parts) > 1:
            parts = parts[1:]
        return parts

    out: list[tuple[str, Path | None]] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] in OURS:
                out.append((alias.name, _longest(repo, repo, absolute(alias.name))))
        return out
    if node.level:
        folder = path.parent
        for _ in range(node.level - 1):
            folder = folder.parent
        parts = node.module.split(".") if node.module else []
        shown = "." * node.level + (node.module or "")
    else:
        if not node.module or node.module.split(".")[0] not in OURS:
            return out
        folder, parts, shown = repo, absolute(node.module), node.module
    for alias in node.names:
        sub = _module_file(repo, folder, [*parts, alias.name])
        if sub is not None:
            out.append((f"{shown}.{alias.name}", sub))
        else:
            out.append((shown, _longest(repo, folder, parts)))
    return out


def _longest(repo: Path, folder: Path, parts: list[str]) -> Path | None:
    """The module ``parts`` names from ``folder``: the file of the whole name, by path."""
    if not parts:
        return _module_file(repo, folder, [])
    return _module_file(repo, folder, parts)


PARTS = ("engine/backends", "engine/runtime", "engine/evaluation", "engine/methods",
         "engine/evolution", "engine/server", "engine/integrations", "engine/commands",
         "engine/prompts", "engine/chat", "engine/library", "skills", "tools", "library_store",
         "whetstone")


def part_of(rel: str) -> str:
    """The drawing's part a file belongs to: a listed folder, else the file itself."""
    for p in PARTS:
        if rel.startswith(p + "/"):
            return p
    return rel


def graph(repo: Path = REPO, strip_prefix: bool = False
          ) -> tuple[dict[str, set[str]], list[str]]:
    """File -> the files it imports at run time; and every import of ours left unplaced."""
    arrows: dict[str, set[str]] = {}
    unplaced: list[str] = []
    for path in source_files(repo):
        rel = path.relative_to(repo).as_posix()
        arrows[rel] = set()
        for node, runs in runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            for shown, target in targets(path, node, repo, strip_prefix):
                if target is None:
                    unplaced.append(f"{rel}:{node.lineno} {shown}")
                elif runs and target != path:
                    arrows[rel].add(target.relative_to(repo).as_posix())
    return arrows, list(dict.fromkeys(unplaced))


def floors(arrows: dict[str, set[str]]) -> dict[str, int]:
    """Each part's floor: the longest chain of arrows between parts below it."""
    between: dict[str, set[str]] = {}
    for src, dsts in arrows.items():
        a = part_of(src)
        between.setdefault(a, set())
        for d in dsts:
            if part_of(d) != a:
                between[a].add(part_of(d))
    out: dict[str, int] = {}

    def floor(p: str, seen: tuple[str, ...] = ()) -> int:
        if p in seen:
            raise ValueError(f"the parts import each other: {' -> '.join((*seen, p))}")
        if p not in out:
            out[p] = 1 + max((floor(q, (*seen, p)) for q in between.get(p, ())), default=-1)
        return out[p]

    for p in between:
        floor(p)
    return out


def summary(repo: Path = REPO, strip_prefix: bool = False) -> dict[str, object]:
    arrows, unplaced = graph(repo, strip_prefix)
    part_arrows = {(part_of(a), part_of(b)) for a, ds in arrows.items() for b in ds
                   if part_of(a) != part_of(b)}
    try:
        fl: dict[str, int] | str = floors(arrows)
    except ValueError as exc:
        fl = str(exc)
    return {"files": len(arrows), "arrows": sum(map(len, arrows.values())),
            "part_arrows": len(part_arrows),
            "floors": (max(fl.values()) + 1 if fl else 0) if isinstance(fl, dict) else fl,
            "unplaced": len(unplaced), "unplaced_examples": unplaced[:5],
            "parts": fl}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strip-prefix", action="store_true",
                        help="read 'whetstone.X' as 'X' (what the tool would see without it)")
    parser.add_argument("--floors", action="store_true", help="list each part's floor")
    parser.add_argument("--repo", type=Path, default=REPO)
    args = parser.parse_args(argv)
    out = summary(args.repo, args.strip_prefix)
    parts = out.pop("parts")
    if args.floors and isinstance(parts, dict):
        for p, f in sorted(parts.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"{f:3d}  {p}")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
