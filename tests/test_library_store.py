"""The versioned store: commits, reads, log/diff/rollback, the view, candidates, export.

The ``lib`` fixture runs each test against both stores: the library's own folder and
PostgreSQL (issue 49; skipped with the reason where PostgreSQL is missing). Tests of the
folder's own layout (fsync order, temp files, blob files) run on the folder alone."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from whetstone.engine.errors import LibraryError, NotFound, ValidationError
from whetstone.library_store.candidates import Candidates
from whetstone.library_store.store import Library
from whetstone.library_store.tree import bucket_of

SKILL = "---\nname: {n}\ndescription: Skill {n}. Use for tests.\n---\n\n# {n}\n{extra}"


def skill(name: str, extra: str = "") -> str:
    return SKILL.format(n=name, extra=extra)


# A folder a method owns (NLPG's policies/): the store treats every such folder alike.
OWNED = ("policies",)


@pytest.fixture(params=["file", "postgresql"])
def lib(request: pytest.FixtureRequest, tmp_path: Path) -> Library:
    store = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    return Library.init(tmp_path / "lib", roots=OWNED, store=store)


def folder_only(lib: Library) -> None:
    if lib.store is not None:
        pytest.skip("the folder's own layout (the PostgreSQL store has none)")


def reopen(lib: Library) -> Library:
    return Library.open(lib.root, roots=lib.roots, store=lib.store)


def blob_ids(lib: Library) -> set[str]:
    """Every blob the store holds."""
    if lib.store is None:
        return {p.parent.name + p.name for p in (lib.root / "blobs").rglob("*") if p.is_file()}
    return {r[0] for r in lib.backing.run(  # type: ignore[attr-defined]
        lambda c: c.execute("SELECT digest FROM blobs").fetchall(), "test")}


def tamper(lib: Library, digest: str, data: bytes) -> None:
    """Overwrite a stored blob behind the store's back."""
    if lib.store is None:
        blob = lib.blobs.path(digest)
        blob.chmod(0o644)
        blob.write_bytes(data)
        return
    lib.backing.run(lambda c: c.execute(  # type: ignore[attr-defined]
        "UPDATE blobs SET data = %s WHERE digest = %s", (data, digest)), "test")
    lib.backing.shared.blob_cache.clear()  # type: ignore[attr-defined]


def test_init_creates_an_empty_first_version(tmp_path: Path) -> None:
    lib = Library.init(tmp_path / "lib", roots=OWNED)
    assert lib.current_id() == "v1"
    assert lib.snapshot().files() == {}
    for sub in ("skills", "policies", "versions", "blobs", "traces"):
        assert (lib.root / sub).is_dir()
    assert Library.init(tmp_path / "lib").current_id() == "v1"  # idempotent


def test_opening_a_missing_library_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(LibraryError) as exc:
        Library.open(tmp_path / "nope")
    assert "library init" in exc.value.hint
    assert Library.open(tmp_path / "made", create=True).current_id() == "v1"


def test_a_folder_is_writable_only_where_the_library_is_opened_with_it(tmp_path: Path) -> None:
    """Core knows only skills/; a method's folder is a root the opener passes. Opened without
    it, the library refuses writes there and keeps the folder's files in every new version."""
    owner = Library.init(tmp_path / "lib", roots=OWNED)
    owner.commit({"policies/think.md": "[n1] :: Check units.\n"}, method="t")
    bare = Library.open(owner.root)
    with pytest.raises(ValidationError, match="starts with one of skills/"):
        bare.commit({"policies/act.md": "[n2] :: x\n"}, method="t")
    bare.commit({"skills/a/SKILL.md": skill("a")}, method="t")
    assert set(bare.snapshot().files()) == {"policies/think.md", "skills/a/SKILL.md"}
    assert Library.open(owner.root, roots=OWNED).snapshot().read_text("policies/think.md")


