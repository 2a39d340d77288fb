"""One ask-parse-retry loop (``whetstone.engine.methods.analyst``) for the async evolvers, the
Dynamo tool maker and the synchronous graph nodes (Co-ReAct's ``rubric.ask``): the same
requests, costs and drops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import BackendError, ParseError
from whetstone.engine.methods.analyst import AnalystReply, AskAgain, ask_parsed, ask_parsed_sync
from whetstone.engine.types import Completion, Request


def as_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ParseError("not a number", text, hint="reply with digits only") from None


class Failing(ScriptedBackend):
    """A backend whose calls fail (a server that went away)."""

    def complete(self, request: Request) -> Completion:
        self.requests.append(request)
        raise BackendError("connection refused")


def shape(reply: AnalystReply[int], backend: ScriptedBackend) -> tuple[Any, ...]:
    s = reply.stats
    return (reply.value, reply.raw, s.calls, s.retries, s.dropped, len(s.errors),
            [(r.seed, r.stop, [m.text for m in r.messages]) for r in backend.requests])


def test_sync_and_async_share_the_retry() -> None:
    runs = []
    for sync in (True, False):
        backend = ScriptedBackend(["forty-two", "42"])
        msgs = [{"role": "user", "content": "How many?"}]
        reply = ask_parsed_sync(backend, msgs, as_int, seed=7, stop=("\n6.",)) if sync else \
            asyncio.run(ask_parsed(backend, msgs, as_int, seed=7, stop=("\n6.",)))
        runs.append(shape(reply, backend))
    assert runs[0] == runs[1]
    value, raw, calls, retries, dropped, _, requests = runs[0]
    assert (value, raw, calls, retries, dropped) == (42, "42", 2, 1, 0)
    assert [seed for seed, _, _ in requests] == [7, 8]
    assert all(stop == ("\n6.",) for _, stop, _ in requests)
    retry = requests[1][2]  # the bad reply and the error go back to the model
    assert retry[1] == "forty-two" and "not a number" in retry[2] and "digits" in retry[2]


def test_a_second_bad_reply_and_a_failed_call_are_dropped_not_raised() -> None:
    backend = ScriptedBackend(["x", "y"])
    reply = ask_parsed_sync(backend, [{"role": "user", "content": "n?"}], as_int)
    assert reply.value is None and reply.stats.dropped == 1 and reply.raw == "y"
    assert "raw reply: y" in reply.stats.errors[0]
    failing = Failing([])
    reply = ask_parsed_sync(failing, [{"role": "user", "content": "n?"}], as_int)
    assert (reply.value, reply.stats.calls, reply.stats.dropped) == (None, 1, 1)
    assert "connection refused" in reply.stats.errors[0]


def test_a_method_words_its_own_retry_and_asks_again_for_a_reply_that_parses() -> None:
    """The maker's two retries: a reply that does not parse goes back with the method's own
    wording (``retry_prompt``), one that parses but repeats its input with ``AskAgain``'s;
    a last ``AskAgain`` is taken as it is (``fallback``), not dropped."""
    def not_five(text: str) -> int:
        n = as_int(text)
        if n == 5:
            raise AskAgain("That is the number you were given: change it.", n)
        return n

    msgs = [{"role": "user", "content": "Change 5."}]
    backend = ScriptedBackend(["five", "5", "6"])
    reply = ask_parsed_sync(backend, msgs, not_five, retries=2,
                            retry_prompt=lambda exc: f"Digits only, please ({exc.message}).")
    assert (reply.value, reply.stats.retries, reply.stats.dropped) == (6, 2, 0)
    told = [r.messages[-1].text for r in backend.requests[1:]]
    assert told == ["Digits only, please (not a number).",
                    "That is the number you were given: change it."]
    backend = ScriptedBackend(["5", "5"])
    reply = asyncio.run(ask_parsed(backend, msgs, not_five))
    assert (reply.value, reply.stats.retries, reply.stats.dropped, reply.error) == (5, 1, 0, "")
    backend = ScriptedBackend(["x", "y"])
    reply = asyncio.run(ask_parsed(backend, msgs, not_five))
    assert reply.value is None and reply.error.startswith("not a number")


@pytest.mark.co_react
def test_rubric_ask_is_the_shared_loop() -> None:
    from whetstone.engine.methods.co_react import rubric

    backend = ScriptedBackend(["no", "3"])
    value, stats, raw = rubric.ask(backend, "How many?", as_int, max_tokens=50,
                                   temperature=0.0, seed=1, stop=("\n6.",))
    same = ScriptedBackend(["no", "3"])
    reply = ask_parsed_sync(same, [{"role": "user", "content": "How many?"}], as_int,
                            max_tokens=50, temperature=0.0, seed=1, stop=("\n6.",))
    assert (value, raw, stats.to_dict()["retries"]) == (3, "3", 1)
    assert [r.to_dict() for r in backend.requests] == [r.to_dict() for r in same.requests]
    assert stats.errors == reply.stats.errors == []
