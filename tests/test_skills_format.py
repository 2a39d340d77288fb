"""SKILL.md parsing, validation (file, line, rule) and byte-exact rendering."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from whetstone.engine.types import Skill
from whetstone.skills.format import check_name, parse_skill_md, render_skill_md
from whetstone.skills.loader import check_skill_files

FIXTURES = Path(__file__).parent / "fixtures" / "skills"
GOOD = "---\nname: csv-tool\ndescription: Clean CSV files. Use when data is messy.\n---\n\n# Body\n"


def rules(text: str, folder: str | None = None) -> list[tuple[str, int | None]]:
    return [(p.rule, p.line) for p in parse_skill_md(text, path="x/SKILL.md",
                                                     folder=folder).problems]


def test_a_valid_skill_parses_into_its_fields() -> None:
    text = ("---\nname: csv-tool\ndescription: Clean CSV files.\nlicense: MIT\n"
            "compatibility: Python 3.10+\nmetadata:\n  author: me\n  version: \"2\"\n"
            "allowed-tools: Bash Read\n---\n\n# Title\n\nBody line.\n")
    parsed = parse_skill_md(text, folder="csv-tool")
    assert parsed.ok
    s = parsed.skill
    assert (s.name, s.description, s.license, s.compatibility) == (
        "csv-tool", "Clean CSV files.", "MIT", "Python 3.10+")
    assert s.metadata == {"author": "me", "version": "2"}
    assert s.allowed_tools == "Bash Read"
    assert s.body == "# Title\n\nBody line.\n"  # one blank line after '---' is layout


@pytest.mark.parametrize("name,rule", [
    ("Bad_Name", "name-format"), ("-lead", "name-format"), ("trail-", "name-format"),
    ("dou--ble", "name-format"), ("x" * 65, "name-length"), ("", "name-missing"),
])
def test_name_rules(name: str, rule: str) -> None:
    text = f"---\nname: '{name}'\ndescription: d\n---\nbody\n"
    assert (rule, 2) in rules(text)


def test_name_must_match_the_folder() -> None:
    assert rules(GOOD, folder="other") == [("name-folder", 2)]
    assert rules(GOOD, folder="csv-tool") == []


def test_description_rules_name_the_line() -> None:
    long = "x" * 1025
    assert rules(f"---\nname: a\nlicense: MIT\ndescription: {long}\n---\n") == [
        ("description-length", 4)]
    assert rules("---\nname: a\n---\n") == [("description-missing", 1)]
    assert rules("---\nname: a\ndescription: ''\n---\n") == [("description-type", 3)]
    assert rules("---\nname: a\ndescription: " + "x" * 1024 + "\n---\n") == []


def test_optional_fields_are_checked() -> None:
    assert ("compatibility-length", 4) in rules(
        "---\nname: a\ndescription: d\ncompatibility: " + "c" * 501 + "\n---\n")
    assert ("metadata-type", 4) in rules(
        "---\nname: a\ndescription: d\nmetadata:\n  version: 1.0\n---\n")
    assert ("unknown-field", 4) in rules("---\nname: a\ndescription: d\nversion: 3\n---\n")
    assert ("license-type", 4) in rules("---\nname: a\ndescription: d\nlicense: [a]\n---\n")
    assert ("duplicate-field", 4) in rules("---\nname: a\ndescription: d\nname: a\n---\n")


def test_a_trailing_newline_in_a_name_and_an_empty_compatibility_are_rejected() -> None:
    assert [e.rule for e in check_name("demo\n", path="p", line=None, folder="demo\n")] == [
        "name-format"]
    assert ("name-format", 2) in rules('---\nname: "demo\\n"\ndescription: d\n---\nbody\n')
    assert rules('---\nname: a\ndescription: d\ncompatibility: ""\n---\n') == [
        ("compatibility-empty", 4)]
    assert rules("---\nname: a\ndescription: d\ncompatibility: c\n---\n") == []


def test_front_matter_must_open_and_close() -> None:
    assert rules("# no front matter\n") == [("front-matter", 1)]
    assert rules("---\nname: a\ndescription: d\n") == [("front-matter", 1)]
    assert rules("---\n- a list\n---\n") == [("front-matter", 2)]


def test_bad_yaml_reports_the_line_of_the_problem() -> None:
    parsed = parse_skill_md("---\nname: a\ndescription: d\nlicense: [MIT\n---\nbody\n",
                            path="s/SKILL.md")
    (err,) = parsed.problems
    assert err.rule == "yaml" and err.path == "s/SKILL.md" and err.line in (4, 5)
    assert parsed.skill is None


def test_body_over_500_lines_is_rejected_at_line_501_of_the_body() -> None:
    body = "".join(f"line {i}\n" for i in range(501))
    text = "---\nname: a\ndescription: d\n---\n\n" + body
    assert rules(text) == [("body-length", 6 + 500)]
    assert rules("---\nname: a\ndescription: d\n---\n\n" + body[len("line 0\n"):]) == []


def test_malformed_fixture_files_name_file_line_and_rule() -> None:
    expected = {
        "bad-yaml": ("yaml", 5), "missing-name": ("name-missing", 1),
        "wrong-folder": ("name-folder", 2), "long-description": ("description-length", 3),
        "long-body": ("body-length", 506),
    }
    for folder, (rule, line) in expected.items():
        path = FIXTURES / "malformed" / folder / "SKILL.md"
        parsed = parse_skill_md(path.read_text(), path=str(path), folder=folder)
        assert [(p.rule, p.line) for p in parsed.problems] == [(rule, line)], folder
        assert str(path) in str(parsed.problems[0]) and f"[{rule}]" in str(parsed.problems[0])


def test_folder_rules_for_bundled_files() -> None:
    files = {
        "SKILL.md": GOOD.encode(),
        "references/ok.md": b"short\n",
        "references/long.md": b"x\n" * 301,
        "references/deep/inner.md": b"x\n",
        "scripts/tool.py": b"print(1)\n",
        "templates/t.txt": b"t",
        "LICENSE.txt": b"MIT",
    }
    _, problems = check_skill_files("csv-tool", files, base="skills/csv-tool")
    got = sorted((p.rule, p.path) for p in problems)
    assert got == [
        ("layout", "skills/csv-tool/templates/t.txt"),
        ("nesting", "skills/csv-tool/references/deep/inner.md"),
        ("reference-length", "skills/csv-tool/references/long.md"),
    ]
    _, missing = check_skill_files("csv-tool", {"scripts/a.py": b""}, base="skills/csv-tool")
    assert [p.rule for p in missing] == ["skill-md-missing"]


def test_rendering_the_unchanged_skill_returns_the_original_bytes() -> None:
    for path in sorted((FIXTURES / "library").glob("*/SKILL.md")):
        original = path.read_bytes().decode("utf-8")
        parsed = parse_skill_md(original, folder=path.parent.name)
        assert parsed.ok, parsed.problems
        assert render_skill_md(parsed.skill, original=original) == original


def test_changing_the_body_keeps_the_front_matter_bytes() -> None:
    original = (FIXTURES / "library" / "markdown-tables" / "SKILL.md").read_text()
    skill = parse_skill_md(original).skill
    out = render_skill_md(replace(skill, body="# New body\n"), original=original)
    head = original[:original.index("# Markdown tables")]
    assert out == head + "# New body\n"
    assert parse_skill_md(out).skill.body == "# New body\n"


def test_changing_one_field_rewrites_only_its_lines() -> None:
    original = (FIXTURES / "library" / "markdown-tables" / "SKILL.md").read_text()
    skill = parse_skill_md(original).skill
    changed = replace(skill, metadata={"score": "0.8"}, license="MIT")
    out = render_skill_md(changed, original=original)
    assert "# hand-written for the README work\n" in out  # the comment survives
    assert out.split("description:")[1].split("\n---")[0].startswith(
        original.split("description:")[1].split("\nmetadata")[0].split("\n---")[0])
    reparsed = parse_skill_md(out, folder="markdown-tables")
    assert reparsed.ok and reparsed.skill == changed
    assert out.endswith(skill.body)


def test_a_new_skill_renders_and_parses_back_to_itself() -> None:
    # names, not uses: trace2skill
    skill = Skill(name="new-one", description="Does: things, with 'quotes' and # hashes",
                  body="# New\n\nText.\n", metadata={"origin": "trace2skill"},
                  allowed_tools="Read")
    text = render_skill_md(skill)
    assert text.startswith("---\nname: new-one\n")
    assert parse_skill_md(text, folder="new-one").skill == skill


def test_crlf_files_parse_and_round_trip() -> None:
    original = (FIXTURES / "library" / "timezone-conversion" / "SKILL.md").read_bytes()
    assert b"\r\n" in original
    text = original.decode("utf-8")
    parsed = parse_skill_md(text, folder="timezone-conversion")
    assert parsed.ok and parsed.skill.body.startswith("# Time zone conversion\r\n")
    assert render_skill_md(parsed.skill, original=text).encode("utf-8") == original
