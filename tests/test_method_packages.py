"""A method is one package that declares what it owns (``MethodSpec``): its evolver, its
runtime plugin, its library folders with their validators, and its commands. A third-party
method arrives through one entry point and touches no core file; core code names no method.
(docs/architecture.md, "Adding a method")."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.commands.kit import Kit
from whetstone.engine.errors import ConfigError, ValidationError, WhetstoneError
from whetstone.engine.methods.registry import (
    BUILTIN_METHODS,
    LibraryRoot,
    MethodRegistry,
    MethodSpec,
    default_registry,
    load_spec,
)

REPO = Path(__file__).resolve().parent.parent
PLUGIN = Path(__file__).parent / "fixtures" / "method_plugin"


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The glossary method installed: its folder (with a dist-info and entry point) on
    sys.path, as pip would leave it."""
    monkeypatch.syspath_prepend(str(PLUGIN))


def test_every_built_in_method_is_a_package_with_a_spec() -> None:
    for package in BUILTIN_METHODS:
        spec = load_spec(package)
        assert (REPO / package.removeprefix("whetstone.").replace(".", "/") / "__init__.py"
                ).exists()
        assert spec.evolver or spec.runtime
        for target in (spec.evolver, spec.runtime):
            if target:  # each class sits in the method's own package
                assert target.startswith(package + "."), target
    roots = default_registry().roots()
    assert set(roots) == {"policies", "memory", "workflows"}  # the built-ins' besides skills/


def test_each_method_keeps_its_prompts_in_its_package() -> None:
    """A method's prompts live in its package's ``prompts/`` folder and its spec declares
    them; the core's folder holds none named after a method."""
    from whetstone.engine.prompts import Prompts

    for spec in default_registry().specs():
        package = next(p for p in BUILTIN_METHODS if load_spec(p) is spec)
        folder = REPO / package.removeprefix("whetstone.").replace(".", "/") / "prompts"
        if not folder.is_dir():
            assert spec.prompts is None, f"{spec.name} declares prompts it does not have"
            continue
        assert spec.prompts == Prompts(package), spec.name
        assert spec.prompts.names() == sorted(p.name for p in folder.iterdir())
        for name in spec.prompts.names():  # each one loads
            assert spec.prompts.load(name)
    core = [p.name for p in (REPO / "engine" / "prompts").iterdir()]
    for spec in default_registry().specs():
        assert not [n for n in core if n.split(".")[0] == spec.name
                    or n.startswith(spec.name + "_")], spec.name


