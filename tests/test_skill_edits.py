"""Edit ops on a skill folder: anchors by section and text, never by line number."""

from __future__ import annotations

import pytest

from whetstone.engine.errors import ParseError
from whetstone.engine.methods.trace2skill.edits import (
    Edit,
    EditError,
    SkillPatch,
    apply_edit,
    apply_patch,
    patch_from_json_text,
    sections,
)
from whetstone.engine.replies import extract_json_object

SKILL = """---
name: units
description: Keep units straight in word problems.
---

# Units

## Procedure
1. List every quantity with its unit.
2. Convert to one unit before adding.

## Pitfalls
- Minutes are not hours.

```python
# not a heading
```

### Deep detail
text
"""


def files() -> dict[str, str]:
    return {"SKILL.md": SKILL}


def edited(**kw: str) -> str:
    return apply_edit(files(), Edit(**kw))["SKILL.md"]  # type: ignore[arg-type]


@pytest.mark.trace2skill
def test_sections_skip_front_matter_and_code_fences() -> None:
    titles = [(s.title, s.level) for s in sections(SKILL.split("\n"))]
    assert titles == [("Units", 1), ("Procedure", 2), ("Pitfalls", 2), ("Deep detail", 3)]


@pytest.mark.trace2skill
def test_append_to_section_lands_before_the_next_heading() -> None:
    out = edited(file="SKILL.md", op="append_to_section", target_section="## Procedure",
                 content="3. Check the unit of the answer.")
    assert "2. Convert to one unit before adding.\n3. Check the unit of the answer.\n\n## Pitfalls" in out


@pytest.mark.trace2skill
def test_insert_after_and_before_anchor_on_text() -> None:
    out = edited(file="SKILL.md", op="insert_after", target_text="1. List every quantity",
                 content="   (write them down)")
    assert "1. List every quantity with its unit.\n   (write them down)\n2." in out
    out = edited(file="SKILL.md", op="insert_before", target_section="Pitfalls",
                 target_text="- Minutes are not hours.", content="- Read twice.")
    assert "- Read twice.\n- Minutes are not hours." in out


@pytest.mark.trace2skill
def test_replace_in_section_only_touches_that_section() -> None:
    out = edited(file="SKILL.md", op="replace_in_section", target_section="Pitfalls",
                 target_text="Minutes are not hours.", content="60 minutes make an hour.")
    assert "- 60 minutes make an hour." in out and "Minutes are not hours" not in out
    with pytest.raises(EditError, match="not found"):
        edited(file="SKILL.md", op="replace_in_section", target_section="Procedure",
               target_text="Minutes are not hours.", content="x")


@pytest.mark.trace2skill
def test_whitespace_lenient_anchor() -> None:
    out = edited(file="SKILL.md", op="insert_after", target_text="2.  Convert to one unit  before adding.",
                 content="3. New.")
    assert "before adding.\n3. New." in out


@pytest.mark.trace2skill
def test_add_and_delete_sections() -> None:
    out = edited(file="SKILL.md", op="add_section", target_section="Examples", content="- 2 h = 120 min")
    assert out.endswith("## Examples\n\n- 2 h = 120 min\n")
    with pytest.raises(EditError, match="already exists"):
        edited(file="SKILL.md", op="add_section", target_section="Pitfalls", content="x")
    out = edited(file="SKILL.md", op="delete_section", target_section="Pitfalls")
    # The level-3 heading below Pitfalls belongs to it and goes with it.
    assert "Minutes are not hours" not in out and "Deep detail" not in out
    assert "2. Convert to one unit before adding." in out


@pytest.mark.trace2skill
def test_create_and_delete_files_one_level_deep() -> None:
    out = apply_edit(files(), Edit("references/tables.md", "create", content="# Tables"))
    assert out["references/tables.md"] == "# Tables\n"
    assert "references/tables.md" not in apply_edit(out, Edit("references/tables.md", "delete_file"))
    for bad in ("../x.md", "/etc/passwd", "references/a/b.md", "other/x.md"):
        with pytest.raises(EditError):
            apply_edit(files(), Edit(bad, "create", content="x"))
    with pytest.raises(EditError, match="cannot be deleted"):
        apply_edit(files(), Edit("SKILL.md", "delete_file"))


@pytest.mark.trace2skill
def test_unknown_section_lists_the_real_ones() -> None:
    with pytest.raises(EditError) as err:
        edited(file="SKILL.md", op="append_to_section", target_section="Mistakes", content="x")
    assert "'Pitfalls'" in (err.value.hint or "")


