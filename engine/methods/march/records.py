"""MARCH's records: a claim of an answer, what the checker may see, and a claim's verdict.

Frozen dataclasses with a JSON round trip (``to_dict``/``from_dict``), like the core's
records; only MARCH reads or writes them, so they live here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...types import JsonRecord


@dataclass(frozen=True)
class Claim(JsonRecord):
    """An atomic claim of an answer, phrased as a checkable question with the answer's
    version.

    ``answer_claimed`` is what the checked answer implies; ``checked_answers`` are the
    checker's answers to ``question`` (one per sample; "" when it could not answer).
    """

    question: str
    answer_claimed: str
    checked_answers: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckRequest(JsonRecord):
    """Everything a claim checker may see: the evidence and the claims' questions.

    There is deliberately no field for the answer being checked nor for any claimed answer:
    the checker's prompt is built from this record alone, so the answer cannot leak into it
    (information asymmetry).
    """

    questions: tuple[str, ...]
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict(JsonRecord):
    """The outcome of checking one claim.

    ``claim`` is the claim's question; ``supported`` True when the checker's majority answer
    agrees with ``claimed``, False when it disagrees, None when the evidence could not settle
    it (the majority could not answer, or the votes split). ``votes`` holds each sample's
    vote (agree | disagree | cannot | missing), ``checked`` the majority's answer and
    ``evidence`` the evidence the checker quoted for it.
    """

    claim: str
    supported: bool | None  # None: the checker could not tell from the evidence
    votes: tuple[str, ...] = ()
    note: str = ""
    claimed: str = ""
    checked: str = ""
    evidence: str = ""

    @property
    def flagged(self) -> bool:
        """A claim is flagged unless the evidence supports it."""
        return self.supported is not True
