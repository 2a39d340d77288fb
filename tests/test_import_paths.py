"""Every import of the product's own modules resolves by path, with no link followed (issue 47;
docs/architecture.md, "One namespace"): a tool that reads files (an editor, a structure
drawer) finds the file each import names, and draws the structure the layer drawing shows."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
DOOR = "whetstone/"  # the namespace's two files: they name the product by its installed names


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and the like look their module up
    spec.loader.exec_module(module)
    return module


structure = _script("structure")
codemod = _script("relative_imports")


def test_every_product_import_is_placed_by_path() -> None:
    """Nothing of ours is left unplaced outside the door, and the walk saw every file."""
    arrows, unplaced = structure.graph(REPO)
    assert [u for u in unplaced if not u.startswith(DOOR)] == [], (
        "imports a file-reading tool cannot place (run scripts/relative_imports.py)")
    product = {p.relative_to(REPO).as_posix() for p in codemod.product_files(REPO)}
    assert product <= set(arrows)
    assert sum(len(arrows[f]) for f in product) > 3 * len(product)  # it found the imports


def test_the_door_names_only_what_the_namespace_places() -> None:
    """``whetstone/__init__.py`` and ``__main__.py`` import by installed name; read as the
    one-namespace rule says (``whetstone.X`` is the top-level ``X``), each lands on a file."""
    _, unplaced = structure.graph(REPO)
    door = [u for u in unplaced if u.startswith(DOOR)]
    assert door, "the door's imports are what this test is about"
    _, stripped = structure.graph(REPO, strip_prefix=True)
    assert stripped == []


@pytest.mark.integration
def test_the_codemod_has_nothing_left_to_do() -> None:
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "relative_imports.py"),
                          "--check"], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, ("absolute whetstone.* imports in the product: run "
                                 "`python scripts/relative_imports.py`\n" + res.stdout)


def test_the_codemod_rewrites_only_the_module_and_is_idempotent() -> None:
    # names, not uses: march
    src = ("from __future__ import annotations\n\n"
           "from whetstone.engine.errors import ConfigError  # why it is here\n"
           "from whetstone.engine.methods.march import (\n    METHOD,\n)\n"
           "import whetstone.skills.loader as loader\n"
           "from whetstone import Engine\n\n\n"
           "def f() -> None:\n"
           "    from whetstone.engine.runtime import Agent  # lazy: the runtime is heavy\n")
    out = codemod.rewrite(src, ["whetstone", "engine", "methods", "march"])
    assert out == ("from __future__ import annotations\n\n"
                   "from ...errors import ConfigError  # why it is here\n"
                   "from . import (\n    METHOD,\n)\n"
                   "from ....skills import loader as loader\n"
                   "from .... import Engine\n\n\n"
                   "def f() -> None:\n"
                   "    from ...runtime import Agent  # lazy: the runtime is heavy\n")
    assert codemod.rewrite(out, ["whetstone", "engine", "methods", "march"]) == out
    assert codemod.rewrite(src, ["whetstone"]).splitlines()[2] == \
        "from .engine.errors import ConfigError  # why it is here"


def test_the_placement_check_can_fail(tmp_path: Path) -> None:
    """An absolute import through the link, and a relative one naming no file, are unplaced;
    a relative one naming a real file is an arrow."""
    (tmp_path / "engine" / "runtime").mkdir(parents=True)
    (tmp_path / "skills").mkdir()
    (tmp_path / "whetstone").mkdir()
    (tmp_path / "whetstone" / "engine").symlink_to("../engine")
    for rel in ("engine/__init__.py", "engine/runtime/__init__.py", "skills/__init__.py",
                "skills/loader.py"):
        (tmp_path / rel).write_text("")
    (tmp_path / "engine" / "runtime" / "agent.py").write_text(
        "from whetstone.engine.runtime import graph\n"
        "from ...skills import loader\n"
        "from ...skills.missing import x\n")
    arrows, unplaced = structure.graph(tmp_path)
    assert arrows["engine/runtime/agent.py"] == {"skills/loader.py"}
    assert unplaced == ["engine/runtime/agent.py:1 whetstone.engine.runtime",
                        "engine/runtime/agent.py:3 ...skills.missing"]
    assert "whetstone/engine/__init__.py" not in arrows  # the link is not entered


# --- the layer drawing is the code's -------------------------------------------------------

_PART = re.compile(r"(?<![\w/])((?:engine/)?[a-z_]+(?:\.py|/))")
RECORDS = 0  # the first floor: its modules may import each other


def drawn_floors(text: str) -> dict[str, int]:
    """docs/architecture.md's layer drawing (the code block under "## Layers"), read as part
    -> floor: floors are separated by ``^`` lines (the one below imports the one above it, so
    the first is floor 0), a part is a path in the drawing's left columns."""
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    floors: list[list[str]] = [[]]
    for line in block.splitlines()[1:]:
        if line.strip() == "^":
            floors.append([])
            continue
        left = line[:43]  # the parts; the prose is to the right
        floors[-1] += [m.group(1).rstrip("/") for m in _PART.finditer(left)
                       if "/" in m.group(1) or m.group(1).endswith(".py")]
    return {part: i for i, parts in enumerate(floors) for part in parts}


def code_arrows() -> set[tuple[str, str]]:
    """(part, part) for each run-time import between two parts of the drawing."""
    arrows, _ = structure.graph(REPO)
    return {(structure.part_of(a), structure.part_of(b)) for a, targets in arrows.items()
            for b in targets if structure.part_of(a) != structure.part_of(b)}


def drawing_problems(floors: dict[str, int], arrows: set[tuple[str, str]]) -> list[str]:
    bad = []
    for src, dst in sorted(arrows):
        if src in ("whetstone", "engine/__init__.py") or dst == "engine/__init__.py":
            continue  # the namespace's door and the engine package's empty __init__
        if src not in floors or dst not in floors:
            bad.append(f"{src if src not in floors else dst} is not in the drawing")
        elif floors[src] < floors[dst] or (floors[src] == floors[dst] != RECORDS):
            bad.append(f"{src} (floor {floors[src]}) imports {dst} (floor {floors[dst]})")
    return sorted(set(bad))


def test_the_layer_drawing_is_what_the_code_draws() -> None:
    """Every import between two parts goes down the drawing of docs/architecture.md (the
    first floor's modules may import each other): ``api.py`` sits above ``server/``, which
    it builds the app of, and below the integrations and commands that use it."""
    floors = drawn_floors((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert floors["cli.py"] > floors["engine/commands"] > floors["engine/api.py"] > \
        floors["engine/server"] > floors["engine/chat"]
    assert drawing_problems(floors, code_arrows()) == []


def test_the_layer_test_uses_the_drawings_floors() -> None:
    """tests/test_layers.py's ranks are the drawing's floors."""
    from test_layers import LAYERS

    floors = drawn_floors((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    ranks = {p: r for p, r in LAYERS if p in floors}
    assert ranks == floors


def test_the_drawing_check_can_fail() -> None:
    floors = {"engine/api.py": 8, "engine/server": 8, "engine/types.py": 0,
              "engine/errors.py": 0}
    assert drawing_problems(floors, {("engine/api.py", "engine/server")}) == [
        "engine/api.py (floor 8) imports engine/server (floor 8)"]
    assert drawing_problems(floors, {("engine/types.py", "engine/errors.py")}) == []
    assert drawing_problems(floors, {("engine/types.py", "engine/api.py")}) == [
        "engine/types.py (floor 0) imports engine/api.py (floor 8)"]
    assert drawing_problems(floors, {("engine/chat", "engine/types.py")}) == [
        "engine/chat is not in the drawing"]
