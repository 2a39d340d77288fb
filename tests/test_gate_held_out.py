"""The gate never decides on a task the evolver learned from (issue 46, item 5): without
--gate-tasks it holds out the dev split of the tasks (docs/gate.md, "Which tasks the gate
decides on") and decides on those only, the evolver never sees them, and where no held-out
task exists the command refuses with the command to run. Through the command line, with a
scripted model and the memory evolver (no analyst)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.evaluation.tasks import split_of
from whetstone.library_store.store import Library

N = 40


def question(i: int) -> str:
    return f"Tom has {i} apples and gets {i} more. How many?"


def write_tasks(path: Path, ids: range | list[int]) -> Path:
    path.write_text("".join(json.dumps({"id": f"q{i}", "question": question(i),
                                        "expected": str(2 * i), "scorer": "numeric"}) + "\n"
                            for i in ids))
    return path


def by_split() -> dict[str, list[int]]:
    out: dict[str, list[int]] = {"train": [], "dev": [], "test": []}
    for i in range(1, N + 1):
        out[split_of(f"q{i}")].append(i)
    return out


def evolve(tmp_path: Path, replies: list[str], *args: str) -> Any:
    (tmp_path / "replies.json").write_text(json.dumps(replies))
    return CliRunner().invoke(cli, [
        "evolve", "memory", "--model", f"scripted:{tmp_path / 'replies.json'}",
        "--library", str(tmp_path / "lib"), "--tools", "", "-j", "1", "--json", *args])


def test_the_gate_holds_out_the_dev_split_and_decides_on_it_alone(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "apples.jsonl", range(1, N + 1))
    split = by_split()
    assert len(split["dev"]) >= 6 and split["test"]
    (tmp_path / "lib").mkdir()
    # The model: the train tasks (collected: only they run), then the gate on the dev tasks,
    # the current version wrong and the candidate right.
    replies = [f"Final Answer: {2 * i}" for i in split["train"]] + \
        ["Final Answer: 0" for _ in split["dev"]] + \
        [f"Final Answer: {2 * i}" for i in split["dev"]]
    res = evolve(tmp_path, replies, "--tasks", str(tasks))
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    d = out["decision"]
    assert d["accepted"] and d["verdict"] == "gain"
    # It names the tasks it used: the dev split's, and no other.
    assert d["tasks"] == [f"q{i}" for i in split["dev"]]
    assert d["task_set"] == f"{tasks}, its dev split"
    assert out["traces"] == len(split["train"]) and out["split"]["held_out"] is True
    # The evolver never saw a held-out task: none ran outside the gate, none is in memory.
    lib = Library.open(tmp_path / "lib")
    ran = {t.meta["task_id"] for t in lib.traces.query() if "gate" not in t.meta}
    assert ran == {f"q{i}" for i in split["train"]}
    memory = lib.snapshot().read_text("memory/demonstrations.md")
    assert memory.count("## Example ") == len(split["train"])
    assert not [i for i in split["dev"] + split["test"] if question(i) in memory]


def test_no_held_out_task_refuses_with_the_command_to_run(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "apples.jsonl", range(1, N + 1))
    (tmp_path / "lib").mkdir()
    # Every task of the train split: nothing is held out, so nothing may decide. The model
    # has no replies: it would fail if anything ran.
    res = evolve(tmp_path, [], "--tasks", f"{tasks}@train")
    assert res.exit_code == 2, res.output
    assert "the gate has no held-out task" in res.output
    assert f"--gate-tasks {tasks}@dev:0:30" in res.output
    lib = Library.open(tmp_path / "lib")
    assert lib.current_id() == "v1" and not lib.traces.query()
    # Stored traces of train-split tasks only, picked by a filter: the same.
    train = by_split()["train"][:4]
    write_tasks(tmp_path / "train.jsonl", train)
    (tmp_path / "run.json").write_text(json.dumps([f"Final Answer: {2 * i}" for i in train]))
    ran = CliRunner().invoke(cli, ["eval", "--tasks", str(tmp_path / "train.jsonl"),
                                   "--model", f"scripted:{tmp_path / 'run.json'}",
                                   "--library", str(tmp_path / "lib"), "-j", "1"])
    assert ran.exit_code == 0, ran.output
    res = evolve(tmp_path, [], "--traces", "outcome=answered")
    assert res.exit_code == 2 and "no task of the 4 trace(s) falls in the dev split" in res.output
    assert "--gate-tasks SET@dev:0:30" in res.output


def test_named_gate_tasks_are_kept_from_the_evolver(tmp_path: Path) -> None:
    train = by_split()["train"][:6]
    tasks = write_tasks(tmp_path / "apples.jsonl", train)
    # The gate file asks two of the training questions (under other ids) and four new ones.
    gate = [*train[:2], 101, 102, 103, 104]
    (tmp_path / "gate.jsonl").write_text("".join(
        json.dumps({"id": f"g{i}", "question": question(i), "expected": str(2 * i)}) + "\n"
        for i in gate))
    (tmp_path / "lib").mkdir()
    replies = [f"Final Answer: {2 * i}" for i in train[2:]] + \
        ["Final Answer: 0" for _ in gate] + [f"Final Answer: {2 * i}" for i in gate]
    res = evolve(tmp_path, replies, "--tasks", str(tasks), "--gate-tasks",
                 str(tmp_path / "gate.jsonl"))
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["decision"]["tasks"] == [f"g{i}" for i in gate] and out["traces"] == 4
    memory = Library.open(tmp_path / "lib").snapshot().read_text("memory/demonstrations.md")
    assert not [i for i in gate if question(i) in memory]
