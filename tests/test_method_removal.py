"""A method is removable (issues 38, 47): without any built-in method's package (and its
``BUILTIN_METHODS`` line), the command line works and every test that does not use the method
passes.

Every test that uses a method carries its marker (``tests/method_marks.py`` reads them; the
first test here holds the suite to it). Then, in copies of the tree (links kept; each command
runs in its copy, its folder first on ``sys.path``, which a probe test checks):

- for each built-in method, a tree without it answers ``whetstone --help``, ``whetstone
  methods`` and a ``scripted:`` run;
- the fast suite (``not slow and not integration``) passes test by test in a tree holding
  exactly the methods each test is marked with: the tests marked with no method in a tree with
  no method at all, the tests marked ``march`` in a tree with march alone, and so on for each
  set of markers a test carries.

Why this stands for "the fast suite minus X's tests, in a tree without X, for each X": a test
not marked X is marked with some set S of the other methods, and passes with exactly S (here)
and with all of them (the suite itself, in the checkout). The tree without X holds S and some
more methods; the registry adds a method's folders, commands, printers and exit codes one
method at a time, refusing two that claim the same one, so no method present can stand in for
one that is gone, and none can break a test that passes with all of them. What this does not
prove is a test that passes with S and with every method, but fails with a set in between:
that needs two methods that undo each other, which the registry's rules leave no room for.
Ten whole-suite copies take ten times the suite; these take it about once (docs/architecture.md,
"Layers").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import method_marks
import pytest

from whetstone.engine.methods.registry import BUILTIN_METHODS

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parent.parent
REGISTRY = "engine/methods/registry.py"
METHODS = [p.rsplit(".", 1)[1] for p in BUILTIN_METHODS]
FAST = "not slow and not integration"
PROBE = "test_removal_probe.py"  # written into each copy: what the copy's pytest imported


def _tree_files() -> list[str]:
    """The checkout's files as git sees them: tracked and new (not ignored) ones."""
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs a git checkout to list the tree's files")
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy of the checkout (links kept: ``whetstone/engine -> ../engine``)."""
    root = tmp_path_factory.mktemp("tree") / "whetstone-copy"
    for rel in _tree_files():
        src, dst = REPO / rel, root / rel
        if not src.is_symlink() and not src.is_file():
            continue  # deleted in the working tree, or a submodule
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
    assert (root / "whetstone" / "engine").is_symlink()
    return root


def without(tree: Path, dest: Path, removed: set[str], *, keep_lines: bool = False) -> Path:
    """A copy of ``tree`` at ``dest`` without the ``removed`` methods' packages and (unless
    ``keep_lines``) their ``BUILTIN_METHODS`` lines, with a probe test that checks it."""
    shutil.copytree(tree, dest, symlinks=True)
    registry = dest / REGISTRY
    text = registry.read_text(encoding="utf-8")
    for method in sorted(removed):
        shutil.rmtree(dest / "engine" / "methods" / method)
        line = f'    "whetstone.engine.methods.{method}",\n'
        assert text.count(line) == 1, f"{method}'s BUILTIN_METHODS line is not one line"
        if not keep_lines:
            text = text.replace(line, "")
    registry.write_text(text, encoding="utf-8")
    probe = (
        "import importlib.util\nfrom pathlib import Path\n\nimport whetstone\n"
        "from whetstone.engine.methods.registry import BUILTIN_METHODS, default_registry\n\n\n"
        "def test_this_is_the_copy_without_the_methods() -> None:\n"
        f"    root = Path({str(dest)!r})\n"
        "    assert Path(whetstone.__file__).parent == root / 'whetstone'\n"
        f"    for method in {sorted(removed)!r}:\n"
        "        assert importlib.util.find_spec(f'whetstone.engine.methods.{method}') is None\n"
        "        assert not [p for p in BUILTIN_METHODS if p.endswith('.' + method)]\n"
        "        assert method not in [s.name for s in default_registry().specs()]\n")
    (dest / "tests" / PROBE).write_text(probe, encoding="utf-8")
    return dest


def run_in(copy: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in the copy: its folder first on the path, this checkout nowhere."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1",
               WHETSTONE_TEST_CACHE=os.environ.get(
                   "WHETSTONE_TEST_CACHE", str(REPO / ".cache" / "whetstone")))
    return subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


# --- every test that uses a method says so ---------------------------------------------------

def test_every_test_carries_the_markers_it_needs() -> None:
    """A test that uses a method (by import or by name) carries the method's marker, and one
    that starts processes or servers carries ``integration`` (scripts/mark_method_tests.py
    adds them)."""
    assert method_marks.missing_marks() == {}, \
        "run `python scripts/mark_method_tests.py` (tests/method_marks.py says why each)"
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]["markers"]
    assert {m.split(":")[0] for m in markers} >= {*METHODS, "integration"}


def test_the_marker_reading_sees_imports_names_fixtures_and_helpers(tmp_path: Path) -> None:
    """Each way a test can use a method is found, through a fixture, a helper and a support
    module; a name declared as data is not; a process started in a helper is integration."""
    # names, not uses: march, nlpg, memory, horizon, co_react, self_consistency, trace2skill, dynamo, latent
    (tmp_path / "helpers.py").write_text(
        "import subprocess\n\n\ndef run_cli(*args):\n    return subprocess.run(args)\n\n\n"
        "def evolve_memory(engine):\n    return engine.evolve('memory')\n")
    (tmp_path / "test_uses.py").write_text(
        "import pytest\nfrom helpers import evolve_memory, run_cli\n"
        "from whetstone.engine.methods.march.verifier import March\n\n\n"
        "@pytest.fixture\ndef nlpg_engine():\n    return Engine(methods=[('nlpg', {})])\n\n\n"
        "def test_import():\n    assert March\n\n\n"
        "def test_fixture(nlpg_engine):\n    pass\n\n\n"
        "def test_helper():\n    evolve_memory(None)\n\n\n"
        "def test_cli():\n    run_cli('whetstone', 'run', '--methods', 'horizon,co_react')\n\n\n"
        "def test_config():\n    x = '--method-config self_consistency.n=3'\n\n\n"
        "def test_word():\n    x = 'whetstone evolve trace2skill --create'\n\n\n"
        "def test_data():\n    # names, not uses: dynamo\n    x = {'module': 'dynamo'}\n\n\n"
        "def test_plain_word():\n    assert 'memory' != 'horizon'\n\n\n"
        "@pytest.mark.latent\ndef test_marked():\n    x = 'latent'\n")
    (tmp_path / "engine/methods").mkdir(parents=True)
    (tmp_path / "engine/methods/registry.py").write_text(
        f"BUILTIN_METHODS = {[f'whetstone.engine.methods.{m}' for m in METHODS]!r}\n")
    found = method_marks.missing_marks(tmp_path, tmp_path)
    every_test = {"march"}  # the module imports it: no test there is collected without it
    assert found == {
        "test_uses.py::test_import": sorted(every_test),
        "test_uses.py::test_fixture": sorted(every_test | {"nlpg"}),
        "test_uses.py::test_helper": sorted(every_test | {"memory"}),
        "test_uses.py::test_cli": sorted(every_test | {"co_react", "horizon", "integration"}),
        "test_uses.py::test_config": sorted(every_test | {"self_consistency"}),
        "test_uses.py::test_word": sorted(every_test | {"trace2skill"}),
        "test_uses.py::test_data": sorted(every_test),
        "test_uses.py::test_plain_word": sorted(every_test),
        "test_uses.py::test_marked": sorted(every_test),
    }


# --- the command line without each method ----------------------------------------------------

def check_cli(copy: Path, method: str, tmp: Path) -> None:
    """``whetstone --help``, ``whetstone methods`` and a ``scripted:`` run in the copy."""
    res = run_in(copy, "-c", "import whetstone, whetstone.cli as c; print(whetstone.__file__);"
                 " print(c.__file__)")
    assert res.returncode == 0, res.stderr
    assert all(Path(p).is_relative_to(copy) for p in res.stdout.split()), res.stdout
    res = run_in(copy, "-m", "whetstone", "--help")
    assert res.returncode == 0 and "Usage:" in res.stdout, res.stdout + res.stderr
    res = run_in(copy, "-m", "whetstone", "methods", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    names = {row["name"] for row in json.loads(res.stdout)}
    assert method not in names and set(METHODS) - {method} <= names, names
    script = tmp / "replies.json"
    script.write_text(json.dumps({"replies": ["Thought: multiply\nAction: calculator[17*23]",
                                              "Final Answer: 391"]}))
    res = run_in(copy, "-m", "whetstone", "run", "What is 17 * 23?", "--model",
                 f"scripted:{script}", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    trace = json.loads(res.stdout)
    assert trace["answer"] == "391" and trace["outcome"] == "answered"


@pytest.mark.parametrize("method", METHODS)
def test_the_command_line_works_without_a_method(tree: Path, tmp_path: Path,
                                                  method: str) -> None:
    copy = without(tree, tmp_path / "copy", {method})
    assert not (copy / "engine" / "methods" / method).exists()
    check_cli(copy, method, tmp_path)


# --- the fast suite, each test with exactly its methods --------------------------------------

def fast_groups(tests: Path = REPO / "tests") -> dict[frozenset[str], list[str]]:
    """Set of method markers -> the test files holding a fast test marked with exactly those
    (a test marked ``slow`` or ``integration`` is not in the fast suite)."""
    groups: dict[frozenset[str], set[str]] = defaultdict(set)
    for path in method_marks.test_files(tests):
        mod = method_marks.ModuleUses(path, METHODS)
        for marks in mod.marks().values():
            if not marks & {"slow", "integration"}:
                groups[frozenset(marks & set(METHODS))].add(path.name)
    return {g: sorted(files) for g, files in groups.items()}


def selection(group: frozenset[str]) -> str:
    """The ``-m`` expression of the fast tests marked with exactly ``group``."""
    return " and ".join([FAST, *sorted(group), *(f"not {m}" for m in METHODS
                                                 if m not in group)])


def run_group(tree: Path, dest: Path, group: frozenset[str], files: list[str],
              workers: int) -> tuple[int, str]:
    """Run the ``group``'s fast tests in a copy holding exactly its methods: (failed, log)."""
    copy = without(tree, dest, set(METHODS) - group)
    # (langsmith's pytest plugin alone takes 0.7 s to load; nothing here uses it)
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:langsmith_plugin",
            "-m", selection(group), *(["-n", str(workers)] if workers > 1 else []),
            *(f"tests/{f}" for f in files), f"tests/{PROBE}"]
    res = run_in(copy, *args, timeout=1500)
    out = res.stdout + res.stderr
    failed = sum(int(n) for n in re.findall(r"(\d+) (?:failed|errors?)\b", out.splitlines()[-1]
                                            if out.strip() else ""))
    if res.returncode != 0 and failed == 0:
        failed = 1  # it did not run: a collection error, a crash
    return failed, out


