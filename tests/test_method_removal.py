"""A method is removable (issue 38): for each built-in method, a copy of the tree without its
package, its ``BUILTIN_METHODS`` line and its own tests still answers ``whetstone --help``,
``whetstone methods`` and ``whetstone run`` on the ``scripted:`` backend, and passes a set of
core tests. Every command runs in the copy (its folder first on ``sys.path``, checked: the
venv's editable install points at this checkout), so a core file that still needs the method
fails here."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from whetstone.engine.methods.registry import BUILTIN_METHODS

REPO = Path(__file__).resolve().parent.parent
REGISTRY = "engine/methods/registry.py"

# Each built-in method's own tests: the files named after it and every test file that imports
# its package (a file that needs two methods goes with both). The copy leaves them out.
OWN_TESTS: dict[str, tuple[str, ...]] = {
    "trace2skill": ("test_trace2skill.py", "test_evolve.py", "test_methods.py",
                    "test_skill_edits.py", "test_embedded_agent.py", "test_adaptation.py"),
    "dynamo": ("test_dynamo.py", "test_dynamo_maker.py", "test_eval_dead_model.py",
               "test_library_state.py"),
    "nlpg": ("test_nlpg.py", "test_nlpg_evolve.py", "nlpg_support.py",
             "test_eval_dead_model.py", "test_library_state.py"),
    "co_react": ("test_co_react.py", "test_analyst_ask.py"),
    "horizon": ("test_horizon.py", "test_eval_dead_model.py"),
    "march": ("test_march.py", "test_prompts.py"),
    "memory": ("test_adaptation.py", "test_demo_turns.py", "test_langchain.py"),
    "self_consistency": ("test_adaptation.py",),
    "latent": ("test_latent_method.py", "test_latent_tts.py"),
    "workflows": ("test_workflows.py", "test_docs_workflows.py"),
}
# The core tests each copy runs: the import rules over every file (a removed package must
# leave no import behind), the records, reply parsing, the agent loop and the trace store;
# seconds each, so the nine copies cost about a minute together.
CORE_TESTS = ("test_layers.py", "test_types.py", "test_parse.py", "test_agent_loop.py",
              "test_trace_store.py")
# test_layers' checks of one file at a time (heavy imports, sizes, the benchmarks) pass in the
# whole tree, and deleting files cannot make them fail: the copies skip them (~1.5 s each).
PER_FILE_CHECKS = "not heavy_libraries and not benchmarks and not god_file and not long_functions"
PROBE = "test_removal_probe.py"  # written into each copy: what the copy's pytest imported


def _method(package: str) -> str:
    return package.rsplit(".", 1)[1]


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


def without(tree: Path, dest: Path, method: str, *, keep_line: bool = False) -> Path:
    """A copy of ``tree`` at ``dest`` without ``method``'s package, its own tests and (unless
    ``keep_line``) its line in ``BUILTIN_METHODS``."""
    shutil.copytree(tree, dest, symlinks=True)
    shutil.rmtree(dest / "engine" / "methods" / method)
    for name in OWN_TESTS[method]:
        (dest / "tests" / name).unlink(missing_ok=True)
    if not keep_line:
        registry = dest / REGISTRY
        line = f'    "whetstone.engine.methods.{method}",\n'
        text = registry.read_text(encoding="utf-8")
        assert text.count(line) == 1, f"{method}'s BUILTIN_METHODS line is not one line"
        registry.write_text(text.replace(line, ""), encoding="utf-8")
    probe = (
        "import importlib.util\nfrom pathlib import Path\n\nimport whetstone\n"
        "from whetstone.engine.methods.registry import BUILTIN_METHODS, default_registry\n\n\n"
        "def test_this_is_the_copy_without_the_method() -> None:\n"
        f"    root = Path({str(dest)!r})\n"
        "    assert Path(whetstone.__file__).parent == root / 'whetstone'\n"
        f"    assert importlib.util.find_spec('whetstone.engine.methods.{method}') is None\n"
        f"    assert not [p for p in BUILTIN_METHODS if p.endswith('.{method}')]\n"
        f"    assert {method!r} not in [s.name for s in default_registry().specs()]\n")
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
    others = {_method(p) for p in BUILTIN_METHODS} - {method}
    assert method not in names and others <= names, names
    script = tmp / "replies.json"
    script.write_text(json.dumps({"replies": ["Thought: multiply\nAction: calculator[17*23]",
                                              "Final Answer: 391"]}))
    res = run_in(copy, "-m", "whetstone", "run", "What is 17 * 23?", "--model",
                 f"scripted:{script}", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    trace = json.loads(res.stdout)
    assert trace["answer"] == "391" and trace["outcome"] == "answered"


def check_core_tests(copy: Path) -> None:
    tests = [f"tests/{name}" for name in (*CORE_TESTS, PROBE)]
    # (langsmith's pytest plugin alone takes 0.7 s to load; nothing here uses it)
    res = run_in(copy, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p",
                 "no:langsmith_plugin", "-k", PER_FILE_CHECKS, *tests, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "failed" not in res.stdout


def test_the_mapping_names_every_method_and_each_test_of_it() -> None:
    """Every built-in method has its own tests listed, each listed file exists, no core test
    is among them, and every test file that imports a method's package is listed for it."""
    assert set(OWN_TESTS) == {_method(p) for p in BUILTIN_METHODS}
    for method, names in OWN_TESTS.items():
        for name in names:
            assert (REPO / "tests" / name).is_file(), f"{method}: tests/{name} is gone"
        assert not set(names) & set(CORE_TESTS), method
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                       else [])
            for module in modules:
                m = re.match(r"whetstone\.engine\.methods\.([a-z0-9_]+)", module)
                if m and m.group(1) in OWN_TESTS:
                    assert path.name in OWN_TESTS[m.group(1)], (path.name, m.group(1))


@pytest.mark.parametrize("method", [_method(p) for p in BUILTIN_METHODS])
def test_the_tree_without_a_method_works(tree: Path, tmp_path: Path, method: str) -> None:
    copy = without(tree, tmp_path / "copy", method)
    assert not (copy / "engine" / "methods" / method).exists()
    check_cli(copy, method, tmp_path)
    check_core_tests(copy)


def test_the_removal_check_can_fail(tree: Path, tmp_path: Path) -> None:
    """A copy that still lists the removed package fails ``whetstone methods``; a core file
    that imports a removed package fails the core tests and the command line."""
    listed = without(tree, tmp_path / "listed", "march", keep_line=True)
    with pytest.raises(AssertionError):
        check_cli(listed, "march", tmp_path)
    coupled = without(tree, tmp_path / "coupled", "horizon")
    types = coupled / "engine" / "types.py"
    types.write_text(types.read_text(encoding="utf-8")
                     + "\nfrom whetstone.engine.methods.horizon import METHOD  # noqa\n",
                     encoding="utf-8")
    with pytest.raises(AssertionError, match="horizon"):
        check_cli(coupled, "horizon", tmp_path)
    with pytest.raises(AssertionError):
        check_core_tests(coupled)
