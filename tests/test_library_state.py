"""Evolvers' resume state in ``<library>/state/<method>/`` (old folders moved on first use),
one cached ``TraceStore`` per ``Library``, and commit validation on by default."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.commands.library import library_group
from whetstone.engine.errors import ConfigError, ValidationError
from whetstone.engine.library.checks import validate_library
from whetstone.engine.methods.base import EvolveContext
from whetstone.library_store.store import Library

GOOD = "---\nname: {n}\ndescription: Sort words alphabetically.\n---\n# {n}\nSort them.\n"
BAD = "no front matter at all\n"  # a SKILL.md without its YAML header


@pytest.fixture
def lib(tmp_path: Path) -> Library:
    return Library.init(tmp_path / "lib")


# -- resume state ---------------------------------------------------------------------------


@pytest.mark.dynamo
def test_state_saves_loads_and_lists_json_documents(lib: Library) -> None:
    state = lib.state("dynamo")
    assert state.folder == lib.root / "state" / "dynamo"
    assert state.load("abc") is None and state.stored_keys() == []
    path = state.save("abc", {"done": 3, "text": "é"})
    assert path == lib.root / "state" / "dynamo" / "abc.json"
    assert lib.state("dynamo").load("abc") == {"done": 3, "text": "é"}
    state.save("abc", {"done": 4})  # replaced whole
    assert state.load("abc") == {"done": 4} and state.stored_keys() == ["abc"]
    assert not list((state.folder / ".tmp").iterdir())  # no temp file left behind
    state.remove("abc")
    assert state.stored_keys() == []


@pytest.mark.nlpg
def test_a_damaged_state_file_reads_as_missing(lib: Library) -> None:
    state = lib.state("nlpg")
    state.save("k", {"a": 1})
    state.path("k").write_text('{"a": ', encoding="utf-8")  # torn by a crash
    assert state.load("k") is None
    state.path("k").write_text("[1, 2]", encoding="utf-8")  # not a document
    assert state.load("k") is None


@pytest.mark.dynamo
@pytest.mark.parametrize("method,key", [("../up", "k"), ("Dynamo", "k"), ("", "k"),
                                        ("dynamo", "../../CURRENT"), ("dynamo", "a/b")])
def test_bad_state_names_are_refused(lib: Library, method: str, key: str) -> None:
    with pytest.raises(ConfigError):
        lib.state(method).path(key)
    assert (lib.root / "CURRENT").read_text().strip() == "v1"


@pytest.mark.dynamo
@pytest.mark.nlpg
def test_an_old_librarys_state_folders_move_on_first_use(lib: Library) -> None:
    old_dynamo = lib.root / "work" / "dynamo"
    (old_dynamo / "tool-images").mkdir(parents=True)
    (old_dynamo / "k1.json").write_text('{"key": "k1"}')
    (old_dynamo / "tool-images" / "a.png").write_bytes(b"png")
    (lib.root / "work" / "tool-images").mkdir()  # the tools' image cache: not resume state
    old_nlpg = lib.root / ".state" / "nlpg"
    old_nlpg.mkdir(parents=True)
    (old_nlpg / "k2.json").write_text('{"key": "k2"}')
    marker = (lib.root / ".state" / "view.json").read_bytes()

    dynamo = lib.state("dynamo", legacy=("work/dynamo",))
    nlpg = lib.state("nlpg", legacy=(".state/nlpg",))

    assert dynamo.load("k1") == {"key": "k1"} and nlpg.load("k2") == {"key": "k2"}
    assert (dynamo.folder / "tool-images" / "a.png").read_bytes() == b"png"
    assert not old_dynamo.exists() and not old_nlpg.exists()
    assert (lib.root / "work" / "tool-images").is_dir()  # left where it was
    assert (lib.root / ".state" / "view.json").read_bytes() == marker  # the view's own
    reopened = Library.open(lib.root)  # the library still opens, its view intact
    assert reopened.view_problem is None and not reopened.edits()
    assert lib.state("dynamo", legacy=("work/dynamo",)).stored_keys() == ["k1"]  # idempotent


@pytest.mark.nlpg
def test_a_move_into_an_existing_state_folder_keeps_the_newer_files(lib: Library) -> None:
    new = lib.state("nlpg")
    new.save("same", {"from": "new"})
    old = lib.root / ".state" / "nlpg"
    old.mkdir(parents=True)
    (old / "same.json").write_text('{"from": "old"}')
    (old / "other.json").write_text('{"from": "old"}')
    state = lib.state("nlpg", legacy=(".state/nlpg",))
    assert state.load("same") == {"from": "new"}  # never overwritten by the old copy
    assert state.load("other") == {"from": "old"}
    assert (old / "same.json").exists()  # the clash is kept for a person to see


@pytest.mark.dynamo
def test_a_legacy_folder_must_lie_inside_the_library(lib: Library) -> None:
    with pytest.raises(ConfigError, match="inside the library"):
        lib.state("dynamo", legacy=("../elsewhere",))


@pytest.mark.dynamo
def test_dynamo_resumes_from_a_save_an_older_whetstone_left_in_work(lib: Library) -> None:
    from whetstone.engine.methods.dynamo.evolver import Dynamo, DynamoConfig, _Run

    def run() -> _Run:
        return _Run(Dynamo(DynamoConfig()), EvolveContext(library=lib, model="m"),
                    ScriptedBackend([]), [], lib.snapshot(), lib.current_id())

    first = run()
    assert first.path is not None and first.path.parent == lib.root / "state" / "dynamo"
    first.state.seconds = 12.5
    first.save()
    old = lib.root / "work" / "dynamo"
    old.mkdir(parents=True)
    first.path.rename(old / first.path.name)  # as an older Whetstone kept it
    shutil.rmtree(lib.root / "state")  # an old library has no state/ folder
    resumed = run()
    assert resumed.state.seconds == 12.5
    assert resumed.path == first.path and resumed.path.exists() and not old.exists()


@pytest.mark.nlpg
def test_nlpg_resumes_from_a_checkpoint_an_older_whetstone_left_in_dot_state(
        lib: Library) -> None:
    from whetstone.engine.methods.nlpg.evolver import NLPG, _Plan, _State

    nlpg, context = NLPG(), EvolveContext(library=lib, model="m")
    plan = _Plan([], [], 8)
    first = nlpg._checkpoint(lib.snapshot(), context, plan)
    first.save(_State(memory={}, done=2))
    saved = lib.root / "state" / "nlpg" / f"{first.key}.json"
    old = lib.root / ".state" / "nlpg"
    old.mkdir(parents=True)
    saved.rename(old / saved.name)
    shutil.rmtree(lib.root / "state")
    again = nlpg._checkpoint(lib.snapshot(), context, plan)
    state = again.load()
    assert state is not None and state.done == 2
    assert saved.exists() and not old.exists()


# -- one trace store per library ------------------------------------------------------------


def test_traces_is_one_store_per_library_across_threads(lib: Library) -> None:
    seen: list[object] = []
    barrier = threading.Barrier(8)

    def grab() -> None:
        barrier.wait()
        seen.append(lib.traces)

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(s) for s in seen}) == 1 and seen[0] is lib.traces


def test_traces_follows_a_change_of_the_librarys_settings(lib: Library) -> None:
    before = lib.traces
    assert before.keep_days is None
    lib.update_settings(trace_keep_days=3)
    after = lib.traces
    assert after is not before and after.keep_days == 3
    assert lib.traces is after
    # Another process's edit of library.json is seen too (the file is replaced).
    other = Library.open(lib.root)
    other.update_settings(trace_keep_days=5)
    assert lib.traces.keep_days == 5


# -- validation on by default ---------------------------------------------------------------


def _unchanged(lib: Library, view_text: str) -> None:
    assert lib.current_id() == "v2"
    assert lib.snapshot().read_text("skills/sorter/SKILL.md") == GOOD.format(n="sorter")
    assert (lib.root / "skills" / "sorter" / "SKILL.md").read_text() == view_text


def test_an_engines_library_refuses_a_malformed_skill_md_by_default(tmp_path: Path) -> None:
    with Engine(ScriptedBackend([]), library=tmp_path / "lib", create=True,
                checkpointing=False) as e:
        e.library.commit({"skills/sorter/SKILL.md": GOOD.format(n="sorter")}, method="m")
        with pytest.raises(ValidationError) as exc:
            e.library.commit({"skills/sorter/SKILL.md": BAD}, method="m")
        assert exc.value.path == "skills/sorter/SKILL.md" and exc.value.hint
        _unchanged(e.library, GOOD.format(n="sorter"))


def test_a_rollback_to_a_malformed_version_is_refused_by_default(lib: Library) -> None:
    lib = Library.open(lib.root, validator=validate_library)
    lib.commit({"skills/sorter/SKILL.md": GOOD.format(n="sorter")}, method="m")
    lib.commit({"skills/sorter/SKILL.md": BAD}, method="old", validate=False)  # v3
    lib.commit({"skills/sorter/SKILL.md": GOOD.format(n="sorter")}, method="m")  # v4
    with pytest.raises(ValidationError):
        lib.rollback("v3")
    assert lib.current_id() == "v4"


def test_hand_edits_are_validated_by_default_and_kept_when_refused(lib: Library) -> None:
    lib = Library.open(lib.root, validator=validate_library)
    lib.commit({"skills/sorter/SKILL.md": GOOD.format(n="sorter")}, method="m")
    (lib.root / "skills" / "sorter" / "SKILL.md").write_text(BAD)
    with pytest.raises(ValidationError):
        lib.commit_view(message="edit")
    _unchanged(lib, BAD)  # the person's edit is still there to fix
    res = CliRunner().invoke(library_group, ["commit", "-m", "edit", "--library", str(lib.root)])
    assert res.exit_code == ValidationError.exit_code, res.output
    _unchanged(lib, BAD)


def test_a_library_opened_without_rules_still_checks_paths_and_can_opt_out(
        lib: Library) -> None:
    lib.commit({"skills/sorter/SKILL.md": GOOD.format(n="sorter")}, method="m")
    checked = Library.open(lib.root, validator=validate_library)
    v = checked.commit({"skills/raw/SKILL.md": BAD}, method="m", validate=False)  # opted out
    assert v.id == "v3"
    with pytest.raises(ValidationError):  # an explicit validator still applies
        lib.commit({"skills/raw/SKILL.md": BAD + "x"}, method="m", validate=validate_library)


def test_a_rejected_candidate_stays_a_candidate(lib: Library) -> None:
    lib = Library.open(lib.root, validator=validate_library)
    lib.commit({"skills/sorter/SKILL.md": GOOD.format(n="sorter")}, method="m")
    lib.candidates.save("c", {"skills/sorter/SKILL.md": BAD}, method="m")
    with pytest.raises(ValidationError):
        lib.candidates.apply("c")
    assert [c.name for c in lib.candidates.list()] == ["c"]  # nothing lost
    _unchanged(lib, GOOD.format(n="sorter"))