def test_commit_makes_a_new_version_with_a_manifest(lib: Library) -> None:
    v = lib.commit({"skills/a/SKILL.md": skill("a"), "policies/think.md": b"[n1] :: be brief\n"},
                   method="test", message="first", scores={"acc": 0.5}, costs={"tokens": 10})
    assert (v.id, v.parent, v.method, v.message) == ("v2", "v1", "test", "first")
    full = lib.version("v2")
    assert set(full.files) == {"skills/a/SKILL.md", "policies/think.md"}
    assert all(len(h) == 64 for h in full.files.values())
    assert full.scores == {"acc": 0.5} and full.costs == {"tokens": 10}
    on_disk = json.loads(lib.backing.manifest("v2"))  # versions/v2.json, or its row
    assert on_disk["parent"] == "v1" and on_disk["counts"] == {
        "files": 2, "added": 2, "modified": 0, "deleted": 0}
    assert lib.snapshot().read_text("skills/a/SKILL.md") == skill("a")


def test_deletes_modifications_and_the_log(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a"), "skills/b/SKILL.md": skill("b")}, method="m")
    lib.commit({"skills/a/SKILL.md": skill("a", "more\n"), "skills/b/SKILL.md": None},
               method="m", message="edit")
    assert lib.snapshot().children("skills") == ["a"]
    assert [m.id for m in lib.log()] == ["v3", "v2", "v1"]
    assert lib.log()[0].counts == {"files": 1, "added": 0, "modified": 1, "deleted": 1}
    assert [m.id for m in lib.log(limit=2)] == ["v3", "v2"]
    assert set(lib.changes("v3")) == {"skills/a/SKILL.md", "skills/b/SKILL.md"}


def test_an_unchanged_commit_is_refused(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a")}, method="m")
    with pytest.raises(LibraryError, match="nothing to commit"):
        lib.commit({"skills/a/SKILL.md": skill("a"), "skills/zz/SKILL.md": None}, method="m")
    assert lib.commit({"skills/a/SKILL.md": skill("a")}, method="m", allow_empty=True).id == "v3"


@pytest.mark.parametrize("path", ["/abs/x.md", "skills/../x.md", "skills//x.md", "other/x.md",
                                  "skills", "skills\\a\\SKILL.md", "./skills/a.md", ""])
def test_bad_paths_are_rejected(lib: Library, path: str) -> None:
    with pytest.raises(ValidationError) as exc:
        lib.commit({path: "x"}, method="m")
    assert exc.value.rule == "path"
    assert lib.current_id() == "v1"


@pytest.mark.parametrize("path", ["skills/demo/scripts/.env.example", "skills/.hidden/SKILL.md",
                                  "policies/.m.md", "skills/demo/__pycache__/x.pyc"])
def test_hidden_paths_are_rejected_because_the_view_and_export_skip_them(
        lib: Library, path: str) -> None:
    with pytest.raises(ValidationError) as exc:
        lib.commit({"skills/demo/SKILL.md": skill("demo"), path: "K=1\n"}, method="m")
    assert exc.value.rule == "path-hidden"
    assert lib.current_id() == "v1"
    with pytest.raises(ValidationError, match="path-hidden"):
        lib.candidates.save("c1", {path: "x"}, method="m")


def test_a_hidden_file_from_an_older_library_can_still_be_deleted(lib: Library) -> None:
    lib._commit({"skills/a/.env": b"K=1\n"}, method="old", message="", scores=None,
                costs=None, validate=None)  # as an older Whetstone allowed
    lib.commit({"skills/a/.env": None}, method="m")
    assert lib.snapshot().files() == {}


def test_bad_content_is_rejected(lib: Library) -> None:
    with pytest.raises(ValidationError) as exc:
        lib.commit({"skills/a/SKILL.md": 3}, method="m")  # type: ignore[dict-item]
    assert exc.value.rule == "content-type"


def test_a_rejected_change_leaves_the_current_version(lib: Library) -> None:
    seen: list[list[str]] = []

    def validator(snap, changed):
        seen.append(list(changed))
        assert snap.read_text("skills/a/SKILL.md") == "bad"  # the new version, written aside
        return [ValidationError("skills/a/SKILL.md", "rule-one", "first", line=1),
                ValidationError("skills/a/SKILL.md", "rule-two", "second", line=2)]

    with pytest.raises(ValidationError) as exc:
        lib.commit({"skills/a/SKILL.md": "bad"}, method="m", validate=validator)
    assert exc.value.rule == "rule-one" and len(exc.value.problems) == 2
    assert "rule-two" in exc.value.hint
    assert seen == [["skills/a/SKILL.md"]]
    assert lib.current_id() == "v1" and not (lib.root / "skills" / "a").exists()


def test_expect_parent_refuses_a_stale_change(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a")}, method="m")
    with pytest.raises(LibraryError, match="moved from v1 to v2"):
        lib.commit({"skills/b/SKILL.md": skill("b")}, method="m", expect_parent="v1")


def test_durable_commit_syncs_version_and_blob_folders_before_current(
        lib: Library, monkeypatch: pytest.MonkeyPatch) -> None:
    folder_only(lib)
    events: list[tuple[str, str]] = []
    paths: dict[int, str] = {}
    real_open, real_fsync, real_replace = os.open, os.fsync, os.replace

    def spy_open(path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, *args, **kwargs)
        paths[fd] = str(path)
        return fd

    def spy_fsync(fd: int) -> None:
        events.append(("fsync", paths.get(fd, "?")))
        real_fsync(fd)

    def spy_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    lib.commit({"skills/a/SKILL.md": skill("a")}, method="m")
    monkeypatch.undo()
    switch = events.index(("replace", str(lib.current_path)))
    synced_before = {p for kind, p in events[:switch] if kind == "fsync"}
    blob_dir = lib.blobs.path(lib.snapshot().hash_of("skills/a/SKILL.md") or "").parent
    assert str(lib.root / "versions") in synced_before
    assert str(blob_dir) in synced_before  # the rename into blobs/xx/
    assert str(lib.blobs.root) in synced_before  # blobs/xx/ itself was new
    assert ("fsync", str(lib.root)) in events[switch:]  # and CURRENT's own rename


def test_a_snapshot_keeps_reading_its_own_version(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a")}, method="m")
    before = lib.snapshot()
    lib.commit({"skills/a/SKILL.md": skill("a", "changed\n")}, method="m")
    assert before.id == "v2" and before.read_text("skills/a/SKILL.md") == skill("a")
    assert lib.snapshot().read_text("skills/a/SKILL.md") == skill("a", "changed\n")
    with pytest.raises(NotFound):
        before.read_text("skills/zz/SKILL.md")


def test_version_references(lib: Library) -> None:
    for i in range(3):
        lib.commit({"skills/a/SKILL.md": skill("a", f"{i}\n")}, method="m")
    assert lib.resolve(None) == lib.resolve("current") == "v4"
    assert lib.resolve("2") == "v2" and lib.resolve("current~2") == "v2"
    for bad in ("v9", "x3", "current~9"):
        with pytest.raises(NotFound):
            lib.resolve(bad)


def test_diff_is_a_unified_diff_between_versions(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a", "old line\n")}, method="m")
    lib.commit({"skills/a/SKILL.md": skill("a", "new line\n"), "skills/b/SKILL.md": skill("b")},
               method="m")
    text = lib.diff("v2", "v3")
    assert "--- a/skills/a/SKILL.md (v2)\n+++ b/skills/a/SKILL.md (v3)\n" in text
    assert "-old line\n+new line\n" in text
    assert "--- /dev/null\n+++ b/skills/b/SKILL.md (v3)\n" in text
    assert lib.diff("v3", "v3") == ""
    lib.commit({"skills/a/img.png": b"\x89PNG\x00\xff"}, method="m")
    assert "Binary file skills/a/img.png differs" in lib.diff("v3", "v4")


def test_rollback_makes_a_new_version_equal_to_an_old_one(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a")}, method="m")
    lib.commit({"skills/a/SKILL.md": skill("a", "x\n"), "skills/b/SKILL.md": skill("b")},
               method="m")
    v = lib.rollback("v2")
    assert (v.id, v.parent, v.method) == ("v4", "v3", "rollback")
    assert lib.version("v4").files == lib.version("v2").files
    assert not (lib.root / "skills" / "b").exists()
    with pytest.raises(LibraryError, match="nothing to commit"):
        lib.rollback("v4")


def test_the_view_shows_the_current_version(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a"), "skills/a/references/r.md": "ref\n",
                "policies/think.md": "note\n"}, method="m")
    assert (lib.root / "skills/a/references/r.md").read_text() == "ref\n"
    assert (lib.root / "policies/think.md").read_text() == "note\n"
    lib.commit({"skills/a/references/r.md": None}, method="m")
    assert not (lib.root / "skills/a/references").exists()  # empty folders go too
    assert not lib.edits()


def test_hand_edits_are_listed_committed_and_never_lost(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a"), "skills/b/SKILL.md": skill("b")}, method="m")
    (lib.root / "skills/a/SKILL.md").write_text(skill("a", "by hand\n"))
    (lib.root / "skills/b/SKILL.md").unlink()
    (lib.root / "skills/c").mkdir()
    (lib.root / "skills/c/SKILL.md").write_text(skill("c"))
    (lib.root / "skills/c/.notes.swp").write_text("editor junk")
    edits = lib.edits()
    assert edits.modified == ("skills/a/SKILL.md",)
    assert edits.deleted == ("skills/b/SKILL.md",)
    assert edits.added == ("skills/c/SKILL.md",)
    v = lib.commit_view(message="by hand")
    assert lib.snapshot().children("skills") == ["a", "c"] and v.method == "edit"
    # A new version changing a hand-edited file moves the edit to the stash first.
    (lib.root / "skills/a/SKILL.md").write_text("unsaved idea")
    lib.commit({"skills/a/SKILL.md": skill("a", "from a method\n")}, method="m")
    assert (lib.root / "skills/a/SKILL.md").read_text() == skill("a", "from a method\n")
    stashed = list((lib.root / ".state" / "stash").rglob("SKILL.md"))
    assert [p.read_text() for p in stashed] == ["unsaved idea"]


def test_a_view_left_behind_by_a_crash_is_repaired_on_open(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a")}, method="m")
    marker = (lib.root / ".state" / "view.json").read_text()
    lib.commit({"skills/a/SKILL.md": skill("a", "v3\n"), "skills/b/SKILL.md": skill("b")},
               method="m")
    # Simulate a writer killed after the switch but before the view was updated.
    (lib.root / ".state" / "view.json").write_text(marker)
    (lib.root / "skills/a/SKILL.md").write_text(skill("a"))
    (lib.root / "skills/b/SKILL.md").unlink()
    reopened = reopen(lib)
    assert (reopened.root / "skills/a/SKILL.md").read_text() == skill("a", "v3\n")
    assert (reopened.root / "skills/b/SKILL.md").exists()
    assert not reopened.edits()
    assert not (lib.root / ".state" / "stash").exists()  # old content was not a hand edit


def test_a_hand_edit_is_stashed_when_the_view_marker_is_unreadable(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a"), "policies/m.md": "committed\n"}, method="m")
    (lib.root / "policies/m.md").write_text("my hand edit\n")
    (lib.root / ".state" / "view.json").write_text("")  # torn (written without fsync)
    reopened = reopen(lib)
    assert (reopened.root / "policies/m.md").read_text() == "committed\n"
    stashed = list((lib.root / ".state" / "stash").rglob("m.md"))
    assert [p.read_text() for p in stashed] == ["my hand edit\n"]
    assert not list((lib.root / ".state" / "stash").rglob("SKILL.md"))  # unchanged: kept
    assert not reopened.edits()


def test_stale_temp_files_and_orphan_manifests_are_cleaned_by_the_next_write(
        lib: Library) -> None:
    folder_only(lib)
    (lib.root / ".tmp" / "SKILL.md.123.abcd.tmp").write_bytes(b"half written")
    (lib.root / ".tmp" / "dir").mkdir()
    (lib.root / "versions" / "v2.json").write_text("{\"torn")  # manifest of a killed writer
    with pytest.raises(NotFound):
        lib.snapshot("v2")  # never current, so never visible
    v = lib.commit({"skills/a/SKILL.md": skill("a")}, method="m")
    assert v.id == "v2" and list((lib.root / ".tmp").iterdir()) == []
    assert lib.snapshot("v2").read_text("skills/a/SKILL.md") == skill("a")


def test_verify_finds_damaged_content(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a")}, method="m")
    assert lib.verify() == []
    digest = lib.snapshot().hash_of("skills/a/SKILL.md")
    assert digest is not None
    tamper(lib, digest, b"tampered")
    assert lib.verify() == [f"skills/a/SKILL.md: content {digest[:12]} is missing or corrupt"]


def test_a_commit_rewrites_only_the_tree_buckets_it_touches(lib: Library) -> None:
    lib.commit({f"skills/s{i}/SKILL.md": skill(f"s{i}") for i in range(600)}, method="bulk")
    before = blob_ids(lib)
    lib.commit({"skills/s7/SKILL.md": skill("s7", "x\n")}, method="m")
    new = blob_ids(lib) - before
    assert len(new) == 3  # the file, its bucket and the root: not the other buckets
    root = lib.trees.load(lib.snapshot().root)
    assert len(root) > 100 and bucket_of("skills/s7/SKILL.md") in root


@pytest.mark.trace2skill
def test_candidates_are_kept_listed_diffed_and_applied(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a")}, method="m")
    store = lib.candidates
    cand = store.save("t2s-try", {"skills/a/SKILL.md": skill("a", "better\n")},
                      method="trace2skill", message="rejected by the gate",
                      scores={"candidate": 0.4, "current": 0.5})
    assert cand.base == "v2" and lib.current_id() == "v2"
    assert [c.name for c in store.list()] == ["t2s-try"]
    assert store.get("t2s-try").scores == {"candidate": 0.4, "current": 0.5}
    assert "+better\n" in store.diff("t2s-try")
    v = store.apply("t2s-try")
    assert v.method == "trace2skill" and v.scores["candidate"] == 0.4
    assert lib.snapshot().read_text("skills/a/SKILL.md") == skill("a", "better\n")
    assert store.list() == []
    with pytest.raises(NotFound):
        store.get("t2s-try")


def test_a_candidate_whose_files_moved_on_needs_force(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a")}, method="m")
    lib.candidates.save("c1", {"skills/a/SKILL.md": skill("a", "cand\n")}, method="m")
    lib.commit({"skills/a/SKILL.md": skill("a", "meanwhile\n")}, method="m")
    assert lib.candidates.conflicts("c1") == ["skills/a/SKILL.md"]
    with pytest.raises(LibraryError, match="prepared on v2"):
        lib.candidates.apply("c1")
    assert lib.candidates.apply("c1", force=True).id == "v4"


def test_a_write_landing_after_the_conflict_check_is_not_overwritten(
        lib: Library, monkeypatch: pytest.MonkeyPatch) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a")}, method="m")
    lib.candidates.save("c1", {"skills/a/SKILL.md": skill("a", "cand\n")}, method="m")
    check = Candidates.conflicts

    def racing(self: Candidates, name: str, *args: Any, **kwargs: Any) -> list[str]:
        found = check(self, name, *args, **kwargs)  # no conflict yet ...
        Library(lib.root, store=lib.store).commit({"skills/a/SKILL.md": skill("a", "other\n")},
                                                  method="other")
        return found  # ... but another writer lands before the commit

    monkeypatch.setattr(Candidates, "conflicts", racing)
    with pytest.raises(LibraryError, match="another writer made v3") as exc:
        lib.candidates.apply("c1")
    assert "apply` again" in (exc.value.hint or "")
    monkeypatch.undo()
    assert lib.snapshot().read_text("skills/a/SKILL.md") == skill("a", "other\n")
    assert [c.name for c in lib.candidates.list()] == ["c1"]  # kept to retry
    with pytest.raises(LibraryError, match="prepared on v2"):  # the retry sees the conflict
        lib.candidates.apply("c1")


def test_a_candidate_name_with_a_trailing_newline_is_refused(lib: Library) -> None:
    with pytest.raises(ValidationError) as exc:
        lib.candidates.save("c1\n", {"skills/a/SKILL.md": "x"}, method="m")
    assert exc.value.rule == "candidate-name" and lib.candidates.list() == []


def test_candidate_names_are_checked_and_dropped(lib: Library) -> None:
    with pytest.raises(ValidationError) as exc:
        lib.candidates.save("Bad Name", {"skills/a/SKILL.md": "x"}, method="m")
    assert exc.value.rule == "candidate-name"
    auto = lib.candidates.save(None, {"skills/a/SKILL.md": "x"}, method="Trace2Skill")
    assert auto.name.startswith("trace2skill-")
    lib.candidates.drop(auto.name)
    assert lib.candidates.list() == []


def test_export_writes_plain_skill_folders_and_reproducible_archives(
        lib: Library, tmp_path: Path) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a"), "skills/a/assets/x.bin": b"\x00\x01",
                "policies/p.md": "not exported\n"}, method="m")
    out = lib.export(tmp_path / "out")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "a/SKILL.md", "a/assets/x.bin"]
    one = lib.export(tmp_path / "one.tar.gz").read_bytes()
    two = lib.export(tmp_path / "two.tar.gz").read_bytes()
    assert one == two
    with tarfile.open(tmp_path / "one.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["a/SKILL.md", "a/assets/x.bin"]
    from whetstone.engine.errors import ConfigError
    with pytest.raises(ConfigError, match="not empty"):
        lib.export(tmp_path / "out")


def test_traces_live_in_the_library_with_a_retention_setting(lib: Library) -> None:
    folder_only(lib)
    assert lib.traces.root == lib.root / "traces" and lib.traces.keep_days is None
    lib.update_settings(trace_keep_days=30)
    assert lib.traces.keep_days == 30
    day = lib.root / "traces" / "2001-01-01.jsonl"
    day.write_text("")
    assert lib.traces.prune() == [day]  # uses the setting
    lib.update_settings(trace_keep_days=None)
    assert "trace_keep_days" not in lib.settings()


def test_texts_and_units(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a"), "skills/a/assets/x.bin": b"\xff\xfe",
                "skills/ab/SKILL.md": skill("ab")}, method="m")
    snap = lib.snapshot()
    assert set(snap.texts("skills/a/")) == {"skills/a/SKILL.md"}  # binary left out
    assert snap.has("skills/") and snap.has("skills/ab/") and not snap.has("policies/")
    assert set(snap.unit("skills/a")) == {"skills/a/SKILL.md", "skills/a/assets/x.bin"}
    assert lib.units() == ["skills/a", "skills/ab"]
    assert set(lib.delete_unit("skills/a")) == {"skills/a/SKILL.md", "skills/a/assets/x.bin"}


def test_preview_shows_a_change_without_making_it_current(lib: Library) -> None:
    lib.commit({"skills/a/SKILL.md": skill("a")}, method="m")
    snap = lib.preview({"skills/b/SKILL.md": skill("b"), "skills/a/SKILL.md": None},
                       label="try")
    assert snap.id == "v2+try" and snap.children("skills") == ["b"]
    assert lib.current_id() == "v2" and lib.snapshot().children("skills") == ["a"]
    assert not (lib.root / "skills" / "b").exists()
    lib.candidates.save("c", {"skills/c/SKILL.md": skill("c")}, method="m")
    assert lib.candidates.snapshot("c").children("skills") == ["a", "c"]
