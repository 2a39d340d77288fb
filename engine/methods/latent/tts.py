"""Latent test-time scaling: refine the hidden states behind an answer's first tokens.

After LatentSeek (Li et al., 2025, "Seek in the Dark"), made token-disentangled. White-box
models only (transformers ``model`` + ``tokenizer``: ``hf:``/``embedded`` on the transformers
path, or a VLM built in process). For one request:

1. Greedy answer ``a_0 .. a_{n-1}`` from the prompt ``x`` (the plain model's answer).
2. One teacher-forced forward over ``x + a`` captures the last-layer hidden states (the LM
   head's inputs) ``z0_i`` that produced each ``a_i``. The window is the first
   ``W = ceil(prefix * n)`` positions (at most ``max_prefix``); ``z = z0[:, :W]`` becomes a
   trainable fp32 parameter.
3. Every step, each reward term picks the ``m = ceil(fraction * n)`` window positions of its
   role: ``reasoning`` feedback goes to the highest next-token entropy of
   ``softmax(lm_head(z_i))`` (recomputed from the current ``z``), ``visual`` feedback to the
   positions whose states attend most to image tokens (measured once, in step 2).
   - A differentiable term (the default self-reward) sees the window tokens as straight-through
     embeddings: the forward value is exactly the answer token's embedding, the gradient flows
     through ``softmax(lm_head(z_i)) @ E`` at that term's positions only.
   - A plain scorer gets LatentSeek's policy gradient:
     ``loss = -r * sum_i log softmax(lm_head(z_i))[a_i]`` over its positions.
   - The anchor ``anchor/2 * ||z_j - z0_j||^2`` acts on the window positions no term picked,
     so a position that dropped out of the selection is pulled back to where it started.
4. An Adam step; each window token becomes ``argmax lm_head(z_i)`` (EOS excluded: the window
   never ends the answer; positions whose ``z`` never moved keep ``a_i``); when a token changed,
   greedy generation continues from ``x`` + the window tokens.
5. Stop once the reward reaches ``threshold`` or after ``max_steps`` updates; the answer with
   the best reward wins (ties go to the earliest, so the plain answer is kept unless beaten).

Rewards (``whetstone.engine.methods.latent.rewards``) live in [-inf, 0]: the self-reward (the model's own
yes/no verdict on its answer, the default) or any scorer of the answer text. A verdict with no
yes or no in it is dropped, never fatal: the search stops and keeps its best answer.

Decoding is greedy throughout (a request's temperature is ignored); ``refine(request,
initial=completion)`` starts from an answer the backend already gave (the runtime method
``whetstone.engine.methods.latent.plugin`` does this) instead of decoding it again. Cost is recorded in
``RefineRecord``: full-sequence forwards, backwards, decoded tokens and seconds.

Device and dtype are the model's: the same code runs on CUDA in bf16 (the latents keep an fp32
master copy), tested by ``tests/test_latent_tts.py::test_bf16_on_cuda`` where a GPU exists.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from ...backends.chat_template import template_supports_tools
from ...backends.local_text import completion_from_tokens, prompt_text
from ...errors import ConfigError
from ...types import Completion, Request
from .hooks import (
    LatentHooks,
    eager_attention,
    frozen,
    image_attention_mass,
    latent_hooks,
    next_token_entropy,
    top_positions,
)
from .rewards import (
    ROLES,
    Reward,
    RewardContext,
    RewardDropped,
    ScorerReward,
    SelfReward,
    check_role,
)

__all__ = ["ROLES", "LatentConfig", "LatentHooks", "LatentRefiner", "LatentResult",
           "RefineRecord", "Reward", "RewardContext", "RewardDropped", "ScorerReward",
           "SelfReward", "latent_hooks"]


@dataclass(frozen=True)
class LatentConfig:
    """Refinement settings. Defaults after LatentSeek (lr, fraction, steps, threshold).

    ``fraction``: share of the answer's positions updated per step (LatentSeek's ``k``);
    ``prefix``: share of the answer, from its start, in which those positions are chosen
    (capped at ``max_prefix`` tokens); ``anchor``: weight of the pull back to the start.
    """

    lr: float = 0.03
    fraction: float = 0.1
    prefix: float = 0.25
    max_prefix: int = 64
    max_steps: int = 10
    threshold: float = -0.2
    anchor: float = 1.0

    def __post_init__(self) -> None:
        checks = [(self.lr > 0, "lr must be > 0"),
                  (0 < self.fraction <= 1, "fraction must be in (0, 1]"),
                  (0 < self.prefix <= 1, "prefix must be in (0, 1]"),
                  (self.max_prefix >= 1, "max_prefix must be >= 1"),
                  (self.max_steps >= 0, "max_steps must be >= 0"),
                  (self.anchor >= 0, "anchor must be >= 0")]
        for ok, what in checks:
            if not ok:
                raise ConfigError(f"latent config: {what} (got {self})",
                                  hint="e.g. LatentConfig(lr=0.03, fraction=0.1, max_steps=10)")


# --- the record and the result -------------------------------------------------------------

@dataclass
class RefineRecord:
    """What one refinement did, for traces. Positions are answer-relative token indices.

    ``rewards[0]`` is the plain answer's; ``rewards[s]`` the answer after update ``s``.
    ``forward``: full-sequence forwards (one teacher-forced, one per reward evaluation);
    ``backward``: backward passes; ``redecodes`` / ``redecode_tokens``: greedy continuations
    after updates (the plain answer itself is ``answer_tokens`` long, plus its EOS).
    ``forward_tokens``: the positions those forwards processed (what a provider would bill as
    prompt tokens). ``verdicts``: reward events, ``{"repaired": n, "dropped": n}``.
    ``image_mass``: each window state's attention share on image tokens (visual feedback only).
    Wall time: ``seconds`` (all), ``seconds_initial`` (the plain greedy answer), per update
    ``step_seconds`` (reward forward+backward, Adam, window tokens) and ``redecode_seconds``
    (greedy continuation; 0 when no window token changed).
    """

    initial_text: str = ""
    final_text: str = ""
    answer_tokens: int = 0
    window: int = 0
    image_mass: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    updated: list[dict[str, list[int]]] = field(default_factory=list)
    changed: list[list[int]] = field(default_factory=list)
    best_step: int = 0
    stopped: str = ""
    forward: int = 0
    forward_tokens: int = 0
    backward: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    redecodes: int = 0
    redecode_tokens: int = 0
    seconds: float = 0.0
    seconds_initial: float = 0.0
    step_seconds: list[float] = field(default_factory=list)
    redecode_seconds: list[float] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.updated)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "steps": self.steps}


@dataclass(frozen=True)
class LatentResult:
    """The chosen answer as a ``Completion`` and the record of how it was found."""

    completion: Completion
    record: RefineRecord


# --- the refiner ---------------------------------------------------------------------------

class LatentRefiner:
    """Refine a white-box model's answers in latent space.

    ``LatentRefiner(model, tokenizer, config, rewards).refine(request)`` for chat requests on
    text models; ``refine_ids(prompt_ids, model_inputs=..., image_token_id=...)`` for anything
    already tokenised (VLM prompts with ``pixel_values``). ``rewards`` defaults to the
    reasoning self-reward. ``lock``: held around each refinement (share the backend's).
    ``on_step(record)``: called after each reward evaluation (progress bars, logs).
    """

    def __init__(self, model: Any, tokenizer: Any, config: LatentConfig | None = None,
                 rewards: Sequence[Reward] | None = None, *, name: str = "",
                 lock: Any = None,
                 on_step: Callable[[RefineRecord], None] | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or LatentConfig()
        self.rewards = list(rewards) if rewards is not None else [SelfReward(tokenizer)]
        if not self.rewards:
            raise ConfigError("latent refinement needs at least one reward term",
                              hint="leave rewards unset for the self-reward")
        for r in self.rewards:
            check_role(r.role)
            if not r.weight > 0:
                raise ConfigError(f"reward {r.name!r} has weight {r.weight}; weights are > 0",
                                  hint="drop the term instead of giving it weight 0")
        self.name = name
        self.on_step = on_step
        self._lock: AbstractContextManager[Any] = lock or threading.Lock()
        eos = model.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        if tokenizer.eos_token_id is not None:
            ids.add(tokenizer.eos_token_id)
        self._eos = sorted(ids)

    @classmethod
    def from_backend(cls, backend: Any, config: LatentConfig | None = None,
                     rewards: Sequence[Reward] | None = None,
                     on_step: Callable[[RefineRecord], None] | None = None) -> LatentRefiner:
        """A refiner over a white-box backend's model (``HFBackend`` and the like)."""
        if not backend.capabilities.white_box or getattr(backend, "model", None) is None:
            raise ConfigError(f"{backend.spec} gives no access to hidden states: latent "
                              "refinement needs the transformers engine",
                              hint="use embedded@transformers or hf:PATH@transformers")
        # share the backend's generation lock: one forward at a time on one model
        return cls(backend.model, backend.tokenizer, config, rewards, name=backend.spec,
                   lock=getattr(backend, "_lock", None), on_step=on_step)

    # -- public entry points -----------------------------------------------------------------

    def refine(self, request: Request, initial: Completion | None = None) -> LatentResult:
        """Answer a chat request (text models), refined; greedy decoding. The prompt is the
        one the transformers backend renders (tools in the template when it has them);
        ``initial``: the answer the backend already gave, refined instead of decoding a new
        one. The completion reads like the backend's (stop strings cut, tool calls parsed)."""
        if request.max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1 (got {request.max_tokens})",
                              hint="ask for a positive number of tokens")
        native = template_supports_tools(getattr(self.tokenizer, "chat_template", None))
        text = prompt_text(self.tokenizer, request, native)
        ids = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        start = None
        if initial is not None:
            start = self.tokenizer(initial.text, add_special_tokens=False)["input_ids"]
            if initial.finish_reason == "stop" and self._eos:
                start = [*start, self._eos[0]]
        answer, record = self.refine_ids(ids, max_new_tokens=request.max_tokens, initial=start)
        completion = completion_from_tokens(
            request, decode=lambda t: self.tokenizer.decode(t, skip_special_tokens=True),
            new=answer[0].tolist(), n_prompt=int(ids.shape[1]), eos_ids=self._eos,
            max_new=request.max_tokens, elapsed=record.seconds, model=self.name)
        return LatentResult(completion, record)

    def refine_ids(self, prompt_ids: Any, *, max_new_tokens: int = 512,
                   model_inputs: Mapping[str, Any] | None = None,
                   image_token_id: int | None = None,
                   initial: Sequence[int] | None = None) -> tuple[Any, RefineRecord]:
        """Refine the answer to ``prompt_ids`` (1, P). Returns the chosen answer's ids (1, n)
        (EOS included when it ended) and the record. ``model_inputs`` go to every forward
        (``pixel_values`` ...); ``image_token_id`` defaults to the model config's;
        ``initial``: the plain answer's ids (default: decoded greedily here)."""
        import torch  # heavy: torch

        rec = RefineRecord()
        start = time.perf_counter()
        device = self.model.get_input_embeddings().weight.device
        x = prompt_ids.to(device)
        extra = {k: v.to(device) if hasattr(v, "to") else v
                 for k, v in (model_inputs or {}).items()}
        with self._lock, frozen(self.model), latent_hooks(self.model) as hooks:
            if initial is None:
                answer = self._generate(x, max_new_tokens, extra)
                rec.seconds_initial = time.perf_counter() - start
            else:
                answer = torch.tensor([list(initial)], dtype=torch.long, device=device)
            body = self._body(answer)  # (1, n)
            rec.initial_text = rec.final_text = self._decode(body)
            rec.answer_tokens = n = body.shape[1]
            if n == 0:
                rec.stopped = "empty"
            else:
                answer = self._search(hooks, x, answer, max_new_tokens, extra,
                                      image_token_id, rec)
                rec.final_text = self._decode(self._body(answer))
        rec.seconds = time.perf_counter() - start
        return answer.to(torch.long), rec

    # -- the search ------------------------------------------------------------------------------

    def _search(self, hooks: LatentHooks, x: Any, answer: Any, max_new: int,
                extra: dict[str, Any], image_token_id: int | None, rec: RefineRecord) -> Any:
        """Steps 2-5 of the module docstring; returns the best answer."""
        import torch  # heavy: torch

        cfg = self.config
        body = self._body(answer)
        n = body.shape[1]
        rec.window = w = min(cfg.max_prefix, n, max(1, math.ceil(cfg.prefix * n)))
        m = min(w, max(1, math.ceil(cfg.fraction * n)))
        z0, mass = self._states(hooks, x, body, w, extra, image_token_id, rec)  # (1, W, d)
        rec.image_mass = [] if mass is None else mass.tolist()
        z = torch.nn.Parameter(z0.clone())
        opt = torch.optim.Adam([z], lr=cfg.lr)
        start_tokens = body[:, :w]  # (1, W): the plain answer's window
        best_reward, best = -math.inf, answer
        for step in range(cfg.max_steps + 1):
            t0 = time.perf_counter()
            sel = self.select(z, m, mass)
            try:
                reward, loss = self._evaluate(hooks, z, sel, x, body, extra, rec)
            except RewardDropped:  # this answer cannot be judged: keep the best one so far
                rec.stopped = "verdict_dropped"
                break
            rec.rewards.append(reward)
            if reward > best_reward:
                best_reward, best, rec.best_step = reward, answer, step
            if self.on_step is not None:
                self.on_step(rec)
            if reward >= cfg.threshold or step == cfg.max_steps:
                rec.stopped = "threshold" if reward >= cfg.threshold else "max_steps"
                break
            loss = loss + self.anchor_loss(z, z0, sel)
            opt.zero_grad()
            loss.backward()
            rec.backward += 1
            opt.step()
            rec.updated.append({role: pos.tolist() for role, pos in sel.items()})
            window = self.window_tokens(z, z0, start_tokens)  # (1, W)
            changed = (window != body[:, :w])[0].nonzero().flatten().tolist()
            rec.changed.append(changed)
            t1 = time.perf_counter()
            rec.step_seconds.append(t1 - t0)
            if changed:
                rest = self._generate(torch.cat([x, window], dim=1), max_new - w, extra)
                rec.redecodes += 1
                rec.redecode_tokens += rest.shape[1]
                answer = torch.cat([window, rest], dim=1)
                body = self._body(answer)
            rec.redecode_seconds.append(time.perf_counter() - t1)
        return best

    def select(self, z: Any, m: int, image_mass: Any = None) -> dict[str, Any]:
        """Window positions per feedback role: ``{role: (k,) ascending}``."""
        import torch  # heavy: torch

        out = {}
        for role in dict.fromkeys(r.role for r in self.rewards):
            if role == "reasoning":
                with torch.no_grad():
                    entropy = next_token_entropy(self._head(z))[0]  # (W,)
                out[role] = top_positions(entropy, m)
            else:
                out[role] = top_positions(image_mass, m)
        return out

    def anchor_loss(self, z: Any, z0: Any, sel: Mapping[str, Any]) -> Any:
        """``anchor/2 * ||z_j - z0_j||^2`` over the window positions no role selected."""
        import torch  # heavy: torch

        free = torch.ones(z.shape[1], dtype=torch.bool, device=z.device)  # (W,)
        for pos in sel.values():
            free[pos] = False
        return 0.5 * self.config.anchor * ((z[:, free] - z0[:, free]) ** 2).sum()

    def window_tokens(self, z: Any, z0: Any, start_tokens: Any) -> Any:
        """(1, W) tokens read from the latents: argmax of the LM head, never EOS; a position
        whose latent is still exactly its start keeps the plain answer's token."""
        import torch  # heavy: torch

        with torch.no_grad():
            logits = self._head(z).float()  # (1, W, V)
            logits[..., self._eos] = -math.inf
            moved = (z != z0).any(dim=-1)  # (1, W)
            return torch.where(moved, logits.argmax(dim=-1), start_tokens)

    def _evaluate(self, hooks: LatentHooks, z: Any, sel: Mapping[str, Any], x: Any, body: Any,
                  extra: dict[str, Any], rec: RefineRecord) -> tuple[float, Any]:
        """The current answer's reward (weighted mean) and the loss whose gradient improves it."""
        text = self._decode(body)
        total, loss, weights = 0.0, 0.0, sum(r.weight for r in self.rewards)

        def note(event: str) -> None:
            rec.verdicts[event] = rec.verdicts.get(event, 0) + 1

        for term in self.rewards:
            pos = sel[term.role]
            fwd = partial(self._soft_forward, hooks, z, pos, body, extra, term.differentiable,
                          rec)
            value = term(RewardContext(x, body, text, pos, fwd, note))
            if term.differentiable:
                loss = loss - term.weight * value
                value = float(value.detach())
            else:  # LatentSeek's policy gradient on the tokens the latents chose
                value = float(value)
                loss = loss - term.weight * value * self._log_pi(z, pos, body).sum()
            total += term.weight * value
        return total / weights, loss / weights

    def _soft_forward(self, hooks: LatentHooks, z: Any, pos: Any, body: Any,
                      extra: dict[str, Any], differentiable: bool, rec: RefineRecord,
                      ids: Any, offset: int) -> Any:
        import torch  # heavy: torch

        rec.forward += 1
        rec.forward_tokens += int(ids.shape[1])
        if differentiable:
            emb = self.model.get_input_embeddings().weight  # (V, d)
            p = torch.softmax(self._head(z[:, pos, :]).float(), dim=-1)  # (1, k, V)
            soft = p.to(emb.dtype) @ emb  # (1, k, d)
            hard = emb[body[0, pos]].unsqueeze(0)  # (1, k, d): the answer's tokens
            # straight-through: the value is exactly `hard` (soft - soft == 0; (hard + soft)
            # - soft would round), the gradient is the soft path's
            hooks.set_embeddings(offset + pos, hard + (soft - soft.detach()), ids.shape[1])
        grad = nullcontext() if differentiable else torch.no_grad()
        try:
            with grad:
                out = self.model(input_ids=ids, logits_to_keep=1, **extra)
        finally:
            hooks.set_embeddings(None, None)
        return out.logits[:, -1, :]  # (1, V)

    def _log_pi(self, z: Any, pos: Any, body: Any) -> Any:
        """log p(a_i | z_i) at ``pos``: (1, k)."""
        import torch  # heavy: torch

        logp = torch.log_softmax(self._head(z[:, pos, :]).float(), dim=-1)  # (1, k, V)
        return logp.gather(-1, body[:, pos].unsqueeze(-1)).squeeze(-1)

    def _states(self, hooks: LatentHooks, x: Any, body: Any, w: int, extra: dict[str, Any],
                image_token_id: int | None, rec: RefineRecord) -> tuple[Any, Any]:
        """The window's starting latents (1, W, d) in fp32 and, for visual feedback, each
        window state's attention mass on image tokens (W,)."""
        import torch  # heavy: torch

        visual = any(r.role == "visual" for r in self.rewards)
        ids = torch.cat([x, body], dim=1)  # (1, P + n)
        rows = torch.arange(x.shape[1] - 1, x.shape[1] - 1 + w, device=x.device)  # (W,)
        hooks.capture = True
        try:
            with torch.no_grad(), eager_attention(self.model, visual):
                out = self.model(input_ids=ids, output_attentions=visual, **extra)
        finally:
            hooks.capture = False
        rec.forward += 1
        rec.forward_tokens += int(ids.shape[1])
        # fp32 master copy: bf16's 8-bit mantissa would swallow lr-0.03 steps on values > 4
        z0 = hooks.captured[:, rows, :].float()  # (1, W, d)
        hooks.captured = None
        if not visual:
            return z0, None
        image_id = image_token_id if image_token_id is not None else _image_token_id(self.model)
        image_mask = ids[0] == image_id  # (T,)
        if not out.attentions or not bool(image_mask.any()):
            raise ConfigError("visual feedback needs an image in the prompt (no image tokens "
                              "were found, or the model returned no attention weights)",
                              hint="pass the prompt with its image tokens and pixel_values, "
                                   "or use only reasoning feedback")
        return z0, image_attention_mass(out.attentions, image_mask, rows)

    # -- small helpers -----------------------------------------------------------------------

    def _head(self, z: Any) -> Any:
        head = self.model.get_output_embeddings()
        return head(z.to(head.weight.dtype))

    def _generate(self, ids: Any, max_new: int, extra: dict[str, Any]) -> Any:
        """Greedy continuation of ``ids`` (1, T): the new tokens (1, n)."""
        import torch  # heavy: torch

        if max_new <= 0:
            return ids.new_zeros((1, 0))
        cfg = copy.deepcopy(self.model.generation_config)
        cfg.max_new_tokens, cfg.do_sample = max_new, False
        cfg.temperature, cfg.top_p, cfg.top_k = None, None, None
        if cfg.pad_token_id is None:
            cfg.pad_token_id = self._eos[0] if self._eos else None
        # no_grad, not inference_mode: these ids index embeddings inside graphs later
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      generation_config=cfg, **extra)
        return out[:, ids.shape[1]:]

    def _body(self, answer: Any) -> Any:
        """The answer without its trailing EOS."""
        if answer.shape[1] and int(answer[0, -1]) in self._eos:
            return answer[:, :-1]
        return answer

    def _decode(self, ids: Any) -> str:
        return self.tokenizer.decode(ids[0].tolist(), skip_special_tokens=True)


def _image_token_id(model: Any) -> int:
    for key in ("image_token_id", "image_token_index"):
        value = getattr(model.config, key, None)
        if isinstance(value, int):
            return value
    raise ConfigError(f"{type(model).__name__}'s config names no image token",
                      hint="pass image_token_id= to refine_ids")
