"""Whetstone installs under one namespace (``whetstone.engine``, ``whetstone.tools``, ...), so
an application with its own ``engine/``, ``skills/`` or ``tools.py`` imports it without a
collision; ``from whetstone import Engine`` is the public API (docs/architecture.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import tomllib

import whetstone

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {"engine": "whetstone.engine", "skills": "whetstone.skills",
           "tools": "whetstone.tools", "library_store": "whetstone.library_store"}


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_package_folder_is_installed_under_the_namespace() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]
    assert {k: v for k, v in setuptools["package-dir"].items() if k != "whetstone"} == {
        name: folder for folder, name in FOLDERS.items()}
    found = {"whetstone"}
    for folder, name in FOLDERS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((name, *rel)))
    assert sorted(setuptools["packages"]) == sorted(found), \
        "add the new package to [tool.setuptools] packages in pyproject.toml"
    assert _pyproject()["project"]["scripts"]["whetstone"] == "whetstone.cli:main"


def test_the_public_names_load_on_first_use() -> None:
    code = ("import sys, whetstone; assert 'whetstone.engine.api' not in sys.modules; "
            "E = whetstone.Engine; assert 'whetstone.engine.api' in sys.modules; "
            "assert 'torch' not in sys.modules; print(E.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "whetstone.engine.api"
    for name in whetstone.__all__:
        assert getattr(whetstone, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        whetstone.Nope  # noqa: B018


APP_CHECK = """
import sys
import engine, skills, tools, library_store            # the application's own modules
from whetstone import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
import whetstone.tools, whetstone.skills

assert engine.WHO == skills.WHO == tools.WHO == library_store.WHO == "app"
assert whetstone.tools.__file__ != tools.__file__ and "app" not in whetstone.tools.__file__
trace = Engine(ScriptedBackend(["The answer is 4."]), library=sys.argv[1],
               checkpointing=False).run("What is 2 + 2?")
assert trace.answer and "4" in trace.answer, trace
assert sys.modules["tools"] is tools and sys.modules["engine"] is engine
print("ok", trace.outcome)
"""


def test_an_application_with_its_own_engine_skills_and_tools_imports_whetstone(
        tmp_path: Path) -> None:
    app = tmp_path / "app"
    for pkg in ("engine", "skills"):
        (app / pkg).mkdir(parents=True)
        (app / pkg / "__init__.py").write_text('WHO = "app"\n')
    (app / "tools.py").write_text('WHO = "app"\n')
    (app / "library_store.py").write_text('WHO = "app"\n')
    (app / "main.py").write_text(textwrap.dedent(APP_CHECK))
    res = subprocess.run([sys.executable, "main.py", str(tmp_path / "lib")], cwd=app,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("ok")


def test_the_wheel_holds_only_the_namespace_and_works_from_it(tmp_path: Path) -> None:
    """Built from the tree: every file under ``whetstone/`` (``cli.py`` as a real file, the
    prompts as package data), nothing at the top level; importable from the wheel alone."""
    # Built from a copy: setuptools leaves build/ in the source folder, and a stale build/
    # would put files that no longer exist into the next wheel.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".*", "build", "dist", "*.egg-info", "__pycache__", "tests", "benchmarks", "docs"))
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                          "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                         capture_output=True, text=True, timeout=600, check=False)
    if res.returncode != 0:
        pytest.skip(f"pip could not build a wheel here: {res.stderr[-500:]}")
    wheel = next((tmp_path / "dist").glob("whetstone_engine-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        tops = {n.split("/")[0] for n in names}
        assert {t for t in tops if not t.endswith(".dist-info")} == {"whetstone"}
        assert "whetstone/engine/prompts/agent_system.md" in names
        assert "whetstone/engine/methods/march/prompts/solver.md" in names  # a method's own
        assert b"def main()" in zf.read("whetstone/cli.py")
        zf.extractall(tmp_path / "site")
    code = "import whetstone, whetstone.cli; print(whetstone.Engine.__module__, whetstone.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=True,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    module, where = out.stdout.split()
    assert module == "whetstone.engine.api" and where.startswith(str(tmp_path / "site"))
