"""Co-ReAct: a rubric before each decision, and optionally the decision checked against it.

Before every model decision the ``co_react_rubric`` node asks the rubric generator (any
backend: ``co_react.rubric_model``, ``--rubric-model``; default the agent's own model) for 3-5
weighted, concrete conditions the next step should meet, given the task, what the agent did so
far, the calls it already tried (never to be asked for again) and a phase hint (early / mid /
late by steps used against the horizon). The rubric goes to the next model call through the
runtime's step guidance (``AgentState.step_guidance``): the agent reads it at the end of its
context, for that decision only.

With ``rubric_verify`` the proposed step is scored against the rubric by the same generator
(JSON ``{scores, weighted_score, pass, feedback}``, pass at ``weighted_score >= 0.6``); a step
that fails is sent back once with the feedback and the second proposal is taken as it is. With
``best_of_n > 1`` (test-time compute) N candidate steps are sampled and the one the rubric
scores highest is kept. Both act in its wrapper (``Plugin.wrap`` at ``model_call``), around the ``think`` node's model call,
which reads the rubric back from the request; what they decided is kept per decision and
written to ``trace.meta["co_react"]`` when the run finishes (a run resumed in another process
loses the records of decisions made before the interruption; its rubric steps are in the trace).

Malformed rubrics and checks are repaired (with codes) or dropped after one retry (counted),
never fatal: a step without a usable rubric runs as plain ReAct. The tokens of every rubric and
check count against the run's token budget and in ``trace.total_tokens``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import BackendError, ConfigError
from ...runtime.plugins import DecisionRecords, MethodEnv, ModelCall, Node, Plugin
from ...types import Completion, Message, Request, Step
from ..base import knob
from . import PROMPTS
from .rubric import (
    STOP_AFTER_LINES,
    ActionCheck,
    ParsedRubric,
    Rubric,
    ask,
    parse_check,
    parse_rubric,
    phase_of,
    render_rubric,
    rubric_in_request,
    tried_queries,
)

if TYPE_CHECKING:
    from ...backends.base import Backend
    from ...runtime.state import AgentContext, AgentState

NODE = "co_react_rubric"  # the graph names a plugin's node "<plugin>_<function>"


@dataclass(frozen=True)
class CoReActConfig:
    """Co-ReAct's knobs (``--method-config co_react.KEY=VALUE``)."""

    rubric_model: str | None = knob(
        None, help="backend spec of the rubric generator and checker (default: the agent's "
                   "own model)")
    rubric_verify: bool = knob(False, help="check each proposed step against the rubric; a "
                                           "failing step is retried once with the feedback")
    pass_threshold: float = knob(0.6, min=0.0, help="weighted score a step needs to pass")
    best_of_n: int = knob(1, min=1, help="sample N candidate steps and keep the one the rubric "
                                         "scores highest (test-time compute)")
    sample_temperature: float = knob(0.7, min=0.0,
                                     help="temperature of the extra best-of-N candidates")
    temperature: float = knob(0.0, min=0.0, help="temperature of the generator and checker")
    max_tokens: int = knob(256, min=16, help="most tokens a rubric or a check may take")
    history: int = knob(6, min=0, help="recent messages the generator and checker are shown")


