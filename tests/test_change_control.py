"""Change control for every write (issue 45, item 1), through the command line as a newcomer
would use it: a hand-written skill committed with --gate-tasks that hurts is refused and kept
as a candidate; without gate tasks it is committed, the command says it went live unmeasured
and `library log` marks it ungated; imports, rollbacks and candidates are gated the same way;
`require_gate` makes every ungated write refuse with the command to run; `serve --gated-only`
serves the newest gated version and /health says how it was gated. The gate's model is
`scripted:` (its replies, in order: the current version's runs, then the candidate's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from servers import free_port

from whetstone.cli import cli
from whetstone.library_store.store import Library

HURTFUL = """---
name: arithmetic-tips
description: Tips for multiplying two numbers in a word problem.
---

# Arithmetic tips

Multiply the tens first, then add the units twice to be safe.
"""
N = 6  # held-out gate tasks: six that flip are a clear result (McNemar p = 0.03)


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def held_out(tmp_path: Path) -> Path:
    path = tmp_path / "held.jsonl"
    path.write_text("".join(json.dumps({"id": f"m{i}", "question": f"What is {i} * 23?",
                                        "expected": str(23 * i), "scorer": "numeric"}) + "\n"
                            for i in range(11, 11 + N)))
    return path


def gate_args(tmp_path: Path, current_right: bool, candidate_right: bool) -> list[str]:
    """--gate-tasks and a scripted model whose gate runs are right or wrong as asked."""
    def answers(right: bool) -> list[str]:
        return [f"Final Answer: {23 * i + (0 if right else 20)}" for i in range(11, 11 + N)]

    replies = tmp_path / "gate-model.json"
    replies.write_text(json.dumps(answers(current_right) + answers(candidate_right)))
    return ["--gate-tasks", str(held_out(tmp_path)), "--model", f"scripted:{replies}",
            "-j", "1", "--tools", ""]


def draft_skill(lib: Path, name: str = "arithmetic-tips", text: str = HURTFUL) -> None:
    res = invoke("skill", "new", name, "--library", str(lib))
    assert res.exit_code == 0, res.output
    (lib / "skills" / name / "SKILL.md").write_text(text)


def log(lib: Path) -> list[dict[str, Any]]:
    res = invoke("library", "log", "--library", str(lib), "--json")
    assert res.exit_code == 0, res.output
    return list(json.loads(res.stdout))


def test_a_hand_skill_that_hurts_is_refused_with_the_gate_and_marked_ungated_without(
        tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    assert invoke("library", "init", "--library", str(lib)).exit_code == 0
    draft_skill(lib)
    # With --gate-tasks: the candidate answers worse on every held-out task.
    res = invoke("library", "commit", "-m", "add arithmetic tips", "--library", str(lib),
                 *gate_args(tmp_path, current_right=True, candidate_right=False))
    assert res.exit_code == 12, res.output  # EXIT_GATE_REFUSED
    head = res.stdout.splitlines()[0]
    assert head.startswith("gate rejected (cost_aware)") and "a clear loss" in head
    assert "not applied: kept as candidate edit-" in res.stdout
    library = Library.open(lib)
    assert library.current_id() == "v1"  # nothing went live
    (cand,) = library.candidates.list()
    assert cand.method == "edit" and "skills/arithmetic-tips/SKILL.md" in cand.changes
    assert cand.scores["gate"]["verdict"] == "loss"
    # Without gate tasks: a person chose it, so it is committed, and says it went unmeasured.
    res = invoke("library", "commit", "-m", "add arithmetic tips", "--library", str(lib))
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "committed hand edits as version v2" in text
    assert "v2 went live unmeasured: no gate ran (no --gate-tasks)" in text
    newest = log(lib)[0]
    assert newest["id"] == "v2" and newest["gate"]["gated"] is False
    assert newest["gate"]["by"] == "library commit" and newest["scores"]["ungated"]
    table = invoke("library", "log", "--library", str(lib))
    rows = {line.split()[1]: line for line in table.stdout.splitlines()
            if line.startswith("│ v")}
    assert "UNGATED (library commit)" in rows["v2"] and "the empty start" in rows["v1"]


def test_a_commit_that_helps_passes_and_the_log_says_how_it_was_gated(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    Library.init(lib)
    draft_skill(lib, "times-table", HURTFUL.replace("arithmetic-tips", "times-table"))
    res = invoke("library", "commit", "-m", "add times table", "--library", str(lib), "--json",
                 *gate_args(tmp_path, current_right=False, candidate_right=True))
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["version"] == "v2" and out["gated"] is True
    assert out["decision"]["accepted"] and out["decision"]["verdict"] == "gain"
    gate = log(lib)[0]["gate"]
    assert gate == {"gated": True, "rule": "cost_aware", "tasks": str(tmp_path / "held.jsonl"),
                    "n_tasks": N, "verdict": "gain", "difference": 1.0, "decision": "accepted"}
    table = " ".join(invoke("library", "log", "--library", str(lib)).stdout.split())
    assert "gated: a clear gain (cost_aware, 6 tasks)" in table


def test_imports_rollbacks_and_candidates_are_gated_the_same_way(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    Library.init(lib)
    skills = tmp_path / "skills" / "arithmetic-tips"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text(HURTFUL)
    res = invoke("library", "import", str(skills.parent), "--library", str(lib),
                 *gate_args(tmp_path, current_right=False, candidate_right=True))
    assert res.exit_code == 0, res.output
    assert "imported as version v2" in res.stdout and log(lib)[0]["gate"]["gated"] is True
    # A rollback that loses is refused and kept; the candidate applied by hand is ungated.
    res = invoke("library", "rollback", "v1", "--library", str(lib),
                 *gate_args(tmp_path, current_right=True, candidate_right=False))
    assert res.exit_code == 12, res.output
    (cand,) = Library.open(lib).candidates.list()
    assert cand.method == "rollback" and Library.open(lib).current_id() == "v2"
    res = invoke("library", "candidates", "apply", cand.name, "--library", str(lib))
    assert res.exit_code == 0, res.output
    assert "went live unmeasured" in " ".join(res.stdout.split())
    newest = log(lib)[0]
    assert newest["gate"]["gated"] is False and newest["gate"]["by"] == \
        "library candidates apply"
    assert not (lib / "skills" / "arithmetic-tips").exists()  # rolled back to v1's files


def test_require_gate_refuses_every_ungated_write_with_the_command_to_run(
        tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    Library.init(lib)
    res = invoke("library", "config", "require_gate", "true", "--library", str(lib))
    assert res.exit_code == 0 and "require_gate = true" in res.stdout
    assert json.loads((lib / "library.json").read_text())["require_gate"] is True
    draft_skill(lib)
    res = invoke("library", "commit", "-m", "add tips", "--library", str(lib))
    assert res.exit_code == 5, res.output
    assert "requires a gate (require_gate)" in res.stderr
    assert "whetstone library commit -m 'add tips' --gate-tasks SET@dev" in res.stderr
    assert "whetstone library config require_gate false" in res.stderr
    skills = tmp_path / "skills" / "arithmetic-tips"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text(HURTFUL)
    res = invoke("library", "import", str(skills.parent), "--library", str(lib))
    assert res.exit_code == 5 and "requires a gate" in res.stderr, res.output
    assert "whetstone library import " in res.stderr and "--gate-tasks SET@dev" in res.stderr
    # The store refuses too, whatever face writes: the Python API's commit.
    with pytest.raises(Exception, match="requires a gate"):
        Library.open(lib).commit({"skills/y/SKILL.md": HURTFUL.replace("arithmetic-tips", "y")},
                                 method="api")
    # A gated write passes; the setting can be turned off again.
    res = invoke("library", "commit", "-m", "add tips", "--library", str(lib),
                 *gate_args(tmp_path, current_right=False, candidate_right=True))
    assert res.exit_code == 0, res.output
    res = invoke("library", "rollback", "v1", "--library", str(lib))
    assert res.exit_code == 5 and "whetstone library rollback v1 --gate-tasks SET@dev" in \
        res.stderr
    assert Library.open(lib).current_id() == "v2"
    assert invoke("library", "config", "require_gate", "false", "--library",
                  str(lib)).exit_code == 0
    assert invoke("library", "rollback", "v1", "--library", str(lib)).exit_code == 0
    bad = invoke("library", "config", "require_gates", "true", "--library", str(lib))
    assert bad.exit_code == 2 and "unknown library setting" in bad.output


def test_serve_gated_only_serves_the_newest_gated_version_and_health_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    import whetstone.engine.server.app as app_module
    from whetstone.engine.server import create_app

    lib = tmp_path / "lib"
    Library.init(lib)
    draft_skill(lib, "times-table", HURTFUL.replace("arithmetic-tips", "times-table"))
    assert invoke("library", "commit", "-m", "gated", "--library", str(lib),
                  *gate_args(tmp_path, current_right=False, candidate_right=True)).exit_code == 0
    draft_skill(lib)
    assert invoke("library", "commit", "-m", "by hand", "--library", str(lib)).exit_code == 0
    served: list[Any] = []
    monkeypatch.setattr(app_module, "serve", lambda backend, **kw: served.append((backend, kw)))
    res = invoke("serve", "--model", "scripted:", "--library", str(lib), "--port",
                 str(free_port()), "--gated-only")
    assert res.exit_code == 0, res.output
    said = " ".join(res.stderr.split())
    assert "gated only: serving v2, the newest version a gate accepted; the current version " \
           "v3 went live ungated" in said
    backend, kw = served[0]
    assert kw["adapter"].library_version() == "v2"
    health = TestClient(create_app(backend, adapter=kw["adapter"], traces=kw["traces"]),
                        base_url="http://127.0.0.1").get("/health").json()
    assert health.get("library_version") == "v2", health
    assert health["library_gate"]["gated"] is True and health["library_gate"]["rule"] == \
        "cost_aware"
    # Without --gated-only the current, ungated version is served, and /health says so.
    served.clear()
    assert invoke("serve", "--model", "scripted:", "--library", str(lib), "--port",
                  str(free_port())).exit_code == 0
    backend, kw = served[0]
    health = TestClient(create_app(backend, adapter=kw["adapter"], traces=kw["traces"]),
                        base_url="http://127.0.0.1").get("/health").json()
    assert health["library_version"] == "v3" and health["library_gate"]["gated"] is False
    bad = invoke("serve", "--model", "scripted:", "--library", str(lib), "--gated-only",
                 "--version", "v1")
    assert bad.exit_code == 2 and "--gated-only picks the version itself" in bad.output
