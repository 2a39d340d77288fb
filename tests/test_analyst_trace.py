"""``render_trace`` (``whetstone.engine.methods.analyst``): the account of a run the evolvers'
analysts read, including a checking step's result."""

from __future__ import annotations

from whetstone.engine.methods.analyst import render_trace
from whetstone.engine.types import Step, Trace


def test_a_checking_step_is_shown_with_its_kind() -> None:
    """A rubric or verify step with an output reads ``[kind] output``: the template's ``kind``
    placeholder is a keyword like any other (it once clashed with the prompt section's name
    and raised TypeError for every trace with such a step)."""
    # names, not uses: co_react, march
    steps = (Step("think", "agent", output={"text": "17 * 23 = 391"}),
             Step("rubric", "co_react", output={"score": 0.5}),
             Step("verify", "march", output={"claims": 1}))
    text = render_trace(Trace("t1", "What is 17 * 23?", steps, answer="391"))
    assert '[rubric] {"score": 0.5}' in text
    assert '[verify] {"claims": 1}' in text
    assert text.splitlines()[0] == "Task: What is 17 * 23?"
