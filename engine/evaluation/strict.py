"""Strict reading of an answer: the one value a reply gives, and replies that hedge.

A reply hedges when its answer names other candidates beside the label (two of the task's
possible values, ``hammer or saw``, a list of several entities when one was asked) or when it
only repeats the question. ``contains`` (``scorers.py``) credits no hedge; ``value`` reads the
answer's one value and scores 0 for any reply that gives several.

The answer is read as every scorer reads it: ``answer_span`` (a ``\\boxed{}``, what "the answer
is" gives, else the final line; ``engine/answer_text.py``).

``value``: the final answer's value after normalisation (docs/cli.md, "Scorers"):

- an expected number (``12.5``, ``$12.50``, ``1,234``, ``40%``, ``2.5 meters``) is matched by the
  one number the answer gives, within a relative tolerance (default ``1e-6``, ``value:TOL`` sets
  it) plus an absolute ``0.005`` when the value is money-like (a currency sign or word, or two
  decimals: ``12.495`` is ``12.50``), else ``1e-9``. A number may carry a unit word
  (``2.5 meters`` is ``2.5``). Numbers the question itself gives (``order 17``) are not counted
  as candidates; after an ``=`` only the result is read (``30 + 12 = 42`` gives ``42``). Two
  different numbers left: several candidates, 0;
- any other expected value is compared as text: case-folded (NFKC), whitespace collapsed,
  surrounding punctuation, quotes and emphasis trimmed; the answer equals it, or states it
  in a sentence (as whole words) that names no other candidate.

A task's possible values, when it has them, are ``metadata["candidates"]``,
``metadata["options"]`` or ``metadata["choices"]`` (a list).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

from whetstone.engine.answer_text import answer_span
from whetstone.engine.evaluation.answers import normalise, numbers_in

CANDIDATE_KEYS = ("candidates", "options", "choices")
MONEY_ABS_TOL = 0.005  # half a cent: a money-like value rounded to cents still matches
_TRIM = " \t\n\"'`*_.,;:!?()[]{}<>\u2018\u2019\u201c\u201d"
_CURRENCY = re.compile(r"[$\u20ac\u00a3\u00a5]|\b(?:usd|eur|gbp|dollars?|euros?|pounds?|cents?)\b",
                       re.IGNORECASE)
# An expected value that is a number: optional currency sign, sign, digits with thousands
# commas, decimals, then a percent sign or one unit word.
_NUMBER_VALUE = re.compile(
    r"^[$\u20ac\u00a3\u00a5]?\s?[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<dec>\d+))?"
    r"(?:\s*%|\s+[A-Za-z]+)?$")
_OR = re.compile(r"\s+(?:or|vs\.?|versus)\s+|\s*/\s*", re.IGNORECASE)
_LIST = re.compile(r"\s*[,;\n|]\s*|\s+(?:and|&)\s+", re.IGNORECASE)
_SHORT = 3  # words: an item of a list this short names an entity, a longer one is a clause


def candidates_of(metadata: Any) -> list[str]:
    """The task's possible values (``metadata`` ``candidates``/``options``/``choices``)."""
    if not isinstance(metadata, dict):
        return []
    for key in CANDIDATE_KEYS:
        found = metadata.get(key)
        if isinstance(found, (list, tuple)) and found:
            return [str(x) for x in found if isinstance(x, (str, int, float))]
    return []


def _asks(question: str) -> list[str]:
    """The parts of a question a reply may copy: all of it, and its last sentence (where a
    long question's schema ends and the ask begins); only parts of 4 words or more."""
    parts = [question, re.split(r"(?<=[.!:])\s+", question.strip())[-1]]
    return [n for n in dict.fromkeys(normalise(p) for p in parts) if len(n.split()) >= 4]


def without_question(text: str, question: str) -> str:
    """``text`` normalised (``answers.normalise``), every copy of the question taken out."""
    out = f" {normalise(text)} "
    for ask in _asks(question):
        out = out.replace(f" {ask} ", " ")
    return " ".join(out.split())


def cut_question(text: str, question: str) -> str:
    """``text`` with the copies of the question (or of its last sentence) written as in the
    question, up to case and spacing, cut out; its own punctuation kept."""
    for part in (question.strip(), re.split(r"(?<=[.!:])\s+", question.strip())[-1]):
        words = part.split()
        if len(words) >= 4:
            text = re.sub(r"\s+".join(map(re.escape, words)), " ", text, flags=re.IGNORECASE)
    return text


def repeats_question(text: str, question: str) -> bool:
    """The reply holds a copy of the question (or of its last sentence)."""
    padded = f" {normalise(text)} "
    return any(f" {ask} " in padded for ask in _asks(question))


