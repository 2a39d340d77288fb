"""Where the answer is in a model's reply: a ``\\boxed{}``, an answer cue ("the answer is ...",
"Final Answer: ..."), or else the final line.

One reading for everyone: the runtime asks ``has_answer`` (did the model state an answer?),
the scorers take ``answer_span`` (which part to compare) and ``whetstone.engine.evaluation.answers``
builds its number extraction on the same cue and boxes. So a direct call and the agent loop,
given the same reply, are scored the same way.
"""

from __future__ import annotations

import re

# "The answer is 12", "Final Answer: 12", "answer = 12", "the answer would be: 12".
ANSWER_CUE = re.compile(
    r"(?:final\s+answer|the\s+answer|answer)\s*(?:is|was|would\s+be|will\s+be|=|:)\s*:?",
    re.IGNORECASE,
)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_DECORATION = " \t*_`\"'"


def boxed_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` (and ``\\fbox{...}``), braces balanced, in order."""
    out: list[str] = []
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end():i - 1])
    return out


def _after_cue(text: str) -> str | None:
    """The text the last answer cue gives: the rest of its line, or the next line when the cue
    ends its line ("Final Answer:" with the answer below)."""
    for m in reversed(list(ANSWER_CUE.finditer(text))):
        lines = text[m.end():].lstrip(" \t").split("\n", 2)
        rest = lines[0] if lines[0].strip() or len(lines) == 1 else lines[1]
        rest = rest.strip(_DECORATION).strip()
        if rest:
            return rest
    return None


def has_answer(text: str) -> bool:
    """Whether ``text`` states an answer explicitly (a box, or a cue followed by something)."""
    return bool(boxed_contents(text)) or _after_cue(text) is not None


def answer_span(text: str) -> str:
    """The part of a reply that is the answer: the last non-empty ``\\boxed{}``, else what the
    last answer cue gives, else the final non-empty line. Surrounding markdown emphasis and a
    trailing full stop are dropped (``**42**.`` -> ``42``)."""
    for box in reversed(boxed_contents(text)):
        if box.strip():
            return box.strip()
    span = _after_cue(text)
    if span is None:
        lines = [ln for ln in text.strip().splitlines() if ln.strip(_DECORATION)]
        span = lines[-1] if lines else ""
    span = span.strip(_DECORATION).strip()
    return span[:-1].rstrip(_DECORATION) if span.endswith(".") else span
