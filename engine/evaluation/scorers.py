"""Scorers: ``(prediction, task) -> float`` in [0, 1].

A prediction is what the agent produced: a ``Trace`` (text scorers read ``trace.answer``; the
BFCL scorer reads its tool calls), a plain string, or for BFCL a ``ToolCall`` / list of calls.
``task.expected`` may be a list of acceptable answers; text scorers take the best match.

Built-in names (``get_scorer``): ``exact``, ``normalised`` (alias ``normalized``),
``numeric`` (``numeric:TOL`` sets a relative tolerance), ``contains`` (no credit for a hedge:
``strict.py``), ``value`` (strict: the answer's one value; ``value:TOL``), ``f1``, ``bfcl``, and
for task sets built from other formats (``whetstone.engine.evaluation.bigbench``): ``choice`` (a
multiple-choice option named by letter or text), ``exact_text`` (the final answer's text,
case and spacing aside, punctuation kept) and ``number`` (``numeric`` that also reads number
words: "seven" -> 7).

Anything else of the form ``module:function`` (or ``path/to/file.py:function``) is a user
scorer, called as ``function(answer, task)``: ``answer`` is the answer text (a ``str``,
``""`` when the run gave none), ``task`` the ``TaskRecord``. A user scorer that declares a
``trace`` parameter (or ``**kwargs``) also gets the whole run as ``trace=`` (a ``Trace``,
None when the prediction was plain text). See ``USER_SCORER_HELP``.

The tool calls of a trace are read from its steps of kind ``"act"`` whose ``input`` is
``{"tool": <name>, "arguments": <dict or JSON text>}``, in step order (``tool_calls_of``);
the runtime writes its act steps in that shape.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whetstone.engine.answer_text import answer_span
from whetstone.engine.errors import EvalError, WhetstoneError
from whetstone.engine.evaluation.answers import extract_number, normalise, tokens
from whetstone.engine.evaluation.bfcl import check_calls
from whetstone.engine.evaluation.strict import contains_score, value_score
from whetstone.engine.evaluation.tasks import TaskRecord, is_user_scorer
from whetstone.engine.types import ToolCall, Trace

Prediction = Trace | str | ToolCall | Sequence[Any] | Mapping[str, Any] | None
ScoreFn = Callable[[Prediction, TaskRecord], float]

USER_SCORER_HELP = """\
A user scorer is FILE.py:FUNCTION or module:FUNCTION, called once per task as
FUNCTION(answer, task) -> float in [0, 1]:
  answer  the agent's answer text (str; "" when it gave none)
  task    the task record: task.expected, task.question, task.metadata, task.id
