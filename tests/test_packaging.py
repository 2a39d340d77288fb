"""Whetstone installs under one namespace (``whetstone.engine``, ``whetstone.tools``, ...), so
an application with its own ``engine/``, ``skills/`` or ``tools.py`` imports it without a
collision; ``from whetstone import Engine`` is the public API (docs/architecture.md)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

import whetstone

pytestmark = [pytest.mark.integration]  # every test here uses it

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {"engine": "whetstone.engine", "skills": "whetstone.skills",
           "tools": "whetstone.tools", "library_store": "whetstone.library_store"}


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _packages_in_tree() -> set[str]:
    """Every folder with an ``__init__.py``, under its ``whetstone.*`` name."""
    found = {"whetstone"}
    for folder, name in FOLDERS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            found.add(".".join((name, *init.parent.relative_to(REPO / folder).parts)))
    return found


def test_the_namespace_folders_are_links_to_the_top_level_folders() -> None:
    """``whetstone/engine`` is ``engine/`` (and so on) through a relative link that git keeps,
    so in any clone every ``whetstone.*`` name is a plain path an editor or type checker can
    follow."""
    for folder in [*FOLDERS, "cli.py"]:
        link = REPO / "whetstone" / folder
        assert link.is_symlink() and os.readlink(link) == f"../{folder}", \
            f"whetstone/{folder} must be the link ../{folder}: ln -s ../{folder} whetstone/"
    assert _pyproject()["project"]["scripts"]["whetstone"] == "whetstone.cli:main"
    if shutil.which("git") is None or not (REPO / ".git").exists():
        return  # an unpacked tree: the links above are what counts
    staged = subprocess.run(["git", "ls-files", "-s", "whetstone"], cwd=REPO, check=True,
                            capture_output=True, text=True, timeout=60).stdout
    modes = {line.split("\t")[1]: line.split()[0] for line in staged.splitlines()}
    for folder in [*FOLDERS, "cli.py"]:
        assert modes.get(f"whetstone/{folder}") == "120000", \
            f"git must keep whetstone/{folder} as a link (mode 120000), not a copy: {modes}"


NO_FINDER_CHECK = """
import importlib, json, sys
names = sys.argv[1:]
for name in names:
    importlib.import_module(name)
import whetstone
print(json.dumps({"files": {n: sys.modules[n].__file__ for n in names},
                  "path": list(whetstone.__path__), "torch": "torch" in sys.modules,
                  "finders": [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path]}))
"""


def test_every_name_resolves_by_path_without_an_installed_finder(tmp_path: Path) -> None:
    """With ``-S`` no ``.pth`` runs, so no editable finder is installed: the checkout on
    ``sys.path`` is enough for every package, each found at its path under ``whetstone/``."""
    names = sorted(_packages_in_tree() | {"whetstone.cli", "whetstone.engine.api"})
    # This interpreter's folders, for the dependencies (a .pth may have added some).
    deps = [p for p in sys.path if p and Path(p).is_dir()]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(REPO), *deps])}
    res = subprocess.run([sys.executable, "-S", "-c", NO_FINDER_CHECK, *names], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["finders"] == ["BuiltinImporter", "FrozenImporter", "PathFinder"]
    assert out["path"] == [str(REPO / "whetstone")]  # one folder: nothing appended to it
    for name, file in out["files"].items():
        rel = Path(*name.split(".")[1:])
        want = REPO / "whetstone" / (rel / "__init__.py" if name in _packages_in_tree()
                                     else rel.with_suffix(".py"))
        assert file == str(want), (name, file)
    assert not out["torch"]


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
               checkpointing=False, create=True).run("What is 2 + 2?")
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


# Left out of the copy a wheel is built from: only at the top (a package may have a tests/).
OUTSIDE_THE_PRODUCT = {"build", "dist", "tests", "benchmarks", "docs", "scripts"}


def _copy_ignore(folder: str, names: list[str]) -> set[str]:
    top = Path(folder) == REPO
    return {n for n in names if n.startswith(".") or n == "__pycache__" or n.endswith(
        ".egg-info") or (top and n in OUTSIDE_THE_PRODUCT)}


def _product_files() -> dict[str, Path]:
    """Installed name (``whetstone/engine/api.py``) -> the real file in the tree."""
    files = {"whetstone/cli.py": REPO / "cli.py"}
    for folder in FOLDERS:
        for f in (REPO / folder).rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix in {".py", ".md"}:
                files[f"whetstone/{folder}/{f.relative_to(REPO / folder).as_posix()}"] = f
    return files


def _check_archive(members: dict[str, bytes], links: list[str]) -> None:
    """The files of a built archive (path under its root -> bytes): every package and source
    file under ``whetstone/`` as a real file with the tree's content, nothing outside it."""
    tops = {n.split("/")[0] for n in members}
    assert {t for t in tops if not t.endswith((".dist-info", ".egg-info"))} == {"whetstone"}
    assert not links, f"links in the archive instead of files: {links[:5]}"
    for package in _packages_in_tree():
        assert f"{package.replace('.', '/')}/__init__.py" in members, \
            f"{package} is missing: give its folder an __init__.py"
    expected = _product_files()
    missing = sorted(set(expected) - set(members))
    assert not missing, f"not in the archive: {missing[:10]}"
    differ = [n for n, f in expected.items() if members[n] != f.read_bytes()]
    assert not differ, f"archive files that are not the tree's: {differ[:10]}"
    assert "whetstone/engine/prompts/agent_system.md" in members
    assert "whetstone/engine/methods/march/prompts/solver.md" in members  # a method's own
    assert b"def main()" in members["whetstone/cli.py"]


