"""Dynamo with scripted models: attempts split into correct and incorrect, the analyst's
diagnosis, a tool that must pass the AST check and its sandbox test on the failing inputs, the
gate, provenance in the version, repaired and dropped replies, given-toolset mode, resuming."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ParseError
from whetstone.engine.evaluation.tasks import TaskRecord, TaskSet
from whetstone.engine.methods.dynamo.evolver import Dynamo, DynamoConfig
from whetstone.engine.methods.dynamo.parts import Cluster, Repairs, parse_clusters, parse_tool
from whetstone.engine.types import Request

pytestmark = [pytest.mark.dynamo]  # every test here uses it


def shop(i: int, prefix: str = "t") -> TaskRecord:
    a, b, c = i + 1, 2 * i + 3, 3 * i + 2
    return TaskRecord(id=f"{prefix}{i}", question=f"Pens cost {a}, {b} and {c} dollars. "
                      "What do they cost together?", expected=str(a + b + c), scorer="numeric")


# The tool maker (tests/test_dynamo_maker.py) would run first on these all-failed tasks; these
# tests are about the diagnosis path, so it is switched off.
DIAGNOSE = {"maker_share": 2.0}
TRAIN = TaskSet("shop-train", tuple(shop(i) for i in range(4)))
# Six: six tasks that flip are a clear gain (McNemar p = 0.03), three are not (p = 0.25).
DEV = TaskSet("shop-dev", tuple(shop(i, "d") for i in range(10, 16)))

GOOD_TOOL = '''```python
def sum_prices(prices: list[float]) -> float:
    """Add up several prices exactly.

    Args:
        prices: the prices to add.
    """
    return sum(prices)
```'''
EVAL_TOOL = GOOD_TOOL.replace("return sum(prices)", "return eval('+'.join(map(str, prices)))")
CRASHING_TOOL = GOOD_TOOL.replace("return sum(prices)", "return prices[0] / 0")


def numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"Pens cost (\d+), (\d+) and (\d+)", text)[0]]


def shopper(request: Request) -> str:
    """A frozen model that forgets the third price, unless a tool adds them up for it."""
    system, last = request.messages[0].text, request.messages[-1].text
    if last.startswith("Observation:"):
        return "Final Answer: " + last.split("Observation:")[1].strip()
    task = next(m.text for m in request.messages if m.role == "user")
    a, b, c = numbers(task)
    if "- sum_prices:" in system:
        return f'Action: sum_prices[{{"prices": [{a}, {b}, {c}]}}]'
    if "python" in system and "## Verified examples" in system:
        return f'Action: python[{{"code": "print({a} + {b} + {c})"}}]'
    return f"Final Answer: {a + b}"


def failure_tests(user: str, key: str = "prices") -> list[dict[str, Any]]:
    blocks = re.findall(r"### (F\d+) \(task \w+\)\nTask: (Pens cost [^\n]+)", user)
    if key == "code":
        return [{"failure": f, "arguments": {"code": "print({} + {} + {})".format(*numbers(t))}}
                for f, t in blocks]
    return [{"failure": f, "arguments": {key: numbers(t)}} for f, t in blocks]


class Analyst:
    """A scripted analyst keyed by the prompt it is given; ``tools`` are its tool replies
    in order (the last one repeats)."""

    def __init__(self, tools: list[str] = (GOOD_TOOL,), kind: str = "arithmetic",  # type: ignore
                 diagnosis_reply: str | None = None) -> None:
        self.tools, self.kind, self.diagnosis_reply = list(tools), kind, diagnosis_reply
        self.prompts: list[str] = []

    def __call__(self, request: Request) -> str:
        user = request.messages[1].text
        self.prompts.append(user)
        if len(request.messages) > 2:  # a retry: answer the last user turn
            user = request.messages[1].text
        if "Group the failures" in user:
            if self.diagnosis_reply is not None:
                return self.diagnosis_reply
            labels = re.findall(r"### (F\d+) ", user)
            return json.dumps({"clusters": [{"failures": labels + ["F99"], "kind": self.kind,
                                             "diagnosis": "It adds only two of three prices.",
                                             "fix": "Add every price with a tool."}]})
        if "Write ONE Python function" in user:
            code = self.tools.pop(0) if len(self.tools) > 1 else self.tools[0]
            meta = {"skill": "Sum Prices", "description": "Add up the prices in a shopping "
                    "word problem. Use when a question lists several prices.",
                    "when": "Call it whenever a question asks for the total of prices.",
                    "tests": failure_tests(user)}
            return f"{code}\n{json.dumps(meta)}"
        if "Pick the ONE tool" in user:
            return json.dumps({"tool": "python", "skill": "totals-with-python",
                               "description": "Total several prices with a program. Use when "
                               "a question lists prices to add.",
                               "when": "Write a program that adds every price.",
                               "tests": failure_tests(user, "code")})
        if "reasoning skill" in user:
            return json.dumps({"name": "count-every-price", "description": "Add all prices. "
                               "Use for shopping totals.", "steps": "1. List every price. "
                               "2. Add them all."})
        raise AssertionError(f"unexpected analyst prompt: {user[:200]}")


def engine_at(tmp_path: Path, agent: Any = shopper) -> Engine:
    return Engine(ScriptedBackend(responder=agent), library=tmp_path / "lib", create=True,
                  checkpointing=False)


def test_dynamo_learns_a_skill_and_tool_pair_that_passes_its_test_and_the_gate(
        tmp_path: Path) -> None:
    engine = engine_at(tmp_path)
    analyst = Analyst(tools=[EVAL_TOOL, GOOD_TOOL])
    result = engine.evolve("dynamo", **DIAGNOSE, tasks=TRAIN, gate_tasks=DEV, train=4, rounds=2,
                           analyst=ScriptedBackend(responder=analyst))
    d = result.decision
    assert d is not None and d.accepted and (d.current_score, d.candidate_score) == (0.0, 1.0)
    assert result.version is not None
    snap = engine.library.snapshot()
    files = set(snap.files("skills/sum-prices/"))
    assert files == {"skills/sum-prices/SKILL.md", "skills/sum-prices/scripts/sum_prices.py",
                     "skills/sum-prices/assets/provenance.json"}
    # The first code used eval: refused by the AST check, shown to the analyst, rewritten.
    retry = next(p for p in analyst.prompts if "Write ONE Python function" in p)
    assert retry and result.patch.details["analyst"]["retries"] == 1
    assert "return sum(prices)" in snap.read_text("skills/sum-prices/scripts/sum_prices.py")
    provenance = json.loads(snap.read_text("skills/sum-prices/assets/provenance.json"))
    assert [f["task_id"] for f in provenance["failures"]] == ["t0", "t1", "t2", "t3"]
    tests = provenance["sandbox_tests"]
    assert len(tests) == 4 and all(t["ok"] and t["matched"] for t in tests)
    assert tests[0]["sandbox"]["isolation"] in ("bwrap", "process")
    skill = snap.read_text("skills/sum-prices/SKILL.md")
    assert "tool: sum_prices" in skill and "## Verified examples" in skill
    assert "sandbox-test: 4/4 ran, 4 held the expected answer" in skill
    manifest = engine.library.manifest(result.version.id)
    assert manifest.method == "dynamo" and "sum-prices + sum_prices" in manifest.message
    # Round 1 reuses the 4 runs the evolve collected; Dynamo ran 4 more over its preview.
    assert manifest.costs["agent_runs"] == 4
    details = result.patch.details
    assert details["training_accuracy"] == [0.0, 1.0]
    assert details["stopped"] == "no failures left on the training tasks"
    assert details["repairs"]["kind-word"] == 1 and details["repairs"]["unknown-failure-label"]
    # The next run is offered the tool beside its skill, and uses it.
    trace = engine.run("Pens cost 2, 3 and 4 dollars. What do they cost together?")
    assert trace.answer == "9"


def test_a_tool_that_crashes_on_the_failing_inputs_is_dropped_with_the_reason(
        tmp_path: Path) -> None:
    engine = engine_at(tmp_path)
    result = engine.evolve("dynamo", **DIAGNOSE, tasks=TRAIN, gate_tasks=DEV, train=4,
                           analyst=ScriptedBackend(responder=Analyst(tools=[CRASHING_TOOL])))
    assert result.patch.empty and result.version is None
    proposal = result.patch.details["rounds"][0]["proposals"][0]
    assert not proposal["kept"]
    assert proposal["reason"].startswith("crashed on every failing input (ZeroDivisionError")
    assert "no skill or tool survived" in result.patch.details["stopped"]


def test_a_round_without_gain_is_not_kept(tmp_path: Path) -> None:
    # A cognitive diagnosis becomes a reasoning skill; this model ignores it: no gain.
    engine = engine_at(tmp_path)
    analyst = Analyst(kind="cognitive")
    result = engine.evolve("dynamo", **DIAGNOSE, tasks=TRAIN, gate_tasks=DEV, train=4, rounds=3,
                           analyst=ScriptedBackend(responder=analyst))
    rnd = result.patch.details["rounds"][0]
    assert rnd["proposals"][0]["kind"] == "reasoning" and rnd["proposals"][0]["kept"]
    assert rnd["kept"] is False and "no gain" in result.patch.details["stopped"]
    assert result.patch.empty and len(result.patch.details["rounds"]) == 1


def test_malformed_diagnoses_are_dropped_with_a_count(tmp_path: Path) -> None:
    engine = engine_at(tmp_path)
    analyst = Analyst(diagnosis_reply="The agent was wrong. {not json")
    result = engine.evolve("dynamo", **DIAGNOSE, tasks=TRAIN, gate_tasks=DEV, train=4,
                           analyst=ScriptedBackend(responder=analyst))
    stats = result.patch.details["analyst"]
    assert stats["calls"] == 2 and stats["retries"] == 1 and stats["dropped"] == 1
    assert result.patch.details["dropped_replies"] == 1 and result.patch.empty
    assert "raw reply: The agent was wrong." in stats["errors"][0]


def test_reply_repairs_are_counted() -> None:
    repairs = Repairs()
    labels = {"F1": "t0", "F2": "t1"}
    clusters = parse_clusters(json.dumps({"clusters": [
        {"failures": "F1", "kind": "Arithmetic slip", "diagnosis": "adds wrong"},
        {"failures": ["t1", "F7"], "kind": "cognitive", "diagnosis": "misreads"},
        {"failures": ["F2"], "kind": "astrology", "diagnosis": "?"}]}), labels, repairs)
    assert [(c.kind, c.failures) for c in clusters] == [("computational", ["t0"]),
                                                        ("cognitive", ["t1"])]
    assert repairs.counts == {"kind-word": 1, "unknown-failure-label": 1, "cluster-dropped": 1}
    cluster = Cluster("computational", ["t0"], "adds wrong")
    raw = GOOD_TOOL.replace("sum_prices", "Sum_Prices") + '\n{"tests": [{"arguments": ' \
        '"{\\"prices\\": [1, 2]}"}]}'
    proposal, definition = parse_tool(raw, cluster, {"F1": "t0"}, {"python"}, repairs)
    assert definition.name == proposal.tool == "sum_prices"
    assert proposal.tests[0].task_id == "t0" and proposal.tests[0].arguments == {"prices": [1, 2]}
    assert repairs.counts["test-arguments-text"] == 1 and repairs.counts["test-failure-label"]


def test_a_diagnosis_cut_off_at_the_token_limit_keeps_its_finished_clusters() -> None:
    # Seen with the 0.5B analyst on GSM8K: every diagnosis ran out of tokens mid-list.
    raw = ('{"clusters": [{"failures": ["F1"], "kind": "computational", "diagnosis": '
           '"adds the prices wrong", "fix": "sum exactly"}, {"failures": ["F2"], "kind": "cog')
    repairs = Repairs()
    [cluster] = parse_clusters(raw, {"F1": "t0", "F2": "t1"}, repairs)
    assert cluster.failures == ["t0"] and cluster.kind == "computational"
    assert repairs.counts["truncated-reply"] == 1
    with pytest.raises(ParseError, match="no cluster names a known failure"):
        parse_clusters('{"clusters": [{"failures": ["F1"], "kind": "comp', {"F1": "t0"},
                       Repairs())


OS_SYSTEM = 'import os\n\ndef f(x: int) -> int:\n    """F."""\n    return os.system("id")\n'
DUNDER_IMPORT = 'def f(x: int) -> int:\n    """F."""\n    return __import__("os").getpid()\n'


@pytest.mark.parametrize("bad,why", [(OS_SYSTEM, "imports 'os'"),
                                     (DUNDER_IMPORT, "__import__")])
def test_code_using_os_system_or_dunder_import_is_refused_before_it_runs(bad: str,
                                                                         why: str) -> None:
    from whetstone.engine.errors import ValidationError

    cluster = Cluster("computational", ["t0"], "x")
    reply = f"```python\n{bad}```\n" + '{"tests": [{"failure": "F1", "arguments": {"x": 1}}]}'
    with pytest.raises(ValidationError) as err:
        parse_tool(reply, cluster, {"F1": "t0"}, set(), Repairs())
    assert why in err.value.detail


def test_given_toolset_mode_learns_only_when_to_call_python(tmp_path: Path) -> None:
    engine = engine_at(tmp_path)
    analyst = Analyst()
    result = engine.evolve("dynamo", **DIAGNOSE, tasks=TRAIN, gate_tasks=DEV, train=4, toolset="python",
                           analyst=ScriptedBackend(responder=analyst))
    assert not any("Write ONE Python function" in p for p in analyst.prompts)
    assert result.version is not None, result.note
    snap = engine.library.snapshot()
    assert sorted(snap.files("skills/")) == ["skills/totals-with-python/SKILL.md",
                                             "skills/totals-with-python/assets/provenance.json"]
    skill = snap.read_text("skills/totals-with-python/SKILL.md")
    assert "Call the `python` tool with: `code` (string)" in skill
    assert 'Call `python` with {"code": "print(' in skill  # a verified worked example
    assert result.patch.details["mode"] == "given-toolset"
    assert result.patch.details["pairs"][0]["kind"] == "when"


def test_an_unknown_given_tool_is_a_clear_error(tmp_path: Path) -> None:
    from whetstone.engine.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown tool.*abacus"):
        engine_at(tmp_path).evolve("dynamo", **DIAGNOSE, tasks=TRAIN, gate_tasks=DEV, train=4,
                                   toolset="abacus", analyst=ScriptedBackend(
                                       responder=Analyst()))


def test_an_interrupted_evolve_resumes_where_it_stopped(tmp_path: Path) -> None:
    engine = engine_at(tmp_path)
    analyst = Analyst()
    calls: list[str] = []

    def interrupting(request: Request) -> str:
        if "Write ONE Python function" in request.messages[1].text and not calls:
            calls.append("x")
            raise KeyboardInterrupt
        return analyst(request)

    with pytest.raises(KeyboardInterrupt):
        engine.evolve("dynamo", **DIAGNOSE, tasks=TRAIN, gate_tasks=DEV, train=4,
                      analyst=ScriptedBackend(responder=interrupting))
    saved = list((tmp_path / "lib" / "state" / "dynamo").glob("*.json"))
    assert len(saved) == 1
    assert json.loads(saved[0].read_text())["rounds"][0]["clusters"]  # the diagnosis is kept
    diagnosed = sum("Group the failures" in p for p in analyst.prompts)
    result = engine.evolve("dynamo", **DIAGNOSE, tasks=TRAIN, gate_tasks=DEV, train=4,
                           analyst=ScriptedBackend(responder=analyst))
    assert sum("Group the failures" in p for p in analyst.prompts) == diagnosed  # not again
    assert result.version is not None and "sum_prices" in result.patch.message


def test_an_interrupted_agent_run_resumes_with_the_tasks_left(tmp_path: Path) -> None:
    ran: list[str] = []
    interrupted: list[bool] = []

    def agent(request: Request) -> str:
        task = next(m.text for m in request.messages if m.role == "user")
        if not request.messages[-1].text.startswith("Observation:"):
            ran.append(task)
            if len(ran) == 3 and not interrupted:
                interrupted.append(True)
                raise KeyboardInterrupt
        return shopper(request)

    engine = engine_at(tmp_path, agent)
    with pytest.raises(KeyboardInterrupt):  # one run at a time, so the interrupt lands at #3
        engine.evolve("dynamo", **DIAGNOSE, tasks=TRAIN, gate_tasks=DEV, train=4, traces=[],
                      analyst=ScriptedBackend(responder=Analyst()), concurrency=1)
    assert len(ran) == 3
    ran.clear()
    result = engine.evolve("dynamo", **DIAGNOSE, tasks=TRAIN, gate_tasks=DEV, train=4, traces=[],
                           analyst=ScriptedBackend(responder=Analyst()), concurrency=1)
    # The two attempts that finished before the interrupt are not run again.
    assert ran[:2] == [t.question for t in TRAIN.tasks[2:]]
    assert result.version is not None


def test_cli_evolve_dynamo_has_its_knobs() -> None:
    res = CliRunner().invoke(cli, ["evolve", "dynamo", "--help"])
    assert res.exit_code == 0
    for flag in ("--train", "--rounds", "--toolset", "--tasks", "--analyst", "--fresh"):
        assert flag in res.output
    methods = CliRunner().invoke(cli, ["methods", "--json"])
    assert any(m["name"] == "dynamo" and m["kind"] == "evolver"
               for m in json.loads(methods.output))


def test_dynamo_needs_labelled_tasks_and_an_evolve_context() -> None:
    from whetstone.engine.errors import ConfigError

    with pytest.raises(ConfigError, match="needs an evolve context"):
        Dynamo(DynamoConfig()).fit([], {}, ScriptedBackend())


def test_a_toolset_pattern_names_the_agents_own_tools_it_matches() -> None:
    # One command for any environment: "*" is every tool of the agent's own servers.
    from whetstone.engine.errors import ConfigError
    from whetstone.engine.methods.dynamo.parts import expand_toolset
    from whetstone.engine.types import ToolSpec
    from whetstone.tools.base import Tool

    def tool(name: str) -> Tool:
        return Tool(ToolSpec(name=name, description=name), lambda a: "")

    known = {"python": tool("python")}
    own = [tool("db_read_query"), tool("db_list_tables")]
    assert list(expand_toolset("*", known, lambda: own)) == ["db_read_query", "db_list_tables"]
    assert list(expand_toolset("python,*_query", known, lambda: own)) == ["python",
                                                                          "db_read_query"]
    with pytest.raises(ConfigError, match="fs_"):
        expand_toolset("fs_*", known, lambda: own)
