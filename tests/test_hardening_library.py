"""Issue 12, items 1-3 and 8 (library side): inputs that used to break a library or an import.

Each test reproduces one attack from the issue; on the code before the fix each one failed
(a library stuck on "File name too long", a YAML alias bomb rendered, a TypeError stopping the
whole import, a 40 MB SKILL.md accepted, a misleading summary, a ValueError traceback).
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from whetstone.engine.commands.library import library_group
from whetstone.engine.errors import LibraryError
from whetstone.library_store import view as view_module
from whetstone.library_store.store import Library
from whetstone.skills.format import MAX_YAML_DEPTH, parse_skill_md
from whetstone.skills.transfer import import_skills

GOOD = "---\nname: {name}\ndescription: A good skill called {name}.\n---\n\n# {name}\n\nDo it.\n"
LONG_NAME = "b" * 245 + ".md"  # legal on ext4; too long once a temp suffix is added
TOO_LONG = "b" * 260 + ".md"  # more than any file system takes (NAME_MAX is 255)


def lib_cmd(*args: str) -> Result:
    return CliRunner().invoke(library_group, list(args), catch_exceptions=False)


def write_skill(root: Path, name: str, text: str | None = None,
                files: dict[str, str] | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(text if text is not None else GOOD.format(name=name))
    for rel, body in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(body)
    return folder


def assert_library_works(lib_path: Path, skills: set[str]) -> None:
    """log, ls and validate all work, and the view shows exactly ``skills``."""
    for cmd in (("log",), ("validate",)):
        res = lib_cmd(*cmd, "--library", str(lib_path))
        assert res.exit_code == 0, res.output
    listing = json.loads(lib_cmd("ls", "--library", str(lib_path), "--json").stdout)
    assert {s["name"] for s in listing["skills"]} == skills
    on_disk = {p.name for p in (lib_path / "skills").iterdir()}
    assert on_disk == skills


# --- 1. long file names ----------------------------------------------------------------------

def test_a_skill_with_a_245_character_file_name_is_skipped_and_the_library_stays_usable(
        tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_skill(src, "good")
    write_skill(src, "long-ref", files={f"references/{LONG_NAME}": "hello\n"})
    lib_path = tmp_path / "lib"
    Library.init(lib_path)
    res = lib_cmd("import", str(src), "--library", str(lib_path))
    assert res.exit_code == 11, res.output  # a skill was skipped, the rest committed
    assert "[path-length]" in res.stdout and "long-ref" in res.stdout
    assert "imported 1 skill(s) as version v2" in res.stdout
    assert_library_works(lib_path, {"good"})


def test_a_tar_gz_with_a_300_character_name_is_skipped_and_the_library_stays_usable(
        tmp_path: Path) -> None:
    archive = tmp_path / "skills.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel, text in (("good/SKILL.md", GOOD.format(name="good")),
                          ("long/SKILL.md", GOOD.format(name="long")),
                          ("long/assets/" + "c" * 300 + ".txt", "x")):
            data = text.encode()
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    lib = Library.init(tmp_path / "lib")
    report = import_skills(lib, archive)
    assert report.imported == ("good",) and report.skipped_skills == ("long",)
    assert {e.rule for e in report.skipped} == {"path-length"}
    assert_library_works(lib.root, {"good"})


def _break_the_view(lib: Library, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the old code left behind: a version holding a name the file system refuses is
    current, and the view was never written for it."""
    with monkeypatch.context() as m:
        m.setattr(Library, "_sync_after_publish", lambda *a, **k: None)
        lib._commit({f"skills/good/references/{TOO_LONG}": b"hello\n"}, method="old",
                    message="made by an older Whetstone", scores=None, costs=None,
                    validate=None)


