"""Tools that read the task themselves (``Annotated[str, "task"]``) and whose output is the
answer (``-> Annotated[str, "answer"]``): the schema the model sees, the runtime filling the
task in, and a run that ends with the tool's verified output."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.evaluation.tasks import TaskRecord
from whetstone.library_store.store import Library
from whetstone.tools.base import Tool, Toolbox
from whetstone.tools.learned import define_tool

SORT = textwrap.dedent('''
    from typing import Annotated

    def sort_words(question: Annotated[str, "task"], sep: str = " ") -> Annotated[str, "answer"]:
        """Sort the words listed in the task alphabetically.

        Args:
            question: the task text.
            sep: what goes between the words.
        """
        return sep.join(sorted(question.split("List:", 1)[1].split()))
''')
SKILL = """---
name: word-sorting
description: Sort a list of words alphabetically. Use when a task asks to sort words.
---

# Word sorting

Call `sort_words`: it reads the task itself. Its result is the answer.
"""
TASK = "Sort the following words alphabetically:\nList: pear apple fig"


def test_a_task_parameter_is_hidden_from_the_model_and_marked_for_the_runtime() -> None:
    definition, problems = define_tool(SORT, name="sort_words", skill="word-sorting")
    assert problems == [] and definition is not None
    spec = definition.spec
    assert spec.inject == {"question": "task"} and spec.returns_answer is True
    assert set(spec.parameters["properties"]) == {"sep"}
    assert spec.parameters["required"] == []
    assert "question" not in str(spec.schema())


@pytest.mark.parametrize("signature,words", [
    ('def t(q: Annotated[str, "image"]) -> str:', "unknown mark 'image'"),
    ('def t(q: Annotated[int, "task"]) -> str:', "the task text is a str"),
    ('def t(q: Annotated[str]) -> str:', "Annotated takes a type and one mark"),
    ('def t(q: str) -> Annotated[str, "final"]:', "unknown mark 'final'"),
])
def test_a_bad_mark_is_refused_with_what_to_write(signature: str, words: str) -> None:
    source = f"from typing import Annotated\n\n{signature}\n    \"\"\"Doc.\"\"\"\n    return ''\n"
    definition, problems = define_tool(source, name="t", skill="s")
    assert definition is None
    assert any(words in p.message for p in problems), [p.message for p in problems]


def test_the_toolbox_fills_the_task_over_what_the_model_wrote() -> None:
    definition, _ = define_tool(SORT, name="sort_words", skill="word-sorting")
    assert definition is not None
    seen: list[dict[str, object]] = []
    box = Toolbox.of([Tool(definition.spec, lambda args: seen.append(dict(args)) or "ok")])
    assert box.call("sort_words", {"question": "made up", "sep": ","}, task=TASK).ok
    assert seen[-1] == {"question": TASK, "sep": ","}
    # Outside a run there is no task to fill: the tool says so (an observation, not a crash).
    box.call("sort_words", {}, task=None)
    assert "question" not in seen[-1]


def test_an_answer_tool_ends_the_run_with_its_output(tmp_path: Path) -> None:
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit({"skills/word-sorting/SKILL.md": SKILL,
                "skills/word-sorting/scripts/sort_words.py": SORT},
               method="test", message="a task tool")
    # The model calls the tool with no arguments; no second model call is needed.
    backend = ScriptedBackend(['<tool_call>{"name": "sort_words", "arguments": {}}</tool_call>'])
    trace = Engine(backend, library=lib.root, checkpointing=False).run(TASK)
    assert trace.answer == "apple fig pear" and trace.outcome == "answered"
    assert len(backend.requests) == 1
    [act] = [s for s in trace.steps if s.kind == "act"]
    assert act.input["tool"] == "sort_words" and not act.error
    # The model saw a tool with no task parameter to copy.
    system = backend.requests[0].messages[0].text
    assert "sort_words(" in system and "question" not in system.split("sort_words(")[1][:20]


EXAMPLES = """# Verified calls

## Example t1

