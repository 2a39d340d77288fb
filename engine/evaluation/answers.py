"""Reading answers out of model text: the final number, and SQuAD-style normalisation.

Pure functions, no state; the scorers in ``engine.evaluation.scorers`` build on them.
"""

from __future__ import annotations

import re
import string
import unicodedata

# A number as people write it: optional sign, thousands commas ("1,234,567"), decimals, ".5",
# and an exponent. The sign counts only when it does not follow a word or digit, so "3-5" reads
# as 3 and 5, while "x = -5" and "(-5)" read as -5.
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-+\u2212]?)\s?\$?\s?"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:[eE](?P<exp>[-+]?\d+)(?![\w]))?"
)
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
_ANSWER_CUE = re.compile(
    r"(?:final\s+answer|the\s+answer|answer)\s*(?:is|was|would\s+be|will\s+be|=|:)\s*:?",
    re.IGNORECASE,
)
_GSM_CUE = re.compile(r"####")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation) | {"\u2018", "\u2019", "\u201c", "\u201d", "\u2013", "\u2014"}


def boxed_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` (and ``\\fbox{...}``), braces balanced, in order."""
    out: list[str] = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end():i - 1])
    return out


def _replace_fracs(text: str) -> str:
    """``\\frac{3}{4}`` -> ``0.75`` so the fraction reads as one number."""

    def value(m: re.Match[str]) -> str:
        try:
            num, den = float(m.group(1).replace(",", "")), float(m.group(2).replace(",", ""))
        except ValueError:
            return m.group(0)
        return m.group(0) if den == 0 else repr(num / den)

    return _FRAC.sub(value, text)


def numbers_in(text: str) -> list[float]:
    """Every number in ``text`` in order (units, ``$``, ``%``, commas and trailing periods are
    ignored; a unicode minus counts as a sign)."""
    text = _replace_fracs(text)
    out: list[float] = []
    for m in _NUMBER.finditer(text):
        raw = m.group("num").replace(",", "")
        if m.group("exp"):
            raw += "e" + m.group("exp")
        try:
            value = float(raw)
        except ValueError:
            continue
        out.append(-value if m.group("sign") in ("-", "\u2212") else value)
    return out


def _first_number_after(text: str, cue: re.Pattern[str]) -> float | None:
    """The first number after the last cue that is followed by one (within its line)."""
    for m in reversed(list(cue.finditer(text))):
        rest = text[m.end():].split("\n", 1)[0]
        nums = numbers_in(rest)
        if nums:
            return nums[0]
    return None


def extract_number(text: str | float | None) -> float | None:
    """The final numeric answer in ``text``, or ``None``.

    Preference: the last ``\\boxed{}`` holding a number, then ``#### N`` (GSM8K), then the number
    after the last "answer is" / "Final Answer:" cue, else the last number in the text.
    """
    if text is None:
        return None
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text)
    text = unicodedata.normalize("NFKC", str(text)).replace("\u2212", "-")
    for box in reversed(boxed_contents(text)):
        nums = numbers_in(box)
        if nums:
            return nums[-1] if len(nums) > 1 and "=" in box else nums[0]
    for cue in (_GSM_CUE, _ANSWER_CUE):
        value = _first_number_after(text, cue)
        if value is not None:
            return value
    nums = numbers_in(text)
    return nums[-1] if nums else None


def normalise(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = unicodedata.normalize("NFKC", str(text)).lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)  # as SQuAD: "1,000" -> "1000"
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def tokens(text: str) -> list[str]:
    """Normalised whitespace tokens."""
    return normalise(text).split()
