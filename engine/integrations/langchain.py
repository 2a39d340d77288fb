"""LangChain and LangGraph: a Whetstone library in front of any LangChain chat model.

    from whetstone.engine.integrations.langchain import WhetstoneChatModel

    model = WhetstoneChatModel(inner=ChatOpenAI(model="qwen", base_url=...), library="lib")
    reply = model.invoke("How many minutes are 2.5 hours?")
    model.feedback(reply.response_metadata["whetstone_trace_id"], 1.0)

Each call does what chat mode does (``Engine.chat``, ``Engine.wrap``, the server): the
library's guidance (the skills retrieved for the conversation, the methods' notes) appended to
the first system message, memory demonstrations put before the conversation as earlier turns,
then the inner model's reply, stored as a chat trace (``meta.client == "langchain"``) whose id
is in the reply's ``response_metadata``. ``bind_tools``, streaming and async pass through to
the inner model; the model works as an agent's model (a ``ToolNode`` loop, LangChain's
agents) and, through ``whetstone_node``, as a node of a ``StateGraph``; the calls of one
agent run are one trace (``langchain_runs``). ``library_tools_for_langchain`` gives the
library's learned tools as LangChain tools that run in the sandbox (``langchain_tools.py``).

langchain-core is imported only by this package's LangChain modules: ``import engine`` never
loads it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    convert_to_messages,
    convert_to_openai_messages,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableBinding
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, PrivateAttr

from ...library_store.store import Library
from ...library_store.trace_build import new_trace_id
from ..api import Engine
from ..backends.base import Backend, Capabilities
from ..chat.adapter import Adapted, ChatAdapter, ChatSwitches, chat_query
from ..chat.exchange import chat_trace
from ..errors import ConfigError
from ..runtime.skills_plugin import SkillsPlugin
from ..types import Completion, Message, Request, ToolCall
from .langchain_runs import TRACE_KEY, RunLink, link_of, run_trace
from .langchain_tools import library_tools_for_langchain

if TYPE_CHECKING:
    from ..types import Trace

log = logging.getLogger("whetstone.langchain")

VERSION_KEY = "whetstone_library_version"
SKILLS_KEY = "whetstone_skills"
# The inner model runs with its own callbacks only: inheriting the caller's (LangChain passes
# them down through a context variable), a stream handler such as LangGraph's "messages" mode
# would get every token twice, once from the inner run and once from this model's.
OWN_CALLBACKS: Any = {"callbacks": []}
# Plugin hooks that act only inside the agent loop (a node, a model wrapper, a whole-task
# wrapper, per-run budgets, tools of its own): a chat model has one call and no loop.

# --- messages both ways -----------------------------------------------------------------------

def to_whetstone(messages: Sequence[BaseMessage]) -> tuple[Message, ...]:
    """LangChain messages as Whetstone ``Message``s (through the OpenAI format both speak)."""
    out = []
    for d in convert_to_openai_messages(list(messages)):
        role = "system" if d.get("role") == "developer" else d.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise ConfigError(f"a {role!r} message cannot be sent through Whetstone",
                              hint="use system, human, ai and tool messages")
        out.append(Message.from_dict({**d, "role": role}))
    return tuple(out)


def with_guidance(messages: Sequence[BaseMessage], adapted: Adapted) -> list[BaseMessage]:
    """``messages`` with the guidance appended to the first system message (or a new one
    first) and the demonstration turns after the leading system messages, as
    ``inject_guidance`` and ``inject_turns`` do; every other message is passed on as is."""
    out = list(messages)
    text = adapted.guidance
    if text:
        at = next((i for i, m in enumerate(out) if isinstance(m, SystemMessage)), None)
        if at is None:
            out.insert(0, SystemMessage(text))
        else:
            old = out[at].content
            content: Any = ((old.rstrip() + "\n\n" + text) if old.strip() else text) \
                if isinstance(old, str) else [*old, {"type": "text", "text": "\n\n" + text}]
            out[at] = out[at].model_copy(update={"content": content})
    if adapted.turns:
        at = next((i for i, m in enumerate(out) if not isinstance(m, SystemMessage)), len(out))
        out[at:at] = [HumanMessage(t["content"]) if t["role"] == "user" else AIMessage(t["content"])
                      for t in adapted.turns]
    return out


def completion_of(message: BaseMessage, latency_s: float, model: str) -> Completion:
    """The ``Completion`` a trace keeps of a LangChain reply: text, tool calls (a malformed
    one with its raw arguments), usage and finish reason when the provider gave them."""
    calls = [ToolCall(name=c["name"], arguments=json.dumps(c.get("args") or {}),
                      id=c.get("id") or f"call_{i}")
             for i, c in enumerate(getattr(message, "tool_calls", None) or ())]
    calls += [ToolCall(name=str(c.get("name") or ""), arguments=str(c.get("args") or ""),
                       id=c.get("id") or f"invalid_{i}")
              for i, c in enumerate(getattr(message, "invalid_tool_calls", None) or ())]
    usage = getattr(message, "usage_metadata", None) or {}
    meta = message.response_metadata or {}
    finish = meta.get("finish_reason") or meta.get("stop_reason") or \
        ("tool_calls" if calls else "stop")
    return Completion(text=str(message.text), finish_reason=str(finish),
                      prompt_tokens=int(usage.get("input_tokens") or 0),
                      completion_tokens=int(usage.get("output_tokens") or 0),
                      latency_s=latency_s, tool_calls=tuple(calls),
                      model=str(meta.get("model_name") or meta.get("model") or model))


def model_name(inner: Any) -> str:
    """The inner model's name for traces: ``langchain:<model>`` (its class when unnamed)."""
    base = inner.bound if isinstance(inner, RunnableBinding) else inner
    name = next((getattr(base, a) for a in ("model_name", "model", "model_id")
                 if isinstance(getattr(base, a, None), str) and getattr(base, a)),
                type(base).__name__)
    return f"langchain:{name}"


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"


