"""Import and export of hand-written skills, loading with problems, and the skill scaffold."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from whetstone.engine.errors import ConfigError, NotFound, ValidationError
from whetstone.library_store.store import Library
from whetstone.skills.format import parse_skill_md
from whetstone.skills.loader import load_skill, load_skills, skill_changes, validate_snapshot
from whetstone.skills.transfer import (
    export_skills,
    import_skills,
    new_skill_changes,
    scaffold_skill,
)

FIXTURES = Path(__file__).parent / "fixtures" / "skills"


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def lib(tmp_path: Path) -> Library:
    return Library.init(tmp_path / "lib")


def test_import_then_export_gives_byte_identical_files_that_pass_the_rules(
        lib: Library, tmp_path: Path) -> None:
    report = import_skills(lib, FIXTURES / "library")
    assert report.version is not None and len(report.imported) == 34 and not report.skipped
    out, problems = export_skills(lib, tmp_path / "export")
    assert problems == []
    assert files_of(out) == files_of(FIXTURES / "library")
    # The exported folder is itself importable with nothing to change.
    again = import_skills(lib, out)
    assert again.version is None and len(again.unchanged) == 34


def test_export_to_an_archive_and_import_it_back(lib: Library, tmp_path: Path) -> None:
    import_skills(lib, FIXTURES / "library")
    archive, problems = export_skills(lib, tmp_path / "skills.tar.gz")
    assert problems == []
    other = Library.init(tmp_path / "other")
    report = import_skills(other, archive)
    assert len(report.imported) == 34
    assert other.version(files=True).files == lib.version(files=True).files


def test_malformed_skills_are_reported_and_skipped_while_the_rest_imports(lib: Library) -> None:
    report = import_skills(lib, FIXTURES / "malformed")
    assert sorted(report.imported) == ["good-one", "good-two"]
    got = sorted((Path(e.path).parent.name, e.rule, e.line) for e in report.skipped)
    assert got == [("bad-yaml", "yaml", 5), ("long-body", "body-length", 506),
                   ("long-description", "description-length", 3),
                   ("missing-name", "name-missing", 1), ("wrong-folder", "name-folder", 2)]
    assert lib.snapshot().children("skills") == ["good-one", "good-two"]


def test_strict_import_rejects_everything(lib: Library) -> None:
    with pytest.raises(ValidationError) as exc:
        import_skills(lib, FIXTURES / "malformed", strict=True)
    assert len(exc.value.problems) == 5
    assert lib.current_id() == "v1"


def test_loading_a_version_with_broken_skills_reports_them_and_loads_the_rest(
        lib: Library) -> None:
    changes = {}
    for folder in (FIXTURES / "malformed").iterdir():
        for rel, data in files_of(folder).items():
            changes[f"skills/{folder.name}/{rel}"] = data
    changes["skills/loose.md"] = "not in a folder\n"
    lib.commit(changes, method="raw")  # no validator: the store itself does not judge skills
    loaded = load_skills(lib.snapshot())
    assert sorted(loaded.skills) == ["good-one", "good-two"]
    assert sorted(e.rule for e in loaded.problems) == [
        "body-length", "description-length", "layout", "name-folder", "name-missing", "yaml"]
    assert sorted(e.rule for e in validate_snapshot(lib.snapshot())) == sorted(
        e.rule for e in loaded.problems)


def test_a_single_skill_folder_can_be_imported(lib: Library, tmp_path: Path) -> None:
    src = tmp_path / "bash-scripting"
    shutil.copytree(FIXTURES / "library" / "bash-scripting", src)
    report = import_skills(lib, src)
    assert report.imported == ("bash-scripting",)
    skill = load_skill(lib.snapshot(), "bash-scripting")
    assert skill.allowed_tools == "Bash Read Write"
    assert set(skill.files) == {"scripts/rename_ext.sh"}


def test_a_skill_folder_given_as_dot_is_imported_under_its_name(
        lib: Library, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "bash-scripting"
    shutil.copytree(FIXTURES / "library" / "bash-scripting", src)
    monkeypatch.chdir(src)
    report = import_skills(lib, ".")
    assert report.imported == ("bash-scripting",) and not report.skipped
    monkeypatch.chdir(src / "scripts")
    assert import_skills(lib, "..").unchanged == ("bash-scripting",)


def test_scaffold_refuses_a_name_with_a_trailing_newline() -> None:
    with pytest.raises(ValidationError) as exc:
        scaffold_skill("demo\n")
    assert exc.value.rule == "name-format"


def test_reimport_replaces_the_whole_skill_folder(lib: Library, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "library" / "pdf-text-extraction", src / "pdf-text-extraction")
    import_skills(lib, src)
    (src / "pdf-text-extraction" / "references" / "tools.md").unlink()
    report = import_skills(lib, src)
    assert report.imported == ("pdf-text-extraction",)
    assert not lib.snapshot().exists("skills/pdf-text-extraction/references/tools.md")


def test_import_errors(lib: Library, tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        import_skills(lib, tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("hi")
    with pytest.raises(ConfigError, match="no skill folders"):
        import_skills(lib, tmp_path / "empty")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ConfigError, match="neither a folder"):
        import_skills(lib, tmp_path / "file.txt")
    (tmp_path / "mixed" / "ok").mkdir(parents=True)
    shutil.copy(FIXTURES / "malformed" / "good-one" / "SKILL.md",
                tmp_path / "mixed" / "ok" / "SKILL.md")
    (tmp_path / "mixed" / "notes.txt").write_text("loose")
    report = import_skills(lib, tmp_path / "mixed")
    assert report.ignored == ("notes.txt",)
    assert [e.rule for e in report.skipped] == ["name-folder"]


def test_skill_changes_render_against_the_current_text(lib: Library) -> None:
    import_skills(lib, FIXTURES / "library")
    snap = lib.snapshot()
    skill = load_skill(snap, "markdown-tables")
    changed = replace(skill, metadata={"helpful": "3"})
    changes = skill_changes(changed, snap)
    text = changes["skills/markdown-tables/SKILL.md"]
    assert "# hand-written for the README work" in text
    assert parse_skill_md(text).skill.metadata == {"helpful": "3"}
    v = lib.commit(changes, method="test", validate=validate_snapshot)
    assert v.id == "v3"
    # Binary assets are not carried in Skill.files, and are kept.
    shape = load_skill(lib.snapshot(), "shape-color-questions")
    assert "assets/blue-triangle.png" not in skill_changes(shape, lib.snapshot())


def test_scaffold_makes_a_valid_skill(lib: Library) -> None:
    skill = scaffold_skill("table-extraction", "Pull tables out of documents. Use for tables.")
    lib.commit(new_skill_changes(skill), method="skill new", validate=validate_snapshot)
    loaded = load_skill(lib.snapshot(), "table-extraction")
    assert loaded.description.startswith("Pull tables") and "## Steps" in loaded.body
    with pytest.raises(ValidationError) as exc:
        scaffold_skill("Not_Valid")
    assert exc.value.rule == "name-format"


def test_load_skill_names_the_known_skills_when_the_name_is_wrong(lib: Library) -> None:
    import_skills(lib, FIXTURES / "library")
    with pytest.raises(NotFound) as exc:
        load_skill(lib.snapshot(), "csv-clean")
    assert "did you mean csv-cleanup" in exc.value.hint
