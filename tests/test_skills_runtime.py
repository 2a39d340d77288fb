"""The library in the runtime: skills retrieved into the prompt, read_skill, and the trace."""

from __future__ import annotations

from pathlib import Path

from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.library_store.store import Library

UNITS = """---
name: unit-conversion
description: Convert between units (hours, minutes, metres, kilometres) in word problems.
---

# Unit conversion

## Procedure
1. Write every quantity with its unit.
2. Convert to one unit before adding.
"""

COOKING = """---
name: baking-recipes
description: Scale baking recipes up or down by servings.
---

# Baking

Multiply every ingredient by new servings / old servings.
"""


def library_with_skills(path: Path) -> Library:
    lib = Library.open(path, create=True)
    lib.commit({"skills/unit-conversion/SKILL.md": UNITS,
                "skills/unit-conversion/references/table.md": "1 h = 60 min\n",
                "skills/baking-recipes/SKILL.md": COOKING}, method="test", message="two skills")
    return lib


def test_skills_are_retrieved_into_the_system_prompt_and_recorded(tmp_path: Path) -> None:
    lib = library_with_skills(tmp_path / "lib")
    backend = ScriptedBackend([
        'Action: read_skill[{"name": "unit-conversion", "file": "references/table.md"}]',
        "Final Answer: 150 minutes",
    ])
    engine = Engine(backend, library=lib.root, checkpointing=False)
    trace = engine.run("How many minutes are 2.5 hours?")
    system = backend.requests[0].messages[0].text
    assert "# Skills" in system and "- unit-conversion: Convert between units" in system
    # The unrelated skill scores under the floor (SkillsConfig.min_score): it is not shown,
    # but the retrieval records it with its score.
    assert "baking-recipes" not in system
    scores = dict(trace.meta["skills"]["matches"])
    assert scores["unit-conversion"] >= 0.25 > scores.get("baking-recipes", 0.0)
    assert "## Skill: unit-conversion" in system  # the best match's body is included
    assert "read_skill" in system  # a skill was shown, so the tool is offered and listed
    # read_skill opened the reference file from the same version.
    assert backend.requests[1].messages[-1].text.strip() == "Observation: 1 h = 60 min"
    skills = trace.meta["skills"]
    assert skills["version"] == "v2" and trace.library_version == "v2"
    assert skills["shown"][0] == "unit-conversion"
    assert "unit-conversion" in skills["with_body"]
    assert skills["opened"] == ["unit-conversion/references/table.md"]
    assert engine.traces.get(trace.id).meta["skills"]["opened"] == skills["opened"]


def test_a_pinned_version_is_used_even_after_the_library_moves(tmp_path: Path) -> None:
    lib = library_with_skills(tmp_path / "lib")
    lib.commit({"skills/baking-recipes/SKILL.md": None}, method="test", message="drop baking")
    backend = ScriptedBackend(["Final Answer: ok", "Final Answer: ok"])
    old = Engine(backend, library=lib.root, version="v2", checkpointing=False).run("bake bread")
    new = Engine(backend, library=lib.root, checkpointing=False).run("bake bread")
    assert "baking-recipes" in old.meta["skills"]["shown"] and old.library_version == "v2"
    assert "baking-recipes" not in new.meta["skills"]["shown"] and new.library_version == "v3"


def test_read_skill_errors_are_observations_listing_what_exists(tmp_path: Path) -> None:
    lib = library_with_skills(tmp_path / "lib")
    backend = ScriptedBackend(["Action: read_skill[unit-conversions]", "Final Answer: x"])
    trace = Engine(backend, library=lib.root, checkpointing=False).run("convert hours")
    obs = trace.steps[2].output["observation"]
    assert "no skill named 'unit-conversions'" in obs and "unit-conversion" in obs
    assert trace.meta["skills"]["opened"] == []


def test_empty_library_adds_no_skills_section(tmp_path: Path) -> None:
    backend = ScriptedBackend(["Final Answer: 4"])
    trace = Engine(backend, library=tmp_path / "empty", create=True, checkpointing=False).run("2+2")
    assert "# Skills" not in backend.requests[0].messages[0].text
    assert trace.library_version == "v1" and trace.meta["skills"]["shown"] == []


def test_unrelated_skills_are_not_shown_and_read_skill_is_not_offered(tmp_path: Path) -> None:
    lib = library_with_skills(tmp_path / "lib")
    backend = ScriptedBackend(['{"name": "read_skill", "arguments": {"name": "baking-recipes"}}',
                               "Shakespeare."], tool_calls=True)
    engine = Engine(backend, library=lib.root, checkpointing=False,
                    methods=[("skills", {"min_score": 0.2})])  # a relevance floor
    trace = engine.run("Who wrote Hamlet?")
    system = backend.requests[0].messages[0].text
    assert "# Skills" not in system and "read_skill" not in system
    assert trace.meta["skills"]["shown"] == [] and trace.steps[0].output["tools"] == [
        "calculator", "python"]
    # A call to it anyway is an error the model sees, not an answer.
    assert "unknown tool 'read_skill'" in trace.steps[2].error
    assert trace.answer == "Shakespeare."


def test_no_skills_switch(tmp_path: Path) -> None:
    lib = library_with_skills(tmp_path / "lib")
    backend = ScriptedBackend(["Final Answer: ok"])
    Engine(backend, library=lib.root, skills=False, checkpointing=False).run("convert hours")
    assert "# Skills" not in backend.requests[0].messages[0].text
