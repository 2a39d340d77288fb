"""Every scorer with tricky answers: units, commas, trailing periods, LaTeX boxes, negatives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from whetstone.engine.errors import EvalError
from whetstone.engine.evaluation.answers import boxed_contents, extract_number, normalise
from whetstone.engine.evaluation.benchmarks import load_benchmark
from whetstone.engine.evaluation.scorers import (
    BUILTIN,
    calls_of,
    get_scorer,
    tool_calls_of,
)
from whetstone.engine.evaluation.tasks import TaskRecord
from whetstone.engine.types import Step, ToolCall, Trace


def task(expected: Any, **kw: Any) -> TaskRecord:
    return TaskRecord(id="t", question="q", expected=expected, **kw)


def score(name: str, prediction: Any, expected: Any) -> float:
    return get_scorer(name)(prediction, task(expected))


# --- the final number ----------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ("The answer is 42.", 42),                     # trailing period
    ("42.", 42),
    ("It costs $1,234.50 in total.", 1234.5),      # $ and thousands comma
    ("1,000,000 people", 1_000_000),
    ("The train covers 120 km in 2 hours, so 60 km/h", 60),   # units; the last number
    ("She needs 5cm more", 5),                     # unit glued to the number
    ("The temperature is -5 degrees", -5),         # negative
    ("It fell to \u22127.5 \u00b0C", -7.5),        # unicode minus
    ("x = -3", -3),
    ("from 3-5 apples, she keeps 5", 5),           # a range's hyphen is not a sign
    ("50% of them", 50),                           # percent
    ("#### 72", 72),                               # GSM8K's own format
    ("work... \n#### 1,600", 1600),
    ("So \\boxed{18} is it, though 20 was close", 18),   # boxed beats the last number
    ("$\\boxed{\\$18.00}$", 18),
    ("\\boxed{\\frac{3}{4}}", 0.75),               # LaTeX fraction
    ("\\boxed{-12}", -12),
    ("\\boxed{x = 2 + 3 = 5}", 5),                 # a boxed equation: its result
    ("\\boxed{\\text{{nested}} 7}", 7),            # braces inside the box
    ("Final Answer: 12 apples, but earlier I said 13", 12),   # the cue beats the last number
    ("Step 1: 4*3 = 12. Step 2: 12 + 1 = 13. The answer is: 13", 13),
    ("answer = .5", 0.5),
    ("1.5e3 metres", 1500),
    ("The answer is 3/4", 0.75),                   # a plain fraction is one number
    ("1.5/3", 0.5),
    ("on 3/4/2024 it rained 7 mm", 7),             # a date is no fraction
    ("\\boxed{\\dfrac12}", 0.5),                   # brace-less LaTeX fraction
    ("\\boxed{2^{10}}", 1024),                     # a power
    ("The answer is 20 - 8 = 12.", 12),            # after the cue: the result of its sum
    ("Final Answer:\n- 42 apples", 42),            # a list bullet is no minus sign
    ("Final Answer:\n-42", -42),
    ("I'm not sure.", None),
    ("", None),
])
def test_extract_number(text: str, value: float | None) -> None:
    got = extract_number(text)
    assert got == (None if value is None else pytest.approx(value))


def test_boxed_contents_balances_braces() -> None:
    assert boxed_contents(r"a \boxed{1} b \boxed{\frac{1}{2}} c \boxed{unclosed") == [
        "1", r"\frac{1}{2}"]


def test_normalise_is_squad_like() -> None:
    assert normalise("  The U.S.  Army!") == "us army"
    assert normalise("An apple, a pear") == "apple pear"


# --- numeric -------------------------------------------------------------------------------

@pytest.mark.parametrize("prediction, expected, value", [
    ("The answer is 1,600.", "1600", 1.0),
    ("#### 1600", "1,600", 1.0),
    ("She makes $18 every day.", "18", 1.0),
    ("\\boxed{18.0}", 18, 1.0),
    ("The answer is -4 degrees.", "-4", 1.0),
    ("The answer is 4 degrees.", "-4", 0.0),
    ("The answer is 17.", "18", 0.0),
    ("I cannot tell.", "18", 0.0),
    ("0.333333333", "0.333333333", 1.0),
    ("It is 3 or 4", ["4", "5"], 1.0),           # list of acceptable answers
    ("The answer is 3/4", "3/4", 1.0),
    ("1/4", "3/4", 0.0),
])
def test_numeric(prediction: str, expected: Any, value: float) -> None:
    assert score("numeric", prediction, expected) == value


def test_numeric_tolerance_is_configurable() -> None:
    assert score("numeric", "3.14", "3.14159") == 0.0
    assert score("numeric:0.01", "3.14", "3.14159") == 1.0
    with pytest.raises(EvalError, match="not a number"):
        get_scorer("numeric:abc")
    with pytest.raises(EvalError, match=">= 0"):
        get_scorer("numeric:-1")


def test_numeric_refuses_an_expected_answer_without_a_number() -> None:
    with pytest.raises(EvalError, match="holds no number"):
        score("numeric", "5", "five")


# --- text scorers --------------------------------------------------------------------------

def test_exact_only_strips_whitespace() -> None:
    assert score("exact", "  Paris\n", "Paris") == 1.0
    assert score("exact", "paris", "Paris") == 0.0
    assert score("exact", "Paris.", "Paris") == 0.0


@pytest.mark.parametrize("prediction, expected, value", [
    ("paris.", "Paris", 1.0),
    ("The Eiffel Tower!", "eiffel tower", 1.0),
    ("  1,000 ", "1000", 1.0),
    ("Paris, France", "Paris", 0.0),
    ("Lyon", ["Paris", "lyon"], 1.0),
    ("3.5", "35", 0.0),                              # a decimal point is kept
    ("-5", "5", 0.0),                                # and a minus sign
    ("5.", "5", 1.0),                                # a trailing period is not
])
def test_normalised_exact(prediction: str, expected: Any, value: float) -> None:
    assert score("normalised", prediction, expected) == value
    assert score("normalized", prediction, expected) == value  # alias


@pytest.mark.parametrize("prediction, expected, value", [
    ("It was Arthur's Magazine, founded in 1844.", "Arthur's Magazine", 1.0),
    ("The capital is Delhi.", "delhi", 1.0),
    ("The capital is New Delhi.", "Delhi", 1.0),    # whole words inside
    ("Delhiwala", "Delhi", 0.0),                    # not part of a word
    ("No.", "no", 1.0),
    ("I don't know", "no", 0.0),
    ("anything", "", 0.0),                          # an empty answer matches nothing
    ("The answer is -5", "5", 0.0),                 # a sign is part of the number
])
def test_contains_matches_whole_words(prediction: str, expected: str, value: float) -> None:
    assert score("contains", prediction, expected) == value


def test_token_f1_against_hand_computed_values() -> None:
    # pred tokens: [barack, obama, was, president]; gold: [president, obama]
    # common = 2, precision = 2/4, recall = 2/2, F1 = 2 * 0.5 * 1 / 1.5 = 2/3.
    assert score("f1", "Barack Obama was president", "President Obama") == pytest.approx(2 / 3)
    assert score("f1", "the cat", "a cat") == 1.0           # articles are dropped
    assert score("f1", "dog", "cat") == 0.0
    assert score("f1", "", "") == 1.0
    assert score("f1", "x y", ["z", "x"]) == pytest.approx(2 / 3)


def test_text_scorers_read_a_traces_answer() -> None:
    trace = Trace(id="1", task="q", answer="The answer is 42.")
    assert get_scorer("numeric")(trace, task("42")) == 1.0
    assert get_scorer("contains")(Trace(id="2", task="q"), task("x")) == 0.0  # no answer


def test_missing_expected_answer_is_a_clear_error() -> None:
    with pytest.raises(EvalError, match="no expected answer"):
        score("contains", "x", None)


# --- BFCL ----------------------------------------------------------------------------------

def _first_allowed(v: Any) -> Any:
    """A value built from the first allowed option at every level of a possible_answer."""
    if isinstance(v, dict):
        return {k: _first_allowed(next(o for o in opts if o != ""))
                for k, opts in v.items() if any(o != "" for o in opts)}
    if isinstance(v, list) and v and all(isinstance(d, dict) for d in v):
        return [_first_allowed(d) for d in v]
    return v


@pytest.mark.parametrize("set_name", ["bfcl-simple", "bfcl-multiple"])
def test_bfcl_every_ground_truth_call_is_accepted(set_name: str) -> None:
    # Real data: the call built from each task's own allowed values must score 1.
    scorer = get_scorer("bfcl")
    failures = []
    for t in load_benchmark(set_name):
        (name, params), = t.expected[0].items()
        args = {p: _first_allowed(next(o for o in opts if o != ""))
                for p, opts in params.items() if any(o != "" for o in opts)}
        call = ToolCall(name.replace(".", "_"), json.dumps(args))
        if scorer(call, t) != 1.0:
            failures.append(t.id)
    assert failures == []


def _factorial_task() -> TaskRecord:
    return load_benchmark("bfcl-simple")[1]  # math.factorial(number=5)


def _triangle_task() -> TaskRecord:
    return load_benchmark("bfcl-simple")[0]  # base [10], height [5], unit ["units", ""]


@pytest.mark.parametrize("name, args, value", [
    ("math_factorial", {"number": 5}, 1.0),
    ("math.factorial", {"number": 5}, 1.0),        # the original dotted name
    ("math_factorial", {"number": 6}, 0.0),        # wrong value
    ("math_factorial", {"number": "5"}, 0.0),      # wrong type
    ("math_factorial", {"number": 5.0}, 0.0),      # a float is not an integer
    ("math_factorial", {"number": True}, 0.0),     # nor is a bool
    ("math_factorial", {}, 0.0),                   # missing required
    ("math_factorial", {"number": 5, "x": 1}, 0.0),  # unknown parameter
    ("factorial", {"number": 5}, 0.0),             # wrong function
])
def test_bfcl_call_match(name: str, args: dict, value: float) -> None:
    assert get_scorer("bfcl")(ToolCall(name, json.dumps(args)), _factorial_task()) == value


def test_bfcl_optional_parameters_and_string_standardisation() -> None:
    t, s = _triangle_task(), get_scorer("bfcl")
    assert s(ToolCall("calculate_triangle_area", '{"base": 10, "height": 5}'), t) == 1.0
    assert s(ToolCall("calculate_triangle_area", '{"base": 10, "height": 5, "unit": "Units"}'),
             t) == 1.0
    assert s(ToolCall("calculate_triangle_area", '{"base": 10, "height": 5, "unit": "cm"}'),
             t) == 0.0
    assert s(ToolCall("calculate_triangle_area", '{"base": 10, "height": 5'), t) == 0.0  # bad JSON


def test_bfcl_float_parameter_accepts_an_int() -> None:
    fn = {"name": "f", "parameters": {"type": "dict", "required": ["x"], "properties": {
        "x": {"type": "float"}, "tags": {"type": "array", "items": {"type": "string"}}}}}
    t = TaskRecord(id="f", question="q", scorer="bfcl", metadata={"bfcl_functions": [fn]},
                   expected=[{"f": {"x": [2.0], "tags": [["A b", "c"], ""]}}])
    s = get_scorer("bfcl")
    assert s(ToolCall("f", '{"x": 2}'), t) == 1.0
    assert s(ToolCall("f", '{"x": 2.0, "tags": ["a  B", "C"]}'), t) == 1.0
    assert s(ToolCall("f", '{"x": 2.0, "tags": ["c", "a b"]}'), t) == 0.0  # order matters


def test_bfcl_reads_the_first_act_step_of_a_trace() -> None:
    t = _factorial_task()
    steps = (
        Step(kind="think", module="think", output="let me call it"),
        Step(kind="act", module="act", input={"tool": "math_factorial", "arguments": {"number": 5}}),
        Step(kind="observe", module="act", output="120"),
        Step(kind="act", module="act", input={"tool": "math_factorial", "arguments": {"number": 6}}),
    )
    trace = Trace(id="1", task=t.prompt, steps=steps, answer="120")
    assert tool_calls_of(trace) == [("math_factorial", {"number": 5}),
                                    ("math_factorial", {"number": 6})]
    assert get_scorer("bfcl")(trace, t) == 1.0
    assert get_scorer("bfcl")(trace.with_(steps=steps[:1]), t) == 0.0  # no call at all


@pytest.mark.parametrize("prediction", [
    '{"name": "math_factorial", "arguments": {"number": 5}}',
    '[{"name": "math.factorial", "arguments": "{\\"number\\": 5}"}]',
    "```json\n{\"function\": {\"name\": \"math_factorial\", \"arguments\": {\"number\": 5}}}\n```",
    "math.factorial(number=5)",
    "[math.factorial(number=5)]",
    {"name": "math_factorial", "arguments": {"number": 5}},
    [ToolCall("math_factorial", '{"number": 5}')],
])
def test_bfcl_accepts_calls_written_as_text_or_objects(prediction: Any) -> None:
    assert get_scorer("bfcl")(prediction, _factorial_task()) == 1.0


def test_calls_of_rejects_what_is_not_a_call() -> None:
    assert calls_of("The factorial of 5 is 120.") == []
    assert calls_of("f(5)") == []  # positional arguments cannot be matched to names
    assert calls_of(None) == []


def test_bfcl_needs_ground_truth() -> None:
    with pytest.raises(EvalError, match="ground truth"):
        get_scorer("bfcl")("x", task("just text"))


# --- user scorers and errors ---------------------------------------------------------------

def test_user_scorer_by_module_and_by_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    src = ("def length_match(prediction, task):\n"
           "    text = prediction if isinstance(prediction, str) else prediction.answer\n"
           "    return float(len(text) == len(task.expected))\n"
           "def broken(prediction, task):\n"
           "    return 2\n")
    (tmp_path / "my_scorers.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert get_scorer("my_scorers:length_match")("abc", task("xyz")) == 1.0
    by_file = get_scorer(f"{tmp_path / 'my_scorers.py'}:length_match")
    assert by_file("ab", task("xyz")) == 0.0
    with pytest.raises(EvalError, match=r"returned 2 .* \[0, 1\]"):
        get_scorer("my_scorers:broken")("a", task("b"))
    with pytest.raises(EvalError, match="no function 'nope'"):
        get_scorer("my_scorers:nope")
    with pytest.raises(EvalError, match="cannot import scorer module"):
        get_scorer("no_such_module_xyz:f")


def test_unknown_scorer_lists_the_built_in_ones() -> None:
    with pytest.raises(EvalError) as e:
        get_scorer("bleu")
    assert all(name in (e.value.hint or "") for name in BUILTIN)
