"""MARCH's wire formats and its rules: reading the proposer's claims and the checker's lines,
deciding whether a checked answer agrees with a claimed one, and the majority vote.

Proposer lines: ``- Question: <question> [Answer: <answer>]``. Checker lines:
``k. Evidence: <quote> [Answer: <answer>]`` or ``k. Evidence: none [Cannot answer]``. Small
models slip (no brackets, no numbers, "Answer:" without its bracket, a trailing remark): each
reader repairs what it can and drops the rest, counting both, never failing on one bad line.

**Agreement is a normalised match, not a model's comparison.** The checker never sees the
claimed answer, so comparing inside the checker is impossible by construction; a separate
comparison call would double the prompts and, with the embedded 0.5B model as the judge, add
its own errors. Instead both answers are normalised (case, accents, punctuation, articles,
thousands separators) and they agree when equal, when the content words of one are all in the
other ("Nixon" / "President Richard Nixon"), or when their content words overlap with F1 >=
0.6 — unless both name numbers and share none (1975 / 1976 disagree). Deterministic, free and
testable (tests/test_march.py).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from .records import Claim, Verdict

Vote = str  # agree | disagree | cannot | missing

_STOP = frozenset((
    "a", "an", "the", "of", "in", "on", "at", "to", "for", "by", "with", "from", "and", "or",
    "is", "was", "were", "are", "be", "been", "it", "its", "that", "this", "as", "which",
    "who", "whom", "what", "when", "where", "he", "she", "they", "his", "her", "their"))
_CANNOT = re.compile(r"cannot answer|can ?not be answered|can't answer|not (?:stated|mentioned|"
                     r"given|specified|known)|no (?:answer|information)|unknown|"
                     r"does not (?:say|mention|state)|n/?a\b", re.IGNORECASE)

# "- Question: q [Answer: a]" with the dash, bullet or number optional.
_CLAIM = re.compile(r"^\s*(?:[-*•]|\d+[.)])?\s*(?:question|q)\s*[:：]\s*(?P<q>.+?)\s*"
                    r"\[\s*answer\s*[:：]\s*(?P<a>[^\]]*?)\s*\]\s*\.?\s*$", re.IGNORECASE)
# Repairable: no closing bracket, "Question: q Answer: a" (no brackets) or "q? [Answer: a]".
_CLAIM_LOOSE = re.compile(r"^\s*(?:[-*•]|\d+[.)])?\s*(?:(?:question|q)\s*[:：]\s*(?P<q1>.+?)|"
                          r"(?P<q2>[^:\[]+?\?))\s*[(\[]?\s*answer\s*[:：]\s*(?P<a>[^\])]*?)"
                          r"\s*[\])]?\s*\.?\s*$", re.IGNORECASE)
# "3. Evidence: quote [Answer: a]" / "3. Evidence: none [Cannot answer]".
_CHECK = re.compile(r"^\s*(?P<n>\d+)\s*[.):]\s*evidence\s*[:：]\s*(?P<e>.*?)\s*"
                    r"\[\s*(?:answer\s*[:：]\s*(?P<a>[^\]]*?)|(?P<c>cannot answer[^\]]*))\s*\]"
                    r"\s*\.?\s*$", re.IGNORECASE)
# Repairable: no number, no "Evidence:", no brackets or no closing bracket.
_CHECK_LOOSE = re.compile(r"^\s*(?:(?P<n>\d+)\s*[.):])?\s*(?:evidence\s*[:：]\s*(?P<e>.*?))?\s*"
                          r"\[?\s*(?:answer\s*[:：]\s*(?P<a>[^\]]*?)|(?P<c>cannot answer[^\]]*))"
                          r"\s*\]?\s*\.?\s*$", re.IGNORECASE)


@dataclass
class FormatStats:
    """Lines read, repaired (read after fixing a slip) and dropped (unusable); retries of a
    reply that gave nothing usable."""

    read: int = 0
    repaired: int = 0
    dropped: int = 0
    retries: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, other: FormatStats) -> None:
        self.read += other.read
        self.repaired += other.repaired
        self.dropped += other.dropped
        self.retries += other.retries
        self.problems += other.problems

    def to_dict(self) -> dict[str, object]:
        return {"read": self.read, "repaired": self.repaired, "dropped": self.dropped,
                "retries": self.retries, "problems": self.problems[:10]}


def _clean(text: str) -> str:
    return text.strip().strip('"“”').strip()


# A question line with no answer on it, and an answer line ("Answer: a") right after it.
_QUESTION_ONLY = re.compile(r"^\s*(?:[-*•]|\d+[.)])?\s*(?:question|q)\s*[:：]\s*(?P<q>.+?)\s*$",
                            re.IGNORECASE)
_ANSWER_ONLY = re.compile(r"^\s*(?:[-*•])?\s*answer\s*[:：]\s*(?P<a>.+?)\s*$", re.IGNORECASE)


def _join_answer_lines(lines: list[str]) -> tuple[list[str], int]:
    """"Question: q" then "Answer: a" on the next line, as one claim line (a slip the 0.5B
    makes); how many were joined."""
    out: list[str] = []
    joined = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        q = _QUESTION_ONLY.match(line)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        a = _ANSWER_ONLY.match(nxt)
        if q and a and not re.search(r"answer\s*[:：]", q.group("q"), re.IGNORECASE):
            out.append(f"- Question: {q.group('q')} [Answer: {a.group('a')}]")
            joined += 1
            i += 2
            continue
        out.append(line)
        i += 1
    return out, joined


def parse_claims(text: str, max_claims: int = 6) -> tuple[list[Claim], FormatStats]:
    """The proposer's claims, at most ``max_claims``, duplicates removed. Lines that try the
    format and fail are dropped and counted; prose around the lines is ignored."""
    stats = FormatStats()
    claims: list[Claim] = []
    seen: set[str] = set()
    lines, stats.repaired = _join_answer_lines([ln for ln in text.splitlines() if ln.strip()])
    for line in lines:
        if not line.strip():
            continue
        m = _CLAIM.match(line)
        repaired = m is None
        m = m or _CLAIM_LOOSE.match(line)
        if m is None:
            if re.search(r"question|answer", line, re.IGNORECASE):
                stats.dropped += 1
                stats.problems.append(f"unreadable claim line: {line.strip()[:120]}")
            continue
        groups = m.groupdict()
        question = _clean(groups.get("q") or groups.get("q1") or groups.get("q2") or "")
        answer = _clean(m.group("a"))
        if not question or not answer or _CANNOT.fullmatch(answer):
            stats.dropped += 1
            stats.problems.append(f"claim without a question or an answer: {line.strip()[:120]}")
            continue
        key = normalise(question)
        if key in seen:
            continue
        if len(claims) >= max_claims:
            stats.dropped += 1
            stats.problems.append(f"over the limit of {max_claims} claims: {line.strip()[:80]}")
            continue
        seen.add(key)
        stats.read += 1
        stats.repaired += int(repaired)
        claims.append(Claim(question=question, answer_claimed=answer))
    return claims, stats


@dataclass(frozen=True)
class CheckLine:
    """One checker line: ``answer`` None when the checker could not answer."""

    answer: str | None
    evidence: str = ""


def parse_checks(text: str, n_questions: int) -> tuple[dict[int, CheckLine], FormatStats]:
    """The checker's answers by question number (1-based). Unnumbered lines are taken in
    order when the reply has no numbered ones (repaired); numbers out of range and repeats
    are dropped and counted."""
    stats = FormatStats()
    out: dict[int, CheckLine] = {}
    unnumbered: list[CheckLine] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _CHECK.match(line)
        repaired = m is None
        m = m or _CHECK_LOOSE.match(line)
        if m is None:
            said_cannot = _CANNOT.search(line)
            num = re.match(r"^\s*(\d+)\s*[.):]", line)
            if said_cannot and num:  # "2. Not mentioned in the evidence."
                m_n, check = int(num.group(1)), CheckLine(None, "")
                stats.repaired += 1
                _put(out, m_n, check, n_questions, stats, line)
            elif re.search(r"evidence|answer", line, re.IGNORECASE) or num:
                stats.dropped += 1
                stats.problems.append(f"unreadable checker line: {line.strip()[:120]}")
            continue
        evidence = _clean(m.group("e") or "")
        answer = _clean(m.groupdict().get("a") or "")
        cannot = bool(m.groupdict().get("c")) or not answer or bool(_CANNOT.fullmatch(answer))
        check = CheckLine(None if cannot else answer,
                          "" if evidence.lower() in ("none", "-", "") else evidence)
        stats.repaired += int(repaired)
        if m.group("n") is None:
            unnumbered.append(check)
            continue
        _put(out, int(m.group("n")), check, n_questions, stats, line)
    if unnumbered and not out and len(unnumbered) <= n_questions:
        for i, check in enumerate(unnumbered, start=1):
            out[i] = check
        stats.read += len(unnumbered)
    elif unnumbered:
        stats.dropped += len(unnumbered)
        stats.problems.append(f"{len(unnumbered)} unnumbered line(s) beside numbered ones")
    return out, stats


def _put(out: dict[int, CheckLine], n: int, check: CheckLine, n_questions: int,
         stats: FormatStats, line: str) -> None:
    if not 1 <= n <= n_questions or n in out:
        stats.dropped += 1
        stats.problems.append(f"line for question {n} (of {n_questions}, or repeated): "
                              f"{line.strip()[:80]}")
        return
    out[n] = check
    stats.read += 1


# --- agreement ---------------------------------------------------------------------------------

def normalise(text: str) -> str:
    """Lower case, no accents, no punctuation (a decimal point and digits kept), no thousands
    separators, single spaces."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).lower()
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 8,849 -> 8849
    text = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", text)
    text = re.sub(r"[^\w\s.]", " ", text)
    return " ".join(text.split())


