"""Latent test-time scaling as a runtime method: ``--methods latent``, ``Engine(methods=["latent"])``.

Its wrapper around the model call (``Plugin.wrap`` at ``model_call``) lets the model answer as usual; when the reply is the answer (no tool call in
it), ``LatentRefiner`` (``whetstone.engine.methods.latent.tts``) refines it from that answer: the hidden
states behind its first tokens take a few gradient steps on a reward (the model's own yes/no
verdict by default; ``latent.scorer=module:function`` plugs in any scorer of the answer text),
and the best-rewarded answer replaces the plain one. A refined answer that turned into a tool
call is not used (counted as ``became_call``). Decisions that call tools pass through untouched.

White-box backends only: the transformers engine (``embedded@transformers``,
``hf:PATH@transformers``); any other backend is refused when the method is built. The run's
usage counts the refinement: every forward's positions as prompt tokens, every re-decoded token
as a completion token. Each trace records in ``meta["latent"]`` what refinement did per answer
(steps, rewards, positions updated, forward/backward passes, verdicts repaired or dropped) and
the totals. See docs/latent.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import BackendError, ConfigError
from ...runtime.parse import ReplyRules, parse_reply
from ...runtime.plugins import DecisionRecords, MethodEnv, ModelCall, Plugin
from ...runtime.prompting import CODE_OUTPUT_STOP
from ...types import Completion, Request
from ..base import knob
from .rewards import Reward, ScorerReward, SelfReward
from .tts import LatentConfig, LatentRefiner, RefineRecord

if TYPE_CHECKING:
    from ...backends.base import Backend
    from ...runtime.state import AgentState

_TOTALS = ("steps", "forward", "forward_tokens", "backward", "redecodes", "redecode_tokens")
_TRANSFORMERS_HINT = ("run it on the transformers engine: --model embedded@transformers or "
                      "hf:PATH@transformers")


@dataclass(frozen=True)
class LatentTTSConfig:
    """Latent refinement's knobs (``--method-config latent.KEY=VALUE``); defaults after
    LatentSeek."""

    lr: float = knob(0.03, min=0.0, help="Adam's learning rate on the latents")
    fraction: float = knob(0.1, min=0.0, help="share of the answer's positions updated per step")
    prefix: float = knob(0.25, min=0.0, help="share of the answer, from its start, whose "
                                             "latents may be updated")
    max_prefix: int = knob(64, min=1, help="the most tokens that share may hold")
    max_steps: int = knob(10, min=0, help="the most gradient steps per answer")
    threshold: float = knob(-0.2, help="stop once the reward reaches this (0 is the best)")
    anchor: float = knob(1.0, min=0.0, help="pull of the latents not selected back to their "
                                            "start")
    min_verdict_mass: float = knob(0.05, min=0.0, help="the least yes+no probability a "
                                                       "self-reward verdict needs; below it "
                                                       "the verdict is dropped")
    prompt: str = knob("verify", help="the self-reward's verification prompt: NAME.md in "
                                       "engine/methods/latent/prompts/, or PACKAGE:NAME")
    scorer: str | None = knob(None, help="module:function scoring the answer text in [0, 1], "
                                         "in place of the self-reward")

    def __post_init__(self) -> None:
        self.latent()  # bad values fail when the method is named, before a model loads

    def latent(self) -> LatentConfig:
        """The refiner's settings."""
        return LatentConfig(lr=self.lr, fraction=self.fraction, prefix=self.prefix,
                            max_prefix=self.max_prefix, max_steps=self.max_steps,
                            threshold=self.threshold, anchor=self.anchor)


def load_scorer(target: str) -> Callable[[str], float]:
    """The function ``module:function`` names (a scorer of answer text)."""
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise ConfigError(f"latent.scorer={target!r} is not module:function",
                          hint="e.g. latent.scorer=my_package.scoring:score")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"latent.scorer={target!r} cannot be loaded: {exc}",
                          hint="name an importable module and a function in it") from exc
    if not callable(fn):
        raise ConfigError(f"latent.scorer={target!r} is not callable",
                          hint="name a function text -> score in [0, 1]")
    return fn


def is_answer(request: Request, completion: Completion) -> bool:
    """Whether the reply answers (the ``think`` node's reading: no call of any form in it)."""
    if completion.tool_calls or completion.finish_reason not in ("stop", "length"):
        return False
    code = "python" if CODE_OUTPUT_STOP in request.stop else None
    names = [t["function"]["name"] for t in request.tools if "function" in t]
    rules = ReplyRules(tool_names=[*names, *([code] if code else [])], code_tool=code)
    return parse_reply(completion, rules).kind == "answer"


def decision_key(messages: Sequence[Mapping[str, Any]], text: str) -> str:
    """One model decision as the ``think`` step records it: its messages and the reply."""
    blob = json.dumps([list(messages), text], sort_keys=True, default=str)
    return hashlib.sha1(blob.encode("utf-8")).hexdigest()


