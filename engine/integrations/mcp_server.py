"""What ``whetstone mcp`` serves, without the protocol: a library's skills as files by version,
skill search, the runtime's guidance for a task, the learned tools, and trace writes.

``LibraryServer`` reads everything through the library's own API (``Engine``, ``Snapshot``):
the skills method's retriever for ``search_skills`` (its ``min_score`` floor included), the chat
adapter for the guidance (what ``Engine.chat`` and ``whetstone serve`` inject), the skills
method's learned tools (run only in the sandbox, ``whetstone.tools.learned_run``), the server's
``TraceWriter.label`` for feedback and the trace store for new runs. ``mcp_app`` puts it on the
MCP SDK; this module never imports the SDK.

URIs: ``whetstone://skills/<name>/<file>`` reads the version the server follows (the current
one, re-read as the library moves); ``whetstone://v<N>/skills/<name>/<file>`` reads version N.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

from ...library_store.trace_build import make_trace
from ...tools.base import ToolResult
from ..backends.base import Backend, Capabilities
from ..errors import ConfigError, NotFound, WhetstoneError
from ..prompts import load_prompt
from ..server.metrics import Metrics
from ..types import Completion, Message, Request, Step

if TYPE_CHECKING:
    from ...library_store.store import Snapshot
    from ...tools.base import Tool
    from ...tools.learned import ToolDefinition
    from ..api import Engine
    from ..runtime.skills_plugin import SkillsPlugin
    from ..server.recording import TraceWriter

SCHEME = "whetstone"
SKILLS = "skills"
SKILL_FILE = "SKILL.md"
# The server's own tools; a learned tool of the same name is not offered (its skill still is).
SEARCH_TOOL = "search_skills"
WRITE_TOOLS = ("record_feedback", "log_run")
OWN_TOOLS = (SEARCH_TOOL, *WRITE_TOOLS)
MAX_QUERY_CHARS = 2_000  # what the chat adapter retrieves for, at most (chat_query)
MAX_K = 50
MAX_TASK_CHARS = 100_000
MAX_STEPS = 500
MAX_TRACE_ID_CHARS = 128
_TRACE_ID = re.compile(r"[A-Za-z0-9_.:-]+")
_VERSION = re.compile(r"v[1-9][0-9]{0,8}")
_MIME = {".md": "text/markdown", ".py": "text/x-python", ".json": "application/json",
         ".yaml": "application/yaml", ".yml": "application/yaml", ".txt": "text/plain",
         ".csv": "text/csv", ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}


class LibraryOnly(Backend):
    """The backend of an MCP server: it generates nothing (the MCP client's own model answers)
    and counts the guidance budget with the base estimate, four characters a token."""

    spec = "none"
    capabilities = Capabilities()

    def complete(self, request: Request) -> Completion:
        raise ConfigError("whetstone mcp serves a library to an MCP client and calls no model",
                          hint="the client's own model answers; use `whetstone serve` or "
                               "`whetstone run` to have Whetstone call one")


@dataclass(frozen=True)
class SkillFile:
    """One file of a skill as a resource."""

    uri: str
    name: str  # <skill>/<file>
    mime_type: str
    size: int
    description: str | None = None


@dataclass(frozen=True)
class FileContent:
    """A resource read: text when the file is UTF-8, else bytes."""

    uri: str
    mime_type: str
    text: str | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class LearnedTool:
    """A learned tool as an MCP client sees it: its JSON schema with the task parameters the
    runtime would fill (``Annotated[str, "task"]``) asked of the client instead."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    skill: str
    returns_answer: bool = False


@dataclass(frozen=True)
class ToolRun:
    """A learned tool's call: what the model would see, and how the sandbox ran it."""

    text: str
    ok: bool
    structured: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PromptText:
    """The guidance prompt: a description and (role, text) messages."""

    description: str
    messages: tuple[tuple[str, str], ...]


def skill_uri(name: str, rel: str, version: str | None = None) -> str:
    """``whetstone://[vN/]skills/<name>/<file>`` (each segment percent-encoded)."""
    path = "/".join(quote(s, safe="") for s in (name, *rel.split("/")))
    return f"{SCHEME}://{version}/{SKILLS}/{path}" if version else f"{SCHEME}://{SKILLS}/{path}"


def parse_uri(uri: str) -> tuple[str | None, str, str]:
    """(version or None, skill name, file) of a skill URI; ``NotFound`` saying the forms."""
    forms = (f"{SCHEME}://{SKILLS}/<name>/<file> or {SCHEME}://v<N>/{SKILLS}/<name>/<file>, "
             f"e.g. {SCHEME}://{SKILLS}/<name>/{SKILL_FILE}")
    parts = urlsplit(uri)
    if parts.scheme != SCHEME or parts.query or parts.fragment:
        raise NotFound(f"{uri!r} is not a skill resource of this server", hint=forms)
    segments = [unquote(s) for s in [parts.netloc, *parts.path.split("/")[1:]]]
    version = None
    if segments and _VERSION.fullmatch(segments[0]):
        version, segments = segments[0], segments[1:]
    if segments and segments[-1] == "":
        segments = segments[:-1]  # a trailing slash
    if len(segments) < 2 or segments[0] != SKILLS or any(
            s in ("", ".", "..") or "/" in s for s in segments[1:]):
        raise NotFound(f"{uri!r} is not a skill resource of this server", hint=forms)
    return version, segments[1], "/".join(segments[2:]) or SKILL_FILE


def mime_of(rel: str) -> str:
    return _MIME.get(Path(rel).suffix.lower(), "text/plain")


def owner_tag(owner: str | None) -> dict[str, str]:
    """The trace meta that ties a run to the API key it was logged with (``serve``'s field)."""
    # lazy: loads filelock and 14 more of our modules
    from ..server.recording import OWNER_KEY

    return {OWNER_KEY: owner} if owner is not None else {}


class LibraryServer:
    """The library behind ``whetstone mcp``. ``allow_writes``: ``record_feedback`` and
    ``log_run`` exist (otherwise they are neither listed nor run)."""

    def __init__(self, engine: Engine, *, allow_writes: bool = False) -> None:
        # lazy: loads filelock and 35 more of our modules
        from ..runtime.skills_plugin import SkillsPlugin
        from ..server.recording import TraceWriter

        self.engine = engine
        self.allow_writes = allow_writes
        # The learned tools are this server's own tools: the guidance may say when to call
        # them (a chat completion's may not).
        self.adapter = engine.chat_adapter(offers_tools=True)
        found = [p for p in self.adapter.plugins if isinstance(p, SkillsPlugin)]
        if not found:
            raise ConfigError("the MCP server needs the skills method",
                              hint="build its Engine with skills=True")
        self.skills: SkillsPlugin = found[0]
        self.writer: TraceWriter = TraceWriter(engine.traces, Metrics())

    @classmethod
    def open(cls, library: Path | None, *, allow_writes: bool = False,
             skills: Mapping[str, Any] | None = None, version: str | None = None,
             otel: Any = None) -> LibraryServer:
        """The server for the library at ``library`` (default: ``$WHETSTONE_HOME/library``);
        ``skills``: the skills method's options (``SkillsConfig``); ``version``: pin one;
        ``otel``: ``Engine``'s (the runs it logs and their feedback as spans)."""
        # lazy: loads filelock, numpy and 82 more of our modules
        from ..api import Engine

        engine = Engine(LibraryOnly(), library=library, version=version, checkpointing=False,
                        methods=[("skills", dict(skills or {}))], tools=(), otel=otel)
        return cls(engine, allow_writes=allow_writes)

    def close(self) -> None:
        self.engine.close()

    # -- versions and files ---------------------------------------------------------------

    def snapshot(self, version: str | None = None) -> Snapshot:
        """The version the server follows (pinned, or the current one), or ``version``."""
        return self.skills.snapshot() if version is None else \
            self.engine.library.snapshot(version)

    def version(self) -> str:
        return self.snapshot().id

    def files(self) -> list[SkillFile]:
        """Every file of every skill in the version the server follows."""
        # lazy: loads filelock, yaml and 21 more of our modules
        from ...skills.loader import skill_names

        snap = self.snapshot()
        out: list[SkillFile] = []
        for name in skill_names(snap):
            prefix = f"{SKILLS}/{name}/"
            for path in sorted(snap.unit(f"{SKILLS}/{name}")):
                rel = path[len(prefix):]
                out.append(SkillFile(uri=skill_uri(name, rel), name=f"{name}/{rel}",
                                     mime_type=mime_of(rel), size=self._size(snap, path),
                                     description=self._description(snap, name)
                                     if rel == SKILL_FILE else None))
        return out

    @staticmethod
    def _size(snap: Snapshot, path: str) -> int:
        return len(snap.read_bytes(path))

    @staticmethod
    def _description(snap: Snapshot, name: str) -> str | None:
        # lazy: loads yaml and 4 more of our modules
        from ...skills.format import parse_skill_md

        path = f"{SKILLS}/{name}/{SKILL_FILE}"
        parsed = parse_skill_md(snap.read_text(path), path=path, folder=name)
        return parsed.skill.description if parsed.skill is not None else None

    def read(self, uri: str) -> FileContent:
        """One skill file by URI; ``NotFound`` listing the skills or the skill's files."""
        # lazy: loads filelock, yaml and 21 more of our modules
        from ...skills.loader import skill_names

        version, name, rel = parse_uri(uri)
        snap = self.snapshot(version)
        prefix = f"{SKILLS}/{name}/"
        unit = snap.unit(f"{SKILLS}/{name}")
        if not unit:
            known = skill_names(snap)
            raise NotFound(f"no skill named {name!r} in library version {snap.id}",
                           hint=f"skills: {', '.join(known) if known else 'none'}")
        if prefix + rel not in unit:
            files = sorted(p[len(prefix):] for p in unit)
            raise NotFound(f"skill {name!r} has no file {rel!r} in library version {snap.id}",
                           hint=f"its files: {', '.join(files)}")
        data = snap.read_bytes(prefix + rel)
        try:
            return FileContent(uri, mime_of(rel), text=data.decode("utf-8"))
        except UnicodeDecodeError:
            return FileContent(uri, "application/octet-stream" if mime_of(rel).startswith(
                "text/") else mime_of(rel), data=data)

    # -- search and guidance --------------------------------------------------------------

    def search(self, query: Any, k: Any = None) -> dict[str, Any]:
        """The skills that fit ``query``: the runtime's retrieval, with its score floor."""
        if not isinstance(query, str) or not query.strip():
            raise ConfigError("search_skills needs a 'query': the task, in words")
        cfg = self.skills.config
        k = cfg.k if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ConfigError(f"'k' must be a whole number from 1 to {MAX_K}, got {k!r}")
        snap = self.snapshot()
        matches = self.skills.retriever.search(query.strip()[-MAX_QUERY_CHARS:], snapshot=snap,
                                               k=k) if snap.has(f"{SKILLS}/") else []
        return {"version": snap.id, "min_score": cfg.min_score,
                "skills": [{"name": m.name, "description": m.description,
                            "score": round(m.score, 4),
                            **({"example_score": round(m.example, 4)}
                               if m.example is not None else {}),
                            "uri": skill_uri(m.name, SKILL_FILE, snap.id)} for m in matches]}

    def guidance(self, task: Any) -> PromptText:
        """What the runtime's chat path would send for ``task``: the library's guidance (as
        a system message there; MCP prompts have only user and assistant turns), the worked
        examples as turns when the skills method shows them so, then the task."""
        if not isinstance(task, str) or not task.strip():
            raise ConfigError("the guidance prompt needs a 'task': the question to answer")
        adapted = self.adapter.adapt(Request(messages=(Message(role="user", content=task),)))
        messages = tuple(("assistant" if m.role == "assistant" else "user", m.text)
                         for m in adapted.request.messages)
        shown = adapted.skills_shown
        floor = self.skills.config.min_score
        what = (f"skills shown: {', '.join(shown)}" if shown else
                "no skill fits this task" + (f" (none scores {floor:g} or more)"
                                             if floor is not None else ""))
        return PromptText(f"Library version {adapted.library_version}; {what}.", messages)

    # -- learned tools --------------------------------------------------------------------

    def learned_tools(self) -> dict[str, tuple[Tool, ToolDefinition]]:
        """Name -> (the runtime's sandboxed ``Tool``, its definition), for the version the
        server follows; none when the skills method's ``learned_tools`` is off."""
        if not self.skills.config.learned_tools:
            return {}
        tools = {t.name: t for t in self.skills.tools()}
        return {d.name: (tools[d.name], d)
                for d in self.skills.learned_tools_report().definitions
                if d.name in tools and d.name not in OWN_TOOLS}

    def tool_list(self) -> list[LearnedTool]:
        task_note = load_prompt("mcp.yaml#task_param")
        out = []
        for tool, d in self.learned_tools().values():
            schema = dict(tool.spec.parameters)
            props = dict(schema.get("properties") or {})
            injected = [p for p, source in tool.spec.inject.items() if source == "task"]
            for p in injected:
                props[p] = {"type": "string", "description": task_note}
            schema["properties"] = props
            if injected:
                schema["required"] = [*injected, *(schema.get("required") or [])]
            out.append(LearnedTool(tool.name, tool.spec.description, schema, d.skill,
                                   tool.spec.returns_answer))
        return out

    def run_tool(self, name: str, arguments: Mapping[str, Any]) -> ToolRun:
        """Call a learned tool in the sandbox; a bad argument or a failure in the tool is a
        failed run (the observation the agent would see), never an exception."""
        tools = self.learned_tools()
        if name not in tools:
            raise NotFound(f"no tool named {name!r}",
                           hint=f"tools: {', '.join([SEARCH_TOOL, *tools]) or 'none'}")
        tool = tools[name][0]
        try:
            result = tool.fn(dict(arguments))
        except WhetstoneError as exc:
            result = ToolResult("", exc.message if not exc.hint else f"{exc.message} "
                                                                  f"({exc.hint})")
        if isinstance(result, str):
            result = ToolResult(result)
        sandbox = dict(result.metadata.get("sandbox") or {})
        structured: dict[str, Any] = {
            "output": result.output, "error": result.error,
            "isolation": sandbox.get("isolation"), "sandbox": sandbox,
            "duration_s": round(result.duration_s, 4), "timed_out": result.timed_out}
        if result.metadata.get("images"):
            structured["images"] = list(result.metadata["images"])
        return ToolRun(result.observation(name), result.ok, structured)

    # -- writes ---------------------------------------------------------------------------

    def check_writes(self, tool: str) -> None:
        """``ConfigError`` when this server is read-only."""
        if not self.allow_writes:
            raise ConfigError(f"{tool} writes to the library's traces and this server is "
                              "read-only", hint="start it with `whetstone mcp --allow-writes`")

    async def record_feedback(self, trace_id: Any, score: Any, comment: Any = None, *,
                              owner: str | None = None) -> dict[str, Any]:
        """Label a trace through the server's feedback path (``TraceWriter.label``): on a
        server with API keys only the key a trace was recorded with may label it."""
        # lazy: loads filelock, numpy and 37 more of our modules
        from ..chat.exchange import check_feedback

        self.check_writes("record_feedback")
        if not isinstance(trace_id, str) or not trace_id.strip():
            raise ConfigError("record_feedback needs a 'trace_id' (log_run returns one)")
        trace_id = trace_id.strip()
        if len(trace_id) > MAX_TRACE_ID_CHARS or not _TRACE_ID.fullmatch(trace_id):
            raise ConfigError(f"'trace_id' is not a trace id: at most {MAX_TRACE_ID_CHARS} "
                              "letters, digits and '-_.:'", hint="use the id log_run returned")
        score, comment = check_feedback(score, comment)
        try:
            trace = await self.writer.label(trace_id, score, comment, owner=owner)
        except NotFound as exc:  # the server's hint names an HTTP header: say it for MCP
            raise NotFound(exc.message, hint="use the trace_id log_run returned (or, for an "
                           "exchange `whetstone serve` recorded, its X-Whetstone-Trace-Id); "
                           "`whetstone traces ls` lists the library's traces") from exc
        return {"trace_id": trace.id, "score": trace.score, "comment": comment}

    def log_run(self, task: Any, answer: Any, steps: Any = None, score: Any = None,
                model: Any = None, *, owner: str | None = None) -> dict[str, Any]:
        """Store an outside agent's run as a trace (``meta.source`` ``"mcp"``); ``steps``
        are ``{"thought": ...}`` and ``{"tool", "arguments", "observation", "error"}``
        objects, recorded as the runtime records its think and act steps."""
        # lazy: loads filelock, numpy and 37 more of our modules
        from ..chat.exchange import check_feedback

        self.check_writes("log_run")
        for key, value in (("task", task), ("answer", answer)):
            if not isinstance(value, str) or not value.strip():
                article = "an" if key[0] in "aeiou" else "a"
                raise ConfigError(f"log_run needs {article} '{key}' (a non-empty string)",
                                  hint=f"pass the {key} as text")
            if len(value) > MAX_TASK_CHARS:
                raise ConfigError(f"'{key}' is {len(value)} characters; at most "
                                  f"{MAX_TASK_CHARS} are kept", hint=f"shorten the {key}")
        if score is not None:
            score = check_feedback(score)[0]
        if model is not None and not isinstance(model, str):
            raise ConfigError(f"'model' must be a string, got {type(model).__name__}")
        now = time.time()
        recorded = (*run_steps(steps, now),
                    Step(kind="finish", module="finish", started=now,
                         output={"outcome": "answered", "reason": "logged over MCP"},
                         route="end"))
        trace = make_trace("mcp", task=task, steps=recorded, answer=answer, outcome="answered",
                           score=score, library_version=self.version(), model=model or "",
                           started=now, ended=now, total_tokens=0, meta=owner_tag(owner))
        self.engine.traces.append(trace)
        return {"trace_id": trace.id, "library_version": trace.library_version}


def run_steps(steps: Any, started: float) -> list[Step]:
    """An outside agent's steps as the runtime's ``think`` and ``act`` steps; ``ConfigError``
    naming the first step that is neither."""
    if steps is None:
        return []
    if not isinstance(steps, Sequence) or isinstance(steps, (str, bytes)):
        raise ConfigError("'steps' must be a list of objects",
                          hint='e.g. [{"thought": "..."}, {"tool": "calculator", '
                               '"arguments": {"expression": "2+2"}, "observation": "4"}]')
    if len(steps) > MAX_STEPS:
        raise ConfigError(f"'steps' holds {len(steps)} steps; at most {MAX_STEPS} are kept")
    out: list[Step] = []
    for i, s in enumerate(steps):
        if isinstance(s, Mapping) and isinstance(s.get("thought"), str) and "tool" not in s:
            out.append(Step(kind="think", module="think", started=started, route="think",
                            output={"thought": s["thought"]}))
        elif isinstance(s, Mapping) and isinstance(s.get("tool"), str) and s["tool"].strip():
            error = s.get("error")
            if error is not None and not isinstance(error, str):
                raise ConfigError(f"steps[{i}].error must be a string")
            out.append(Step(kind="act", module="act", started=started, route="think",
                            input={"tool": s["tool"], "arguments": s.get("arguments")},
                            output={"observation": s.get("observation")}, error=error))
        else:
            raise ConfigError(f"steps[{i}] is neither a thought nor a tool call",
                              hint='a step is {"thought": "..."} or {"tool": "name", '
                                   '"arguments": {...}, "observation": "...", "error": null}')
    return out