def _words(text: str) -> str:
    return f" {normalise(text)} "


def _has(padded: str, label: str) -> bool:
    n = normalise(label)
    return bool(n) and f" {n} " in padded


def names_others(span: str, label: str, candidates: Sequence[str] = ()) -> bool:
    """Whether an answer that names ``label`` also names another candidate: another of the
    task's ``candidates`` (not inside the label), an alternative (``X or Y``), or a list of
    several short items (``hammer, saw and drill``) when the label is one of them."""
    padded, own = _words(span), normalise(label)
    if any(_has(padded, c) and normalise(c) not in own and own not in normalise(c)
           for c in candidates if normalise(c)):
        return True
    label_items = {normalise(x) for x in _LIST.split(_OR.sub(",", label)) if normalise(x)}
    for splitter, short in ((_OR, False), (_LIST, True)):
        items = [normalise(x) for x in splitter.split(span) if normalise(x)]
        if len(items) < 2 or (short and any(len(x.split()) > _SHORT for x in items)):
            continue
        if any(x not in label_items and own not in x for x in items):
            return True
    return False


def is_number_value(text: str) -> bool:
    """Whether an expected value is a number (with a currency, a percent or a unit word)."""
    return bool(_NUMBER_VALUE.match(unicodedata.normalize("NFKC", text).strip(_TRIM)))


def _money_like(expected: str, span: str) -> bool:
    m = _NUMBER_VALUE.match(unicodedata.normalize("NFKC", expected).strip(_TRIM))
    return bool(_CURRENCY.search(expected) or _CURRENCY.search(span)
                or (m and m.group("dec") is not None and len(m.group("dec")) == 2))


def _close(a: float, b: float, rel_tol: float, abs_tol: float) -> bool:
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)


def number_score(span: str, expected: str, question: str, rel_tol: float) -> float:
    """1 when the one number the answer gives (those of the question aside; after an ``=``
    only the result) equals ``expected`` within the tolerance; 0 with several."""
    gold = numbers_in(unicodedata.normalize("NFKC", expected))
    if len(gold) != 1:
        return 0.0
    # + 1e-9: 12.495 against 12.50 differs by 0.005000000000000782 in floats
    abs_tol = MONEY_ABS_TOL + 1e-9 if _money_like(expected, span) else 1e-9
    if "=" in span:
        span = span.rsplit("=", 1)[1]
    found = numbers_in(unicodedata.normalize("NFKC", span))
    given = numbers_in(question)
    fresh = [x for x in found if not any(_close(x, g, 1e-12, 1e-12) for g in given)]
    values: list[float] = []
    for x in fresh or found:
        if not any(_close(x, v, rel_tol, abs_tol) for v in values):
            values.append(x)
    return float(len(values) == 1 and _close(values[0], gold[0], rel_tol, abs_tol))


def text_key(text: str) -> str:
    """Text as ``value`` compares it: NFKC, case-folded, single spaces, surrounding
    punctuation, quotes and emphasis trimmed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split()).strip(_TRIM)


def text_score(span: str, expected: str, candidates: Sequence[str]) -> float:
    """1 when the answer is ``expected`` as text, or states it (whole words) and names no
    other candidate."""
    if text_key(span) == text_key(expected):
        return 1.0
    return float(_has(_words(span), expected) and not names_others(span, expected, candidates))


def value_score(text: str, question: str, expected: Sequence[str], metadata: Any,
                rel_tol: float = 1e-6) -> float:
    """The ``value`` scorer on a reply's text (see the module docstring)."""
    span = answer_span(text)
    if not span or repeats_question(span, question):
        return 0.0
    candidates = candidates_of(metadata)
    best = 0.0
    for alt in expected:
        if is_number_value(alt):
            best = max(best, number_score(span, alt, question, rel_tol))
        else:
            best = max(best, text_score(span, alt, candidates))
    return best


def contains_score(text: str, question: str, expected: Sequence[str], metadata: Any) -> float:
    """``contains`` without crediting a hedge: an expected answer appears as whole words in
    the reply once copies of the question are taken out, and the answer (``answer_span``)
    that names it names no other candidate; a reply whose answer does not name it may still
    hold it, if it names none of the task's other possible values."""
    rest = f" {without_question(text, question)} "
    span = cut_question(answer_span(text), question)
    span_rest = f" {without_question(span, question)} "
    candidates = candidates_of(metadata)
    for alt in expected:
        n = normalise(alt)
        if not n or f" {n} " not in rest:
            continue
        if f" {n} " in span_rest:
            if not names_others(span, alt, candidates):
                return 1.0
            continue
        if not any(_has(rest, c) and normalise(c) not in n for c in candidates):
            return 1.0
    return 0.0
