"""Core records round-trip through JSON unchanged."""

from __future__ import annotations

import json

from PIL import Image

from whetstone.engine.types import (
    RUNTIME_STEP_KINDS,
    Completion,
    LibraryVersion,
    Message,
    Request,
    Skill,
    Step,
    ToolCall,
    ToolSpec,
    Trace,
)


def roundtrip(obj: object) -> object:
    return type(obj).from_dict(json.loads(json.dumps(obj.to_dict())))  # type: ignore[attr-defined]


def test_every_record_round_trips() -> None:
    # names, not uses: trace2skill
    call = ToolCall("calculator", '{"expression": "1+1"}', "c1")
    msgs = (Message("system", "be brief"), Message("user", "hi"),
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", "2", tool_call_id="c1", name="calculator"))
    records = [
        call, *msgs,
        Request(messages=msgs, max_tokens=9, stop=("x",), seed=3, tools=({"type": "function",
                "function": {"name": "f"}},)),
        Completion("hi", "tool_calls", 3, 4, 0.5, (call,), (-0.1, -0.2), "m"),
        Step("act", "act", {"tool": "calculator"}, {"observation": "2"}, route="think"),
        Trace("t1", "task", (Step("think", "think"),), "4", "4", "answered", 1.0, "v3", "m",
              1.0, 2.0, 10, {"k": [1]}),
        Skill("math-units", "Check units.", "# Body", metadata={"source": "trace2skill"},
              files={"references/a.md": "x"}),
        ToolSpec("crop", "Crop", source="skills/x/scripts/crop.py", skill="x"),
        LibraryVersion("v2", "v1", 1.0, "trace2skill", "msg", {"skills/a/SKILL.md": "ab"}),
    ]
    for r in records:
        assert roundtrip(r) == r, type(r).__name__


def test_a_step_kind_is_open_and_a_trace_of_unknown_kinds_round_trips() -> None:
    """The runtime names only the kinds it writes; a method records steps of its own kinds,
    and a trace holding a kind nobody declares loads unchanged."""
    assert RUNTIME_STEP_KINDS == ("prepare", "think", "act", "observe", "finish")
    trace = Trace("t2", "task", (Step("think", "think"),
                                 Step("tally", "counter_tally", {"n": 2}, {"sum": 5})))
    again = roundtrip(trace)
    assert again == trace and again.steps[1].kind == "tally"  # type: ignore[attr-defined]


def test_openai_dicts_are_accepted_and_images_become_data_urls() -> None:
    req = Request(messages=[{"role": "user", "content": [
        {"type": "text", "text": "what colour?"},
        {"type": "image", "image": Image.new("RGB", (4, 4), "red")}]}])
    m = req.messages[0]
    assert m.text == "what colour?" and len(m.images) == 1
    part = m.to_dict()["content"][1]
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith(
        "data:image/png;base64,")


def test_tool_call_arguments_may_be_a_dict_on_input() -> None:
    call = ToolCall.from_dict({"function": {"name": "f", "arguments": {"a": 1}}})
    assert call.parsed_arguments() == {"a": 1}
