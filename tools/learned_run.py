"""Running a learned tool: only ever in the sandbox, through ``tools/sandbox_harness.py``.

The host checks the arguments against the tool's schema, copies image arguments (checked by
``ImageFiles``: allowed folders only, no links, bounded size) into the call's folder without
decoding them, and runs the harness, which opens them, calls the function and writes the result
as JSON. Images the tool returns come back as PNG files in ``ImageFiles.out_dir``. Every failure
(a bad argument, an exception in the tool, a limit) is a ``ToolResult`` error: an observation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..engine.errors import ToolError
from .base import Tool, ToolResult
from .images import MAX_IMAGE_PIXELS, ImageFiles
from .learned import ToolDefinition, check_arguments
from .sandbox import DEFAULT_MAX_TASKS, DEFAULT_MEMORY_MB, Sandbox, default_sandbox

HARNESS = Path(__file__).with_name("sandbox_harness.py")
MAX_RESULT_BYTES = 1_000_000
TRACEBACK_LINES = 6


def _suffix(path: Path) -> str:
    return path.suffix.lower() if re.fullmatch(r"\.[a-z0-9]{1,5}", path.suffix.lower()) else ""


def _call_files(definition: ToolDefinition, args: Mapping[str, Any], images: ImageFiles
                ) -> dict[str, str | bytes]:
    plain = {k: v for k, v in args.items() if k not in definition.image_params}
    image_files: dict[str, str] = {}
    files: dict[str, str | bytes] = {"tool.py": definition.source}
    for name in definition.image_params:
        if args.get(name) is None:
            continue  # an optional image left out
        path = images.resolve_input(args[name], param=name)
        rel = f"in/{name}{_suffix(path)}"
        files[rel] = path.read_bytes()
        image_files[name] = rel
    call = {"function": definition.name, "arguments": plain, "images": image_files,
            "max_pixels": MAX_IMAGE_PIXELS}
    files["call.json"] = json.dumps(call)
    return files


def _restore_images(value: Any, outputs: Mapping[str, bytes], images: ImageFiles,
                    kept: list[str]) -> Any:
    """Replace ``{"$image": "out/image-N.png"}`` with the path of the stored PNG."""
    if isinstance(value, dict):
        if set(value) == {"$image"} and isinstance(value["$image"], str):
            rel = value["$image"].removeprefix("out/")
            if rel not in outputs:
                raise ToolError(f"the tool's image {rel} is missing")
            path = str(images.store_png(outputs[rel]))
            kept.append(path)
            return path
        return {k: _restore_images(v, outputs, images, kept) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore_images(v, outputs, images, kept) for v in value]
    return value


def _parse_result(raw: bytes | None, skipped: tuple[str, ...] = ()) -> dict[str, Any]:
    if raw is None:
        why = next((s for s in skipped if s.startswith("out/result.json ")), None)
        raise ToolError("the tool ended without a result" + (
            f": {why} is not a regular file, so it was not read" if why else ""))
    if len(raw) > MAX_RESULT_BYTES:
        raise ToolError(f"the tool's result is larger than {MAX_RESULT_BYTES} bytes",
                        hint="return a summary: counts, a few values, an image")
    try:
        result = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ToolError(f"the tool's result is not JSON ({exc})") from exc
    if not isinstance(result, dict) or "ok" not in result:
        raise ToolError("the tool's result has no 'ok' field")
    return result


def run_learned(definition: ToolDefinition, args: Mapping[str, Any], *, images: ImageFiles,
                sandbox: Sandbox | None = None, timeout_s: float | None = None,
                memory_mb: int = DEFAULT_MEMORY_MB, max_tasks: int = DEFAULT_MAX_TASKS
                ) -> ToolResult:
    """Call a learned tool once in the sandbox (``whetstone tools test`` and the agent both
    come here). Raises ``ToolError`` only for bad arguments; the ``Toolbox`` reports it."""
    try:
        checked = check_arguments(definition, args)
    except ValueError as exc:
        raise ToolError(str(exc), hint=f"{definition.name} takes "
                        f"{json.dumps(definition.spec.parameters.get('properties', {}))}") from exc
    timeout = timeout_s if timeout_s is not None else definition.spec.timeout_s
    box = sandbox or default_sandbox()
    res = box.run_python(HARNESS.read_text(encoding="utf-8"), timeout_s=timeout,
                         memory_mb=memory_mb, max_tasks=max_tasks,
                         files=_call_files(definition, checked, images), collect="out")
    meta = res.metadata()
    if res.stdout.strip():
        meta["printed"] = res.stdout[-2000:]
    failure = res.failure(timeout_s=timeout, memory_mb=memory_mb, max_tasks=max_tasks)
    if failure is not None:
        return ToolResult(res.stderr[-2000:], failure, res.duration_s, res.timed_out, meta)
    result = _parse_result(res.outputs.get("result.json"), res.skipped)
    if not result["ok"]:
        tail = "\n".join(str(result.get("traceback", "")).strip().splitlines()[-TRACEBACK_LINES:])
        return ToolResult(tail, str(result.get("error") or "the tool failed"), res.duration_s,
                          metadata=meta)
    kept: list[str] = []
    value = _restore_images(result.get("value"), res.outputs, images, kept)
    if kept:
        meta["images"] = kept
    return ToolResult(json.dumps(value, ensure_ascii=False), None, res.duration_s,
                      metadata=meta)


def learned_tool(definition: ToolDefinition, *, images: ImageFiles,
                 sandbox: Sandbox | None = None, memory_mb: int = DEFAULT_MEMORY_MB) -> Tool:
    """A ``Tool`` the agent can call; it runs the learned code only in the sandbox."""

    def run(args: Mapping[str, Any]) -> ToolResult:
        return run_learned(definition, args, images=images, sandbox=sandbox,
                           memory_mb=memory_mb)

    return Tool(replace(definition.spec), run)
