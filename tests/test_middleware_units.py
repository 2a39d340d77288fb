"""The middleware's parts on their own: Prometheus text, switches, guidance injection, the query,
the query-embedding cache, API keys, the adapter's budget and the background trace writer."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.chat.adapter import (
    Adapted,
    ChatAdapter,
    ChatSwitches,
    chat_query,
    inject_guidance,
    inject_guidance_dicts,
)
from whetstone.engine.chat.exchange import chat_trace, check_feedback
from whetstone.engine.errors import ConfigError, NotFound, WhetstoneError
from whetstone.engine.runtime.plugins import Guidance, Plugin
from whetstone.engine.server.guard import key_matches, load_api_keys
from whetstone.engine.server.metrics import Counter, Gauge, Histogram, Metrics
from whetstone.engine.server.recording import TraceWriter
from whetstone.engine.types import Completion, Message, Request
from whetstone.library_store.embed_cache import CachedEmbedder
from whetstone.library_store.trace_records import encode_trace
from whetstone.library_store.traces import TraceStore

# --- Prometheus text -------------------------------------------------------------------------


def test_counter_and_gauge_exposition() -> None:
    c = Counter("x_total", "Things.", ("route", "status"))
    c.inc(route='/a"b\\c\nd', status=200)
    c.inc(2.5, route="/z", status=500)
    assert c.render() == [
        "# HELP x_total Things.", "# TYPE x_total counter",
        'x_total{route="/a\\"b\\\\c\\nd",status="200"} 1',
        'x_total{route="/z",status="500"} 2.5']
    with pytest.raises(ValueError, match="takes labels"):
        c.inc(route="/a")
    with pytest.raises(ValueError, match="cannot go down"):
        c.inc(-1, route="/a", status=1)
    depth = [3]
    g = Gauge("q", "Queue.", read=lambda: depth[0])
    depth[0] = 7
    assert g.render()[-1] == "q 7"


def test_histogram_buckets_are_cumulative() -> None:
    h = Histogram("lat_seconds", "Latency.", ("route",), buckets=(0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v, route="r")
    assert h.render()[2:] == [
        'lat_seconds_bucket{route="r",le="0.1"} 2', 'lat_seconds_bucket{route="r",le="1"} 3',
        'lat_seconds_bucket{route="r",le="+Inf"} 4', 'lat_seconds_sum{route="r"} 3.65',
        'lat_seconds_count{route="r"} 4']
    assert h.count(route="r") == 4


def test_metrics_render_every_family_once() -> None:
    text = Metrics(queued=lambda: 2).render()
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types)) == 17
    assert "whetstone_queue_depth 2" in text and text.endswith("\n")


# --- switches, feedback, the conversation ----------------------------------------------------

def test_switches() -> None:
    assert ChatSwitches.from_body(None) == ChatSwitches()
    assert ChatSwitches.from_body({"library": False, "record": False, "budget_tokens": 0}) == (
        ChatSwitches(library=False, record=False, budget_tokens=0))
    for bad in ({"budget_tokens": 10**6}, {"budget_tokens": True}, {"record": 1}, [],
                {"version": "v1"}):
        with pytest.raises(ConfigError):
            ChatSwitches.from_body(bad)


def test_check_feedback() -> None:
    assert check_feedback(1) == (1.0, None) and check_feedback(0.3, "ok") == (0.3, "ok")
    for score in (-0.1, 1.01, float("inf"), float("nan"), None, "1", False):
        with pytest.raises(ConfigError, match="'score'"):
            check_feedback(score)
    with pytest.raises(ConfigError, match="characters"):
        check_feedback(1, "x" * 5000)


def test_the_query_is_the_last_user_messages() -> None:
    msgs = [Message("system", "sys"), Message("user", "first"), Message("assistant", "a"),
            Message("user", "second"), Message("tool", "result", tool_call_id="c")]
    assert chat_query(msgs) == "second"
    assert chat_query(msgs, turns=2) == "first\nsecond"
    assert chat_query([Message("system", "only")]) == ""
    assert chat_query([Message("user", "x" * 50)], max_chars=10) == "x" * 10


def test_guidance_goes_into_the_first_system_message() -> None:
    user = Message("user", "q")
    assert inject_guidance([user], "") == (user,)
    assert inject_guidance([user], "# G") == (Message("system", "# G"), user)
    out = inject_guidance([Message("system", "Be brief.  "), user], "# G")
    assert out[0].text == "Be brief.\n\n# G" and out[1] is user
    parts = inject_guidance([Message("system", ({"type": "text", "text": "A"},)), user], "# G")
    assert parts[0].text == "A\n\n# G"


def test_guidance_into_client_dicts_keeps_the_other_messages() -> None:
    user = {"role": "user", "content": "q", "extra": object()}
    dev = {"role": "developer", "content": "Be brief."}
    out = inject_guidance_dicts([dev, user], "# G")
    assert out[0] == {"role": "developer", "content": "Be brief.\n\n# G"} and out[1] is user
    assert dev["content"] == "Be brief."  # the caller's dict is not changed
    assert inject_guidance_dicts([user], "# G")[0] == {"role": "system", "content": "# G"}


# --- the adapter -----------------------------------------------------------------------------

class _Notes(Plugin):
    def __init__(self, name: str, text: str, version: str | None = None) -> None:
        self.name = name
        self.text = text
        self.version = version
        self.calls: list[tuple[str, int]] = []

    def guidance(self, task: str, ctx: Any, budget_tokens: int) -> Guidance | None:
        self.calls.append((task, budget_tokens))
        return Guidance("Notes", self.text, {"n": 1}, library_version=self.version)


def test_the_adapter_spends_one_budget_across_plugins() -> None:
    backend = ScriptedBackend()
    first, second = _Notes("a", "x" * 400, "v7"), _Notes("b", "# Own heading\nbody")
    adapter = ChatAdapter([first, second], backend, budget_tokens=300,
                          version_of=lambda: "v9")
    req = Request(messages=(Message("user", "the task"),))
    out = adapter.adapt(req)
    assert first.calls == [("the task", 300)]
    assert second.calls == [("the task", 300 - backend.count_tokens("x" * 400))]
    assert out.guidance == "# Notes\n" + "x" * 400 + "\n\n# Own heading\nbody"
    assert out.library_version == "v7" and out.meta == {"a": {"n": 1}, "b": {"n": 1}}
    assert out.applied and out.request.messages[0].role == "system"
    off = adapter.adapt(req, ChatSwitches(library=False))
    assert off.request is req and not off.applied and len(first.calls) == 1
    empty = adapter.adapt(Request(messages=(Message("system", "s"),)))
    assert empty.guidance == "" and len(first.calls) == 1  # nothing to retrieve for
    assert empty.library_version == "v9" and adapter.library_version() == "v9"


class _Keyed(_Notes):
    def __init__(self) -> None:
        super().__init__("k", "keyed notes", "v1")
        self.key: str | None = "tree-1"

    def cache_key(self) -> str | None:
        return self.key


def test_guidance_is_cached_per_key_query_and_budget() -> None:
    keyed = _Keyed()
    adapter = ChatAdapter([keyed], ScriptedBackend(), cache_size=2)
    ask = Request(messages=(Message("user", "q1"),))
    assert adapter.cached(ask) is None
    first = adapter.adapt(ask)
    hit = adapter.cached(ask)
    assert hit is not None and hit.request == first.request and hit.meta == first.meta
    assert len(keyed.calls) == 1 and adapter.cache_hits == 1
    adapter.adapt(ask, ChatSwitches(budget_tokens=50))  # another budget: computed
    keyed.key = "tree-2"  # the library moved: nothing old is served
    assert adapter.cached(ask) is None
    adapter.adapt(ask)
    assert len(keyed.calls) == 3
    keyed.key = None  # the plugin says "do not cache now"
    adapter.adapt(ask)
    adapter.adapt(ask)
    assert len(keyed.calls) == 5
    mixed = ChatAdapter([_Keyed(), _Notes("plain", "x")], ScriptedBackend())
    mixed.adapt(ask)
    assert mixed.cached(ask) is None  # one uncacheable plugin: no caching at all


def test_an_error_trace() -> None:
    adapted = Adapted(Request(messages=(Message("user", "q"),)), query="q", applied=True,
                      library_version="v3")
    t = chat_trace("t1", adapted, model="m", started=1.0, error="boom", request_id="r",
                   ended=2.0)
    assert (t.outcome, t.answer, t.total_tokens, t.library_version) == ("error", None, 0, "v3")
    assert t.meta == {"source": "chat", "library": True, "request_id": "r", "reason": "boom"}
    assert t.steps[0].error == "boom" and t.steps[0].duration_s == 1.0
    ok = chat_trace("t2", adapted, model="m", started=1.0, completion=Completion(
        text="", tool_calls=()), ended=1.5)
    assert ok.outcome == "answered" and ok.answer == ""


# --- the query-embedding cache ---------------------------------------------------------------

class _Counting:
    name = "fake"
    dim = 2

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)


def test_the_cache_answers_repeated_queries_and_evicts_the_oldest() -> None:
    inner = _Counting()
    cache = CachedEmbedder(inner, maxsize=2)
    assert cache.name == "fake" and cache.dim == 2 and bool(cache)
    first = cache.embed(["aa"])
    first[0, 0] = 99  # the caller's copy, not the cached vector
    assert cache.embed(["aa"]).tolist() == [[2.0, 1.0]]
    assert (cache.hits, cache.misses, len(inner.calls)) == (1, 1, 1)
    cache.embed(["b"])
    cache.embed(["ccc"])  # evicts "aa"
    cache.embed(["aa"])
    assert len(inner.calls) == 4 and cache.size == 2
    cache.embed(["x", "y"])  # batches pass through, uncached
    assert inner.calls[-1] == ["x", "y"] and cache.size == 2


def test_whitespace_variants_of_a_query_share_one_entry() -> None:
    inner = _Counting()
    cache = CachedEmbedder(inner)
    a = cache.embed(["  tidy   this\nexport up "])
    b = cache.embed(["tidy this export up"])
    assert inner.calls == [["tidy this export up"]] and a.tolist() == b.tolist()
    keyed = _Keyed()
    adapter = ChatAdapter([keyed], ScriptedBackend())
    adapter.adapt(Request(messages=(Message("user", "how  many\tminutes?"),)))
    hit = adapter.cached(Request(messages=(Message("user", "how many minutes? "),)))
    assert hit is not None and len(keyed.calls) == 1
    assert hit.query == "how many minutes?"  # the request's own text, not the key


def test_the_served_name_defaults_to_the_upstreams_model_name() -> None:
    from whetstone.engine.server.naming import public_spec, upstream_model_name

    assert upstream_model_name("openai:qwen2.5-0.5b@http://10.0.0.5:8000/v1") == "qwen2.5-0.5b"
    assert upstream_model_name("openai:Qwen/Qwen2.5-0.5B-Instruct@http://h:8000/v1") == \
        "Qwen/Qwen2.5-0.5B-Instruct"  # vLLM's model id, as its /v1/models lists it
    assert upstream_model_name("llamacpp:/models/qwen-q4_k_m.gguf") == "qwen-q4_k_m"
    assert upstream_model_name("hf:/models/qwen/") == "qwen"
    assert upstream_model_name("embedded") == "embedded"
    assert public_spec("openai:qwen@http://10.0.0.5:8000/v1") == "openai:qwen"


# --- API keys --------------------------------------------------------------------------------

def test_api_keys_from_options_and_a_file(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("# team keys\nsk-one\n\nsk-two  # ci\n")
    assert load_api_keys(["sk-zero", " "], f) == {"sk-zero", "sk-one", "sk-two"}
    assert load_api_keys() == frozenset()
    with pytest.raises(ConfigError, match="cannot read"):
        load_api_keys(keys_file=tmp_path / "missing")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="holds no key"):
        load_api_keys(keys_file=tmp_path / "empty")
    keys = frozenset({"sk-one"})
    assert key_matches("Bearer sk-one", keys) and key_matches("bearer  sk-one ", keys)
    for header in (None, "", "sk-one", "Basic sk-one", "Bearer sk-on", "Bearer "):
        assert not key_matches(header, keys)


# --- the trace writer ------------------------------------------------------------------------

def _trace(i: int) -> Any:
    adapted = Adapted(Request(messages=(Message("user", f"q{i}"),)))
    return chat_trace(f"t{i}", adapted, model="m", started=1_700_000_000.0 + i,
                      completion=Completion(text=f"a{i}"))


async def test_the_writer_drains_on_stop_and_labels(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "traces")
    writer = TraceWriter(store, Metrics())
    writer.start()
    for i in range(50):
        writer.put(_trace(i))
    await writer.stop()
    assert writer.pending == 0 and sorted(store.latest()) == sorted(f"t{i}" for i in range(50))
    writer.put(_trace(50))  # after stop: written at once, not lost
    assert "t50" in store.latest()
    labelled = await writer.label("t3", 0.0, "wrong")  # found through the store's index
    assert labelled.score == 0.0 and store.get("t3").meta["feedback"] == "wrong"
    assert (await writer.label("t50", 1.0, None)).score == 1.0
    with pytest.raises(NotFound):
        await writer.label("t", 1.0, None)  # a prefix is not an id


async def test_traces_arriving_together_are_written_in_one_batch(tmp_path: Path) -> None:
    batches: list[int] = []

    class Counting(TraceStore):
        def append_records(self, records: Any) -> None:
            records = list(records)
            batches.append(len(records))
            super().append_records(records)

    store = Counting(tmp_path / "t")
    writer = TraceWriter(store, Metrics(), linger_s=0.2)
    writer.start()
    for i in range(5):  # a burst slower than the loop: each put lands a moment after the last
        writer.put(_trace(i))
        await asyncio.sleep(0.01)
    await writer.flush()
    assert batches == [5]  # the lock and segment lookup once, not five times
    await writer.stop()
    assert writer.pending == 0 and len(store.latest()) == 5


async def test_a_failing_store_is_counted_not_fatal(tmp_path: Path) -> None:
    class Full(TraceStore):
        def append_records(self, records: Any) -> None:  # every append goes through here
            raise OSError(28, "No space left on device")

    metrics = Metrics()
    writer = TraceWriter(Full(tmp_path / "t"), metrics)
    writer.put(_trace(1))  # starts the writer lazily on this loop
    await writer.flush()
    assert metrics.trace_errors.value() == 1 and metrics.traces_written.value() == 0
    await writer.stop()
    await asyncio.sleep(0)


async def test_feedback_waits_for_its_trace_only_not_for_steady_traffic() -> None:
    class SlowStore:
        """Each batch takes 0.1 s to write; it keeps what it was given."""

        remote = False

        def __init__(self) -> None:
            self.written: list[tuple[str, float | None]] = []

        def encode(self, trace: Any) -> Any:
            return encode_trace(trace)

        def append_records(self, records: list[Any]) -> None:
            time.sleep(0.1)
            self.written.extend((r.id, json.loads(r.line)["score"]) for r in records)

        def find(self, trace_id: str) -> Any:
            return _trace(int(trace_id[1:])) if (trace_id, None) in self.written else None

        def append(self, trace: Any) -> None:
            self.written.append((trace.id, trace.score))

        def append_feedback(self, trace: Any, score: float, comment: str | None) -> None:
            self.append(trace)  # the store's feedback write (its sinks hear of the label)

    store = SlowStore()
    writer = TraceWriter(store, Metrics())  # type: ignore[arg-type]
    writer.start()
    writer.put(_trace(0))
    stop = asyncio.Event()

    async def traffic() -> None:
        i = 1
        while not stop.is_set():  # 50 requests a second: the queue is never empty
            writer.put(_trace(i))
            i += 1
            await asyncio.sleep(0.02)

    task = asyncio.create_task(traffic())
    await asyncio.sleep(0.05)
    started = time.monotonic()
    labelled = await asyncio.wait_for(writer.label("t0", 1.0, "ok"), 5)
    took = time.monotonic() - started
    stop.set()
    await task
    await writer.stop()
    assert labelled.score == 1.0 and took < 1.0
    # The labelled copy lands after the trace's own write (the latest line for an id wins).
    assert [w for w in store.written if w[0] == "t0"] == [("t0", None), ("t0", 1.0)]


async def test_feedback_on_a_trace_the_store_cannot_take_in_time_fails() -> None:
    gate = threading.Event()

    class Stuck:
        remote = False

        def encode(self, trace: Any) -> Any:
            return encode_trace(trace)

        def append_records(self, records: list[Any]) -> None:
            gate.wait(10)

        def append(self, trace: Any) -> None:
            pass

    writer = TraceWriter(Stuck(), Metrics())  # type: ignore[arg-type]
    writer.put(_trace(1))
    with pytest.raises(WhetstoneError, match="still waiting to be written"):
        await writer.written("t1", timeout=0.1)
    await writer.written("t-never-queued", timeout=0.1)  # nothing to wait for
    gate.set()
    await writer.written("t1", timeout=5)
    await writer.stop()


def test_an_exchange_reads_like_a_run_to_the_evolvers() -> None:
    from whetstone.engine.methods.analyst import render_trace
    from whetstone.engine.types import ToolCall

    adapted = Adapted(Request(messages=(Message("system", "# Skills\n- weather"),
                                        Message("user", "Weather in Oslo?"))),
                      query="Weather in Oslo?", applied=True, library_version="v2",
                      meta={"skills": {"shown": ["weather-reports"]}})
    call = ToolCall(name="get_weather", arguments='{"city": "Oslo"}', id="c1")
    t = chat_trace("t9", adapted, model="openai:qwen@http://h/v1", started=1.0, ended=2.0,
                   completion=Completion(text="", tool_calls=(call,), completion_tokens=7))
    text = render_trace(t)
    assert text.splitlines()[0] == "Task: Weather in Oslo?"
    assert 'Model calls get_weather({"city": "Oslo"})' in text
    assert text.splitlines()[-2:] == ['Final answer: get_weather({"city": "Oslo"})',
                                      "Outcome: answered"]
    assert t.meta["skills"]["shown"] == ["weather-reports"] and t.total_tokens == 7


def test_create_app_refuses_bad_limits() -> None:
    from whetstone.engine.server import create_app

    with pytest.raises(ConfigError, match="max_queue"):
        create_app(ScriptedBackend(), max_queue=-1)
    with pytest.raises(ConfigError, match="max_body_bytes"):
        create_app(ScriptedBackend(), max_body_bytes=0)


# --- the retrieval threads -------------------------------------------------------------------


class _SlowEndpoints:
    """One endpoint, ``check``, that waits for ``release``."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def names(self) -> list[str]:
        return ["check"]

    def report(self, name: str, question: str, answer: str) -> dict[str, Any]:
        self.release.wait(10)
        return {"question": question}


async def test_a_slow_endpoint_does_not_hold_up_retrieval() -> None:
    """One retrieval thread and an endpoint that takes its time: a request adapted meanwhile
    does not wait for it."""
    from whetstone.engine.server.pipeline import ChatPipeline

    endpoints = _SlowEndpoints()
    release = endpoints.release
    pipe = ChatPipeline(ChatAdapter([], ScriptedBackend()), None, Metrics(), workers=1,
                        endpoints=endpoints)
    checking = asyncio.create_task(pipe.call_endpoints(("check",), "q", "a"))
    await asyncio.sleep(0.05)  # the endpoint now holds a thread
    request = Request(messages=(Message(role="user", content="hello"),))
    adapted = await asyncio.wait_for(pipe.adapt(request, ChatSwitches()), timeout=5)
    assert adapted.applied and not checking.done()
    release.set()
    assert (await checking) == {"check": {"question": "q"}}
    await pipe.stop()