def test_an_installed_method_adds_its_folder_command_evolver_and_plugin(
        installed: None, tmp_path: Path) -> None:
    registry = default_registry()
    assert "glossary" in registry.names("evolver") and "glossary" in registry.names("runtime")
    lib_path = tmp_path / "lib"
    runner = CliRunner()
    # its command, mounted from the registry
    res = runner.invoke(cli, ["glossary", "add", "units", "the unit of each quantity",
                              "--library", str(lib_path)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["library", "ls", "--json", "--library", str(lib_path)])
    assert json.loads(res.output)["glossary"] == ["glossary/terms.md"]
    res = runner.invoke(cli, ["methods", "--json"])
    rows = {(r["name"], r["kind"]): r for r in json.loads(res.output)}
    assert rows[("glossary", "runtime")]["folders"] == ["glossary"]
    assert rows[("glossary", "evolver")]["commands"] == ["glossary"]
    assert rows[("glossary", "runtime")]["prompts"] == ["guidance.md"]  # from its own folder
    res = runner.invoke(cli, ["evolve", "glossary", "--help"])
    assert res.exit_code == 0 and "min-score" in res.output
    # its folder is checked by its own validator on every commit
    lib = registry.open_library(lib_path)
    with pytest.raises(ValidationError, match="term :: meaning"):
        lib.commit({"glossary/terms.md": "no separator here\n"}, method="hand")
    # its runtime plugin shows the folder's contents to the model
    backend = ScriptedBackend(["The answer is 4."])
    with Engine(backend, library=lib_path, methods=["glossary"], checkpointing=False) as e:
        trace = e.run("What is 2 + 2?")
    system = backend.requests[0].messages[0].text
    assert "Terms this task may use (term :: meaning):\nunits :: the unit of" in system
    assert trace.meta["methods"][-1]["name"] == "glossary"
    # and its evolver proposes a change to its own folder
    evolver = registry.evolver("glossary")
    patch = evolver.fit([trace.__class__.from_dict({**trace.to_dict(), "score": 0.0})],
                        lib.snapshot(), backend)
    assert "what :: a word a failed task began with" in patch.changes["glossary/terms.md"]


def test_one_registry_line_adds_a_method_and_two_owners_of_a_folder_are_refused(
        installed: None) -> None:
    spec = load_spec("whetstone_glossary")
    registry = MethodRegistry(specs=(spec,))  # the one line a built-in method adds
    assert registry.names("evolver") == ["glossary"]
    assert [c.name for c in registry.commands(Kit())] == ["glossary"]
    registry.add(MethodSpec("other", roots=(LibraryRoot("glossary", "also mine"),)))
    with pytest.raises(ConfigError, match="claimed by both glossary and other"):
        registry.roots()


# --- core names no method ---------------------------------------------------------------

CORE = ["library_store", "skills", "tools", "engine/runtime", "engine/evaluation", "engine/evolution",
        "engine/server", "engine/commands", "engine/integrations", "engine/backends",
        "engine/api.py", "engine/types.py", "engine/errors.py", "engine/paths.py",
        "engine/replies.py", "engine/answer_text.py", "cli.py", "whetstone/__init__.py"]
# Couplings still in core, each named here so that a new one fails the test and a fixed one
# must be taken off the list. (file, method name)
KNOWN = {
    # "horizon" is also the runtime's word for the step limit a run can stop at (the outcome
    # "horizon"), older than the Elastic Horizon method and not a reference to it
    ("engine/types.py", "horizon"),
    ("engine/runtime/nodes.py", "horizon"),
    # and "memory" the sandbox's limit (the cgroup controller, what a killed tool exceeded)
    ("tools/limits.py", "memory"),
    ("tools/sandbox.py", "memory"),
}


def _references(path: Path, names: list[str]) -> set[str]:
    """The methods ``path``'s code refers to: an import of a method's package, or the
    method's name as a whole string constant or an identifier. Docstrings, comments and
    words inside longer strings do not count ("memory" is also a sandbox limit)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        for module in modules:
            m = re.match(r"whetstone\.engine\.methods\.([a-z0-9_]+)", module)
            if m and m.group(1) in names:
                found.add(m.group(1))
        if isinstance(node, ast.Constant) and node.value in names:
            found.add(node.value)
        if isinstance(node, ast.Name) and node.id in names:
            found.add(node.id)
    return found


def _core_files() -> list[Path]:
    files: list[Path] = []
    for entry in CORE:
        p = REPO / entry
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return files


def test_core_code_names_no_method() -> None:
    names = [spec.name for spec in default_registry().specs()]
    found = {(str(path.relative_to(REPO)), name) for path in _core_files()
             for name in _references(path, names)}
    assert found == KNOWN


# Words that are also plain English in core's prose ("memory" limits, the step "horizon"),
# and a keyword argument of torch's own (torch.onnx.export's dynamo=).
GENERIC_WORDS = {"memory", "horizon"}
KNOWN_PROSE = {("library_store/embeddings.py", "dynamo")}


def test_a_grep_of_core_finds_no_method_name_even_in_prose() -> None:
    """What the issue asked: ``grep -rwi NAME`` over core finds nothing, comments and
    docstrings included (each method is written as its name, or with - or a space)."""
    names = [spec.name for spec in default_registry().specs() if spec.name not in GENERIC_WORDS]
    found = set()
    for path in _core_files():
        text = path.read_text(encoding="utf-8")
        for name in names:
            spelled = "[-_ ]".join(re.escape(part) for part in name.split("_"))
            if re.search(rf"(?<![\w-]){spelled}(?![\w-])", text, re.IGNORECASE):
                found.add((str(path.relative_to(REPO)), name))
    assert found == KNOWN_PROSE


def test_the_reference_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('"""Mentions memory and march in prose."""\n'
                   "from whetstone.engine.methods.dynamo.evolver import Dynamo\n"
                   'x = {"nlpg": 1, "sandbox memory": 2}\n')
    assert _references(bad, ["dynamo", "nlpg", "memory", "march"]) == {"dynamo", "nlpg"}


def test_the_public_open_library_shows_every_methods_folder_and_checks_commits(
        tmp_path: Path) -> None:
    """``whetstone.open_library`` opens a library as ``Engine`` and the CLI do; a bare
    ``Library.open`` writes only ``skills/`` (the other folders stay in every version)."""
    import whetstone
    from whetstone.library_store.store import Library

    lib = whetstone.open_library(tmp_path / "lib", create=True)
    lib.commit({"policies/think.md": "[n1] route=* helpful=0 harmful=0 :: Check units.\n"},
               method="hand")
    with pytest.raises(ValidationError):
        lib.commit({"policies/think.md": "not a note line\n"}, method="hand")
    assert (tmp_path / "lib" / "policies" / "think.md").is_file()  # in the view too
    bare = Library.open(tmp_path / "lib")
    with pytest.raises(WhetstoneError, match="skills/"):
        bare.commit({"policies/think.md": "anything\n"}, method="hand")
    bare.commit({"skills/a/SKILL.md": "---\nname: a\ndescription: d\n---\nbody\n"},
                method="hand")
    assert "policies/think.md" in whetstone.open_library(tmp_path / "lib").snapshot().files()
