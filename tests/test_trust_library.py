"""Issue 37, items 3, 4 and the import bullet of 9: nothing a user typed by mistake is
silently accepted, and a scaffold is not live until it is committed.

On the code before (1468746) each test failed: a mistyped ``--library`` (the CLI, ``Engine``,
``WhetstoneChatModel``, the MCP server) made a new empty library and served it, ``skill new``
committed the unedited template (served at once), and ``library import`` of a folder with a bad
name reported only that, naming the folder and not the skill its SKILL.md declares.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.errors import LibraryError
from whetstone.library_store.store import Library
from whetstone.skills.transfer import import_skills

# --- 3. a mistyped --library is an error, never a new empty library -------------------------

@pytest.mark.parametrize("args", [
    ["mcp", "--library", "LIB"],
    ["run", "hello", "--model", "scripted:REPLIES", "--library", "LIB"],
    ["tools", "ls", "--library", "LIB"],
    ["traces", "ls", "--library", "LIB"],
    ["corpus", "ls", "--library", "LIB"],
    ["eval", "--tasks", "TASKS", "--model", "scripted:REPLIES", "--library", "LIB", "-j", "1"],
])
def test_a_mistyped_library_is_refused_by_every_command(tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "nolib"
    replies = tmp_path / "r.json"
    replies.write_text(json.dumps(["Final answer: 2"]))
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"id": "t", "question": "1+1?", "expected": "2"}) + "\n")
    swap = {"LIB": str(missing), "scripted:REPLIES": f"scripted:{replies}", "TASKS": str(tasks)}
    res = CliRunner().invoke(cli, [swap.get(a, a) for a in args])
    assert res.exit_code == LibraryError.exit_code, res.output
    assert f"no library at {missing}" in res.output
    assert f"whetstone library init --library {missing}" in res.output
    assert not missing.exists()  # nothing was made


def test_the_python_faces_refuse_a_missing_library_unless_told_to_create(
        tmp_path: Path, whetstone_home: Path) -> None:
    from whetstone.engine.api import Engine
    from whetstone.engine.backends.scripted import ScriptedBackend
    from whetstone.engine.integrations.mcp_server import LibraryServer

    missing = tmp_path / "lib2"
    with pytest.raises(LibraryError, match="no library at") as exc:
        Engine(ScriptedBackend(["x"]), library=missing)
    assert "create=True" in (exc.value.hint or "")
    with pytest.raises(LibraryError, match="no library at"):
        LibraryServer.open(missing)
    pytest.importorskip("langchain_core")
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from whetstone.engine.integrations.langchain import WhetstoneChatModel

    with pytest.raises(LibraryError, match="no library at"):
        WhetstoneChatModel(inner=FakeListChatModel(responses=["x"]), library=str(missing))
    assert not missing.exists()
    # "~" is the home folder, not a folder named "~" here.
    home_lib = Path("~/whetstone-test-no-such-lib").expanduser()
    with pytest.raises(LibraryError, match=str(home_lib)):
        Engine(ScriptedBackend(["x"]), library="~/whetstone-test-no-such-lib")
    assert not Path("~").exists() and not home_lib.exists()
    # create=True makes it; the default library is made on first use.
    made = Engine(ScriptedBackend(["x"]), library=missing, create=True)
    assert made.library.current_id() == "v1"
    made.close()
    first = Engine(ScriptedBackend(["x"]))
    assert first.library_path == whetstone_home / "library" and first.library.is_initialized()
    first.close()


# --- 4. a new skill is a draft until it is committed ------------------------------------------

def test_skill_new_is_a_draft_that_nothing_serves_until_committed(tmp_path: Path) -> None:
    from whetstone.engine.integrations.mcp_server import LibraryServer

    lib = tmp_path / "lib"
    assert CliRunner().invoke(cli, ["library", "init", "--library", str(lib)]).exit_code == 0
    res = CliRunner().invoke(cli, ["skill", "new", "unit-conversion", "--library", str(lib)])
    assert res.exit_code == 0, res.output
    assert "not live" in res.output and "whetstone library commit" in res.output
    draft = lib / "skills" / "unit-conversion" / "SKILL.md"
    assert draft.is_file()
    opened = Library.open(lib)
    assert opened.current_id() == "v1" and not opened.snapshot().unit("skills/unit-conversion")
    server = LibraryServer.open(lib)
    try:
        said = " ".join(t for _, t in server.guidance("convert 3 miles to km").messages)
        assert "First step" not in said
        assert not any("unit-conversion" in f.uri for f in server.files())
    finally:
        server.close()
    draft.write_text(draft.read_text().replace("First step.", "Multiply miles by 1.609."))
    res = CliRunner().invoke(cli, ["library", "commit", "-m", "add unit-conversion",
                                   "--library", str(lib)])
    assert res.exit_code == 0, res.output
    assert "Multiply miles" in Library.open(lib).snapshot().read_text(
        "skills/unit-conversion/SKILL.md")


# --- 9. import names the skill and reports every problem --------------------------------------

def test_import_of_a_badly_named_folder_names_the_skill_and_every_problem(
        tmp_path: Path) -> None:
    folder = tmp_path / "src" / "Unit Conv"
    (folder / "notes").mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: unit-conversion\n---\n\n# Units\n\nDo it.\n")
    (folder / "notes" / "deep.md").write_text("x\n")
    report = import_skills(Library.init(tmp_path / "lib"), tmp_path / "src")
    rules = [e.rule for e in report.skipped]
    assert "name-format" in rules  # the folder's name ...
    assert "description-missing" in rules and "layout" in rules  # ... and the rest, all of it
    (named,) = [e for e in report.skipped if e.rule == "name-format"]
    assert "the folder name 'Unit Conv'" in named.detail
    assert "'unit-conversion'" in named.detail and named.hint == "rename the folder to " \
                                                                 "unit-conversion"