class LangChainBackend(Backend):
    """A LangChain chat model as a Whetstone ``Backend``: the engine a ``WhetstoneChatModel``
    builds over a library path counts tokens with it (an estimate), and ``engine.chat`` or
    ``engine.run`` reach the inner model through ``complete``."""

    capabilities = Capabilities(tool_calls=True)

    def __init__(self, inner: Runnable[Any, Any]) -> None:
        self.inner = inner
        self.spec = model_name(inner)

    def complete(self, request: Request) -> Completion:
        start = time.perf_counter()
        model: Runnable[Any, Any] = self.inner
        if request.tools:
            model = model.bind_tools(list(request.tools))  # type: ignore[attr-defined]
        reply = model.invoke(convert_to_messages([m.to_dict() for m in request.messages]),
                             stop=list(request.stop) if request.stop else None)
        return completion_of(reply, time.perf_counter() - start, self.spec)


# --- one call -----------------------------------------------------------------------------------

@dataclass
class _Exchange:
    """One call: what the inner model is sent, the adaptation, the trace id to record under
    (its run's: ``langchain_runs``), where the call stands in its run, and LangChain's ids."""

    messages: list[BaseMessage]
    adapted: Adapted
    trace_id: str | None
    started: float
    clock: float
    link: RunLink = dataclasses.field(default_factory=RunLink)
    langchain: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _langchain_facts(run_manager: Any) -> dict[str, Any]:
    """LangChain's run id of this call and LangGraph's thread id, when there are."""
    if run_manager is None:
        return {}
    thread = (getattr(run_manager, "metadata", None) or {}).get("thread_id")
    return {"run_ids": [str(run_manager.run_id)],
            **({"thread_id": str(thread)} if thread is not None else {})}


