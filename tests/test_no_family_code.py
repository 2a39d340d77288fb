"""No family-specific code: the procedure families the scoreboard measures (BIG-bench's word
sorting, Dyck languages, shuffled-object tracking, logical deduction) must be learned, not
written in. Their names may appear only where task sets are loaded (and in docs and tests);
anywhere else in engine/, skills/, tools/ or library_store/ (code, prompts, data files) a
name is a sign that knowledge of a family leaked into a method."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("engine", "skills", "tools", "library_store")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".json", ".txt", ".toml", ".jinja", ".j2"}
# Task loading: the spec grammar and the BIG-bench loader name tasks in examples and hints.
ALLOWED = {"engine/evaluation/bigbench.py", "engine/evaluation/tasks.py"}
FAMILY = re.compile(
    r"word[\s_-]*sort|dyck|tracking[\s_-]*(?:the[\s_-]*)?shuffled|shuffled[\s_-]*objects?"
    r"|logical[\s_-]*deduction", re.IGNORECASE)


def _files() -> list[Path]:
    return sorted(p for root in ROOTS for p in (REPO / root).rglob("*")
                  if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts)


def test_no_family_name_outside_task_loading() -> None:
    hits = []
    for path in _files():
        rel = path.relative_to(REPO).as_posix()
        if rel in ALLOWED:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            m = FAMILY.search(line)
            if m:
                hits.append(f"{rel}:{lineno}: {m.group(0)!r}")
    assert not hits, ("family names outside task loading (a method must carry no knowledge "
                      "of a family):\n" + "\n".join(hits))


def test_the_scan_sees_the_code_it_guards() -> None:
    files = {p.relative_to(REPO).as_posix() for p in _files()}
    assert "engine/evaluation/scorers.py" in files and "engine/prompts/agent_system.md" in files
    assert files >= ALLOWED


@pytest.mark.parametrize("text", [
    "word_sorting", "Word Sorting", "wordsort", "dyck_languages", "Dyck-n words",
    "tracking_shuffled_objects", "tracking the shuffled objects", "shuffled objects",
    "logical_deduction/three_objects", "Logical deduction",
])
def test_the_pattern_catches_each_variant(text: str) -> None:
    assert FAMILY.search(text)


@pytest.mark.parametrize("text", ["sorted words", "bracket balancing", "swap tracking",
                                  "deduce the order"])
def test_the_pattern_leaves_generic_words(text: str) -> None:
    assert not FAMILY.search(text)
