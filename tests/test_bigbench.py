"""BIG-bench task sets (``bigbench:<task>``): fetching into the cache, loading and rendering,
the spec grammar, and the ``choice`` / ``exact_text`` / ``number`` scorers.

Everything runs on tests/fixtures/bigbench (tiny task.json files in the sdist's layout),
packed into a tarball by the tests; nothing is downloaded. The real sdist's families are
checked only when its tasks are already in a cache (``whetstone data fetch bigbench``).
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.errors import EvalError
from whetstone.engine.evaluation import bigbench
from whetstone.engine.evaluation.benchmarks import load_tasks
from whetstone.engine.evaluation.scorers import get_scorer, words_to_digits
from whetstone.engine.evaluation.tasks import TaskRecord, parse_spec, split_of
from whetstone.engine.paths import cache_dir

FIXTURE = Path(__file__).parent / "fixtures" / "bigbench"
TOP = "bigbench-1.0.0"


def _sdist(path: Path, extra: list[tuple[tarfile.TarInfo, bytes | None]] = ()) -> str:
    """Pack the fixture as the sdist is laid out (plus ``extra`` members); its sha256."""
    with tarfile.open(path, "w:gz") as tar:
        tar.add(FIXTURE / "bigbench", arcname=f"{TOP}/bigbench")
        setup = f"{TOP}/setup.py".encode()
        info = tarfile.TarInfo(setup.decode())
        info.size = 3
        tar.addfile(info, io.BytesIO(b"x=1"))
        for member, data in extra:
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache holding the fixture tasks, installed through ``install_sdist``."""
    c = tmp_path / "cache"
    monkeypatch.setenv("WHETSTONE_CACHE", str(c))
    sdist = tmp_path / "bigbench-1.0.0.tar.gz"
    digest = _sdist(sdist)
    bigbench.install_sdist(sdist, c, sha256=digest)
    return c


# --- fetching ------------------------------------------------------------------------------

def test_install_extracts_only_task_files_atomically(tmp_path: Path) -> None:
    sdist = tmp_path / "s.tar.gz"
    evil = [(tarfile.TarInfo(f"{TOP}/bigbench/benchmark_tasks/../../../escape/task.json"), b"{}"),
            (tarfile.TarInfo(f"{TOP}/bigbench/benchmark_tasks/toy/README.md"), b"readme"),
            (tarfile.TarInfo(f"{TOP}/bigbench/benchmark_tasks/toy/task.py"), b"import os")]
    for member, data in evil:
        member.size = len(data or b"")
    link = tarfile.TarInfo(f"{TOP}/bigbench/benchmark_tasks/linked/task.json")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    digest = _sdist(sdist, evil + [(link, None)])
    result = bigbench.install_sdist(sdist, tmp_path / "c", sha256=digest)
    root = tmp_path / "c" / "bigbench-1.0.0"
    assert result.path == root and result.files == 7
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert files == ["benchmark_tasks/toy_choice/task.json", "benchmark_tasks/toy_closing/task.json",
                     "benchmark_tasks/toy_counting/task.json",
                     "benchmark_tasks/toy_nested/task.json",
                     "benchmark_tasks/toy_nested/three_items/task.json",
                     "benchmark_tasks/toy_nested/two_items/task.json",
                     "benchmark_tasks/toy_sorting/task.json", "manifest.json"]
    assert not (tmp_path / "escape").exists() and not any(p.is_symlink() for p in root.rglob("*"))
    assert json.loads((root / "manifest.json").read_text())["sha256"] == digest
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["bigbench-1.0.0"]  # nothing aside


def test_wrong_hash_is_refused_and_leaves_no_cache(tmp_path: Path) -> None:
    sdist = tmp_path / "bigbench-1.0.0.tar.gz"
    _sdist(sdist)  # the fixture, not the pinned sdist
    with pytest.raises(EvalError, match="expected 1bb398a5") as exc:
        bigbench.install_sdist(sdist, tmp_path / "c")
    assert "whetstone data fetch bigbench" in (exc.value.hint or "")
    assert not (tmp_path / "c").exists()


