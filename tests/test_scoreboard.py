"""The scoreboard (benchmarks/scoreboard_harness/runner.py): plan checks, rows run once and reused while fresh,
evolved rows gated on dev, the page pairs every row with the set's baseline."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from scoreboard_harness.page import render
from scoreboard_harness.runner import Runner, load_outcome, parse_plan, row_key, run_plan

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ConfigError
from whetstone.engine.evaluation.tasks import TaskRecord, write_jsonl
from whetstone.engine.methods.registry import MethodEntry, MethodRegistry
from whetstone.engine.types import Request

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "toy_methods"))


def _tasks(folder: Path) -> str:
    tasks = [TaskRecord(id=f"t{i}", question=f"What is {i} + {i}?", expected=str(2 * i),
                        scorer="numeric") for i in range(12)]
    return str(write_jsonl(tasks, folder / "tasks.jsonl"))


def _answer_with_skill(request: Request) -> str:
    """Right on even numbers; with the toy skill in its prompt, right on every task."""
    system = request.messages[0].text if request.messages[0].role == "system" else ""
    question = next(m.text for m in request.messages if "What is " in m.text)
    n = int(question.split("What is ")[1].split(" ")[0])
    right = n % 2 == 0 or "toy" in system.lower()
    return f"Final Answer: {2 * n if right else 2 * n + 1}"


def _plan(path: str, **extra: Any) -> dict[str, Any]:
    return {"model": "scripted", "seed": 0, "concurrency": 1,
            "sets": {"toy": {"train": f"{path}:0:4", "dev": f"{path}:4:8",
                             "test": f"{path}:8:12"}},
            "rows": [{"set": "toy", "name": "agent"},
                     {"set": "toy", "name": "direct", "solver": "direct"},
                     # 4 dev tasks cannot tell a tie (2 better of 4 is not a clear gain):
                     # the old rule lands the change, which these tests of the harness need.
                     {"set": "toy", "name": "toy-evolved",
                      "evolve": {"method": "toy", "options": {"note": "add twice"},
                                 "rule": "mean_not_worse"}},
                     *extra.get("rows", [])]}


def _runner(plan: Any, tmp_path: Path) -> Runner:
    backend = ScriptedBackend(responder=_answer_with_skill)
    registry = MethodRegistry((MethodEntry("toy", "evolver", "toy_methods:ToyEvolver"),
                               MethodEntry("skills", "runtime",
                                           "whetstone.engine.runtime.skills_plugin:SkillsPlugin")))
    return Runner(plan, backend, backend, tmp_path / "work", registry=registry)


def test_a_plan_names_its_mistakes() -> None:
    with pytest.raises(ConfigError, match="unknown key"):
        parse_plan({"sets": {}, "rows": [], "colour": "red"})
    with pytest.raises(ConfigError, match="baseline row 'agent' is missing"):
        parse_plan({"sets": {"s": {"train": "a", "dev": "b", "test": "c"}},
                    "rows": [{"set": "s", "name": "direct"}]})
    with pytest.raises(ConfigError, match="needs test"):
        parse_plan({"sets": {"s": {"train": "a", "dev": "b"}}, "rows": []})
    with pytest.raises(ConfigError, match="known `set`"):
        parse_plan({"sets": {"s": {"train": "a", "dev": "b", "test": "c"}},
                    "rows": [{"set": "other", "name": "agent"}]})


def test_rows_run_once_then_are_reused_until_their_plan_changes(tmp_path: Path) -> None:
    path = _tasks(tmp_path)
    plan = parse_plan(_plan(path))
    results = tmp_path / "results"
    said: list[str] = []
    outcomes = run_plan(_runner(plan, tmp_path), results, say=said.append)
    assert set(outcomes) == {"toy/agent", "toy/direct", "toy/toy-evolved"}
    assert outcomes["toy/agent"].result.accuracy == 0.5  # tasks 8..11: right on 8 and 10
    evolved = outcomes["toy/toy-evolved"]
    assert evolved.evolve is not None and evolved.evolve["accepted"]
    assert evolved.evolve["traces"] == 4  # the train slice's runs, collected once
    assert evolved.evolve["decision"]["candidate_score"] == 1.0  # gated on dev (tasks 4..7)
    assert evolved.result.accuracy == 1.0
    # the test slice is only evaluated: no evolve run ever saw tasks 8..11
    collect = list((tmp_path / "work" / "toy" / "collect").rglob("*.jsonl"))
    seen = "".join(p.read_text() for p in collect)
    assert "What is 9 + 9" not in seen and "What is 3 + 3" in seen

    said.clear()
    run_plan(_runner(plan, tmp_path), results, say=said.append)
    assert not any(s.startswith("running") for s in said)  # all fresh

    changed = parse_plan(_plan(path, rows=[{"set": "toy", "name": "agent-no-tools",
                                            "tools": []}]))
    assert row_key(changed, changed.rows[0]) == row_key(plan, plan.rows[0])
    said.clear()
    run_plan(_runner(changed, tmp_path), results, say=said.append)
    assert [s for s in said if s.startswith("running")] == ["running toy/agent-no-tools"]


def test_the_page_pairs_rows_with_the_baseline(tmp_path: Path) -> None:
    path = _tasks(tmp_path)
    plan = parse_plan(_plan(path))
    results = tmp_path / "results"
    run_plan(_runner(plan, tmp_path), results, say=lambda s: None)
    outcomes = {r.id: load_outcome(results, r) for r in plan.rows}
    page = render(plan, outcomes, tmp_path, command="python benchmarks/scoreboard.py")
    assert "python benchmarks/scoreboard.py" in page
    evolved_line = next(line for line in page.splitlines() if line.startswith("| toy-evolved"))
    assert "1.000 (4/4)" in evolved_line and "+0.500" in evolved_line
    # Landed by the row's own rule, the old one: today's default could not tell on 4 tasks.
    assert "accepted: a tie it could not tell, more expensive: +0.50 [+0.00, +1.00] on 4 " \
        "tasks, tokens " in evolved_line and "could have missed 0.60" in evolved_line
    assert "4 train runs" in evolved_line  # what the evolver learnt from is part of its cost
    saved = json.loads((results / "toy" / "toy-evolved.json").read_text())
    assert saved["evolve"]["method"] == "toy"


def test_a_row_may_evolve_on_its_own_train_and_dev_slices(tmp_path: Path) -> None:
    path = _tasks(tmp_path)
    own = {"set": "toy", "name": "toy-wide",
           "evolve": {"method": "toy", "options": {"note": "add twice"}, "rule": "mean_not_worse",
                      "train": f"{path}:0:6", "dev": f"{path}:6:8"}}
    plan = parse_plan(_plan(path, rows=[own]))
    # the fields are hashed only when set: rows that do not name them keep their saved keys
    base = parse_plan(_plan(path))
    assert row_key(plan, plan.rows[2]) == row_key(base, base.rows[2])
    results = tmp_path / "results"
    outcomes = run_plan(_runner(plan, tmp_path), results, say=lambda s: None,
                        only=["toy/toy-wide", "toy/toy-evolved", "toy/agent"])
    wide = outcomes["toy/toy-wide"].evolve
    assert wide is not None and wide["traces"] == 6
    assert wide["decision"]["n_tasks"] == 2
    assert outcomes["toy/toy-evolved"].evolve["traces"] == 4  # the set's collection is kept
    assert (tmp_path / "work" / "toy" / "collect").is_dir()
    page = render(plan, {r.id: load_outcome(results, r) for r in plan.rows}, tmp_path,
                  command="x")
    line = next(x for x in page.splitlines() if x.startswith("| toy-wide"))
    assert f"on `{path}:6:8`" in line
    evolved = next(x for x in page.splitlines() if x.startswith("| toy-evolved"))
    assert " on `" not in evolved


def test_rows_run_before_a_code_change_are_marked(tmp_path: Path) -> None:
    import time

    path = _tasks(tmp_path)
    plan = parse_plan(_plan(path))
    results = tmp_path / "results"
    run_plan(_runner(plan, tmp_path), results, say=lambda s: None)
    outcomes = {r.id: load_outcome(results, r) for r in plan.rows}
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
    changed = parse_plan({**_plan(path), "code_changes": [{"at": later, "what": "new loop"}]})
    page = render(changed, outcomes, tmp_path, command="x")
    assert next(ln for ln in page.splitlines() if ln.startswith("| agent †1"))
    assert f"- †1: run before {later}: new loop" in page
    only_agent = parse_plan({**_plan(path), "code_changes": [
        {"at": later, "what": "new loop", "solver": "agent"}]})
    page = render(only_agent, outcomes, tmp_path, command="x")
    assert "| agent †1" in page and "| direct |" in page
    # A change to one evolver marks only the rows whose library it made.
    only_toy = parse_plan({**_plan(path), "code_changes": [
        {"at": later, "what": "new evolver", "method": "toy"}]})
    page = render(only_toy, outcomes, tmp_path, command="x")
    assert "| toy-evolved †1" in page and "| agent |" in page and "| direct |" in page
    earlier = parse_plan({**_plan(path), "code_changes": [{"at": "2020-01-01T00:00:00Z",
                                                           "what": "old"}]})
    assert "†" not in render(earlier, outcomes, tmp_path, command="x")
    with pytest.raises(ConfigError, match="ISO UTC time"):
        parse_plan({**_plan(path), "code_changes": [{"what": "no date"}]})


def test_a_missing_section_says_how_to_make_it(tmp_path: Path) -> None:
    path = _tasks(tmp_path)
    data = _plan(path)
    data["sections"] = {"detector": {"title": "Detector", "command": "python make.py",
                                     "result": "out/detector.json"}}
    plan = parse_plan(data)
    page = render(plan, {}, tmp_path, command="x")
    assert "(not run yet: `python make.py` writes `out/detector.json`)" in page
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "detector.json").write_text(json.dumps({"markdown": "| p | r |"}))
    assert "| p | r |" in render(plan, {}, tmp_path, command="x")


def test_a_row_may_score_another_rows_library_on_more_tasks(tmp_path: Path) -> None:
    path = _tasks(tmp_path)
    data = _plan(path)
    data["sets"]["more"] = {"train": f"{path}:0:4", "dev": f"{path}:4:8", "test": f"{path}:1:8"}
    data["rows"] += [{"set": "more", "name": "agent"},
                     {"set": "more", "name": "toy-again", "library_of": "toy/toy-evolved"}]
    plan = parse_plan(data)
    with pytest.raises(ConfigError, match="not an evolved row"):
        parse_plan({**data, "rows": [*data["rows"][:-1],
                                     {"set": "more", "name": "x", "library_of": "toy/agent"}]})
    results = tmp_path / "results"
    with pytest.raises(ConfigError, match="run that row first"):
        run_plan(_runner(plan, tmp_path), results, say=lambda s: None, only=["more/toy-again"])
    said: list[str] = []
    outcomes = run_plan(_runner(plan, tmp_path), results, say=said.append)
    again = outcomes["more/toy-again"]
    assert again.evolve is None and again.result.n == 7 and again.result.accuracy == 1.0
    assert outcomes["more/agent"].result.accuracy < 1.0
    page = render(plan, outcomes, tmp_path, command="x")
    assert "library of `toy/toy-evolved`" in next(
        x for x in page.splitlines() if x.startswith("| toy-again"))
    # Pools: the same rows over several sets' test tasks together.
    pooled = parse_plan({**data, "rows": [*data["rows"], {"set": "more", "name": "toy-evolved",
                                                          "library_of": "toy/toy-evolved"}],
                         "pools": {"all": {"sets": ["toy", "more"],
                                           "rows": ["agent", "toy-evolved"]}}})
    outcomes = run_plan(_runner(pooled, tmp_path), results, say=lambda s: None)
    page = render(pooled, outcomes, tmp_path, command="x")
    table = page.split("### all")[1]
    assert "| agent | 0.455 (5/11) | – |" in table  # 2 of 4, then 3 of 7 (tasks 2, 4, 6)
    assert "| toy-evolved | 1.000 (11/11) | +0.545 [" in table
    with pytest.raises(ConfigError, match="missing: more/direct"):
        parse_plan({**data, "pools": {"p": {"sets": ["toy", "more"], "rows": ["direct"]}}})
    # A new evolve of the source makes the copy stale too.
    changed = parse_plan({**data, "rows": [
        {**r, "evolve": {"method": "toy", "options": {"note": "add once"}}}
        if r.get("name") == "toy-evolved" else r for r in data["rows"]]})
    assert row_key(changed, changed.row("more/toy-again")) != row_key(plan, plan.row(
        "more/toy-again"))


def test_a_decision_saved_under_the_old_rule_is_decided_again_on_the_page(tmp_path: Path) -> None:
    path = _tasks(tmp_path)
    plan = parse_plan(_plan(path))
    results = tmp_path / "results"
    run_plan(_runner(plan, tmp_path), results, say=lambda s: None)
    outcomes = {r.id: load_outcome(results, r) for r in plan.rows}
    evolved = outcomes["toy/toy-evolved"]
    assert evolved is not None and evolved.evolve is not None
    # What bb-tracking-3's Trace2Skill row saved before the gate weighed cost and power.
    evolved.evolve["decision"] = {
        "accepted": True, "rule": "not_worse", "candidate_score": 0.4, "current_score": 0.4,
        "difference": 0.0, "ci_low": -1 / 6, "ci_high": 1 / 6, "confidence": 0.95,
        "mcnemar_p": 1.0, "n_tasks": 30, "wins": 3, "losses": 3, "left_out": [],
        "task_set": f"{path}:4:8"}
    page = render(plan, outcomes, tmp_path, command="x")
    line = next(x for x in page.splitlines() if x.startswith("| toy-evolved"))
    assert ("accepted (0.40 vs 0.40) under the old rule; now rejected: a tie it could not "
            "tell: +0.00 [-0.17, +0.17] on 30 tasks, could have missed 0.17 |") in line
    # The default rule hashes as the name it had, so saved rows are not all rerun for it.
    data = _plan(path)
    data["rows"][2]["evolve"].pop("rule")
    default = parse_plan(data)
    assert default.rows[2].evolve is not None and default.rows[2].evolve.rule is None
    data["rows"][2]["evolve"]["rule"] = "not_worse"
    named = parse_plan(data)
    assert row_key(default, default.rows[2]) == row_key(named, named.rows[2])


def test_a_row_with_mcp_servers_runs_with_their_tools_and_counts_the_calls(tmp_path: Path
                                                                            ) -> None:
    from mcp_support import TEST_SERVER, starts, wait_gone

    log = tmp_path / "starts.log"
    servers = tmp_path / "servers.json"
    servers.write_text(json.dumps({"mcpServers": {"shop": {
        "command": sys.executable, "args": [str(TEST_SERVER), "stdio", "--log", str(log)]}}}))
    # Each question once (order i): the gate never decides on a question a row learned from.
    tasks = [TaskRecord(id=f"p{i}", question=f"Order {i}: what does a {item} cost?",
                        expected=str(price), scorer="numeric")
             for i, (item, price) in enumerate([("kettle", 24.5), ("lamp", 12.25)] * 3)]
    path = str(write_jsonl(tasks, tmp_path / "prices.jsonl"))

    def shopper(request: Request) -> str:
        last = request.messages[-1].text
        if last.startswith("Observation:"):
            return f"Final Answer: {json.loads(last.split(':', 1)[1])['price']}"
        if "shop_lookup" not in request.messages[0].text:
            return "Final Answer: 10"
        item = "kettle" if "kettle" in last else "lamp"
        return f'Action: shop_lookup[{{"item": "{item}"}}]'

    data = {"model": "scripted", "seed": 0, "concurrency": 1,
            "sets": {"shop": {"train": f"{path}:0:2", "dev": f"{path}:2:4",
                              "test": f"{path}:4:6"}},
            "rows": [{"set": "shop", "name": "agent", "tools": [], "mcp": str(servers)},
                     {"set": "shop", "name": "no-server", "tools": []},
                     {"set": "shop", "name": "toy", "tools": [], "mcp": str(servers),
                      "evolve": {"method": "toy", "options": {"note": "x"}}}]}
    plan = parse_plan(data)
    runner = _runner(plan, tmp_path)
    runner.backend = runner.analyst = ScriptedBackend(responder=shopper)
    results = tmp_path / "results"
    outcomes = run_plan(runner, results, say=lambda s: None)
    agent, bare = outcomes["shop/agent"], outcomes["shop/no-server"]
    assert agent.result.accuracy == 1.0 and bare.result.accuracy == 0.0
    assert agent.tool_calls == {"result": {"rate": 1.0, "per_task": 1.0, "tasks": 2}}
    assert bare.tool_calls is None
    # The training runs are collected as the baseline row runs: with the server's tools.
    collected = (tmp_path / "work" / "shop" / "collect").rglob("*.jsonl")
    assert "shop_lookup" in "".join(p.read_text() for p in collected)
    assert len(starts(log)) == 2  # once per row that has the servers, not once per engine
    assert all(wait_gone(pid) for pid in starts(log))
    page = render(plan, outcomes, tmp_path, command="x")
    assert "| MCP tool calls (tasks) | tokens/task |" in page
    assert "| 100% (1.0/task) |" in next(x for x in page.splitlines()
                                         if x.startswith("| agent"))
    assert "| – |" in next(x for x in page.splitlines() if x.startswith("| no-server"))
    # The servers' file is part of the row: editing it makes the row stale.
    before = row_key(plan, plan.row("shop/agent"))
    servers.write_text(servers.read_text().replace("stdio", "stdio "))
    assert row_key(plan, plan.row("shop/agent")) != before


def test_a_row_may_run_its_agent_on_another_model(tmp_path: Path) -> None:
    """``model:`` on a row (the 1.5B agent beside the plan's 0.5B): that row's runs, and only
    its, go to that model, loaded once; rows without it keep the keys they had."""
    path = _tasks(tmp_path)
    replies = tmp_path / "other-model.json"
    replies.write_text(json.dumps({"replies": [f"Final Answer: {2 * n}" for n in range(8, 12)]}))
    spec = f"scripted:{replies}"
    plan = parse_plan(_plan(path, rows=[{"set": "toy", "name": "agent-other", "model": spec}]))
    assert plan.row("toy/agent-other").model == spec and plan.row("toy/agent").model is None
    runner = _runner(plan, tmp_path)
    outcomes = run_plan(runner, tmp_path / "results", say=lambda s: None)
    assert outcomes["toy/agent"].result.accuracy == 0.5  # the plan's model: right on 8 and 10
    assert outcomes["toy/agent-other"].result.accuracy == 1.0  # the row's own model
    other = runner.backend_for(plan.row("toy/agent-other"))
    assert other is not runner.backend and other.spec.startswith("scripted:")
    assert runner.backend_for(plan.row("toy/agent-other")) is other  # loaded once
    assert outcomes["toy/agent-other"].result.model == other.spec
    without = parse_plan(_plan(path))
    assert row_key(plan, plan.row("toy/agent")) == row_key(without, without.row("toy/agent"))
    assert row_key(plan, plan.row("toy/agent-other")) != row_key(plan, plan.row("toy/agent"))


def test_a_collection_cut_short_resumes_with_the_tasks_it_lacks(tmp_path: Path) -> None:
    """A scoreboard run killed while collecting the train slice's runs keeps them: the next
    run solves only the tasks without a trace, and the evolver gets the whole slice."""
    from whetstone.engine.evaluation.benchmarks import load_tasks
    from whetstone.engine.evaluation.runner import evaluate

    path = _tasks(tmp_path)
    plan = parse_plan(_plan(path))
    asked: list[str] = []

    def answer(request: Request) -> str:
        asked.append(next(m.text for m in request.messages if "What is " in m.text))
        return _answer_with_skill(request)

    backend = ScriptedBackend(responder=answer)
    runner = Runner(plan, backend, backend, tmp_path / "work",
                    registry=_runner(plan, tmp_path).registry)
    s = plan.set("toy")
    engine = runner.engine(tmp_path / "work" / "toy" / "collect", plan.row("toy/agent"))
    first = load_tasks(f"{path}:0:2")
    evaluate(first, engine.solver(), seed=plan.seed, store=engine.traces, model="scripted:",
             task_set=s.train)  # the run that was cut after two tasks
    asked.clear()
    traces = runner.train_traces(s)
    assert sorted({t.meta["task_id"] for t in traces}) == ["t0", "t1", "t2", "t3"]
    assert len(traces) == 4
    assert not any("What is 0 " in q or "What is 1 " in q for q in asked)
    assert any("What is 2 " in q for q in asked) and any("What is 3 " in q for q in asked)


def test_a_row_may_learn_from_a_teams_chat_log(tmp_path: Path) -> None:
    """``from_log``: the train runs go through an OpenAI chat-completion log and `whetstone
    traces import` (a real process) before the evolver sees them: the imported traces carry
    the log's expected answers, scored by the set's scorer, and no task ids of ours."""
    path = _tasks(tmp_path)
    row = {"set": "toy", "name": "toy-from-log",
           "evolve": {"method": "toy", "options": {"note": "add twice"},
                      "rule": "mean_not_worse", "from_log": True}}
    plan = parse_plan(_plan(path, rows=[row]))
    base = parse_plan(_plan(path))
    assert row_key(base, base.rows[2]) == row_key(plan, plan.rows[2])  # old keys hold
    outcomes = run_plan(_runner(plan, tmp_path), tmp_path / "results", say=lambda s: None,
                        only=["toy/agent", "toy/toy-from-log"])
    evolved = outcomes["toy/toy-from-log"].evolve
    assert evolved is not None
    assert evolved["imported"]["log_lines"] == 4 and evolved["imported"]["imported"] == 4
    assert evolved["imported"]["scorer"]["scored"] == 4  # the log's answers, scored on import
    assert evolved["traces"] == 4 and evolved["accepted"]
    log = (tmp_path / "work" / "toy" / "toy-from-log" / "team-log.jsonl").read_text()
    first = json.loads(log.splitlines()[0])
    assert first["messages"][0] == {"role": "user", "content": "What is 0 + 0?"}
    assert first["expected"] == "0" and "task_id" not in log
    assert outcomes["toy/toy-from-log"].result.accuracy == 1.0


def test_the_page_gives_each_evolved_row_a_command_the_cli_takes(tmp_path: Path) -> None:
    """docs/results.md names, for every evolved row of the real plan, the `whetstone evolve`
    command that makes its library; each of them parses (every option exists) with the
    evolvers installed here, and a row learning from a log imports it first."""
    from click.testing import CliRunner
    from scoreboard_harness.page import evolve_command
    from scoreboard_harness.runner import load_plan

    from whetstone.cli import cli
    from whetstone.engine.methods.registry import default_registry

    plan = load_plan(Path(__file__).resolve().parents[1] / "benchmarks" / "scoreboard.yaml")
    installed = set(default_registry().names("evolver"))
    checked = 0
    for row in plan.rows:
        if row.evolve is None or row.evolve.method not in installed:
            continue
        command = evolve_command(plan, plan.set(row.set), row)
        parts = [shlex.split(c) for c in command.split(" && ")]
        assert parts[-1][:3] == ["whetstone", "evolve", row.evolve.method]
        assert ("--tasks" in parts[-1]) is not row.evolve.from_log
        if row.evolve.from_log:
            assert parts[0][:3] == ["whetstone", "traces", "import"]
        for args in parts:
            got = CliRunner().invoke(cli, [*args[1:], "--help"])
            assert got.exit_code == 0, (command, got.output)
        checked += 1
    # Every evolver the plan names and this tree holds (none, in the removal test's core tree).
    assert checked >= len(installed & {r.evolve.method for r in plan.rows if r.evolve})
    page = render(plan, {}, tmp_path, command="x")
    assert "--mcp-config benchmarks/fixtures/env_ledger/servers.json" in page
