"""A small world for the learning-in-production tests (issue 48): questions about item codes
whose answers a scripted model knows only for a third of the items, unless the system message
shows it worked examples (the memory method's demonstrations); users behind four API keys who
ask through ``serve`` and send each reply's score and the right answer as feedback.

``live_loses``: the model answers worse live with the examples than without them, while it
still answers right with them in the gate's runs (the direct solver's requests carry no
client system message): a candidate the gate accepts and live traffic rejects, which is why
a canary is served before a version becomes current.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.evolution.canary import CanaryRules
from whetstone.engine.evolution.learner import Learner, LearnerConfig
from whetstone.engine.types import Request
from whetstone.library_store.lease import FileLease

KEYS = ("alice-key", "bob-key", "carol-key", "dave-key")
LIVE = "You answer the support team's questions."  # the client's own system message


def code(n: int) -> str:
    return f"K{(n * 37) % 1000:03d}"


def question(n: int) -> str:
    return f"What is the code of item {n}?"


def responder(*, live_loses: bool = False, delay_s: float = 0.0) -> Callable[[Request], str]:
    """The scripted model of the module docstring."""
    import time

    def answer(request: Request) -> str:
        if delay_s:
            time.sleep(delay_s)
        system = " ".join(m.text for m in request.messages if m.role == "system")
        asked = [m.text for m in request.messages if m.role == "user"][-1]
        found = re.search(r"item (\d+)", asked)
        if found is None:
            return "I do not know"
        n = int(found.group(1))
        examples = "worked example" in system.lower()
        if examples and live_loses and LIVE in system:
            return "K999"
        return code(n) if examples or n % 3 == 0 else "I do not know"

    return answer


def engine(library: Path, backend: Any, **kw: Any) -> Engine:
    """An engine serving and learning with the memory method, the direct solver, no tools."""
    return Engine(backend, library=library, create=True, methods=["memory"],
                  checkpointing=False, solver="direct", tools=[], **kw)


def scripted(**kw: Any) -> ScriptedBackend:
    return ScriptedBackend(responder=responder(**kw))


FAST_RULES = CanaryRules(min_scored=30, min_rollback=10, max_scored=300)


def learner(eng: Engine, *, every: int = 40, share: float = 0.3,
            rules: CanaryRules = FAST_RULES, lease: FileLease | None = None,
            say: Callable[[str], None] | None = None) -> Learner:
    """A learner on ``eng``'s library, evolving with memory (the ``whetstone learn``
    defaults but for sizes a test can afford)."""
    def evolve(traces: Any) -> Any:
        import time

        return eng.evolve("memory", traces=traces, commit=False, scorer="normalised",
                          candidate_name=f"learn-{time.time_ns()}")

    # No heartbeat runs when a test takes the steps itself: a lease that outlives the test.
    return Learner(eng.library, lease or FileLease(eng.library.root / "learning", ttl_s=3600),
                   evolve, LearnerConfig(every=every, share=share, poll_s=0.05, rules=rules),
                   sinks=eng.library.trace_sinks, say=say)


@dataclass
class Served:
    n: int
    key: str
    version: str
    trace_id: str
    right: bool


class Users:
    """The users: a chat through ``base`` with one of the keys, then feedback (the score and
    the right answer) on the reply; ``flip`` makes a key vote the opposite of the truth."""

    def __init__(self, base: str, keys: tuple[str, ...] = KEYS) -> None:
        self.client = httpx.Client(base_url=base, timeout=60)
        self.keys = keys
        self.served: list[Served] = []

    def ask(self, n: int, *, key: str | None = None, flip: bool = False,
            label: bool = True) -> Served:
        key = key or self.keys[n % len(self.keys)]
        auth = {"Authorization": f"Bearer {key}"}
        res = self.client.post("/v1/chat/completions", headers=auth, json={
            "model": "scripted:", "messages": [{"role": "system", "content": LIVE},
                                               {"role": "user", "content": question(n)}]})
        assert res.status_code == 200, res.text
        right = res.json()["choices"][0]["message"]["content"] == code(n)
        trace_id = res.headers["x-whetstone-trace-id"]
        body: dict[str, Any] = {"trace_id": trace_id, "score": float(right != flip)}
        if label:
            body["label"] = code(n)
        fb = self.client.post("/v1/feedback", headers=auth, json=body)
        assert fb.status_code == 200, fb.text
        served = Served(n, key, res.headers["x-whetstone-library-version"], trace_id, right)
        self.served.append(served)
        return served

    def close(self) -> None:
        self.client.close()