def summary(rec: RefineRecord) -> dict[str, Any]:
    """What the trace keeps of one refinement (texts clipped; per-step detail kept)."""
    return {"steps": rec.steps, "rewards": [round(r, 4) for r in rec.rewards],
            "best_step": rec.best_step, "stopped": rec.stopped, "window": rec.window,
            "answer_tokens": rec.answer_tokens, "positions_updated": rec.updated,
            "changed": rec.changed, "forward": rec.forward,
            "forward_tokens": rec.forward_tokens, "backward": rec.backward,
            "redecodes": rec.redecodes, "redecode_tokens": rec.redecode_tokens,
            "verdicts": dict(rec.verdicts), "seconds": round(rec.seconds, 3),
            "replaced": rec.best_step > 0, "initial_text": rec.initial_text[:2000]}


class LatentTTS(Plugin):
    """Latent test-time scaling: refine a white-box model's answers in latent space."""

    name = "latent"
    wraps = ("model_call",)  # the answer refined in the hidden states
    config_class = LatentTTSConfig

    @classmethod
    def build(cls, config: Any, env: MethodEnv) -> LatentTTS:
        check_white_box(env.backend)
        return cls(config)

    def __init__(self, config: LatentTTSConfig | None = None, *,
                 rewards: Sequence[Reward] | None = None) -> None:
        """``rewards``: reward terms to use (Python only); default: ``config.scorer`` if set,
        else the self-reward."""
        self.config = config or LatentTTSConfig()
        self._rewards = list(rewards) if rewards is not None else None
        self._records = DecisionRecords(1024)
        self._reward_names: list[str] = []

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "rewards": self._reward_names}

    def rewards_for(self, tokenizer: Any) -> list[Reward]:
        """The reward terms for a model with ``tokenizer``."""
        if self._rewards is not None:
            return self._rewards
        cfg = self.config
        if cfg.scorer:
            return [ScorerReward(load_scorer(cfg.scorer), name=cfg.scorer)]
        return [SelfReward(tokenizer, prompt=cfg.prompt, min_mass=cfg.min_verdict_mass)]

    def wrap(self, point: str, call: ModelCall, backend: Backend | None) -> ModelCall:
        check_white_box(backend)
        assert backend is not None  # checked above
        rewards = self.rewards_for(backend.tokenizer)  # type: ignore[attr-defined]
        self._reward_names = [r.name for r in rewards]
        refiner = LatentRefiner.from_backend(backend, self.config.latent(), rewards)

        def refined(request: Request) -> Completion:
            plain = call(request)
            if not is_answer(request, plain):
                return plain
            return self._refine(refiner, request, plain)

        return refined

    def _refine(self, refiner: LatentRefiner, request: Request, plain: Completion
                ) -> Completion:
        key_messages = [m.to_dict() for m in request.messages]
        try:
            result = refiner.refine(request, initial=plain)
        except (BackendError, RuntimeError) as exc:  # e.g. out of memory: keep the answer
            self._records.put(decision_key(key_messages, plain.text),
                              {"error": f"{type(exc).__name__}: {exc}"[:500]})
            return plain
        rec = result.record
        final = result.completion
        info = summary(rec)
        if not is_answer(request, final):
            final, info["replaced"], info["became_call"] = plain, False, True
        # usage covers every pass refinement made, so the run's budgets and totals stay true
        final = dataclasses.replace(
            final, prompt_tokens=plain.prompt_tokens + rec.forward_tokens,
            completion_tokens=plain.completion_tokens + rec.redecode_tokens,
            latency_s=plain.latency_s + rec.seconds, model=plain.model or final.model)
        self._records.put(decision_key(key_messages, final.text), info)
        return final

    def finish_meta(self, state: AgentState) -> Mapping[str, Any]:
        answers: list[dict[str, Any]] = []
        for i, s in enumerate(state.get("steps") or []):
            if s.get("kind") != "think" or not isinstance(s.get("output"), Mapping):
                continue
            text = (s["output"].get("completion") or {}).get("text", "")
            record = self._records.pop(decision_key(
                (s.get("input") or {}).get("messages") or [], text))
            if record is not None:
                answers.append({"step": i, **record})
        done = [a for a in answers if "error" not in a]
        verdicts: dict[str, int] = {}
        for a in done:
            for k, v in a["verdicts"].items():
                verdicts[k] = verdicts.get(k, 0) + v
        return {"answers": answers, "refined": len(done),
                "errors": len(answers) - len(done),
                "replaced": sum(1 for a in done if a["replaced"]),
                "became_call": sum(1 for a in done if a.get("became_call")),
                **{k: sum(a[k] for a in done) for k in _TOTALS},
                "verdicts": verdicts, "seconds": round(sum(a["seconds"] for a in done), 3)}


def check_white_box(backend: Backend | None) -> None:
    """``ConfigError`` unless ``backend`` exposes a transformers model (hidden states,
    gradients)."""
    if backend is None:
        raise ConfigError("the latent method refines a model's answers, and was given none",
                          hint="build it through Engine, or pass a backend")
    if not backend.capabilities.white_box or getattr(backend, "model", None) is None:
        raise ConfigError(f"the latent method needs hidden states and gradients; {backend.spec} "
                          "gives neither", hint=_TRANSFORMERS_HINT)
