"""A library's learned tools: admitted only through the AST check on every commit path (evolve,
import, validate), offered to the agent beside their skill, run in the sandbox with how they
ran recorded in the act step, and `whetstone tools ls | show | test`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ValidationError
from whetstone.engine.library.checks import validate_library
from whetstone.engine.runtime.library_tools import load_library_tools
from whetstone.library_store.store import Library

SKILL = textwrap.dedent("""\
    ---
    name: {name}
    description: Add up a list of amounts. Use when a word problem sums several prices.
    ---
    # Sum amounts
    Call `{tool}` with the amounts.
    """)
TOOL = textwrap.dedent('''\
    def {tool}(amounts: list[float]) -> float:
        """Add up amounts exactly.

        Args:
            amounts: the numbers to add.
        """
        return sum(amounts)
    ''')
BAD_TOOL = textwrap.dedent('''\
    import os

    def {tool}(cmd: str) -> str:
        """Run a command."""
        return str(os.system(cmd))
    ''')


def skill_files(name: str = "sum-amounts", tool: str = "sum_amounts",
                code: str = TOOL) -> dict[str, str]:
    return {f"skills/{name}/SKILL.md": SKILL.format(name=name, tool=tool),
            f"skills/{name}/scripts/{tool}.py": code.format(tool=tool)}


def test_a_commit_with_a_refused_tool_is_rejected_with_the_reason(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    with pytest.raises(ValidationError) as err:
        lib.commit(skill_files(code=BAD_TOOL), method="test", validate=validate_library)
    assert "imports 'os'" in err.value.detail and err.value.rule == "import"
    assert lib.current_id() == "v1"  # nothing landed
    v = lib.commit(skill_files(), method="test", validate=validate_library)
    assert [d.name for d in load_library_tools(lib.snapshot(v.id)).definitions] == \
        ["sum_amounts"]


def test_tool_names_may_not_clash_with_built_ins_or_other_skills(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    with pytest.raises(ValidationError, match="built in"):
        lib.commit(skill_files(tool="python"), method="test", validate=validate_library)
    lib.commit(skill_files(), method="test", validate=validate_library)
    with pytest.raises(ValidationError, match="in skill 'sum-amounts'"):
        lib.commit(skill_files(name="other"), method="test", validate=validate_library)


def test_a_helper_script_is_not_a_tool_and_is_not_checked(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    files = skill_files()
    files["skills/sum-amounts/scripts/setup.py"] = "import os\nos.system('true')\n"
    v = lib.commit(files, method="test", validate=validate_library)
    found = load_library_tools(lib.snapshot(v.id))
    assert [d.name for d in found.definitions] == ["sum_amounts"]
    assert any("setup.py" in s for s in found.loaded.skipped)


def test_import_skips_a_skill_whose_tool_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for name, tool, code in (("good-sum", "good_sum", TOOL), ("bad-sum", "bad_sum", BAD_TOOL)):
        (src / name / "scripts").mkdir(parents=True)
        (src / name / "SKILL.md").write_text(SKILL.format(name=name, tool=tool))
        (src / name / "scripts" / f"{tool}.py").write_text(code.format(tool=tool))
    lib = tmp_path / "lib"
    runner = CliRunner()
    assert runner.invoke(cli, ["library", "init", "--library", str(lib)]).exit_code == 0
    res = runner.invoke(cli, ["library", "import", str(src), "--library", str(lib), "--json"])
    assert res.exit_code == 11, res.output  # EXIT_PARTIAL: a version was committed
    report = json.loads(res.output)
    assert report["imported"] == ["good-sum"]
    assert report["skipped"][0]["path"].endswith("bad-sum/scripts/bad_sum.py")
    assert "imports 'os'" in report["skipped"][0]["detail"]


def test_library_validate_reports_a_refused_tool(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit(skill_files(code=BAD_TOOL), method="test")  # no validator: as if edited by hand
    res = CliRunner().invoke(cli, ["library", "validate", "--library", str(lib.root), "--json"])
    assert res.exit_code == 5
    problems = json.loads(res.output)["problems"]
    assert [(p["rule"], p["line"]) for p in problems] == [("import", 1)]
    assert problems[0]["path"] == "skills/sum-amounts/scripts/sum_amounts.py"


def test_the_agent_is_offered_the_library_tools_and_the_act_step_records_the_sandbox(
        tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit(skill_files(), method="test", validate=validate_library)
    backend = ScriptedBackend([
        'Action: sum_amounts[{"amounts": [1.5, 2.25, 3]}]',
        "Final Answer: 6.75",
    ])
    engine = Engine(backend, library=lib.root, checkpointing=False)
    trace = engine.run("Pens cost 1.5, 2.25 and 3. What is the total?")
    system = backend.requests[0].messages[0].text
    assert "- sum_amounts(amounts): Add up amounts exactly. (skill 'sum-amounts' says when" in system
    act = next(s for s in trace.steps if s.kind == "act")
    assert act.output["observation"] == "6.75" and act.error is None
    assert act.meta["tool"]["sandbox"]["isolation"] in ("bwrap", "process")
    assert trace.meta["skills"]["learned_tools"] == ["sum_amounts"]


def test_a_new_version_with_a_tool_reaches_an_agent_built_before_it(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    backend = ScriptedBackend(['Action: sum_amounts[{"amounts": [1, 2]}]', "Final Answer: 3"])
    engine = Engine(backend, library=lib.root, checkpointing=False)
    agent = engine.agent  # built on the empty library
    lib.commit(skill_files(), method="test", validate=validate_library)
    trace = agent.run("1 + 2?")
    act = next(s for s in trace.steps if s.kind == "act")
    assert act.output["observation"] == "3" and act.error is None


@pytest.mark.dynamo
def test_tools_cli_ls_show_and_test(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    files = skill_files()
    files["skills/sum-amounts/assets/dynamo.json"] = json.dumps({"round": 1})
    lib.commit(files, method="test", validate=validate_library)
    runner = CliRunner()
    base = ["--library", str(lib.root), "--json"]
    listed = json.loads(runner.invoke(cli, ["tools", "ls", *base]).output)
    kinds = {t["name"]: (t["kind"], t["skill"]) for t in listed["tools"]}
    assert kinds["sum_amounts"] == ("learned", "sum-amounts")
    assert kinds["python"] == ("builtin", None) and kinds["crop"][0] == "visual"
    shown = json.loads(runner.invoke(cli, ["tools", "show", "sum_amounts", *base]).output)
    assert "return sum(amounts)" in shown["source"] and shown["provenance"] == {"round": 1}
    res = runner.invoke(cli, ["tools", "test", "sum_amounts", '{"amounts": [2, 3.5]}', *base])
    ran = json.loads(res.output)
    assert res.exit_code == 0 and ran["output"] == "5.5"
    assert ran["metadata"]["sandbox"]["isolation"] in ("bwrap", "process")
    res = runner.invoke(cli, ["tools", "test", "calculator", "17*23", *base])
    assert json.loads(res.output)["output"] == "391"
    res = runner.invoke(cli, ["tools", "test", "sum_amounts", '{"amounts": "x"}', *base])
    assert res.exit_code == 1 and "amounts must be array" in json.loads(res.output)["error"]
    res = runner.invoke(cli, ["tools", "test", "nope", "1", "--library", str(lib.root)])
    assert res.exit_code == 6 and "sum_amounts" in res.output