Task: Sort the following words alphabetically: List: stick gelatine

````
<tool_call>{"name": "sort_words", "arguments": {}}</tool_call>
<tool_response>
gelatine stick
</tool_response>
````
"""


def _sorting_library(tmp_path: Path) -> Library:
    lib = Library.open(tmp_path / "lib", create=True)
    lib.commit({"skills/word-sorting/SKILL.md": SKILL,
                "skills/word-sorting/scripts/sort_words.py": SORT,
                "skills/word-sorting/references/examples.md": EXAMPLES},
               method="test", message="a task tool with a verified call")
    return lib


def test_a_task_like_a_verified_example_must_call_the_skills_tool(tmp_path: Path) -> None:
    """The first decision is prefilled up to the tool's arguments (tool_choice naming it) when
    the task is close to one the tool was verified on; the model only closes the call."""
    lib = _sorting_library(tmp_path)
    backend = ScriptedBackend(["}}</tool_call>"], tool_calls=True, prefill=True)
    trace = Engine(backend, library=lib.root, checkpointing=False).run(TASK)
    assert backend.requests[0].prefix == '<tool_call>{"name": "sort_words", "arguments": {'
    assert trace.answer == "apple fig pear"
    assert trace.meta["skills"]["strong"] == ["word-sorting"]
    # A backend that cannot prefill is only offered the tool.
    plain = ScriptedBackend(["apple fig pear"], tool_calls=True)
    Engine(plain, library=lib.root, checkpointing=False).run(TASK)
    assert plain.requests[0].prefix == ""


def test_an_unlike_task_or_a_later_decision_is_not_forced(tmp_path: Path) -> None:
    lib = _sorting_library(tmp_path)
    backend = ScriptedBackend(["Final Answer: 4"], tool_calls=True, prefill=True)
    engine = Engine(backend, library=lib.root, checkpointing=False)
    trace = engine.run("What is 2 + 2? Think about the apples.")
    assert backend.requests[0].prefix == "" and "strong" not in trace.meta["skills"]
    # After a forced call fails (the tool cannot read this task), the model decides freely.
    failing = ScriptedBackend(["}}</tool_call>", "Final Answer: none"], tool_calls=True, prefill=True)
    trace = Engine(failing, library=lib.root, checkpointing=False).run(
        "Sort the following words alphabetically: stick gelatine")
    assert failing.requests[0].prefix and failing.requests[1].prefix == ""
    assert trace.answer == "none"
    assert any(s.kind == "act" and s.error for s in trace.steps)
    # require_tool_at=None turns it off.
    off = ScriptedBackend(["apple fig pear"], tool_calls=True, prefill=True)
    Engine(off, library=lib.root, checkpointing=False,
           methods=[("skills", {"require_tool_at": None})]).run(TASK)
    assert off.requests[0].prefix == ""


def test_a_generic_description_is_matched_through_its_examples(tmp_path: Path) -> None:
    """An evolved skill's description is often generic; a task like its verified examples
    still finds it (the skills floor would hide it by its description alone)."""
    lib = Library.open(tmp_path / "lib", create=True)
    vague = "---\nname: lessons\ndescription: Lessons learned for misc tasks.\n---\n\n# Lessons\n"
    lib.commit({"skills/lessons/SKILL.md": vague}, method="test", message="vague")
    backend = ScriptedBackend(["x"] * 2)
    engine = Engine(backend, library=lib.root, checkpointing=False, solver="direct")
    assert engine.solver()(TASK_RECORD, 0).meta["skills"]["shown"] == []
    lib.commit({"skills/lessons/references/examples.md": EXAMPLES}, method="test",
               message="examples")
    trace = engine.solver()(TASK_RECORD, 0)
    assert trace.meta["skills"]["shown"] == ["lessons"]
    assert dict(trace.meta["skills"]["matches"])["lessons"] >= 0.6


TASK_RECORD = TaskRecord(id="s1", question=TASK, expected="apple fig pear", scorer="exact_text")