def _clip(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _call_text(name: str, arguments: Any) -> tuple[str, str]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return name, _clip(args, 200)


def tried_calls(state: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The tool calls made so far in the run, each once, in order."""
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for s in state.get("steps") or []:
        if s["kind"] == "act" and isinstance(s.get("input"), Mapping) and "tool" in s["input"]:
            key = json.dumps([s["input"]["tool"], s["input"].get("arguments")], sort_keys=True,
                             default=str)
            if key not in seen:
                seen.add(key)
                out.append((s["input"]["tool"], s["input"].get("arguments")))
    return out


def render_history(messages: Sequence[Mapping[str, Any]], limit: int) -> str:
    """The run's recent messages (the task's own first turn left out), one line each."""
    lines: list[str] = []
    for m in list(messages[1:])[-limit:] if limit else []:
        content = m.get("content")
        text = content if isinstance(content, str) else " ".join(
            p.get("text", "") for p in content or [] if isinstance(p, Mapping))
        if m["role"] == "assistant":
            if text.strip():
                lines.append(PROMPTS.render("parts.yaml#history_agent", text=_clip(text)))
            for c in m.get("tool_calls") or []:
                name, args = _call_text(c["function"]["name"], c["function"]["arguments"])
                lines.append(PROMPTS.render("parts.yaml#history_call", name=name,
                                            arguments=args))
        elif m["role"] == "tool":
            lines.append(PROMPTS.render("parts.yaml#history_tool", name=m.get("name") or "?",
                                        text=_clip(text)))
        elif text.strip():
            lines.append(PROMPTS.render("parts.yaml#history_user", text=_clip(text)))
    return "\n".join(lines) or PROMPTS.load("parts.yaml#history_none")


def _proposal(completion: Completion) -> str:
    """A proposed step as the checker (and the agent, on a retry) reads it."""
    parts = [completion.text.strip()] if completion.text.strip() else []
    for c in completion.tool_calls:
        name, args = _call_text(c.name, c.arguments)
        parts.append(PROMPTS.render("parts.yaml#proposal_call", name=name, arguments=args))
    return "\n".join(parts) or PROMPTS.load("parts.yaml#proposal_empty")


def decision_key(messages: Sequence[Mapping[str, Any]], text: str,
                 tool_calls: Sequence[Mapping[str, Any]]) -> str:
    """One model decision, as the ``think`` step records it: its request's messages and the
    completion it kept."""
    blob = json.dumps([list(messages), text, list(tool_calls)], sort_keys=True, default=str)
    return hashlib.sha1(blob.encode("utf-8")).hexdigest()


class CoReAct(Plugin):
    """Co-ReAct: a weighted step rubric before each decision; optional check, retry and
    best-of-N against it."""

    name = "co_react"
    config_class = CoReActConfig
    stages = ("decide",)  # the rubric node
    wraps = ("model_call",)  # the decision checked against the rubric (when configured)

    @classmethod
    def build(cls, config: Any, env: MethodEnv) -> CoReAct:
        cfg = config or CoReActConfig()
        if cfg.rubric_model and (env.backend is None or cfg.rubric_model != env.backend.spec):
            return cls(cfg, generator=env.model(cfg.rubric_model)[0])
        if env.backend is None:
            raise ConfigError("co_react needs a model to write its rubrics",
                              hint="set co_react.rubric_model=SPEC, or build it through Engine")
        return cls(cfg, generator=env.backend)

    def __init__(self, config: CoReActConfig | None = None, *, generator: Backend) -> None:
        self.config = config or CoReActConfig()
        self.generator = generator
        self._records = DecisionRecords()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "generator": self.generator.spec}

    # -- the rubric node ---------------------------------------------------------------------

    def nodes(self) -> list[Node]:
        return [Node("decide", self.rubric)]

    def rubric(self, state: AgentState, ctx: AgentContext) -> dict[str, Any]:
        """Write the rubric for the next decision and leave it in the step guidance."""
        start = time.time()
        cfg = self.config
        used, horizon = state.get("n_calls", 0), ctx.config.max_steps
        phase = phase_of(used, horizon)
        calls = tried_calls(state)
        prompt = PROMPTS.render(
            "rubric", task=state["task"], tools=", ".join(self._tool_names(state, ctx)),
            history=render_history(state.get("messages") or [], cfg.history),
            tried=PROMPTS.render("parts.yaml#tried_block", calls="\n".join(
                PROMPTS.render("parts.yaml#tried_call", name=n, arguments=a)
                for n, a in (_call_text(n, a) for n, a in calls))) if calls else "",
            steps_used=used, horizon=horizon, phase=phase,
            phase_hint=PROMPTS.load(f"parts.yaml#phase_{phase}"))
        queries = tried_queries(calls)
        seed = None if ctx.config.seed is None else ctx.config.seed + 1000 * (used + 1)
        parsed, stats, raw = ask(
            self.generator, prompt, lambda text: parse_rubric(text, phase=phase, tried=queries),
            max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=seed,
            stop=STOP_AFTER_LINES)
        guidance = dict(state.get("step_guidance") or {})
        if parsed is not None:
            guidance[NODE] = render_rubric(parsed.rubric)
        else:
            guidance.pop(NODE, None)
        tokens = stats.prompt_tokens + stats.completion_tokens
        step = Step(
            kind="rubric", module=NODE,
            input={"phase": phase, "steps_used": used, "horizon": horizon,
                   "tried": [[n, a] for n, a in calls]},
            output=self._rubric_output(parsed, raw), tokens=tokens, started=start,
            duration_s=time.time() - start,
            error=None if parsed is not None else "rubric dropped: " + "; ".join(stats.errors),
            route="think",
            meta={"calls": stats.calls, "retries": stats.retries, "dropped": stats.dropped})
        return {"step_guidance": guidance, "tokens": state.get("tokens", 0) + tokens,
                "steps": [step.to_dict()]}

    @staticmethod
    def _rubric_output(parsed: ParsedRubric | None, raw: str) -> dict[str, Any]:
        return {"rubric": parsed.rubric.to_dict() if parsed else None,
                "repairs": list(parsed.repairs) if parsed else [], "raw": raw}

    @staticmethod
    def _tool_names(state: Mapping[str, Any], ctx: AgentContext) -> list[str]:
        names = list(ctx.toolbox.names())
        names += [t.get("function", t)["name"] for t in state.get("answer_tools") or []]
        return names or ["(none)"]

    # -- checking the decision ---------------------------------------------------------------

    def wrap(self, point: str, call: ModelCall, backend: Backend | None) -> ModelCall:
        if not (self.config.rubric_verify or self.config.best_of_n > 1):
            return call

        def decide(request: Request) -> Completion:
            rubric = rubric_in_request(request)
            if rubric is None:  # no rubric this step (dropped), or not the agent's call
                return call(request)
            return self._decide(call, request, rubric)

        return decide

    def _check(self, request: Request, rubric: Rubric, completion: Completion
               ) -> tuple[ActionCheck | None, dict[str, int]]:
        cfg = self.config
        rubric_text = "\n".join(f"{i}. [{w:.2f}] {c}" for i, (w, c) in enumerate(rubric.lines, 1))
        history = render_history([{**m.to_dict(), "content": _without_rubric(m.text)}
                                  for m in request.messages[1:]], cfg.history)
        prompt = PROMPTS.render("verify", task=_task_of(request), history=history,
                                rubric=rubric_text, action=_proposal(completion),
                                threshold=f"{cfg.pass_threshold:g}")
        check, stats, _ = ask(self.generator, prompt,
                              lambda text: parse_check(text, rubric, cfg.pass_threshold),
                              max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                              seed=request.seed)
        return check, {"calls": stats.calls, "retries": stats.retries, "dropped": stats.dropped,
                       "prompt_tokens": stats.prompt_tokens,
                       "completion_tokens": stats.completion_tokens}

    def _candidates(self, call: ModelCall, request: Request) -> list[Completion]:
        cfg = self.config
        out = [call(request)]  # the plain decision first: its failure is the run's failure
        for i in range(1, cfg.best_of_n):
            seed = None if request.seed is None else request.seed + 7919 * i
            try:
                out.append(call(request.with_(seed=seed, temperature=max(
                    request.temperature, cfg.sample_temperature))))
            except BackendError:
                break  # keep the candidates we have
        return out

    def _decide(self, call: ModelCall, request: Request, rubric: Rubric) -> Completion:
        cfg = self.config
        candidates = self._candidates(call, request)
        checked = [self._check(request, rubric, c) for c in candidates]
        scores = [c.score if c is not None else None for c, _ in checked]
        best = max(range(len(candidates)),
                   key=lambda i: (scores[i] if scores[i] is not None else -1.0, -i))
        chosen, check = candidates[best], checked[best][0]
        spent = [c for i, c in enumerate(candidates) if i != best]
        retried = False
        if cfg.rubric_verify and check is not None and not check.passed:
            feedback = PROMPTS.render(
                "parts.yaml#retry", score=f"{check.score:.2f}",
                threshold=f"{cfg.pass_threshold:.2f}",
                feedback=check.feedback or "(none given)")
            retry = request.with_(messages=(*request.messages,
                                            Message("assistant", _proposal(chosen)),
                                            Message("user", feedback)))
            try:
                second = call(retry)
            except BackendError:
                second = None  # the first proposal stands
            if second is not None:
                spent.append(chosen)
                chosen, retried = second, True
        costs = {k: sum(c[1][k] for c in checked)
                 for k in ("calls", "retries", "dropped", "prompt_tokens", "completion_tokens")}
        costs["tokens"] = costs["prompt_tokens"] + costs["completion_tokens"]
        # The decision's usage covers every call made for it, so budgets and totals stay true.
        final = dataclasses.replace(
            chosen,
            prompt_tokens=chosen.prompt_tokens + sum(c.prompt_tokens for c in spent)
            + costs["prompt_tokens"],
            completion_tokens=chosen.completion_tokens + sum(c.completion_tokens for c in spent)
            + costs["completion_tokens"],
            latency_s=chosen.latency_s + sum(c.latency_s for c in spent))
        self._records.put(decision_key(
            [m.to_dict() for m in request.messages], final.text,
            [t.to_dict() for t in final.tool_calls]), {
            "candidates": len(candidates), "chosen": best,
            "scores": [None if s is None else round(s, 4) for s in scores],
            "check": check.to_dict() if check is not None else None, "retried": retried,
            "check_calls": costs["calls"], "check_dropped": costs["dropped"],
            "check_tokens": costs["tokens"],
            "extra_agent_tokens": sum(c.total_tokens for c in spent)})
        return final

    # -- the trace ---------------------------------------------------------------------------

    def finish_meta(self, state: AgentState) -> Mapping[str, Any]:
        steps = state.get("steps") or []
        rubrics = [s for s in steps if s["kind"] == "rubric" and s["module"] == NODE]
        made = [s for s in rubrics if (s.get("output") or {}).get("rubric")]
        repairs = Counter(r for s in made for r in s["output"].get("repairs") or [])
        meta: dict[str, Any] = {
            "rubrics": len(rubrics), "injected": len(made), "dropped": len(rubrics) - len(made),
            "repaired": sum(1 for s in made if s["output"].get("repairs")),
            "repairs": dict(repairs),
            "generator_retries": sum((s.get("meta") or {}).get("retries", 0) for s in rubrics),
            "rubric_tokens": sum(s.get("tokens", 0) for s in rubrics),
        }
        if self.config.rubric_verify or self.config.best_of_n > 1:
            meta["checks"] = self._collect_checks(steps)
        return meta

    def _collect_checks(self, steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        decisions = []
        for i, s in enumerate(steps):
            if s["kind"] != "think" or s.get("error") or not isinstance(s.get("output"), Mapping):
                continue
            completion = s["output"].get("completion") or {}
            record = self._records.pop(decision_key(
                (s.get("input") or {}).get("messages") or [], completion.get("text", ""),
                completion.get("tool_calls") or []))
            if record is not None:
                decisions.append({"step": i, **record})
        checks = [d["check"] for d in decisions if d["check"] is not None]
        return {
            "decisions": decisions, "checked": len(checks),
            "passed": sum(1 for c in checks if c["pass"]),
            "failed": sum(1 for c in checks if not c["pass"]),
            "retried": sum(1 for d in decisions if d["retried"]),
            "check_dropped": sum(d["check_dropped"] for d in decisions),
            "check_tokens": sum(d["check_tokens"] for d in decisions),
            "extra_agent_tokens": sum(d["extra_agent_tokens"] for d in decisions),
        }


def _without_rubric(text: str) -> str:
    """A message's text without the rubric the step guidance added to it."""
    return text.split(PROMPTS.load("parts.yaml#guidance_heading"), 1)[0].rstrip()


def _task_of(request: Request) -> str:
    """The task as the run's first user turn states it."""
    first = next((m for m in request.messages if m.role == "user"), None)
    return _clip(_without_rubric(first.text), 1500) if first is not None else ""