def _workers() -> int:
    """pytest-xdist workers for the big run: the CPUs, at most 2 (make test's machine)."""
    try:
        import xdist  # noqa: F401  # optional: runs the core group on two workers
    except ImportError:
        return 1
    return max(1, min(2, os.cpu_count() or 1))


def test_each_test_passes_with_exactly_the_methods_it_is_marked_with(
        tree: Path, tmp_path: Path) -> None:
    groups = fast_groups()
    assert frozenset() in groups and len(groups) > 5  # the core tests, and the methods'
    results: dict[frozenset[str], tuple[int, str]] = {}
    core = groups.pop(frozenset())
    with ThreadPoolExecutor(max_workers=2) as pool:
        # The core tests (most of the suite) on the workers; the methods' groups beside it.
        jobs = {frozenset(): pool.submit(run_group, tree, tmp_path / "none", frozenset(), core,
                                         _workers())}
        for i, (group, files) in enumerate(sorted(groups.items(), key=lambda g: sorted(g[0]))):
            jobs[group] = pool.submit(run_group, tree, tmp_path / f"g{i}", group, files, 1)
        results = {g: job.result() for g, job in jobs.items()}
    failed = {"+".join(sorted(g)) or "(no method)": n for g, (n, _) in results.items() if n}
    logs = "\n\n".join(f"== tree with {'+'.join(sorted(g)) or 'no method'}:\n{out[-3000:]}"
                       for g, (n, out) in results.items() if n)
    assert failed == {}, f"failures by the methods the tree held: {failed}\n{logs}"


# --- the check can fail ----------------------------------------------------------------------

def test_the_removal_check_can_fail(tree: Path, tmp_path: Path) -> None:
    """A copy that still lists the removed package fails ``whetstone methods``; a core file
    that imports a removed package fails the command line and the core tests."""
    # names, not uses: march, horizon
    listed = without(tree, tmp_path / "listed", {"march"}, keep_lines=True)
    with pytest.raises(AssertionError):
        check_cli(listed, "march", tmp_path)
    coupled = tmp_path / "coupled-src"
    shutil.copytree(tree, coupled, symlinks=True)
    types = coupled / "engine" / "types.py"
    types.write_text(types.read_text(encoding="utf-8")
                     + "\nfrom .methods.horizon import METHOD  # noqa\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="horizon"):
        check_cli(without(coupled, tmp_path / "coupled", {"horizon"}), "horizon", tmp_path)
    failed, out = run_group(coupled, tmp_path / "coupled-core", frozenset(),
                            ["test_types.py"], 1)
    assert failed, out