def _wheel_files(wheel: Path) -> tuple[dict[str, bytes], list[str]]:
    with zipfile.ZipFile(wheel) as zf:
        links = [i.filename for i in zf.infolist()
                 if stat.S_ISLNK(i.external_attr >> 16)]
        return {n: zf.read(n) for n in zf.namelist() if not n.endswith("/")}, links


def _sdist_files(sdist: Path) -> tuple[dict[str, bytes], list[str]]:
    """Under the sdist's root folder; tests/ and the metadata files at its top left out."""
    out, links = {}, []
    with tarfile.open(sdist) as tf:
        for m in tf.getmembers():
            name = m.name.split("/", 1)[1] if "/" in m.name else ""
            if not name.startswith("whetstone/"):
                continue
            if m.issym() or m.islnk():
                links.append(name)
            elif m.isfile():
                out[name] = tf.extractfile(m).read()  # type: ignore[union-attr]
    return out, links


def _build(src: Path, out: Path, *what: str) -> None:
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                          "--no-build-isolation", "-w", str(out), *what],
                         cwd=src, capture_output=True, text=True, timeout=600, check=False)
    if res.returncode != 0:
        pytest.skip(f"pip could not build a wheel here: {res.stderr[-500:]}")


@pytest.mark.march
def test_the_wheel_holds_only_the_namespace_and_works_from_it(tmp_path: Path) -> None:
    """Built from the tree, setuptools follows the links: every file under ``whetstone/`` is
    a real file with the tree's content (``cli.py``, the prompts as package data), nothing at
    the top level; importable from the wheel alone. The sdist holds the same real files, and a
    wheel built from it is the same."""
    # Built from a copy: setuptools leaves build/ in the source folder, and a stale build/
    # would put files that no longer exist into the next wheel.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=_copy_ignore)
    _build(src, tmp_path / "dist", str(src))
    wheel = next((tmp_path / "dist").glob("whetstone_engine-*.whl"))
    _check_archive(*_wheel_files(wheel))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path / "site")
    code = "import whetstone, whetstone.cli; print(whetstone.Engine.__module__, whetstone.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=True,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    module, where = out.stdout.split()
    assert module == "whetstone.engine.api" and where.startswith(str(tmp_path / "site"))

    sdist = tmp_path / "sdist"  # through the backend pyproject.toml names, as pip would
    code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    res = subprocess.run([sys.executable, "-c", code, str(sdist)], cwd=src,
                         capture_output=True, text=True, timeout=600, check=True)
    name = res.stdout.split()[-1]
    _check_archive(*_sdist_files(sdist / name))
    _build(tmp_path, tmp_path / "from-sdist", str(sdist / name))
    again = next((tmp_path / "from-sdist").glob("whetstone_engine-*.whl"))
    assert _wheel_files(again)[0].keys() == _wheel_files(wheel)[0].keys()