@pytest.mark.trace2skill
def test_shape_errors_name_the_missing_field() -> None:
    for d, msg in [({"op": "explode"}, "unknown op"),
                   ({"op": "insert_after", "content": "x"}, "needs target_text"),
                   ({"op": "append_to_section", "content": "x"}, "needs target_section"),
                   ({"op": "append_to_section", "target_section": "P"}, "needs content")]:
        with pytest.raises(EditError, match=msg):
            Edit.from_dict(d)


@pytest.mark.trace2skill
def test_front_matter_is_never_an_anchor_target() -> None:
    with pytest.raises(EditError, match="not found"):
        edited(file="SKILL.md", op="insert_after", target_text="name: units", content="x: y")


@pytest.mark.trace2skill
def test_json_is_found_in_fences_prose_and_repaired() -> None:
    raw = 'Sure!\n```json\n{"reasoning": "r", "edits": [], "changelog": "c",}\n```'
    assert extract_json_object(raw)["changelog"] == "c"
    raw2 = '{"reasoning": "line one\nline two", "edits": []}'
    assert extract_json_object(raw2)["reasoning"] == "line one\nline two"
    with pytest.raises(ParseError, match="not a JSON object") as err:
        extract_json_object("I think the skill is fine.")
    assert err.value.raw == "I think the skill is fine."  # the raw reply travels with it
    with pytest.raises(ParseError, match="the reply is not a JSON patch"):
        patch_from_json_text("I think the skill is fine.")
    with pytest.raises(EditError, match="no 'edits' list"):
        patch_from_json_text('{"reasoning": "r"}')


@pytest.mark.trace2skill
def test_apply_patch_collects_failures_or_raises_when_strict() -> None:
    patch = SkillPatch(edits=(
        Edit("SKILL.md", "append_to_section", "Pitfalls", content="- ok"),
        Edit("SKILL.md", "append_to_section", "Nope", content="- lost"),
    ))
    out, failed = apply_patch(files(), patch)
    assert "- ok" in out["SKILL.md"] and len(failed) == 1
    with pytest.raises(EditError, match="edit append_to_section on SKILL.md"):
        apply_patch(files(), patch, strict=True)


@pytest.mark.trace2skill
def test_latex_backslashes_that_are_not_json_escapes_are_repaired() -> None:
    # Seen from the embedded 0.5B analyst: "Invalid \escape" on \$ inside a JSON string.
    raw = r'{"reasoning": "7 lemons * \$1.5 = \$10.50", "edits": [], "changelog": "c"}'
    assert extract_json_object(raw)["reasoning"] == r"7 lemons * \$1.5 = \$10.50"


@pytest.mark.trace2skill
def test_support_is_the_analysed_traces_whatever_the_model_wrote() -> None:
    raw = ('{"reasoning": "r", "changelog": "c", "edits": [{"op": "append_to_section", '
           '"target_section": "Pitfalls", "content": "- x", "support": "trace-7"}]}')
    patch = patch_from_json_text(raw, ["20260101-abc"])
    assert patch.edits[0].support == ("20260101-abc",)
    assert patch.support == ("20260101-abc",)
    saved = SkillPatch.from_dict({"edits": [{"op": "append_to_section", "target_section": "P",
                                             "content": "- x", "support": "t-1"}]})
    assert saved.edits[0].support == ("t-1",)  # a saved patch keeps its own; one id, not 3


@pytest.mark.trace2skill
def test_an_insert_the_section_already_says_is_refused() -> None:
    with pytest.raises(EditError, match="already says this"):
        edited(file="SKILL.md", op="append_to_section", target_section="Pitfalls",
               content="- minutes are NOT hours")
    # Partly new content is kept whole.
    md = edited(file="SKILL.md", op="append_to_section", target_section="Pitfalls",
                content="- Minutes are not hours.\n- Days are not weeks.")
    assert md.count("Minutes are not hours") == 2 and "Days are not weeks" in md


@pytest.mark.trace2skill
def test_latex_in_a_json_reply_keeps_its_backslashes() -> None:
    # Seen in the 0.5B analyst's changelogs: "\text" and "\boxed" read as a tab and a
    # backspace ("60 	ext{ m}", "oxed{540}"). Real escapes stay what they are.
    raw = r'{"content": "60 \text{ m} \times 3 = \boxed{180}\nNext\tcell, \\frac kept"}'
    content = extract_json_object(raw)["content"]
    assert content == "60 \\text{ m} \\times 3 = \\boxed{180}\nNext\tcell, \\frac kept"