def test_a_library_whose_view_cannot_be_written_opens_and_says_how_to_repair(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    write_skill(src, "good")
    lib = Library.init(tmp_path / "lib")
    import_skills(lib, src)
    _break_the_view(lib, monkeypatch)
    reopened = Library.open(lib.root)  # used to raise "File name too long", every time
    assert reopened.current_id() == "v3" and reopened.view_problem is not None
    for cmd in ("log", "ls"):
        res = lib_cmd(cmd, "--library", str(lib.root))
        assert res.exit_code == 0, res.output
        assert "could not be written" in res.stderr and "library rollback" in res.stderr
    res = lib_cmd("validate", "--library", str(lib.root))
    assert res.exit_code == 5 and "[path-length]" in res.stdout  # the old file is reported
    assert lib_cmd("repair", "--library", str(lib.root)).exit_code == 5
    res = lib_cmd("rollback", "v2", "--library", str(lib.root))
    assert res.exit_code == 0, res.output
    healed = Library.open(lib.root)
    assert healed.view_problem is None and healed.current_id() == "v4"
    assert lib_cmd("repair", "--library", str(lib.root)).exit_code == 0
    assert_library_works(lib.root, {"good"})


def test_a_commit_whose_view_cannot_be_written_is_undone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = Library.init(tmp_path / "lib")
    lib.commit({"skills/good/SKILL.md": GOOD.format(name="good")}, method="test")
    real = view_module.atomic_write

    def full_disk(target: Path, data: bytes, **kw: object) -> None:
        if target.name == "SKILL.md" and "second" in str(target):
            raise OSError(28, "No space left on device")
        real(target, data, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(view_module, "atomic_write", full_disk)
    with pytest.raises(LibraryError, match="was not kept.*No space left") as info:
        lib.commit({"skills/second/SKILL.md": GOOD.format(name="second"),
                    "skills/second/references/a.md": "a\n",
                    "skills/good/SKILL.md": GOOD.format(name="good") + "more\n"},
                   method="test")
    assert "stays at v2" in info.value.message
    monkeypatch.setattr(view_module, "atomic_write", real)
    reopened = Library.open(lib.root)
    assert reopened.current_id() == "v2" and reopened.view_problem is None
    assert reopened.edits().to_dict() == {"modified": [], "added": [], "deleted": []}
    assert_library_works(lib.root, {"good"})
    # The next commit takes the number the undone one had.
    assert lib.commit({"skills/second/SKILL.md": GOOD.format(name="second")},
                      method="test").id == "v3"


def test_names_the_view_could_not_hold_are_refused_before_any_commit(tmp_path: Path) -> None:
    lib = Library.init(tmp_path / "lib")
    for path, rule in ((f"skills/x/references/{LONG_NAME}", "path-length"),
                       ("skills/x/references/a\nb.md", "path-characters"),
                       ("skills/x/" + "/".join("d" * 8) + "/f.md", "path-depth")):
        with pytest.raises(LibraryError, match=rf"\[{rule}\]"):
            lib.commit({path: "x"}, method="test")
    assert lib.current_id() == "v1"


# --- 2. YAML alias bomb ----------------------------------------------------------------------

def _alias_bomb(levels: int) -> str:
    lines = ["  a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return ("---\nname: bomb\ndescription: A skill.\nx-defs:\n" + "\n".join(lines)
            + f"\nmetadata:\n  k: *a{levels - 1}\n---\n\nBody\n")


def test_a_yaml_alias_bomb_is_refused_before_it_is_built_or_rendered() -> None:
    text = _alias_bomb(6)  # 9**6 values once expanded (the issue's 1.4 KB file had 9**9)
    assert len(text) < 2000
    parsed = parse_skill_md(text, folder="bomb")
    assert parsed.skill is None
    (problem,) = parsed.problems
    assert problem.rule == "yaml-limits" and "alias" in problem.detail


def test_deep_nesting_and_recursive_aliases_are_refused() -> None:
    deep = "---\nname: d\ndescription: x\nmetadata: " + "[" * (MAX_YAML_DEPTH + 2) + \
        "]" * (MAX_YAML_DEPTH + 2) + "\n---\nb\n"
    assert [p.rule for p in parse_skill_md(deep).problems] == ["yaml-limits"]
    loop = "---\nname: l\ndescription: x\nmetadata: &a [*a, *a]\n---\nb\n"
    assert [p.rule for p in parse_skill_md(loop).problems] in (["yaml-limits"], ["yaml"])


def test_a_bad_metadata_value_is_reported_never_rendered() -> None:
    text = "---\nname: m\ndescription: x\nmetadata:\n  k: [1, 2]\n---\nb\n"
    parsed = parse_skill_md(text, folder="m")
    assert [p.rule for p in parsed.problems] == ["metadata-type"]
    assert parsed.skill is not None and parsed.skill.metadata == {}


# --- 3. one bad skill, a whole import --------------------------------------------------------

def test_one_bad_skill_is_reported_and_the_rest_imported(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_skill(src, "good")
    write_skill(src, "tools", "---\nname: tools\ndescription: x\nallowed-tools: [1, 2]\n---\nb\n")
    write_skill(src, "bomb", _alias_bomb(6))
    big = GOOD.format(name="huge") + "x" * 1_000_000  # the issue's was 40 MB
    write_skill(src, "huge", big)
    lib = Library.init(tmp_path / "lib")
    report = import_skills(lib, src)
    assert report.imported == ("good",)
    assert report.skipped_skills == ("bomb", "huge", "tools")
    rules = {e.rule for e in report.skipped}
    assert rules == {"allowed-tools-type", "yaml-limits", "file-size"}
    assert "1 imported" in report.summary() and "3 skipped as malformed" in report.summary()


def test_an_import_of_only_malformed_skills_says_so(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_skill(src, "tools", "---\nname: tools\ndescription: x\nallowed-tools: [1, 2]\n---\nb\n")
    Library.init(tmp_path / "lib")
    res = lib_cmd("import", str(src), "--library", str(tmp_path / "lib"))
    assert res.exit_code == 5
    assert "already holds" not in res.stdout
    assert "nothing imported (0 imported, 0 unchanged, 1 skipped as malformed)" in res.stdout


def test_links_and_special_files_are_refused_by_name(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_skill(src, "good")
    linked = write_skill(src, "linked")
    (linked / "references").mkdir()
    (linked / "references" / "secret.md").symlink_to("/etc/passwd")
    lib = Library.init(tmp_path / "lib")
    report = import_skills(lib, src)
    assert report.imported == ("good",) and report.skipped_skills == ("linked",)
    (err,) = report.skipped
    assert err.rule == "file-type" and "symbolic link" in err.detail
    assert err.path.endswith("linked/references/secret.md")


# --- 8. a version id that is not one ---------------------------------------------------------

@pytest.mark.parametrize("ref", ["v²", "current~²", "v١٢"])
def test_a_unicode_digit_version_is_a_clear_error_not_a_traceback(tmp_path: Path,
                                                                  ref: str) -> None:
    Library.init(tmp_path / "lib")
    res = CliRunner().invoke(library_group, ["ls", "--version", ref, "--library",
                                             str(tmp_path / "lib")])
    assert res.exit_code == 6, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert "Traceback" not in res.output and "error:" in res.stderr
