"""``whetstone library ...`` and ``whetstone skill new`` through click's test runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from whetstone.engine.commands.library import library_group, skill_group
from whetstone.engine.errors import EXIT_PARTIAL
from whetstone.library_store.store import Library

FIXTURES = Path(__file__).parent / "fixtures" / "skills"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def lib_cmd(runner: CliRunner, *args: str) -> Result:
    return runner.invoke(library_group, list(args), catch_exceptions=False)


def as_json(result: Result) -> object:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_commands_need_an_initialised_library(runner: CliRunner) -> None:
    res = lib_cmd(runner, "ls")
    assert res.exit_code == 5
    assert "no library at" in res.stderr and "library init" in res.stderr


def test_init_defaults_to_whetstone_home(runner: CliRunner, whetstone_home: Path) -> None:
    out = as_json(lib_cmd(runner, "init", "--json"))
    assert out == {"library": str(whetstone_home / "library"), "version": "v1", "created": True}
    assert as_json(lib_cmd(runner, "init", "--json"))["created"] is False
    res = lib_cmd(runner, "init")
    assert "already exists" in res.stdout


def test_import_ls_show_log_diff_validate(runner: CliRunner, tmp_path: Path) -> None:
    lib = str(tmp_path / "lib")
    lib_cmd(runner, "init", "--library", lib)
    out = as_json(lib_cmd(runner, "import", str(FIXTURES / "library"), "--library", lib,
                          "--json"))
    assert out["version"] == "v2" and len(out["imported"]) == 34
    listing = as_json(lib_cmd(runner, "ls", "--library", lib, "--json"))
    assert len(listing["skills"]) == 34 and listing["problems"] == []
    assert "csv-cleanup" in lib_cmd(runner, "ls", "--library", lib).stdout
    shown = lib_cmd(runner, "show", "bash-scripting", "--library", lib)
    assert shown.stdout == (FIXTURES / "library" / "bash-scripting" / "SKILL.md").read_text()
    script = lib_cmd(runner, "show", "bash-scripting", "--file", "scripts/rename_ext.sh",
                     "--library", lib)
    assert script.stdout.startswith("#!/usr/bin/env bash")
    version = as_json(lib_cmd(runner, "show", "v2", "--library", lib, "--json"))
    assert version["method"] == "import" and version["changes"][
        "skills/csv-cleanup/SKILL.md"] == "added"
    log = as_json(lib_cmd(runner, "log", "--library", lib, "--json"))
    assert [v["id"] for v in log] == ["v2", "v1"]
    assert "v2" in lib_cmd(runner, "log", "--library", lib).stdout
    diff = lib_cmd(runner, "diff", "v1", "v2", "--library", lib).stdout
    assert "+++ b/skills/csv-cleanup/SKILL.md (v2)" in diff
    valid = as_json(lib_cmd(runner, "validate", "--library", lib, "--json"))
    assert valid == {"version": "v2", "ok": True, "problems": [], "integrity": [],
                     "hand_edits": [], "hand_edit_problems": []}


def test_import_of_malformed_skills_reports_file_line_rule_and_exits_partial(
        runner: CliRunner, tmp_path: Path) -> None:
    lib = str(tmp_path / "lib")
    lib_cmd(runner, "init", "--library", lib)
    res = lib_cmd(runner, "import", str(FIXTURES / "malformed"), "--library", lib)
    assert res.exit_code == EXIT_PARTIAL == 11  # a version was committed, minus the skipped
    assert "imported 2 skill(s)" in res.stdout
    assert "wrong-folder/SKILL.md:2: [name-folder]" in res.stdout
    assert "long-body/SKILL.md:506: [body-length]" in res.stdout
    again = lib_cmd(runner, "import", str(FIXTURES / "malformed"), "--library", lib, "--json")
    assert again.exit_code == 5  # nothing committed: the skipped skills are all that is new
    data = json.loads(again.stdout)
    assert data["version"] is None and sorted(data["unchanged"]) == ["good-one", "good-two"]
    assert {p["rule"] for p in data["skipped"]} == {
        "yaml", "name-missing", "name-folder", "description-length", "body-length"}


def test_validate_fails_on_a_broken_library(runner: CliRunner, tmp_path: Path) -> None:
    lib = Library.init(tmp_path / "lib")
    lib.commit({"skills/a/SKILL.md": "---\nname: b\ndescription: d\n---\n"}, method="raw")
    res = lib_cmd(runner, "validate", "--library", str(lib.root))
    assert res.exit_code == 5 and "skills/a/SKILL.md:2: [name-folder]" in res.stdout


def test_skill_new_rollback_status_commit_export(runner: CliRunner, tmp_path: Path) -> None:
    lib = str(tmp_path / "lib")
    lib_cmd(runner, "init", "--library", lib)
    res = runner.invoke(skill_group, ["new", "table-tricks", "--library", lib, "--json"])
    created = as_json(res)  # a draft in the view: no version yet
    assert created["version"] == "v1" and created["draft"] and Path(created["path"]).exists()
    again = runner.invoke(skill_group, ["new", "table-tricks", "--library", lib])
    assert again.exit_code == 5 and "already exists" in again.stderr
    bad = runner.invoke(skill_group, ["new", "Bad_Name", "--library", lib])
    assert bad.exit_code == 5 and "'Bad_Name' may hold only a-z" in bad.stderr
    path = Path(created["path"])
    status = as_json(lib_cmd(runner, "status", "--library", lib, "--json"))
    assert status["added"] == ["skills/table-tricks/SKILL.md"]
    assert as_json(lib_cmd(runner, "commit", "-m", "add table-tricks", "--library", lib,
                           "--json"))["version"] == "v2"
    path.write_text(path.read_text() + "\nA hand-written tip.\n")
    status = as_json(lib_cmd(runner, "status", "--library", lib, "--json"))
    assert status["modified"] == ["skills/table-tricks/SKILL.md"]
    assert as_json(lib_cmd(runner, "commit", "-m", "tip", "--library", lib, "--json"))[
        "version"] == "v3"
    rolled = as_json(lib_cmd(runner, "rollback", "v1", "--library", lib, "--json"))
    assert (rolled["version"], rolled["parent"], rolled["rolled_back_to"]) == ("v4", "v3", "v1")
    assert rolled["gated"] is False  # no --gate-tasks: it went live unmeasured
    assert not path.exists()
    lib_cmd(runner, "rollback", "v3", "--library", lib)
    out = as_json(lib_cmd(runner, "export", str(tmp_path / "x.tar.gz"), "--library", lib,
                          "--json"))
    assert out["skills"] == 1 and out["problems"] == [] and Path(out["path"]).exists()
    dup = lib_cmd(runner, "export", str(tmp_path / "x.tar.gz"), "--library", lib)
    assert dup.exit_code == 2 and "--force" in dup.stderr


def test_show_names_the_known_skills(runner: CliRunner, tmp_path: Path) -> None:
    lib = str(tmp_path / "lib")
    lib_cmd(runner, "init", "--library", lib)
    lib_cmd(runner, "import", str(FIXTURES / "library"), "--library", lib)
    res = lib_cmd(runner, "show", "csv-clean", "--library", lib)
    assert res.exit_code == 6 and "csv-cleanup" in res.stderr
    res = lib_cmd(runner, "diff", "v1", "v9", "--library", lib)
    assert res.exit_code == 6 and "library log" in res.stderr


def test_candidates_commands(runner: CliRunner, tmp_path: Path) -> None:
    lib = Library.init(tmp_path / "lib")
    lib.commit({"skills/a/SKILL.md": "---\nname: a\ndescription: d\n---\n"}, method="m")
    lib.candidates.save("c1", {"skills/a/SKILL.md": "---\nname: a\ndescription: better\n---\n"},
                        method="trace2skill", scores={"candidate": 0.4, "current": 0.5},
                        message="gate said no")
    root = str(lib.root)
    listed = as_json(lib_cmd(runner, "candidates", "ls", "--library", root, "--json"))
    assert [c["name"] for c in listed] == ["c1"]
    shown = lib_cmd(runner, "candidates", "show", "c1", "--library", root)
    assert "+description: better" in shown.stdout and "candidate" in shown.stdout
    applied = as_json(lib_cmd(runner, "candidates", "apply", "c1", "--library", root, "--json"))
    assert applied["version"] == "v3"
    missing = lib_cmd(runner, "candidates", "drop", "c1", "--library", root)
    assert missing.exit_code == 6


def test_reindex_rebuilds_the_index(runner: CliRunner, tmp_path: Path) -> None:
    lib = Library.init(tmp_path / "lib")
    lib.commit({"skills/a/SKILL.md": "---\nname: a\ndescription: Parse dates.\n---\n"},
               method="m")
    out = as_json(lib_cmd(runner, "reindex", "--library", str(lib.root), "--json"))
    assert out["version"] == "v2" and out["documents"] == {"skill": 1}
    assert (lib.root / "index" / "state.json").exists()
