"""Nothing learned is a label (issue 46, item 6): an evolver's edit that carries a training
task's answer is dropped before the gate, and the decision counts it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.evaluation.tasks import TaskRecord, TaskSet
from whetstone.engine.evolution.leaks import drop_label_leaks, labelled_tasks
from whetstone.engine.methods.base import LibraryPatch

QUESTIONS = [(f"What colour is the {n} gate?", c) for n, c in [
    ("Dorsal", "silver"), ("Kelvin", "amber"), ("Morrow", "crimson"), ("Tallis", "silver"),
    ("Vesper", "amber"), ("Quill", "indigo"), ("Brant", "crimson")]] + \
    [(f"How many doors does the {n} hall have?", d) for n, d in [
        ("Ostrow", 1204), ("Pellam", 377), ("Rundle", 12)]]

SKILL = """---
name: gates
description: Answer questions about gates.
---
# Gates
- Look the gate up by its name before answering.
- Pitfall: The expected answer was: silver.
- The Dorsal gate is silver.
- Colours in use: silver, amber, crimson, indigo.
- A hall of 12 doors is small.
- The Ostrow hall has 1,204 doors.
- Call `halls` with {"name": "Ostrow"} -> {"doors": 1204}
"""

EXAMPLES = """# Examples

## Example t1

Task: What colour is the Dorsal gate?

````
The Dorsal gate is silver.
````

## Example t2

Task: What colour is the Kelvin gate?

````
Its neighbour, the Dorsal gate, is silver; the Kelvin gate is amber.
````
"""


@pytest.mark.trace2skill
@pytest.mark.workflows
def test_lines_that_carry_a_training_answer_are_dropped_and_counted() -> None:
    patch = LibraryPatch("trace2skill", {"skills/gates/SKILL.md": SKILL,
                                         "skills/gates/references/examples.md": EXAMPLES,
                                         "workflows/gates.yaml": "- note: Dorsal gate is silver\n"},
                         "a skill")
    cleaned, leaks = drop_label_leaks(patch, labelled_tasks(QUESTIONS))
    skill = cleaned.changes["skills/gates/SKILL.md"]
    assert "The expected answer was" not in skill  # an answer presented as one
    assert "Dorsal gate is silver" not in skill  # one item's fact
    assert "The Ostrow hall has 1,204 doors" not in skill  # a number with its item
    assert 'Call `halls` with {"name": "Ostrow"}' in skill  # a call that worked, with its result
    assert "Colours in use: silver, amber, crimson, indigo." in skill  # layout, not a fact
    assert "A hall of 12 doors is small." in skill  # 12 is too plain to be a copied answer
    assert "Look the gate up" in skill
    examples = cleaned.changes["skills/gates/references/examples.md"]
    assert "The Dorsal gate is silver." in examples  # a worked example holds its own answer
    assert "the Dorsal gate, is silver" not in examples  # but not another task's
    assert "workflows/gates.yaml" not in cleaned.changes  # structured: refused whole
    assert leaks.total == 5 and leaks.refused == ["workflows/gates.yaml"]
    assert cleaned.details["label_leaks"]["lines_dropped"] == 5


def test_an_examples_own_question_is_kept_when_it_holds_another_tasks_label() -> None:
    """Issue 48's replay: an order status ("placed") in another order's question beside
    "Answer as" read as a leak, and the dropped Task line broke the memory file."""
    questions = [("Where does order 45603 stand right now: what is its status?", "placed"),
                 ("On what date was order 43073 placed? Answer as YYYY-MM-DD.", "2022-10-22")]
    memory = ("# Memory\n\n## Example t1\n\nTask: On what date was order 43073 placed? Answer "
              "as YYYY-MM-DD.\n\n````\n2022-10-22\n````\n")
    cleaned, leaks = drop_label_leaks(LibraryPatch("memory", {"memory/m.md": memory}, "m"),
                                      labelled_tasks(questions))
    assert cleaned.changes["memory/m.md"] == memory and leaks.total == 0


@pytest.mark.workflows
def test_a_label_inside_a_name_is_the_layout_not_a_leak() -> None:
    """The ledger's order-date workflow reads the column ``placed_day``; "placed" is an order
    status (another task's label), and the file was refused whole for its ``answer:`` line."""
    questions = [("What is the status of order 44853?", "placed"),
                 ("When was order 43073 placed? Answer as YYYY-MM-DD.", "2022-10-22")]
    flows = ("workflows:\n- name: placed_day_of_order_no\n  steps:\n  - tool: q\n"
             "    arguments: {query: 'SELECT placed_day FROM order_head WHERE order_no = "
             "{order_no}'}\n  answer: {kind: key, key: placed_day, convert: 'date:days'}\n")
    tasks = labelled_tasks(questions)
    cleaned, leaks = drop_label_leaks(LibraryPatch("workflows", {"workflows/l.yaml": flows},
                                                   "w"), tasks)
    assert cleaned.changes["workflows/l.yaml"] == flows and leaks.total == 0
    # the label standing as a value is still one
    leaking = flows.replace("key: placed_day", "key: st, expected: placed")
    _, leaks = drop_label_leaks(LibraryPatch("workflows", {"workflows/l.yaml": leaking}, "w"),
                                tasks)
    assert leaks.refused == ["workflows/l.yaml"]


class Copier:
    """An evolver that writes what a small analyst wrote: one run's answer, as a pitfall."""

    name = "copier"
    config_class = dict

    def __init__(self) -> None:
        self.config: dict[str, str] = {}

    def fit(self, traces: Any, library: Any, analyst: Any, labels: Any = None, *,
            context: Any = None) -> LibraryPatch:
        return LibraryPatch("copier", {"skills/gates/SKILL.md": SKILL}, "gates skill")


def test_evolve_drops_a_copied_label_before_the_gate_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from whetstone.engine.commands.evolve import _print

    train = TaskSet("gates", tuple(TaskRecord(f"t{i}", q, expected=a) for i, (q, a)
                                   in enumerate(QUESTIONS)))
    gate = TaskSet("gates-dev", (TaskRecord("d0", "What colour is the Zeller gate?",
                                            expected="white"),))
    engine = Engine(model=ScriptedBackend(responder=lambda r: "I do not know."),
                    library=tmp_path / "lib", create=True, tools=[])
    result = engine.evolve(Copier(), tasks=train, gate_tasks=gate, dry_run=True)
    assert result.patch.details["label_leaks"]["lines_dropped"] == 3
    assert "silver" not in result.diff.split("Colours in use")[0]
    _print(result, show_diff=False)
    out = capsys.readouterr().out
    assert "label leaks: 3 line(s) that held a training answer dropped" in out
    assert "The expected answer was: silver" in out  # the person sees what was dropped
