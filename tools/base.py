"""The tool contract: a ``ToolSpec`` (OpenAI function schema) plus a callable that never raises.

Tool failures are observations, not exceptions (DSPy ReAct, smolagents): a ``Toolbox`` turns
every error — bad arguments, a crash, a timeout — into ``ToolResult.error`` the model can read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..engine.errors import ToolError
from ..engine.types import ToolSpec
from .arguments import check_arguments

MAX_OBSERVATION_CHARS = 4000


@dataclass(frozen=True)
class ToolResult:
    """What a tool call produced. ``error`` set means the call failed; ``output`` may still
    hold partial output (e.g. what a program printed before it was killed)."""

    output: str = ""
    error: str | None = None
    duration_s: float = 0.0
    timed_out: bool = False
    # Not shown to the model: how the call ran (the sandbox's mode and warnings, images it
    # produced). JSON-safe, for traces and ``whetstone``.
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    def observation(self, tool: str) -> str:
        """The text the model sees."""
        if self.error is None:
            return self.output if self.output.strip() else "(no output)"
        text = f"Error in {tool}: {self.error}"
        if self.output.strip():
            text += f"\nOutput before the error:\n{self.output}"
        return text


@dataclass(frozen=True)
class Tool:
    """A spec and the function that runs it. ``fn(arguments) -> str`` may raise; the
    ``Toolbox`` catches and reports."""

    spec: ToolSpec
    fn: Callable[[Mapping[str, Any]], str | ToolResult]

    @property
    def name(self) -> str:
        return self.spec.name

    def primary_parameter(self) -> str | None:
        """The parameter a plain-text call ``tool[input]`` fills: the first required one."""
        params = self.spec.parameters
        required = list(params.get("required") or [])
        props = list((params.get("properties") or {}).keys())
        return (required or props or [None])[0]


def _truncate(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[: limit // 2] + f"\n... [{len(text) - limit} characters cut] ...\n" + text[-limit // 2:]


@dataclass
class Toolbox:
    """The tools one run may call, by name."""

    tools: dict[str, Tool] = field(default_factory=dict)

    @classmethod
    def of(cls, tools: Iterable[Tool]) -> Toolbox:
        return cls({t.name: t for t in tools})

    def add(self, tool: Tool) -> None:
        self.tools[tool.name] = tool

    def names(self) -> list[str]:
        return list(self.tools)

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self.tools.values()]

    def schemas(self) -> list[dict[str, Any]]:
        return [t.spec.schema() for t in self.tools.values()]

    def coerce_arguments(self, name: str, raw: str | Mapping[str, Any]) -> dict[str, Any]:
        """Turn what the model wrote into keyword arguments.

        JSON objects are taken as they are; anything else (``calculator[17*23]``) fills the
        tool's primary parameter. Raises ``ToolError`` when the tool is unknown.
        """
        tool = self._get(name)
        if isinstance(raw, Mapping):
            return dict(raw)
        text = raw.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
                if isinstance(value, dict):
                    return value
            except json.JSONDecodeError:
                pass
        key = tool.primary_parameter()
        if key is None:
            return {}
        return {key: text}

    def _get(self, name: str) -> Tool:
        if name not in self.tools:
            known = ", ".join(self.tools) or "(none)"
            raise ToolError(f"unknown tool {name!r}; available tools: {known}",
                            hint="call one of the available tools by its exact name")
        return self.tools[name]

    def call(self, name: str, arguments: str | Mapping[str, Any], *,
             task: str | None = None) -> ToolResult:
        """Run a tool; every failure comes back as ``ToolResult.error``, never as an exception.
        ``task``: the run's task text, passed to the parameters the tool's spec injects
        (``ToolSpec.inject``) in place of whatever the model wrote there."""
        start = time.perf_counter()
        try:
            tool = self._get(name)
            kwargs = self.coerce_arguments(name, arguments) if tool.spec.parameters.get(
                "properties") or not tool.spec.inject else {}
            for param in tool.spec.inject:
                kwargs.pop(param, None)
            # Checked against the schema the model saw (injected parameters are not in it).
            kwargs, problem = check_arguments(tool.spec, kwargs)
            if problem is not None:
                return ToolResult(error=problem, duration_s=time.perf_counter() - start)
            for param, source in tool.spec.inject.items():
                if source == "task" and task is not None:
                    kwargs[param] = task
            result = tool.fn(kwargs)
        except ToolError as exc:
            return ToolResult(error=exc.message, duration_s=time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 -- a tool's bug is the model's observation, not our crash
            return ToolResult(error=f"{type(exc).__name__}: {exc}",
                              duration_s=time.perf_counter() - start)
        if isinstance(result, ToolResult):
            return replace(result, output=_truncate(result.output),
                           duration_s=result.duration_s or time.perf_counter() - start)
        return ToolResult(output=_truncate(str(result)), duration_s=time.perf_counter() - start)