Declare a `trace=None` parameter to get the whole run too (whetstone.engine.types.Trace:
its steps, tool calls, tokens). A run where every task scores 0 is flagged."""


@dataclass(frozen=True)
class NamedScorer:
    """A scorer with the name it was asked for; checks that every score is a number in [0, 1]."""

    name: str
    fn: ScoreFn

    def __call__(self, prediction: Prediction, task: TaskRecord) -> float:
        try:
            value = self.fn(prediction, task)
        except WhetstoneError:
            raise
        except Exception as exc:  # a user scorer's bug: stop with its name, not a traceback
            raise EvalError(f"scorer {self.name!r} failed on task {task.id}: "
                            f"{type(exc).__name__}: {exc}", hint=USER_SCORER_HELP) from exc
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, (int, float)) or math.isnan(value) or not 0.0 <= value <= 1.0:
            raise EvalError(f"scorer {self.name!r} returned {value!r} for task {task.id}; "
                            "a score must be a number in [0, 1]",
                            hint="fix the scorer so it returns a float between 0 and 1")
        return float(value)


# --- reading predictions -------------------------------------------------------------------

def text_of(prediction: Prediction) -> str:
    """The answer text of a prediction (a trace's ``answer``; ``""`` when there is none)."""
    if prediction is None:
        return ""
    if isinstance(prediction, Trace):
        return prediction.answer or ""
    if isinstance(prediction, str):
        return prediction
    return str(prediction)


def _args(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return raw  # bad JSON stays text; the checker then rejects the call
    return raw


def tool_calls_of(trace: Trace) -> list[tuple[str, Any]]:
    """The (name, arguments) of every tool call in a trace, in order, from its ``act`` steps."""
    calls: list[tuple[str, Any]] = []
    for step in trace.steps:
        if step.kind != "act" or not isinstance(step.input, Mapping):
            continue
        name = step.input.get("tool")
        if isinstance(name, str) and name:
            calls.append((name, _args(step.input.get("arguments", {}))))
    return calls


def _call_from_mapping(d: Mapping[str, Any]) -> tuple[str, Any] | None:
    fn = d.get("function", d)
    if not isinstance(fn, Mapping):
        return None
    name = fn.get("name") or fn.get("tool")
    if not isinstance(name, str):
        return None
    return name, _args(fn.get("arguments", fn.get("parameters", {})))


def _calls_from_text(text: str) -> list[tuple[str, Any]]:
    """Calls written as text: a JSON call object / list, or Python syntax ``f(a=1, b="x")``."""
    text = text.strip().strip("`")
    if text.startswith("json"):
        text = text[4:].strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, Mapping):
        call = _call_from_mapping(data)
        return [call] if call else []
    if isinstance(data, list):
        return [c for c in (_call_from_mapping(d) for d in data if isinstance(d, Mapping)) if c]
    try:
        tree = ast.parse(text.strip("[]"), mode="eval")
    except SyntaxError:
        return []
    nodes = tree.body.elts if isinstance(tree.body, ast.Tuple) else [tree.body]
    calls: list[tuple[str, Any]] = []
    for node in nodes:
        if not isinstance(node, ast.Call) or node.args:
            return []
        try:
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        except ValueError:
            return []
        calls.append((ast.unparse(node.func), kwargs))
    return calls


def calls_of(prediction: Prediction) -> list[tuple[str, Any]]:
    """Tool calls from any prediction shape: a Trace, ToolCall(s), call dicts, or text."""
    if prediction is None:
        return []
    if isinstance(prediction, Trace):
        return tool_calls_of(prediction)
    if isinstance(prediction, ToolCall):
        return [(prediction.name, _args(prediction.arguments))]
    if isinstance(prediction, str):
        return _calls_from_text(prediction)
    if isinstance(prediction, Mapping):
        call = _call_from_mapping(prediction)
        return [call] if call else []
    out: list[tuple[str, Any]] = []
    for item in prediction:
        out += calls_of(item)
    return out


def _alternatives(task: TaskRecord) -> list[str]:
    exp = task.expected
    if exp is None:
        raise EvalError(f"task {task.id} has no expected answer, so it cannot be scored",
                        hint="add `expected` to the task record, or use a user scorer")
    items = exp if isinstance(exp, (list, tuple)) else [exp]
    return [str(x) for x in items]


# --- the scorers ---------------------------------------------------------------------------

def exact(prediction: Prediction, task: TaskRecord) -> float:
    """1 when the answer equals an expected answer after stripping surrounding whitespace."""
    pred = text_of(prediction).strip()
    return float(any(pred == alt.strip() for alt in _alternatives(task)))


def _readings(prediction: Prediction) -> set[str]:
    """The whole answer text, and the part of it that is the answer (``answer_span``: a box,
    what "the answer is" gives, else the final line), so a direct reply and the agent's are
    read alike."""
    text = text_of(prediction)
    return {text, answer_span(text)}


def normalised_exact(prediction: Prediction, task: TaskRecord) -> float:
    """1 when the answer (or its answer span) matches after SQuAD normalisation (case,
    punctuation, articles)."""
    preds = {normalise(t) for t in _readings(prediction)}
    return float(any(normalise(alt) in preds for alt in _alternatives(task)))


def contains(prediction: Prediction, task: TaskRecord) -> float:
    """1 when a normalised expected answer appears in the normalised answer as whole words,
    and the reply does not hedge: its answer names no other candidate (``X or Y``, a list of
    several entities, another of the task's possible values) and the match is not in a copy
    of the question (``strict.contains_score``)."""
    return contains_score(text_of(prediction), task.prompt, _alternatives(task), task.metadata)


def value(prediction: Prediction, task: TaskRecord, rel_tol: float = 1e-6) -> float:
    """1 when the answer's one value equals an expected value after normalisation: numbers
    within ``rel_tol`` (plus 0.005 for money-like values), text case-folded and trimmed; a
    reply that names several candidate values, or repeats the question, scores 0
    (``strict``; docs/cli.md, "Scorers")."""
    return value_score(text_of(prediction), task.prompt, _alternatives(task), task.metadata,
                       rel_tol=rel_tol)


def token_f1(prediction: Prediction, task: TaskRecord) -> float:
    """SQuAD token F1 between the answer (or its answer span) and the best expected answer."""
    return max(_f1(tokens(t), task) for t in _readings(prediction))


def _f1(pred: list[str], task: TaskRecord) -> float:
    best = 0.0
    for alt in _alternatives(task):
        gold = tokens(alt)
        if not pred or not gold:
            best = max(best, float(pred == gold))
            continue
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            p, r = common / len(pred), common / len(gold)
            best = max(best, 2 * p * r / (p + r))
    return best


def numeric(prediction: Prediction, task: TaskRecord, rel_tol: float = 1e-6,
            abs_tol: float = 1e-9) -> float:
    """1 when the answer's final number equals the expected number within tolerance
    (see ``answers.extract_number`` for how the final number is found)."""
    pred = extract_number(text_of(prediction))
    if pred is None:
        return 0.0
    for alt in (task.expected if isinstance(task.expected, (list, tuple)) else [task.expected]):
        if alt is None:
            raise EvalError(f"task {task.id} has no expected answer, so it cannot be scored",
                            hint="add `expected` to the task record")
        gold = extract_number(alt)
        if gold is None:
            raise EvalError(f"task {task.id}: expected answer {alt!r} holds no number",
                            hint="use a text scorer (normalised, contains) for this set")
        if math.isclose(pred, gold, rel_tol=rel_tol, abs_tol=abs_tol):
            return 1.0
    return 0.0


def bfcl_call(prediction: Prediction, task: TaskRecord) -> float:
    """1 when the first tool call matches BFCL's ``possible_answer``
    (see ``whetstone.engine.evaluation.bfcl``)."""
    truth = task.expected
    if not isinstance(truth, (list, tuple)) or not all(isinstance(t, Mapping) for t in truth):
        raise EvalError(f"task {task.id}: the bfcl scorer needs `expected` to be BFCL's "
                        "ground truth, a list of {function: {param: [allowed values]}}",
                        hint="load the task from bfcl-simple / bfcl-multiple")
    functions = task.metadata.get("bfcl_functions") or [
        t.get("function", t) for t in task.tools]
    if not functions:  # nothing to check types against: a 0 here would be a false verdict
        raise EvalError(f"task {task.id}: the bfcl scorer needs the task's function "
                        "definitions (its tools or metadata['bfcl_functions'])",
                        hint="score against the task as loaded from bfcl-simple / bfcl-multiple")
    calls = [(n, a) for n, a in calls_of(prediction)]
    if calls and not isinstance(calls[0][1], Mapping):
        return 0.0  # the arguments were not a JSON object
    return float(check_calls(calls, functions, truth).ok)


# --- multiple choice, exact text, numbers in words -----------------------------------------

_LETTER_IN_PARENS = re.compile(r"\(([A-Z])\)")
# The whole answer is a letter: "B", "B.", "B)", "Option B", "choice (B)", "letter: B".
_BARE_LETTER = re.compile(r"^(?:(?:option|choice|letter)\s*:?\s*)?\(?([A-Z])\)?[.:)]?$",
                          re.IGNORECASE)
_LEADING_LETTER = re.compile(r"^\(?([A-Z])[.):]\s")  # "B) red ball", "B. red ball"


_LISTED_OPTION = re.compile(r"^\(([A-Z])\)\s+(.+?)\s*$", re.MULTILINE)


def _options_of(task: TaskRecord) -> tuple[list[str], list[str]]:
    """The options and their letters: from ``metadata`` (``options``, ``letters``), else read
    back from "(A) ..." lines of the question (a task rebuilt from a trace keeps only that)."""
    options, letters = task.metadata.get("options"), task.metadata.get("letters")
    if (isinstance(options, (list, tuple)) and isinstance(letters, (list, tuple))
            and len(options) == len(letters) and options):
        return [str(o) for o in options], [str(x).upper() for x in letters]
    listed = _LISTED_OPTION.findall(task.prompt)
    if len(listed) >= 2 and [x for x, _ in listed] == [chr(65 + i) for i in range(len(listed))]:
        return [o for _, o in listed], [x for x, _ in listed]
    raise EvalError(f"task {task.id}: the choice scorer needs the options: metadata['options'] "
                    "and metadata['letters'], or '(A) ...' lines in the question",
                    hint="load the task from a multiple-choice set (bigbench:<task>), or "
                         "use a text scorer")


def named_options(text: str, options: Sequence[str], letters: Sequence[str]) -> set[int]:
    """The indices of the options a reply's final answer names, by letter ("(B)", a bare
    "B") or by the option's text (whole words, normalised). An option whose text lies inside
    a longer option that is also named is not counted separately ("ball" in "blue ball")."""
    span = answer_span(text)
    by_letter = {letters.index(x) for x in _LETTER_IN_PARENS.findall(span) if x in letters}
    bare = _BARE_LETTER.match(span.strip(" *_`\"'")) or _LEADING_LETTER.match(span)
    if bare and bare.group(1).upper() in letters:
        by_letter.add(letters.index(bare.group(1).upper()))
    padded = f" {normalise(span)} "
    texts = [normalise(o) for o in options]
    by_text = {i for i, t in enumerate(texts) if t and f" {t} " in padded}
    by_text = {i for i in by_text if not any(j != i and texts[i] in texts[j] for j in by_text)}
    return by_letter | by_text


def choice(prediction: Prediction, task: TaskRecord) -> float:
    """1 when the final answer names exactly one option and it is a correct one (``expected``:
    the correct option text, or a list of them). Naming two different options scores 0."""
    options, letters = _options_of(task)
    wanted = {a.strip() for a in _alternatives(task)}
    correct = {i for i, o in enumerate(options) if o.strip() in wanted}
    if not correct:
        raise EvalError(f"task {task.id}: expected {task.expected!r} is none of its options",
                        hint="set `expected` to the text of the correct option(s)")
    named = named_options(text_of(prediction), options, letters)
    return float(len(named) == 1 and named <= correct)


_LIST_MARKER = re.compile(r"^\s*(?:\d{1,3}[.)]|[-*\u2022])\s+", re.MULTILINE)  # "1. x", "- x"
_LABEL = re.compile(r"^[A-Za-z][A-Za-z ]{0,60}:\s*")  # "Sorted: ..." opening the final line
_FENCE = re.compile(r"```[\w+-]*\n(.*?)```", re.DOTALL)


def _text_key(text: str) -> str:
    """Text up to case, spacing and list layout: lower case; items one per line, numbered or
    bulleted, or separated by ", " read as one space-separated sequence; no space between two
    symbols (") ]" equals ")]"); no surrounding quotes, emphasis or final full stop."""
    text = _LIST_MARKER.sub("", unicodedata.normalize("NFKC", text))
    text = text.lower().replace(", ", " ").strip(" \t\n*_`\"'")
    text = text.removesuffix(".")
    text = " ".join(text.split())
    return re.sub(r"(?<=[^\w\s]) (?=[^\w\s])", "", text)


def _text_readings(text: str) -> set[str]:
    """The parts of a reply that may be its answer: all of it, the answer span, the final
    line (and without a leading "Label:"), the final paragraph, the last code block."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    last = lines[-1].strip(" *_`") if lines else ""
    fences = _FENCE.findall(text)
    readings = {text, answer_span(text), last, _LABEL.sub("", last),
                re.split(r"\n\s*\n", text.strip())[-1], *fences[-1:]}
    return readings | {r for r in map(_listed, readings) if r is not None}


def _listed(text: str) -> str | None:
    """A printed list of strings (``['apple', 'fig']``, the output of ``print(sorted(w))``) as
    the space-separated sequence it stands for; None when the text is not one."""
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")) or len(text) > 100_000:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return " ".join(value)
    return None


def exact_text(prediction: Prediction, task: TaskRecord) -> float:
    """1 when a reading of the reply (``_text_readings``) equals an expected text up to case,
    spacing and list layout (``_text_key``); the words and symbols themselves must match.
    When ``metadata["continues"]`` holds the text the answer continues (a completion task),
    that text followed by the expected one counts too."""
    keys = {_text_key(r) for r in _text_readings(text_of(prediction))}
    prefix = task.metadata.get("continues")
    for alt in _alternatives(task):
        if _text_key(alt) in keys:
            return 1.0
        if isinstance(prefix, str) and prefix.strip() and _text_key(f"{prefix} {alt}") in keys:
            return 1.0
    return 0.0


_UNITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
          "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
          "eighteen", "nineteen"]
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_WORD_VALUE = {w: i for i, w in enumerate(_UNITS)} | {w: 20 + 10 * i for i, w in enumerate(_TENS)}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_ANY_WORD = "|".join(sorted(_WORD_VALUE | _SCALES, key=len, reverse=True))
_AND = r"(?:(?<=hundred)|(?<=thousand)|(?<=million))\s+and\s+"  # "one hundred and five"
_NUMBER_WORDS = re.compile(rf"\b(?:{_ANY_WORD})(?:(?:{_AND}|[\s-]+)(?:{_ANY_WORD}))*\b",
                           re.IGNORECASE)


def _words_values(words: str) -> list[int]:
    """A run of number words as numbers: "twenty-one" -> [21], "one hundred and five" ->
    [105], but "one two" -> [1, 2] (a word that cannot extend the number starts a new one)."""
    out: list[int] = []
    total = current = 0
    last = ""  # kind of the previous word: unit, tens, scale
    for w in re.split(r"[\s-]+", words.lower()):
        if w == "and":
            continue
        kind = "scale" if w in _SCALES else "tens" if w in _TENS else "unit"
        extends = last == "scale" or (last == "tens" and kind == "unit"
                                      and _WORD_VALUE[w] < 10) or (kind == "scale" and last)
        if last and not extends:
            out.append(total + current)
            total = current = 0
        if kind == "scale":
            current = max(current, 1) * _SCALES[w]
            if _SCALES[w] >= 1000:
                total, current = total + current, 0
        else:
            current += _WORD_VALUE[w]
        last = kind
    return [*out, total + current]


def words_to_digits(text: str) -> str:
    """Number words as digits: "twenty-one apples" -> "21 apples", "seven" -> "7"."""
    return _NUMBER_WORDS.sub(
        lambda m: " ".join(str(v) for v in _words_values(m.group(0))), text)


def number(prediction: Prediction, task: TaskRecord) -> float:
    """``numeric`` on the reply with number words read as numbers ("seven" -> 7); the
    expected answers may be words too."""
    exp = task.expected
    items = exp if isinstance(exp, (list, tuple)) else [exp]
    converted = [words_to_digits(x) if isinstance(x, str) else x for x in items]
    pred = words_to_digits(text_of(prediction))
    return numeric(pred, task.with_(expected=converted))


BUILTIN: dict[str, ScoreFn] = {
    "exact": exact,
    "normalised": normalised_exact,
    "contains": contains,
    "f1": token_f1,
    "numeric": numeric,
    "bfcl": bfcl_call,
    "choice": choice,
    "exact_text": exact_text,
    "number": number,
    "value": value,
}
_ALIASES = {"normalized": "normalised", "normalised_exact": "normalised",
            "normalized_exact": "normalised", "token_f1": "f1", "bfcl_call": "bfcl"}


def _accepts(fn: Callable[..., Any], keyword: str) -> bool:
    """Whether ``fn`` takes ``keyword`` as a keyword argument (or any keyword)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return any(p.kind is p.VAR_KEYWORD or (p.name == keyword and p.kind in (
        p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) for p in params)


def _check_arity(fn: Callable[..., Any], name: str) -> None:
    """A user scorer must take (answer, task) positionally; say so at load time."""
    try:
        inspect.signature(fn).bind("answer", "task")
    except TypeError as exc:
        raise EvalError(f"user scorer {name!r} cannot be called as {name.rpartition(':')[2]}"
                        f"(answer, task): {exc}", hint=USER_SCORER_HELP) from None
    except ValueError:
        return  # no signature to check: it will be called as documented


def user_scorer(fn: Callable[..., Any]) -> ScoreFn:
    """Adapt a user function to the scorer contract: it receives the answer text and the
    task, and ``trace=`` when it declares that parameter."""
    with_trace = _accepts(fn, "trace")

    def score(prediction: Prediction, task: TaskRecord) -> float:
        answer = text_of(prediction)
        if with_trace:
            return fn(answer, task, trace=prediction if isinstance(prediction, Trace) else None)
        return fn(answer, task)

    score.__name__ = getattr(fn, "__name__", "user_scorer")
    return score


def _user_scorer(name: str) -> ScoreFn:
    module_name, _, attr = name.rpartition(":")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise EvalError(f"scorer file {path} does not exist",
                                hint="give path/to/file.py:function or module:function")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EvalError(f"cannot import scorer module {module_name!r} ({exc})",
                        hint="check the module is importable (on PYTHONPATH) or give a .py path"
                        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise EvalError(f"{module_name!r} has no function {attr!r}", hint=USER_SCORER_HELP)
    _check_arity(fn, name)
    return user_scorer(fn)


def get_scorer(name: str) -> NamedScorer:
    """A scorer by name: a built-in, ``numeric:TOL``, or a user ``module:function``. Only pass
    a user scorer name that the person running whetstone chose (``is_user_scorer``)."""
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if key in BUILTIN:
        return NamedScorer(key, BUILTIN[key])
    head, sep, tail = name.partition(":")
    if sep and head.strip().lower() in ("numeric", "value"):
        kind = head.strip().lower()
        try:
            tol = float(tail)
        except ValueError:
            raise EvalError(f"{kind} tolerance {tail!r} is not a number",
                            hint=f"e.g. --scorer {kind}:0.01 (relative tolerance)") from None
        if not tol >= 0:
            raise EvalError(f"{kind} tolerance must be >= 0, got {tol}",
                            hint=f"e.g. {kind}:0.01")
        if kind == "value":
            return NamedScorer(name, lambda p, t: value(p, t, rel_tol=tol))
        return NamedScorer(name, lambda p, t: numeric(p, t, rel_tol=tol, abs_tol=tol))
    if is_user_scorer(name):
        return NamedScorer(name.strip(), _user_scorer(name.strip()))
    raise EvalError(f"unknown scorer {name!r}",
                    hint="built-in scorers: " + ", ".join(BUILTIN)
                    + "; or a user scorer as module:function")


def as_scorer(scorer: str | ScoreFn | None, default: str) -> NamedScorer:
    """Turn a name, a plain function or ``None`` (use ``default``) into a ``NamedScorer``."""
    if scorer is None:
        return get_scorer(default)
    if isinstance(scorer, NamedScorer):
        return scorer
    if isinstance(scorer, str):
        return get_scorer(scorer)
    return NamedScorer(getattr(scorer, "__name__", "custom"), scorer)