def _open_engine(inner: Runnable[Any, Any], library: Any, *, methods: Sequence[Any],
                 version: str | None, skills: bool) -> tuple[Engine, bool]:
    """The engine a chat model reads its library through, and whether it built it."""
    if isinstance(library, Engine):
        if methods or version is not None or not skills:
            raise ConfigError("methods, version and skills are set on the Engine given as "
                              "library, not beside it",
                              hint="Engine(model, library=..., methods=[...], version=...)")
        return library, False
    if isinstance(library, Library):
        library = library.root
    if library is not None and not isinstance(library, (str, Path)):
        raise ConfigError(f"library must be a folder, a Library or an Engine, got "
                          f"{type(library).__name__}", hint='library="path/to/library"')
    return Engine(LangChainBackend(inner), library=library, methods=methods, version=version,
                  skills=skills, checkpointing=False), True


def check_chat_methods(engine: Engine) -> None:
    """``ConfigError`` for a runtime method that needs the agent loop (``Engine``'s own
    check: a chat model, like chat mode, applies only the methods' guidance)."""
    engine.check_chat_methods()


class WhetstoneChatModel(BaseChatModel):
    """A LangChain chat model that puts a Whetstone library in front of ``inner``.

    ``inner``: any LangChain chat model (or one with arguments bound). ``library``: a library
    folder, a ``Library``, or an ``Engine`` (its adapter, methods and pinned version are used;
    default: ``$WHETSTONE_HOME/library``). ``methods``: runtime methods that add guidance
    (by name, with options as ``(name, {...})``); one that needs the agent loop is
    a ``ConfigError``. ``version`` pins a library version; ``skills=False`` leaves the skills
    out; ``record=False`` stores no traces; ``budget_tokens`` bounds the guidance. Per call,
    ``model.bind(whetstone={"library": False, "record": False, "budget_tokens": 400})`` does
    what the server's ``extra_body`` switches do.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: Any
    library: Any = None
    methods: tuple[Any, ...] = ()
    version: str | None = None
    skills: bool = True
    record: bool = True
    budget_tokens: int | None = None

    _engine: Engine = PrivateAttr()
    _own_engine: bool = PrivateAttr(default=False)
    _runs_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        base = self.inner.bound if isinstance(self.inner, RunnableBinding) else self.inner
        if not isinstance(base, BaseChatModel):
            raise ConfigError(f"inner must be a LangChain chat model, got {type(base).__name__}",
                              hint="e.g. WhetstoneChatModel(inner=ChatOpenAI(...), "
                                   "library='lib')")
        ChatSwitches.from_body({} if self.budget_tokens is None
                               else {"budget_tokens": self.budget_tokens})
        self._engine, self._own_engine = _open_engine(
            self.inner, self.library, methods=self.methods, version=self.version,
            skills=self.skills)
        try:
            check_chat_methods(self._engine)
        except ConfigError:
            self.close()
            raise

    @property
    def _llm_type(self) -> str:
        return "whetstone"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"inner": model_name(self.inner), "library": str(self._engine.library_path),
                "version": self.version}

    @property
    def engine(self) -> Engine:
        """The engine the library is read through (its ``traces`` hold the exchanges)."""
        return self._engine

    # -- tools ---------------------------------------------------------------------------------

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any
                   ) -> Runnable[Any, AIMessage]:
        """Tools for the inner model (an agent binds its tools here): kept in
        OpenAI form, bound on the inner model per call and listed in the trace."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return super().bind(tools=formatted, **kwargs)

    def library_tools(self) -> list[Any]:
        """The library's learned tools as LangChain tools (sandboxed), at the version read."""
        return library_tools_for_langchain(self._engine)

    # -- one exchange --------------------------------------------------------------------------

    def _switches(self, value: Any) -> ChatSwitches:
        """This model's defaults, overridden by a call's ``whetstone`` switches."""
        given = ChatSwitches.from_body(value)
        if given.endpoints:  # refused, not ignored: the caller would think they were called
            raise ConfigError("'whetstone.endpoints' are answered by the Whetstone server, "
                              "not by a chat model",
                              hint="call them with model.engine.endpoint(name, question=..., "
                                   "answer=...)")
        value = value or {}
        return dataclasses.replace(given, record=value.get("record", self.record),
                                   budget_tokens=value.get("budget_tokens", self.budget_tokens))

    def _adapter(self, tools: Sequence[Mapping[str, Any]]) -> ChatAdapter:
        """The chat adapter for a call: the one whose guidance may say when to call the
        library's learned tools when the call binds every one of them
        (``library_tools_for_langchain``), else the one that leaves their lines out."""
        plain = self._engine.chat_adapter()
        if not tools:
            return plain
        bound = {str((t.get("function") or {}).get("name")) for t in tools}
        learned = {d.name for p in plain.plugins if isinstance(p, SkillsPlugin)
                   for d in p.learned_tools_report().definitions}
        return self._engine.chat_adapter(offers_tools=True) if learned and learned <= bound \
            else plain

    def _begin(self, messages: Sequence[BaseMessage], kwargs: dict[str, Any],
               run_manager: Any = None) -> tuple[_Exchange, Runnable[Any, Any], dict[str, Any]]:
        """Adapt the conversation (blocking: retrieval embeds the query); the exchange, the
        inner model with this call's tools bound, and the arguments left for it."""
        started, clock = time.time(), time.perf_counter()
        kwargs = dict(kwargs)
        switches = self._switches(kwargs.pop("whetstone", None))
        tools = kwargs.pop("tools", None) or []
        bind = {"tool_choice": kwargs.pop("tool_choice")} if "tool_choice" in kwargs else {}
        request = Request(messages=to_whetstone(messages), tools=tuple(tools))
        adapted = Adapted(request, query=chat_query(request.messages))
        if switches.library:
            try:
                adapted = self._adapter(tools).adapt(request, switches)
            except Exception as exc:  # noqa: BLE001 - the app's call matters more than guidance
                # As the server and Engine.wrap do: send it unadapted, and say so in the trace.
                log.warning("library retrieval failed; sending the request without it: %s",
                            _error_text(exc))
                adapted = dataclasses.replace(adapted, meta={"library_error": _error_text(exc)})
        inner: Runnable[Any, Any] = self.inner
        if tools:
            try:
                inner = inner.bind_tools(tools, **bind)  # type: ignore[attr-defined]
            except NotImplementedError as exc:
                raise ConfigError(f"{model_name(self.inner)} cannot bind tools",
                                  hint="wrap a chat model that implements bind_tools") from exc
        link = link_of(messages)
        trace_id = (link.continues or new_trace_id(started)) if switches.record else None
        return _Exchange(with_guidance(messages, adapted), adapted, trace_id, started,
                         clock, link, _langchain_facts(run_manager)), inner, kwargs

    def _trace(self, ex: _Exchange, reply: BaseMessage | None, failure: str | None, *,
               outcome: Any = None, **meta: Any) -> Trace | None:
        if ex.trace_id is None:
            return None
        completion = None if reply is None else completion_of(
            reply, time.perf_counter() - ex.clock, model_name(self.inner))
        return chat_trace(ex.trace_id, ex.adapted, model=model_name(self.inner),
                          started=ex.started, completion=completion, error=failure,
                          outcome=outcome, meta={"client": "langchain", **meta})

    def _write(self, ex: _Exchange, trace: Trace | None) -> bool:
        """Store this call in its run's trace (``langchain_runs.run_trace``); False (logged)
        when the store cannot be written: the model's reply is returned all the same."""
        if trace is None:
            return True
        with self._runs_lock:  # two calls of one run must not both extend the same version
            prior = self._engine.traces.find(ex.link.continues) if ex.link.continues else None
            return self._engine.traces.record(run_trace(trace, prior, ex.link, ex.langchain))

    @staticmethod
    def _facts(ex: _Exchange) -> dict[str, Any]:
        return {TRACE_KEY: ex.trace_id, VERSION_KEY: ex.adapted.library_version,
                SKILLS_KEY: ex.adapted.skills_shown}

    def _tagged(self, reply: Any, ex: _Exchange) -> AIMessage:
        if not isinstance(reply, AIMessage):
            raise ConfigError(f"{model_name(self.inner)} returned {type(reply).__name__}, "
                              "not an AIMessage", hint="wrap a LangChain chat model")
        return reply.model_copy(update={"response_metadata": {**reply.response_metadata,
                                                              **self._facts(ex)}})

    def _stored(self, tagged: AIMessage, ex: _Exchange) -> AIMessage:
        """Record the exchange; a reply whose trace could not be stored carries no trace id."""
        if self._write(ex, self._trace(ex, tagged, None)):
            return tagged
        meta = {**tagged.response_metadata, TRACE_KEY: None}
        return tagged.model_copy(update={"response_metadata": meta})

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any
                  ) -> ChatResult:
        ex, inner, kwargs = self._begin(messages, kwargs, run_manager)
        try:
            reply = inner.invoke(ex.messages, OWN_CALLBACKS, stop=stop, **kwargs)
        except Exception as exc:
            self._write(ex, self._trace(ex, None, _error_text(exc)))
            raise
        tagged = self._stored(self._tagged(reply, ex), ex)
        return ChatResult(generations=[ChatGeneration(message=tagged)])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        ex, inner, kwargs = await asyncio.to_thread(self._begin, messages, kwargs, run_manager)
        try:
            reply = await inner.ainvoke(ex.messages, OWN_CALLBACKS, stop=stop, **kwargs)
        except Exception as exc:
            await asyncio.to_thread(self._write, ex, self._trace(ex, None, _error_text(exc)))
            raise
        tagged = await asyncio.to_thread(self._stored, self._tagged(reply, ex), ex)
        return ChatResult(generations=[ChatGeneration(message=tagged)])

    # -- streams -------------------------------------------------------------------------------

    def _stream_trace(self, ex: _Exchange, acc: AIMessageChunk | None, done: bool,
                      failure: str | None) -> Trace | None:
        """The trace of a stream that ended, failed, or was closed by its reader."""
        whole = None if acc is None else acc + AIMessageChunk(
            content="" if isinstance(acc.content, str) else [], chunk_position="last")
        if done:
            return self._trace(ex, whole or AIMessage(""), None, stream=True)
        partial = str(whole.text) if whole is not None else ""
        if failure is not None:
            return self._trace(ex, None, failure, stream=True, partial=partial)
        return self._trace(ex, None, "the stream was closed before it ended",
                           outcome="interrupted", stream=True, partial=partial)

    def _last_chunk(self, ex: _Exchange, acc: AIMessageChunk | None) -> ChatGenerationChunk:
        # The facts ride on a last, empty chunk: merged, the reply carries them.
        empty: Any = "" if acc is None or isinstance(acc.content, str) else []
        return ChatGenerationChunk(message=AIMessageChunk(
            content=empty, chunk_position="last", response_metadata=self._facts(ex)))

    @staticmethod
    def _chunk(chunk: Any) -> AIMessageChunk:
        if not isinstance(chunk, AIMessageChunk):
            raise ConfigError(f"the inner model streamed {type(chunk).__name__}, not "
                              "AIMessageChunk", hint="wrap a LangChain chat model")
        # Only the last chunk this model yields closes the stream.
        return chunk.model_copy(update={"chunk_position": None}) if chunk.chunk_position \
            else chunk

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any
                ) -> Iterator[ChatGenerationChunk]:
        ex, inner, kwargs = self._begin(messages, kwargs, run_manager)
        acc: AIMessageChunk | None = None
        done, failure = False, None
        try:
            for piece in inner.stream(ex.messages, OWN_CALLBACKS, stop=stop, **kwargs):
                chunk = self._chunk(piece)
                acc = chunk if acc is None else acc + chunk
                yield ChatGenerationChunk(message=chunk)
            done = True
        except Exception as exc:
            failure = _error_text(exc)
            raise
        finally:
            self._write(ex, self._stream_trace(ex, acc, done, failure))
        yield self._last_chunk(ex, acc)

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        ex, inner, kwargs = await asyncio.to_thread(self._begin, messages, kwargs, run_manager)
        acc: AIMessageChunk | None = None
        done, failure = False, None
        try:
            async for piece in inner.astream(ex.messages, OWN_CALLBACKS, stop=stop,
                                             **kwargs):
                chunk = self._chunk(piece)
                acc = chunk if acc is None else acc + chunk
                yield ChatGenerationChunk(message=chunk)
            done = True
        except Exception as exc:
            failure = _error_text(exc)
            raise
        finally:
            await asyncio.to_thread(self._write, ex, self._stream_trace(ex, acc, done, failure))
        yield self._last_chunk(ex, acc)

    # -- feedback ------------------------------------------------------------------------------

    def feedback(self, trace_id: str, score: float, comment: str | None = None) -> Trace:
        """Label an exchange (``reply.response_metadata["whetstone_trace_id"]``): ``score``
        from 0 (bad) to 1 (good), checked as the server's ``/v1/feedback`` checks it."""
        return self._engine.feedback(trace_id, score, comment)

    async def afeedback(self, trace_id: str, score: float, comment: str | None = None
                        ) -> Trace:
        return await asyncio.to_thread(self.feedback, trace_id, score, comment)

    def close(self) -> None:
        """Close the engine this model built (a given ``Engine`` stays open)."""
        if self._own_engine:
            self._engine.close()
            self._own_engine = False