def test_force_replaces_and_existing_cache_is_kept(tmp_path: Path) -> None:
    sdist = tmp_path / "s.tar.gz"
    digest = _sdist(sdist)
    c = tmp_path / "c"
    bigbench.install_sdist(sdist, c, sha256=digest)
    marker = c / "bigbench-1.0.0" / "benchmark_tasks" / "toy_sorting" / "task.json"
    marker.write_text("{}")
    again = bigbench.install_sdist(sdist, c, sha256=digest)
    assert again.bytes == 0 and marker.read_text() == "{}"  # already there: untouched
    forced = bigbench.install_sdist(sdist, c, sha256=digest, force=True)
    assert forced.replaced and json.loads(marker.read_text())["name"] == "toy_sorting"
    assert sorted(p.name for p in c.iterdir()) == ["bigbench-1.0.0"]


@pytest.mark.integration
def test_download_uses_a_pinned_pip_by_package_name(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        if "download" in cmd:
            (Path(cmd[cmd.index("-d") + 1]) / "bigbench-1.0.0.tar.gz").write_bytes(b"x")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    path = bigbench.download_sdist(tmp_path, python="python3", run=run)
    assert path == tmp_path / "bigbench-1.0.0.tar.gz"
    assert calls[0][1:3] == ["-m", "venv"] and "pip==23.2.1" in calls[1]
    assert calls[2][-1] == "bigbench==1.0.0" and "--no-deps" in calls[2]
    assert not any("://" in part for cmd in calls for part in cmd)  # a name, never a URL
    assert not (tmp_path / "pip-venv").exists()  # the throwaway venv is gone


@pytest.mark.integration
def test_pip_failure_says_what_to_do(tmp_path: Path) -> None:
    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        failed = "download" in cmd
        return subprocess.CompletedProcess(cmd, 1 if failed else 0, "", "no route to index")

    with pytest.raises(EvalError, match="no route to index") as exc:
        bigbench.download_sdist(tmp_path, python="python3", run=run)
    assert "--from" in (exc.value.hint or "")


def test_cli_fetch_from_ls_and_wrong_hash(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WHETSTONE_CACHE", str(tmp_path / "c"))
    sdist = tmp_path / "bigbench-1.0.0.tar.gz"
    digest = _sdist(sdist)
    runner = CliRunner()
    bad = runner.invoke(cli, ["data", "fetch", "bigbench", "--from", str(sdist)])
    assert bad.exit_code == 7 and "sha256" in bad.output
    ls = runner.invoke(cli, ["data", "ls"])
    assert ls.exit_code == 0 and "not fetched" in ls.output
    monkeypatch.setattr(bigbench, "SDIST_SHA256", digest)
    ok = runner.invoke(cli, ["data", "fetch", "bigbench", "--from", str(sdist), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output[ok.output.index("{"):])["files"] == 7
    listed = runner.invoke(cli, ["data", "ls", "--tasks"])
    assert "bigbench:toy_nested/two_items" in listed.output


# --- loading -------------------------------------------------------------------------------

def test_missing_cache_hints_the_fetch_command(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WHETSTONE_CACHE", str(tmp_path / "empty"))
    with pytest.raises(EvalError) as exc:
        load_tasks("bigbench:toy_sorting@test")
    assert exc.value.hint and exc.value.hint.startswith("whetstone data fetch bigbench")


def test_unknown_task_suggests_close_names(cache: Path) -> None:
    with pytest.raises(EvalError, match="toy_sortin") as exc:
        load_tasks("bigbench:toy_sortin")
    assert "bigbench:toy_sorting" in (exc.value.hint or "")
    for bad in ("../../etc", "toy_nested/../../x", "a b"):
        with pytest.raises(EvalError, match="bad BIG-bench task name"):
            bigbench.load_bigbench(bad, cache)
    with pytest.raises(EvalError, match="no BIG-bench JSON task 'etc/passwd'"):
        bigbench.load_bigbench("/etc/passwd", cache)  # read under the cache, never at /


def test_generative_task_rendering(cache: Path) -> None:
    tasks = load_tasks("bigbench:toy_sorting")
    assert [t.id for t in tasks] == [f"bigbench-toy_sorting-{i}" for i in range(3)]
    first = tasks[0]
    assert first.question == "Sort the following words alphabetically:\nList: cherry apple banana"
    assert first.expected == "apple banana cherry" and first.scorer == "exact_text"
    assert tasks[2].expected == ["alpha delta", "alpha, delta"]
    assert tasks[2].metadata["target"] == ["alpha delta", "alpha, delta"]
    counting = load_tasks("bigbench:toy_counting")
    assert [t.scorer for t in counting] == ["number", "number"]


def test_multiple_choice_rendering(cache: Path) -> None:
    task = load_tasks("bigbench:toy_choice")[0]
    assert task.scorer == "choice" and task.expected == "blue ball."
    assert task.question.endswith("Alice has the\n\nOptions:\n(A) red ball.\n(B) blue ball.\n"
                                  "(C) green ball.\n\nAnswer with the letter of the correct "
                                  "option.")
    assert task.metadata["letters"] == ["A", "B", "C"]
    assert task.metadata["correct_letters"] == ["B"]
    assert task.metadata["target_scores"]["blue ball."] == 1
    # Too many options to list: the correct one is the text to write.
    closing = load_tasks("bigbench:toy_closing")[0]
    assert closing.scorer == "exact_text" and closing.expected == "] )"
    assert "Options:" not in closing.question and closing.question.endswith("Input: ( [")


def test_subtasks_and_their_union(cache: Path) -> None:
    two = load_tasks("bigbench:toy_nested/two_items")
    assert [t.id for t in two] == ["bigbench-toy_nested-two_items-0",
                                   "bigbench-toy_nested-two_items-1"]
    assert two[0].question.startswith("The following paragraphs")
    union = load_tasks("bigbench:toy_nested")
    assert {t.id for t in union} == {t.id for t in two} | {
        t.id for t in load_tasks("bigbench:toy_nested/three_items")}


def test_splits_are_stable_hashes_of_the_ids(cache: Path) -> None:
    everything = load_tasks("bigbench:toy_nested")
    for split in ("train", "dev", "test"):
        chosen = load_tasks(f"bigbench:toy_nested@{split}")
        assert [t.id for t in chosen] == [t.id for t in everything if split_of(t.id) == split]
    assert [t.id for t in load_tasks("bigbench:toy_sorting:1:3")] == [
        "bigbench-toy_sorting-1", "bigbench-toy_sorting-2"]
    assert split_of("bigbench-word_sorting-17") == split_of("bigbench-word_sorting-17")


def test_spec_grammar_takes_namespaced_sets() -> None:
    spec = parse_spec("bigbench:word_sorting@test:0:50")
    assert (spec.source, spec.split, spec.start, spec.end) == (
        "bigbench:word_sorting", "test", 0, 50)
    spec = parse_spec("bigbench:tracking_shuffled_objects/three_objects@dev")
    assert (spec.source, spec.split) == ("bigbench:tracking_shuffled_objects/three_objects",
                                         "dev")
    assert parse_spec("bigbench:word_sorting:5:").start == 5
    for old in ("gsm8k", "gsm8k:0:30", "gsm8k@dev", "gsm8k@dev:0:20", "gsm8k::30"):
        assert str(parse_spec(old)) == old and parse_spec(old).source == "gsm8k"
    with pytest.raises(EvalError, match="cannot read"):
        parse_spec("gsm8k:0")
    with pytest.raises(EvalError, match="not an integer"):
        parse_spec("gsm8k:abc:def")


def test_unknown_namespace_is_named() -> None:
    with pytest.raises(EvalError, match="namespace 'nosuch'") as exc:
        load_tasks("nosuch:thing")
    assert "bigbench:<task>" in (exc.value.hint or "")


# --- scorers -------------------------------------------------------------------------------

def _mc(expected: str = "blue ball.") -> TaskRecord:
    return TaskRecord(id="t", question="q", expected=expected, scorer="choice", metadata={
        "options": ["red ball.", "blue ball.", "green ball."], "letters": ["A", "B", "C"]})


@pytest.mark.parametrize(("reply", "score"), [
    ("The answer is (B) the blue ball.", 1.0),
    ("The answer is (B).", 1.0),
    ("Let me trace the swaps.\nAlice gives her red ball to Bob.\n\nAnswer: B", 1.0),
    ("After the swap Alice holds the blue ball.", 1.0),
    ("B) blue ball", 1.0),
    ("**(B)**", 1.0),
    ("The answer is (A) the red ball.", 0.0),
    ("The answer is (B) the red ball.", 0.0),  # two different options named
    ("The answer is (A) or (B).", 0.0),
    ("Alice has a ball.", 0.0),
    ("", 0.0),
])
def test_choice_scorer(reply: str, score: float) -> None:
    assert get_scorer("choice")(reply, _mc()) == score


def test_choice_scorer_needs_options_and_a_valid_expected() -> None:
    with pytest.raises(EvalError, match="metadata"):
        get_scorer("choice")("(B)", TaskRecord(id="t", question="q", expected="x"))
    with pytest.raises(EvalError, match="none of its options"):
        get_scorer("choice")("(B)", _mc(expected="purple ball."))


def test_choice_scorer_reads_options_from_a_question_rebuilt_from_a_trace(cache: Path) -> None:
    """The gate rebuilds tasks from traces (question text and label only, no metadata)."""
    from whetstone.engine.evaluation.tasks import tasks_from_traces
    from whetstone.engine.types import Trace

    task = load_tasks("bigbench:toy_choice")[0]
    trace = Trace(id="r1", task=task.question, answer="The answer is (B).", label=task.expected,
                  meta={"task_id": task.id, "scorer": "choice"})
    rebuilt = tasks_from_traces([trace])[0]
    assert not rebuilt.metadata.get("options")
    assert get_scorer("choice")(trace, rebuilt) == 1.0
    assert get_scorer("choice")("The answer is (C).", rebuilt) == 0.0


def test_choice_scorer_prefers_the_longer_option() -> None:
    task = TaskRecord(id="t", question="q", expected="ball", metadata={
        "options": ["ball", "blue ball"], "letters": ["A", "B"]})
    assert get_scorer("choice")("The answer is the blue ball.", task) == 0.0
    assert get_scorer("choice")("The answer is the ball.", task) == 1.0


@pytest.mark.parametrize(("reply", "expected", "score"), [
    ("Answer: apple banana cherry", "apple banana cherry", 1.0),
    ("Sorted: Apple Banana Cherry.", "apple banana cherry", 1.0),
    ("The sorted list is:\n\napple banana cherry", "apple banana cherry", 1.0),
    ("The answer is `apple  banana cherry`", "apple banana cherry", 1.0),
    ("Answer: apple cherry banana", "apple banana cherry", 0.0),
    ("apple, banana, cherry", "apple banana cherry", 1.0),  # list layout aside
    ("apple, cherry, banana", "apple banana cherry", 0.0),
    # Replies of the embedded 0.5B model (direct solver) to word-sorting prompts:
    ("The sorted words alphabetically are:\n\n1. bendix\n2. foxhole", "bendix foxhole", 1.0),
    ("The sorted words alphabetically are: beat, list, scathe", "beat list scathe", 1.0),
    ("Here's the sorted list alphabetically:\n\n1. depredation\n2. brainwash",
     "brainwash depredation", 0.0),
    ("The sorted words alphabetically are:\n\nheadroom wham", "headroom wham", 1.0),
    ("The closing sequence is: ] )", "] )", 1.0),
    ("Output: ])", "] )", 1.0),
    ("Output: ) ]", "] )", 0.0),
    ("Output: ] ) }", "] )", 0.0),
])
def test_exact_text_scorer(reply: str, expected: str, score: float) -> None:
    task = TaskRecord(id="t", question="q", expected=expected)
    assert get_scorer("exact_text")(reply, task) == score


def test_exact_text_accepts_the_input_continued(cache: Path) -> None:
    """A completion task: the reply may write the input and then the answer (in a code block,
    as the 0.5B model does), but not the input alone or another continuation."""
    task = load_tasks("bigbench:toy_closing")[0]
    assert task.metadata["continues"] == "( ["
    scorer = get_scorer("exact_text")
    assert scorer("Here's the completed sequence:\n\n```python\n( [ ] )\n```\n\nDone.",
                  task) == 1.0
    assert scorer("Output: ] )", task) == 1.0
    assert scorer("```\n( [\n```", task) == 0.0
    assert scorer("```\n( [ ) ]\n```", task) == 0.0
    plain = TaskRecord(id="t", question="q", expected="] )")  # no "continues": no prefix
    assert scorer("( [ ] )", plain) == 0.0


def test_exact_text_takes_a_list_of_targets() -> None:
    task = TaskRecord(id="t", question="q", expected=["alpha delta", "alpha, delta"])
    assert get_scorer("exact_text")("Answer: alpha, delta", task) == 1.0


@pytest.mark.parametrize(("reply", "expected", "score"), [
    ("There are seven fruits in total.", ["7", "seven"], 1.0),
    ("I count 3 + 4 = 7. The answer is 7.", ["7", "seven"], 1.0),
    ("The answer is twenty-one.", "21", 1.0),
    ("You have two animals.", "two", 1.0),
    ("The answer is six.", ["7", "seven"], 0.0),
    ("I am not sure.", "two", 0.0),
])
def test_number_scorer(reply: str, expected: Any, score: float) -> None:
    task = TaskRecord(id="t", question="q", expected=expected)
    assert get_scorer("number")(reply, task) == score


def test_number_words() -> None:
    assert words_to_digits("one hundred and five apples") == "105 apples"
    assert words_to_digits("two thousand three hundred") == "2300"
    assert words_to_digits("someone said none") == "someone said none"
    assert words_to_digits("one two, three and four") == "1 2, 3 and 4"  # not one number
    assert words_to_digits("ninety-nine") == "99"


def test_old_exact_scorer_unchanged() -> None:
    task = TaskRecord(id="t", question="q", expected="Paris")
    assert get_scorer("exact")("paris", task) == 0.0  # strict: exact_text is the lenient one


# --- the real sdist, when it has been fetched ----------------------------------------------

FAMILIES = ("word_sorting", "dyck_languages", "tracking_shuffled_objects/three_objects",
            "tracking_shuffled_objects/five_objects", "logical_deduction/three_objects",
            "logical_deduction/five_objects")


def _real_cache() -> Path | None:
    for c in (cache_dir(), Path.home() / ".whetstone" / "cache"):
        if (bigbench.data_dir(c) / "manifest.json").is_file():
            return c
    return None


@pytest.mark.skipif(_real_cache() is None,
                    reason="BIG-bench not fetched (whetstone data fetch bigbench)")
@pytest.mark.parametrize("family", FAMILIES)
def test_real_families_give_50_test_tasks(family: str) -> None:
    tasks = bigbench.load_bigbench(family, _real_cache())
    counts = bigbench.split_counts(tasks.tasks)
    assert counts["test"] >= 50, counts
    assert len({t.id for t in tasks}) == len(tasks)
    expected_scorer = "exact_text" if family in ("word_sorting", "dyck_languages") else "choice"
    assert {t.scorer for t in tasks} == {expected_scorer}


def test_exact_text_reads_a_printed_list_of_strings() -> None:
    """The agent sorts with a program and answers with its output, a Python list."""
    from whetstone.engine.evaluation.scorers import exact_text
    from whetstone.engine.evaluation.tasks import TaskRecord

    task = TaskRecord(id="w", question="Sort: pear apple", expected="apple pear",
                      scorer="exact_text")
    assert exact_text("['apple', 'pear']", task) == 1.0
    assert exact_text("['pear', 'apple']", task) == 0.0
    assert exact_text("[1, 2]", task) == 0.0
