"""The agent's typed state (checkpointed) and the run-scoped context (injected, never saved)."""

from __future__ import annotations

import operator
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypedDict

if TYPE_CHECKING:
    from whetstone.engine.backends.base import Backend
    from whetstone.engine.runtime.plugins import ModelCall, Plugin
    from whetstone.engine.types import Completion, Request
    from whetstone.tools.base import Toolbox


class AgentState(TypedDict, total=False):
    """What the graph carries between nodes; JSON-safe so the SQLite checkpointer can save it.

    ``messages`` is the conversation after the system message, as OpenAI dicts; ``steps`` holds
    ``Step.to_dict()`` records and only ever grows (the reducer appends).
    """

    trace_id: str
    task: str
    label: str | None
    system: str
    messages: list[dict[str, Any]]
    steps: Annotated[list[dict[str, Any]], operator.add]
    pending: list[dict[str, Any]]  # tool calls the last think step asked for
    force_answer: bool  # the model repeated a call: next decision is offered no tools
    # The tools failed twice in a row: the next decision sees only the task and the guidance
    # (RunConfig.fresh_start_after_failures).
    fresh_start: bool
    guidance: str  # the library's guidance text alone (what the direct solver shows)
    # Demonstrations as earlier exchanges (memory with ``turns``): every call sees them between
    # the system message and ``messages``; they are not part of the run's own conversation.
    demo_turns: list[dict[str, str]]
    answer_tools: list[dict[str, Any]]  # task-given tools whose call *is* the answer (BFCL)
    tools: list[str]  # the tools this run offers (prepare chooses them)
    # The first decision must call one of these (Plugin.offer's required), where the backend
    # can prefill the reply.
    require_tools: list[str]
    answer: str | None
    outcome: str | None
    reason: str | None  # why the run stopped, in words
    # What failed when the outcome is "error" ("Type: message"): the run's own record of the
    # failure, so a scorer never reads an unanswered run as a wrong answer.
    error: str | None
    n_calls: int  # model calls so far (the horizon counts these)
    # Text the before-think nodes leave for the next model call only (a step rubric), by
    # node; ``think`` adds it to that call's request and clears it.
    step_guidance: dict[str, str]
    tokens: int
    started: float
    meta: dict[str, Any]
    ended: float  # when ``finish`` settled the run (the final trace is built from the state)


@dataclass(frozen=True)
class RunConfig:
    """Budgets and sampling for one run. ``max_steps`` is the horizon in model calls."""

    max_steps: int = 8
    max_total_tokens: int = 24_000
    timeout_s: float = 600.0
    max_tokens_per_call: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0
    guidance_budget_tokens: int = 1_200  # skills, policy notes and rubrics in the system prompt
    # How tools are offered (whetstone.engine.runtime.prompting): "tags" (one line per tool in the system
    # message, calls in the template's <tool_call> format), "native" (the backend's template
    # renders the tool schemas), "react" (Action:/Observation: text); "auto": tags when the
    # backend has tool calls, else react.
    tool_format: Literal["auto", "tags", "native", "react"] = "auto"
    # A ```python block that prints something runs as a python call (the coder model's own
    # way to compute); its output comes back as ```output.
    code_blocks: bool = True
    # When a reply ends with such a block and it ran cleanly, its output is the answer: the
    # model stops at ```output to have it filled in, and asking it to restate the number
    # would re-read the whole conversation (about twice the tokens on GSM8K; docs/results.md).
    answer_with_program_output: bool = True
    # After tool results, remind the model it may answer now. Small models (the embedded
    # 0.5B) otherwise call tools again and again; measured in tests/test_embedded_agent.py.
    after_tool_nudge: bool = True
    # A task that brings its own tools and whose answer is one of their calls (function
    # calling, BFCL) is offered only those: measured on bfcl-simple@dev:0:50, also offering
    # calculator and python cost 8 points and twice the tokens (the 0.5B wrote python that
    # imported the task's functions). The methods' tools (skills, learned tools) stay.
    own_tools_with_answer_tools: bool = False
    # When every call failed in two rounds in a row, the next decision starts afresh from
    # the task (the direct solver's request, seeded like the run's first call) instead of
    # reading the failures: on gsm8k@dev:0:50 the 0.5B otherwise answered them with guesses
    # ("Grace's combined weight is 125 pounds."). Off: it is told to solve it without tools.
    fresh_start_after_failures: bool = True
    system_prompt: str | None = None  # replaces engine/prompts/agent_system.md


@dataclass
class AgentContext:
    """Dependencies the nodes need, passed through LangGraph's ``Runtime.context``."""

    backend: Backend
    toolbox: Toolbox
    config: RunConfig = field(default_factory=RunConfig)
    plugins: Sequence[Plugin] = ()
    library_version: str | None = None
    # When this invocation's wall clock started; a resumed run gets a fresh clock.
    clock_start: float = field(default_factory=time.time)
    # The backend's complete() as the plugins wrapped it (None: the backend's own).
    model_call: ModelCall | None = None
    # Tools the plugins contributed: each plugin's offer() decides per run whether to offer.
    plugin_tools: frozenset[str] = frozenset()
    # Plugin tools left out because a given tool has the name: name -> the warning.
    tool_clashes: Mapping[str, str] = field(default_factory=dict)

    def call_model(self, request: Request) -> Completion:
        """One model call, through the plugins' wrappers at ``model_call``."""
        call = self.model_call or self.backend.complete
        return call(request)