def trace_id_of(message: BaseMessage) -> str | None:
    """The trace id of a reply a ``WhetstoneChatModel`` gave (None: not recorded)."""
    value = (message.response_metadata or {}).get(TRACE_KEY)
    return value if isinstance(value, str) else None


def whetstone_node(model: BaseChatModel, *, library: Any = None, tools: Sequence[Any] = (),
                   messages_key: str = "messages") -> Runnable[Any, dict[str, list[Any]]]:
    """A LangGraph node for a ``StateGraph`` over ``MessagesState``: it answers the state's
    messages with ``model`` (a ``WhetstoneChatModel``, or any chat model wrapped over
    ``library``), ``tools`` bound, and returns ``{"messages": [reply]}``. Sync and async."""
    from langchain_core.runnables import RunnableConfig, RunnableLambda  # heavy: langchain-core

    if not isinstance(model, WhetstoneChatModel):
        if library is None:
            raise ConfigError("whetstone_node needs a WhetstoneChatModel or a library to wrap "
                              f"{type(model).__name__} over",
                              hint='whetstone_node(ChatOpenAI(...), library="lib")')
        model = WhetstoneChatModel(inner=model, library=library)
    bound: Runnable[Any, Any] = model.bind_tools(list(tools)) if tools else model

    def read(state: Any) -> list[Any]:
        messages = state.get(messages_key) if isinstance(state, Mapping) \
            else getattr(state, messages_key, None)
        if messages is None:
            raise ConfigError(f"the graph state has no {messages_key!r}",
                              hint="use MessagesState, or name the key: messages_key=...")
        return list(messages)

    def node(state: Any, config: RunnableConfig) -> dict[str, list[Any]]:
        return {messages_key: [bound.invoke(read(state), config)]}

    async def anode(state: Any, config: RunnableConfig) -> dict[str, list[Any]]:
        return {messages_key: [await bound.ainvoke(read(state), config)]}

    return RunnableLambda(node, afunc=anode, name="whetstone")


__all__ = ["LangChainBackend", "WhetstoneChatModel", "check_chat_methods", "completion_of",
           "library_tools_for_langchain", "to_whetstone", "trace_id_of", "whetstone_node",
           "with_guidance"]