def _content(text: str) -> list[str]:
    return [w for w in normalise(text).split() if w not in _STOP]


def _numbers(words: Sequence[str]) -> set[str]:
    return {w.rstrip(".") for w in words if re.fullmatch(r"\d+(?:\.\d+)?", w.rstrip("."))}


def answers_agree(claimed: str, checked: str) -> bool:
    """Whether a checked answer supports a claimed one (see the module docstring)."""
    a, b = normalise(claimed), normalise(checked)
    if not a or not b:
        return False
    if a == b:
        return True
    wa, wb = _content(claimed) or a.split(), _content(checked) or b.split()
    na, nb = _numbers(wa), _numbers(wb)
    if na and nb and not na & nb:
        return False
    sa, sb = set(wa), set(wb)
    if sa <= sb or sb <= sa or (na and (na <= nb or nb <= na)):
        return True  # one says all the other says, or both name the same numbers
    common = sum((Counter(wa) & Counter(wb)).values())
    if common == 0:
        return False
    precision, recall = common / len(wb), common / len(wa)
    return 2 * precision * recall / (precision + recall) >= 0.6


# --- the vote ----------------------------------------------------------------------------------

def vote_of(claim: Claim, check: CheckLine | None) -> Vote:
    """One checker sample's vote on one claim."""
    if check is None:
        return "missing"
    if check.answer is None:
        return "cannot"
    return "agree" if answers_agree(claim.answer_claimed, check.answer) else "disagree"


