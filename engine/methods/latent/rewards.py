"""Reward terms for latent refinement (``whetstone.engine.methods.latent.tts``).

Rewards live in [-inf, 0]. ``SelfReward``: the model judges its own answer, ``log P(yes)``
normalised over {yes, no} for a verification turn appended after the answer
(``prompts/verify*.md`` of this package); the default threshold -0.2 then means
``P(yes) >= 0.82``. ``ScorerReward``: any scorer of the answer text returning ``s`` in [0, 1]
gives ``r = s - 1``, as LatentSeek's verifier votes do.

The verdict is read from the next-token distribution, never parsed from text, so it cannot be
malformed in the usual sense; but a small model may put its mass elsewhere ("The answer ...",
"yes" in lower case, " Yes" with a space). So every casing and spacing of yes and no is pooled
(**repaired**: counted when the exact ``Yes``/``No`` tokens hold under half of the pooled
mass), and a verdict whose pooled mass is under ``min_mass`` is **dropped** (counted; the
refiner stops and keeps the best answer it has): it says nothing about the answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...errors import ConfigError
from . import PROMPTS

ROLES = ("reasoning", "visual")
_MARKER = "\u2063WHETSTONE-ANSWER\u2063"  # invisible separator: no template rewrites it
YES_FORMS = ("Yes", "yes", "YES", " Yes", " yes")
NO_FORMS = ("No", "no", "NO", " No", " no")


def _ignore(event: str) -> None:
    return None


@dataclass(frozen=True)
class RewardContext:
    """What a reward term sees for the current answer.

    ``soft_forward(ids, offset)`` runs the model on ``ids`` (1, T), which must hold
    ``answer_ids`` starting at ``offset``; for a differentiable term the answer's ``selected``
    positions enter as straight-through embeddings of the latents. Returns the last
    position's logits (1, V). ``note(event)`` counts an event in the record's ``verdicts``
    ("repaired", "dropped").
    """

    prompt_ids: Any  # (1, P)
    answer_ids: Any  # (1, n), without a trailing EOS
    text: str
    selected: Any  # (k,) answer positions this term's feedback reaches
    soft_forward: Callable[[Any, int], Any]
    note: Callable[[str], None] = _ignore


class RewardDropped(Exception):  # control flow inside the refiner, never raised out of it
    """A reward term could not judge this answer (a verdict with no yes/no in it)."""


class Reward(Protocol):
    """A reward term. ``differentiable``: ``__call__`` returns a 0-dim tensor with a graph to
    the latents; otherwise a float in [-inf, 0] that weights the policy gradient. It may
    raise ``RewardDropped`` when it cannot judge the answer."""

    name: str
    role: str
    weight: float
    differentiable: bool

    def __call__(self, ctx: RewardContext) -> Any: ...


def check_role(role: str) -> None:
    if role not in ROLES:
        raise ConfigError(f"unknown feedback role {role!r}", hint=f"use one of {ROLES}")


def verify_suffix_ids(tokenizer: Any, instruction: str) -> list[int]:
    """Token ids that close the answer's turn and open a verification turn after it."""
    if getattr(tokenizer, "chat_template", None):
        msgs = [{"role": "user", "content": "question"},
                {"role": "assistant", "content": _MARKER},
                {"role": "user", "content": instruction}]
        text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        if _MARKER in text:
            return tokenizer(text.split(_MARKER, 1)[1], add_special_tokens=False)["input_ids"]
    return tokenizer(f"\n\n{instruction}\n", add_special_tokens=False)["input_ids"]


def _first_tokens(tokenizer: Any, forms: tuple[str, ...]) -> list[int]:
    """The distinct first token ids of ``forms``; forms the tokenizer maps to unknown are
    left out."""
    unk = getattr(tokenizer, "unk_token_id", None)
    out: list[int] = []
    for form in forms:
        ids = tokenizer(form, add_special_tokens=False)["input_ids"]
        if ids and ids[0] != unk and ids[0] not in out:
            out.append(ids[0])
    return out


@dataclass
class SelfReward:
    """The model judges its own answer: ``log P(yes)`` over {yes, no} after a verification
    turn (every casing and spacing pooled). ``differentiable=False`` hands the value to the
    policy gradient instead. ``min_mass``: the least pooled yes+no probability a verdict
    needs; below it the verdict is dropped."""

    tokenizer: Any
    role: str = "reasoning"
    prompt: str = "verify"
    weight: float = 1.0
    differentiable: bool = True
    min_mass: float = 0.05
    name: str = "self"
    suffix: list[int] = field(init=False)
    verdicts: tuple[int, int] = field(init=False)
    yes_ids: list[int] = field(init=False)
    no_ids: list[int] = field(init=False)

    def __post_init__(self) -> None:
        check_role(self.role)
        if not 0.0 <= self.min_mass < 1.0:
            raise ConfigError(f"min_mass must be in [0, 1) (got {self.min_mass})",
                              hint="e.g. 0.05: a verdict needs 5% of its mass on yes or no")
        self.suffix = verify_suffix_ids(self.tokenizer, PROMPTS.render(self.prompt).strip())
        self.yes_ids = _first_tokens(self.tokenizer, YES_FORMS)
        self.no_ids = _first_tokens(self.tokenizer, NO_FORMS)
        if not self.yes_ids or not self.no_ids or set(self.yes_ids) & set(self.no_ids):
            raise ConfigError("the tokenizer gives no distinct first tokens for 'Yes' and 'No'",
                              hint="pass a scorer (ScorerReward) instead of the self-reward")
        self.verdicts = (self.yes_ids[0], self.no_ids[0])

    def __call__(self, ctx: RewardContext) -> Any:
        import torch  # heavy: torch

        suffix = torch.tensor([self.suffix], device=ctx.prompt_ids.device)
        ids = torch.cat([ctx.prompt_ids, ctx.answer_ids, suffix], dim=1)  # (1, P + n + s)
        logits = ctx.soft_forward(ids, ctx.prompt_ids.shape[1])  # (1, V)
        logp = torch.log_softmax(logits[0].float(), dim=-1)  # (V,)
        pooled = torch.stack([torch.logsumexp(logp[self.yes_ids], dim=0),
                              torch.logsumexp(logp[self.no_ids], dim=0)])  # (2,): yes, no
        mass = float(torch.logsumexp(pooled.detach(), dim=0).exp())
        if mass < self.min_mass:
            ctx.note("dropped")
            raise RewardDropped(f"the verdict puts {mass:.3f} of its mass on yes or no")
        exact = float(logp.detach()[list(self.verdicts)].exp().sum())
        if exact < 0.5 * mass:
            ctx.note("repaired")
        value = torch.log_softmax(pooled, dim=-1)[0]
        return value if self.differentiable else float(value)


@dataclass
class ScorerReward:
    """Any scorer of the answer text, ``fn(text) -> float in [0, 1]``; reward ``s - 1``.
    Not differentiable: it drives LatentSeek's policy gradient."""

    fn: Callable[[str], float]
    role: str = "reasoning"
    weight: float = 1.0
    name: str = "scorer"
    differentiable: bool = False

    def __post_init__(self) -> None:
        check_role(self.role)

    def __call__(self, ctx: RewardContext) -> float:
        score = self.fn(ctx.text)
        if isinstance(score, bool) or not isinstance(score, (int, float)) \
                or math.isnan(score) or not 0.0 <= score <= 1.0:
            raise ConfigError(f"scorer {self.name!r} returned {score!r}; a score is a number "
                              "in [0, 1]", hint="fix the scorer so it returns a float in [0, 1]")
        return float(score) - 1.0
