"""Trace2Skill with scripted analysts: map, reduce, apply; conflicts; retries; limits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ConfigError
from whetstone.engine.methods.trace2skill.edits import Edit, SkillPatch, apply_patch
from whetstone.engine.methods.trace2skill.evolver import (
    Trace2Skill,
    Trace2SkillConfig,
    draft_skill,
    merge_group,
    merge_tree_shape,
    reduce_patches,
)
from whetstone.engine.types import Request, Trace

pytestmark = [pytest.mark.trace2skill]  # every test here uses it

BASE = draft_skill("word-math", "Solve arithmetic word problems.")
LIB = {f"skills/word-math/{k}": v for k, v in BASE.items()}


def reply(*edits: dict[str, Any], changelog: str = "c") -> str:
    return json.dumps({"reasoning": "because", "edits": list(edits), "changelog": changelog})


def pitfall(text: str) -> dict[str, Any]:
    return {"file": "SKILL.md", "op": "append_to_section", "target_section": "Pitfalls",
            "content": text}


def traces(n: int, score: float = 0.0) -> list[Trace]:
    return [Trace(f"t{i}", f"task {i}", answer="1", label="2", outcome="answered", score=score)
            for i in range(n)]


def skill_md(patch: Any) -> str:
    return patch.changes["skills/word-math/SKILL.md"]


@pytest.mark.parametrize("n,shape", [
    (1, []), (5, [[5]]), (6, [[5, 1], [2]]),
    (26, [[5, 5, 5, 5, 5, 1], [5, 1], [2]]),
])
def test_merge_tree_shape(n: int, shape: list[list[int]]) -> None:
    assert merge_tree_shape(n) == shape


def test_merge_tree_never_exceeds_five_levels() -> None:
    levels = merge_tree_shape(10_000)
    assert len(levels) == 5 and len(levels[-1]) == 1


def test_map_reduce_apply_gives_the_expected_skill() -> None:
    analyst = ScriptedBackend(responder=lambda r: reply(pitfall("- Convert units first.")))
    t2s = Trace2Skill(Trace2SkillConfig("word-math"))
    patch = t2s.fit(traces(3), LIB, analyst)
    md = skill_md(patch)
    # Three analysts said the same thing: one line, supported by all three traces.
    assert md.count("- Convert units first.") == 1
    assert md.endswith("## Pitfalls\n- Convert units first.\n")
    edit = patch.details["patch"]["edits"][0]
    assert sorted(edit["support"]) == ["t0", "t1", "t2"]
    assert patch.details["report"]["folded"] == 2
    assert patch.costs["analyst_calls"] == 3


def test_failure_and_success_analysts_get_their_prompts() -> None:
    analyst = ScriptedBackend(responder=lambda r: reply())
    ts = [Trace("bad", "q1", answer="5", label="7", outcome="answered", score=0.0),
          Trace("good", "q2", answer="7", label="7", outcome="answered", score=1.0)]
    Trace2Skill(Trace2SkillConfig("word-math")).fit(ts, LIB, analyst)
    prompts = {r.messages[1].text.split("\n")[-1][:30]: r for r in analyst.requests}
    users = [r.messages[1].text for r in analyst.requests]
    failure = next(u for u in users if "q1" in u)
    success = next(u for u in users if "q2" in u)
    assert "This run FAILED" in failure and "root cause" in failure and "expected answer was: 7" in failure
    assert "This run SUCCEEDED" in success and "what worked" in success
    assert "## Pitfalls" in failure  # the current skill is shown
    assert all(r.temperature == 0.3 for r in analyst.requests)
    assert prompts


def test_contradictions_are_won_by_the_better_supported_edit() -> None:
    replace = lambda text: {"file": "SKILL.md", "op": "replace_in_section",
                            "target_section": "Procedure",
                            "target_text": "2. Work step by step; use a tool for exact arithmetic.",
                            "content": text}
    keep = "2. Work step by step and use the calculator for every multiplication."
    lose = "2. Do the arithmetic in your head."
    answers = iter([reply(replace(keep)), reply(replace(lose)), reply(replace(keep))])
    analyst = ScriptedBackend(responder=lambda r: next(answers))
    patch = Trace2Skill(Trace2SkillConfig("word-math", workers=1)).fit(traces(3), LIB, analyst)
    md = skill_md(patch)
    assert keep in md and lose not in md
    assert patch.details["report"]["conflicts_resolved"] == 1


def test_inserts_at_the_same_place_both_land_in_order() -> None:
    a = SkillPatch((Edit("SKILL.md", "append_to_section", "Pitfalls", content="- A", support=("t1",)),))
    b = SkillPatch((Edit("SKILL.md", "append_to_section", "Pitfalls", content="- B", support=("t2",)),))
    merged = merge_group([a, b], BASE)
    assert [e.support for e in merged.edits] == [("t1",), ("t2",)]
    assert apply_patch(BASE, merged)[0]["SKILL.md"].endswith("## Pitfalls\n- A\n- B\n")


def test_delete_section_loses_to_better_supported_edits_inside_it() -> None:
    keep = Edit("SKILL.md", "append_to_section", "Pitfalls", content="- keep", support=("a", "b"))
    drop = Edit("SKILL.md", "delete_section", "Pitfalls", support=("c",))
    merged = merge_group([SkillPatch((drop,)), SkillPatch((keep,))], BASE)
    assert merged.edits == (keep,)


def test_reduce_over_26_patches_keeps_every_trace_id() -> None:
    patches = [SkillPatch((Edit("SKILL.md", "append_to_section", "Pitfalls",
                                content=f"- lesson {i % 4}", support=(f"t{i}",)),),
                          support=(f"t{i}",)) for i in range(26)]
    merged = reduce_patches(patches, BASE)
    files, failed = apply_patch(BASE, merged)
    assert not failed
    for i in range(4):
        assert files["SKILL.md"].count(f"- lesson {i}") == 1
    assert sorted(merged.support) == sorted(f"t{i}" for i in range(26))
    everyone = sorted(s for e in merged.edits for s in e.support)
    assert everyone == sorted(f"t{i}" for i in range(26))


def test_malformed_reply_is_retried_with_the_error_then_dropped_and_counted() -> None:
    answers = iter(["here you go: {not json", reply(pitfall("- fixed")),  # trace 0: retry ok
                    "nope", "still nope"])  # trace 1: dropped
    analyst = ScriptedBackend(responder=lambda r: next(answers))
    t2s = Trace2Skill(Trace2SkillConfig("word-math", workers=1))
    patch = t2s.fit(traces(2), LIB, analyst)
    report = patch.details["report"]
    assert report["map"]["retries"] == 2 and report["map"]["dropped"] == 1
    assert report["map_patches"] == 1 and "- fixed" in skill_md(patch)
    retry = analyst.requests[1].messages
    assert retry[-2].role == "assistant" and retry[-2].text == "here you go: {not json"
    assert "could not be used" in retry[-1].text and "JSON" in retry[-1].text
    assert "raw reply: still nope" in report["map"]["errors"][0]


def test_missing_anchor_is_retried_too() -> None:
    answers = iter([reply(pitfall("- x") | {"target_section": "Mistakes"}),
                    reply(pitfall("- y"))])
    analyst = ScriptedBackend(responder=lambda r: next(answers))
    patch = Trace2Skill(Trace2SkillConfig("word-math")).fit(traces(1), LIB, analyst)
    assert "section 'Mistakes' not found" in analyst.requests[1].messages[-1].text
    assert "- y" in skill_md(patch)


def test_sequential_baseline_sees_each_previous_edit() -> None:
    answers = iter([reply(pitfall("- first")), reply(pitfall("- second"))])
    analyst = ScriptedBackend(responder=lambda r: next(answers))
    patch = Trace2Skill(Trace2SkillConfig("word-math", sequential=True)).fit(traces(2), LIB, analyst)
    assert "- first" in analyst.requests[1].messages[1].text  # the 2nd analyst saw the 1st edit
    assert skill_md(patch).endswith("- first\n- second\n")
    assert patch.details["mode"] == "sequential"


def test_new_reference_and_its_link_stay_together() -> None:
    create = {"file": "references/units.md", "op": "create", "content": "# Units\n1 h = 60 min"}
    analyst = ScriptedBackend(responder=lambda r: reply(create))
    patch = Trace2Skill(Trace2SkillConfig("word-math")).fit(traces(1), LIB, analyst)
    assert patch.changes["skills/word-math/references/units.md"].startswith("# Units")
    assert "(references/units.md)" in skill_md(patch)  # linked automatically

    dangling = pitfall("- See references/tables.md for conversions.")
    analyst = ScriptedBackend(responder=lambda r: reply(dangling))
    patch = Trace2Skill(Trace2SkillConfig("word-math")).fit(traces(1), LIB, analyst)
    assert patch.changes == {}  # the only edit linked a missing file, so it was dropped
    assert any("missing references/tables.md" in d for d in patch.details["report"]["limit_drops"])


def test_skill_md_stays_under_500_lines() -> None:
    big = "\n".join(f"- line {i}" for i in range(300))
    other = "\n".join(f"* step {i} of the other list" for i in range(1000, 1300))
    answers = iter([reply(pitfall(big)), reply(pitfall(other))])
    analyst = ScriptedBackend(responder=lambda r: next(answers))
    patch = Trace2Skill(Trace2SkillConfig("word-math", workers=1)).fit(traces(2), LIB, analyst)
    assert len(skill_md(patch).splitlines()) <= 500
    assert any("under 500 lines" in d for d in patch.details["report"]["limit_drops"])


def test_missing_skill_needs_create_and_no_traces_is_an_error() -> None:
    analyst = ScriptedBackend(responder=lambda r: reply())
    with pytest.raises(ConfigError, match="not in the library"):
        Trace2Skill(Trace2SkillConfig("other")).fit(traces(1), LIB, analyst)
    with pytest.raises(ConfigError, match="no traces"):
        Trace2Skill(Trace2SkillConfig("word-math")).fit([], LIB, analyst)


def test_create_mode_starts_from_a_draft() -> None:
    analyst = ScriptedBackend(responder=lambda r: reply(pitfall("- new")))
    patch = Trace2Skill(Trace2SkillConfig("fresh-skill", create=True,
                                          description="Fresh lessons.")).fit(traces(1), {}, analyst)
    md = patch.changes["skills/fresh-skill/SKILL.md"]
    assert md.startswith('---\nname: fresh-skill\ndescription: "Fresh lessons."')
    assert patch.details["created"] is True


class _Concurrency(ScriptedBackend):
    """Counts how many analyst calls are in flight at once."""

    def __init__(self) -> None:
        super().__init__(responder=lambda r: reply())
        self.in_flight = 0
        self.peak = 0

    async def acomplete(self, request: Request) -> Any:
        import asyncio

        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        return self.complete(request)


@pytest.mark.parametrize("workers", [1, 4])
def test_map_keeps_exactly_workers_calls_in_flight(workers: int) -> None:
    analyst = _Concurrency()
    Trace2Skill(Trace2SkillConfig("word-math", workers=workers)).fit(traces(12), LIB, analyst)
    assert analyst.peak == workers and len(analyst.requests) == 12


def test_batches_put_several_traces_in_one_call() -> None:
    analyst = ScriptedBackend(responder=lambda r: reply(pitfall("- batch lesson")))
    patch = Trace2Skill(Trace2SkillConfig("word-math", batch_size=3)).fit(traces(6), LIB, analyst)
    assert len(analyst.requests) == 2
    assert "### Run 3: FAILED" in analyst.requests[0].messages[1].text
    assert sorted(patch.details["patch"]["edits"][0]["support"]) == [f"t{i}" for i in range(6)]


def _deterministic(request: Request) -> str:
    # The reply depends only on the prompt, so any executor must give the same patch.
    user = request.messages[1].text
    n = sum(map(ord, user)) % 3
    return reply(pitfall(f"- lesson {n}"))


def test_ray_executor_gives_the_same_result_as_asyncio() -> None:
    ray = pytest.importorskip("ray", reason="optional extra: pip install 'whetstone-engine[ray]'")
    import sys

    # Ray workers cannot import this test module; ship its functions by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ts = traces(6)
    local = Trace2Skill(Trace2SkillConfig("word-math", workers=2)).fit(
        ts, LIB, ScriptedBackend(responder=_deterministic))
    on_ray = Trace2Skill(Trace2SkillConfig("word-math", workers=2, executor="ray")).fit(
        ts, LIB, ScriptedBackend(responder=_deterministic))
    assert on_ray.changes == local.changes
    assert on_ray.details["patch"] == local.details["patch"]
    assert on_ray.costs["analyst_calls"] == local.costs["analyst_calls"] == 6


NESTED = {"SKILL.md": "---\nname: word-math\ndescription: d\n---\n\n# Word math\n\n"
                      "## Method\n- Read twice.\n\n### Units\n- Convert first.\n"}


def test_an_append_and_a_delete_of_the_last_subsection_both_survive() -> None:
    # The append lands in Method's own text, before ### Units, so deleting Units keeps it.
    add = Edit("SKILL.md", "append_to_section", "Method", content="- Check the sign.",
               support=("t1",))
    drop = Edit("SKILL.md", "delete_section", "Units", support=("t2",))
    merged = merge_group([SkillPatch((add,)), SkillPatch((drop,))], NESTED)
    assert len(merged.edits) == 2
    md, failed = apply_patch(NESTED, merged)
    assert not failed and "- Check the sign." in md["SKILL.md"]
    assert "Units" not in md["SKILL.md"]
    assert md["SKILL.md"].index("- Read twice.") < md["SKILL.md"].index("- Check the sign.")


def test_edits_on_what_the_same_patch_adds_are_folded_not_dropped() -> None:
    patch = SkillPatch((
        Edit("SKILL.md", "add_section", "Examples", content="- 2 + 2 = 4", support=("t1",)),
        Edit("SKILL.md", "append_to_section", "Examples", content="- 3 * 3 = 9",
             support=("t1",)),
        Edit("references/tables.md", "create", content="# Tables\n", support=("t1",)),
        Edit("references/tables.md", "append_to_section", "Tables", content="7 x 8 = 56",
             support=("t1",)),
    ), support=("t1",))
    merged = reduce_patches([patch], BASE)
    assert [e.op for e in merged.edits] == ["add_section", "create"]
    files, failed = apply_patch(BASE, merged)
    assert not failed
    assert files["SKILL.md"].rstrip().endswith("## Examples\n\n- 2 + 2 = 4\n- 3 * 3 = 9")
    assert files["references/tables.md"] == "# Tables\n7 x 8 = 56\n"


def test_sequential_does_not_pile_up_copies_of_one_lesson() -> None:
    analyst = ScriptedBackend(responder=lambda r: reply(pitfall("- Use the calculator.")))
    patch = Trace2Skill(Trace2SkillConfig("word-math", sequential=True)).fit(
        traces(3), LIB, analyst)
    assert skill_md(patch).count("- Use the calculator.") == 1
    assert patch.details["report"]["map"]["dropped"] == 2  # told "already says this", then dropped


def test_a_created_skill_whose_description_holds_a_colon_is_valid() -> None:
    from whetstone.engine.methods.trace2skill.evolver import draft_skill
    from whetstone.skills.format import parse_skill_md

    desc = "Grade-school math word problems: compute the numeric answer."
    parsed = parse_skill_md(draft_skill("word-math", desc)["SKILL.md"])
    assert not parsed.problems, parsed.problems
    assert parsed.skill is not None and parsed.skill.description == desc
