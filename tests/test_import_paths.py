"""Every import of the product's own modules resolves by path, with no link followed (issue 47;
docs/architecture.md, "One namespace"): a tool that reads files (an editor, a structure
drawer) finds the file each import names, and draws the structure the layer drawing shows."""

from __future__ import annotations

import importlib.util
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
    assert sum(len(arrows[f]) for f in product) > 900  # the walk found the imports


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
