"""Reading answers out of model text: the final number, and SQuAD-style normalisation.

Pure functions, no state; the scorers in ``whetstone.engine.evaluation.scorers`` build on them. Where the
answer sits in a reply (boxes, "the answer is" cues, the final line) is ``whetstone.engine.answer_text``,
which the runtime reads too.
"""

from __future__ import annotations

import re
import string
import unicodedata

from ..answer_text import ANSWER_CUE, boxed_contents

# A number as people write it: optional sign, thousands commas ("1,234,567"), decimals, ".5",
# and an exponent. The sign counts only when it does not follow a word or digit, so "3-5" reads
# as 3 and 5, while "x = -5" and "(-5)" read as -5.
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-+\u2212]?)\s?\$?\s?"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:[eE](?P<exp>[-+]?\d+)(?![\w]))?"
)
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")  # \frac12: one-digit arguments
# "3/4" (not a date like 3/4/2024, not part of a path or a unit like km/h).
_SLASH = re.compile(r"(?<![\w./])(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)(?![\w/]|\.\d)")
_POWER = re.compile(r"(?<![\w.])(\d+)\s*\^\s*\{?\s*(\d{1,3})\s*\}?")
_GSM_CUE = re.compile(r"####")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation) | {"\u2018", "\u2019", "\u201c", "\u201d", "\u2013", "\u2014"}


def _replace_fracs(text: str) -> str:
    """``\\frac{3}{4}``, ``\\frac34`` and ``3/4`` -> ``0.75``, ``2^{10}`` -> ``1024``, so each
    reads as one number."""

    def value(m: re.Match[str]) -> str:
        try:
            num, den = float(m.group(1).replace(",", "")), float(m.group(2).replace(",", ""))
        except ValueError:
            return m.group(0)
        return m.group(0) if den == 0 else repr(num / den)

    def power(m: re.Match[str]) -> str:
        try:
            return repr(float(int(m.group(1)) ** int(m.group(2))))
        except OverflowError:
            return m.group(0)

    for pattern in (_FRAC, _FRAC_SHORT, _SLASH):
        text = pattern.sub(value, text)
    return _POWER.sub(power, text)


def numbers_in(text: str) -> list[float]:
    """Every number in ``text`` in order (units, ``$``, ``%``, commas and trailing periods are
    ignored; a unicode minus counts as a sign)."""
    text = _replace_fracs(text)
    out: list[float] = []
    for m in _NUMBER.finditer(text):
        raw = m.group("num").replace(",", "")
        sign = m.group("sign")
        if sign and text[m.start("sign") + 1:m.start("num")][:1].isspace() \
                and not text[text.rfind("\n", 0, m.start()) + 1:m.start()].strip():
            sign = ""  # "- 42" opening a line is a list bullet, not a minus
        if m.group("exp"):
            raw += "e" + m.group("exp")
        try:
            value = float(raw)
        except ValueError:
            continue
        out.append(-value if sign in ("-", "\u2212") else value)
    return out


def _first_number_after(text: str, cue: re.Pattern[str]) -> float | None:
    """The number a cue gives: after the last cue that is followed by one, the first number
    on its line, or after the line's last ``=`` ("the answer is 20 - 8 = 12"). A cue that
    ends its line ("Final Answer:" then the number below) reads the next line."""
    for m in reversed(list(cue.finditer(text))):
        lines = text[m.end():].lstrip(" \t").split("\n", 2)
        rest = lines[0] if lines[0].strip() or len(lines) == 1 else lines[1]
        if "=" in rest:
            after = numbers_in(rest.rsplit("=", 1)[1])
            if after:
                return after[0]
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
    for cue in (_GSM_CUE, ANSWER_CUE):
        value = _first_number_after(text, cue)
        if value is not None:
            return value
    nums = numbers_in(text)
    return nums[-1] if nums else None


def _kept(text: str, i: int) -> bool:
    """Whether punctuation at ``i`` carries a number's meaning: a decimal point ("3.5" is not
    "35") or a minus sign ("-5" is not "5")."""
    ch = text[i]
    nxt = text[i + 1:i + 2]
    if ch == ".":
        return nxt.isdigit() and text[i - 1:i].isdigit()
    if ch in "-\u2212":
        return nxt.isdigit() and not text[i - 1:i].isalnum()
    return False


def normalise(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces; except that
    a decimal point and a minus sign in a number stay."""
    text = unicodedata.normalize("NFKC", str(text)).lower()
    # as SQuAD: "1,000" -> "1000"
    text = "".join(ch for i, ch in enumerate(text) if ch not in _PUNCT or _kept(text, i))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def tokens(text: str) -> list[str]:
    """Normalised whitespace tokens."""
    return normalise(text).split()