def verdict(claim: Claim, checks: Sequence[CheckLine | None]) -> Verdict:
    """The majority vote of the checker samples on one claim: supported when more than half
    agree, contradicted when more than half disagree, undecided (None) otherwise (most could
    not answer, or the votes split). ``checked`` and ``evidence`` come from a sample of the
    winning side."""
    votes = [vote_of(claim, c) for c in checks]
    need = len(votes) // 2 + 1
    counts = Counter(votes)
    supported: bool | None = None
    side = "cannot"
    if counts["agree"] >= need:
        supported, side = True, "agree"
    elif counts["disagree"] >= need:
        supported, side = False, "disagree"
    note = {True: "supported by the evidence", False: "contradicted by the evidence",
            None: "the evidence does not settle it"}[supported]
    answers = [c.answer for c, v in zip(checks, votes, strict=False) if v == side and c is not None
               and c.answer]
    checked = Counter(answers).most_common(1)[0][0] if answers else ""
    evidence = next((c.evidence for c, v in zip(checks, votes, strict=False) if v == side and c is not None
                     and c.evidence and (not checked or c.answer == checked)), "")
    return Verdict(claim=claim.question, supported=supported, votes=tuple(votes), note=note,
                   claimed=claim.answer_claimed, checked=checked, evidence=evidence)
