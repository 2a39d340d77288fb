"""``whetstone library canary``: the learner's canary (show it, stop it by hand), and how the
steps of learning in production read in ``library log``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from ...library_store.learning import LearningState, Step
from ...library_store.store import Library
from .common import (
    console,
    emit_json,
    handle_errors,
    json_option,
    library_option,
)
from .gating import open_library_for

_WORDS = {"canary_started": "canary started", "promoted": "canary promoted",
          "rolled_back": "canary ROLLED BACK", "expired": "canary expired (undecided)",
          "abandoned": "canary abandoned", "stopped": "canary stopped by hand",
          "gate_rejected": "evolved: the gate rejected it",
          "refused": "evolved: kept as a candidate, not gated", "no_change": "evolved: no change"}


def _interval(f: Mapping[str, Any]) -> str:
    try:
        return (f"canary {f['canary']:.3f} vs current {f['current']:.3f}, "
                f"{f['difference']:+.3f} [{f['ci_low']:+.3f}, {f['ci_high']:+.3f}] on "
                f"{f['n_canary']:.0f}/{f['n_current']:.0f} scored")
    except (KeyError, TypeError, ValueError):
        return ""


def _gate(g: Mapping[str, Any]) -> str:
    try:
        return (f"gate {g.get('verdict')} {g['difference']:+.3f} [{g['ci_low']:+.3f}, "
                f"{g['ci_high']:+.3f}] on {g['n_tasks']} held-out tasks")
    except (KeyError, TypeError, ValueError):
        return ""


def step_text(step: Step) -> str:
    """One step of learning in production, with its figures, in a line."""
    f = step.figures
    parts = [_WORDS.get(step.step, step.step)]
    if step.canary:
        parts.append(step.canary)
    if step.step == "canary_started":
        parts.append(f"on {float(f.get('share') or 0):.0%} of conversations")
        parts.append(_gate(f.get("gate") or {}))
    elif step.step == "gate_rejected":
        parts.append(_gate(f.get("gate") or {}))
    elif step.version:
        parts.append(f"as {step.version}")
    parts.append(_interval(f))
    if step.note and step.step in ("abandoned", "stopped", "no_change", "expired", "refused"):
        parts.append(step.note)
    return ": ".join([parts[0], ", ".join(p for p in parts[1:] if p)]) if parts[1:] \
        else parts[0]


def steps_by_base(library: Library) -> dict[str, list[Step]]:
    """The learning steps by the version current when each happened, newest first."""
    out: dict[str, list[Step]] = {}
    for step in reversed(LearningState(library).steps()):
        out.setdefault(step.base, []).append(step)
    return out


@click.group("canary", invoke_without_command=True)
@library_option
@json_option
@click.pass_context
@handle_errors
def canary_group(ctx: click.Context, library_path: Path | None, as_json: bool) -> None:
    """The canary a learner serves to a share of conversations (`whetstone learn`); alone:
    show it and the learner's last comparison."""
    if ctx.invoked_subcommand is not None:
        return
    state = LearningState(open_library_for(library_path))
    record, status = state.canary(), state.status()
    if as_json:
        emit_json({"canary": record.to_dict() if record else None, "status": status})
        return
    out = console()
    if record is None:
        out.print("no canary runs", markup=False)
    else:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.started))
        out.print(f"canary {record.id} on {record.share:.0%} of conversations since {started} "
                  f"(base {record.base}, {record.method}: {record.message})", markup=False,
                  soft_wrap=True)
        out.print(f"  {_gate(record.gate)}", markup=False, soft_wrap=True)
        compared = status.get("comparison") if status.get("canary") == record.id else None
        if isinstance(compared, Mapping):
            out.print(f"  live: {_interval(compared)} ({compared.get('action')}: "
                      f"{compared.get('why')})", markup=False, soft_wrap=True)
    if status:
        out.print(f"learner {status.get('holder')}: {status.get('state')}", markup=False,
                  soft_wrap=True)


@canary_group.command("stop")
@click.option("--message", "-m", default="", help="Why (kept in the step).")
@library_option
@json_option
@handle_errors
def stop_cmd(message: str, library_path: Path | None, as_json: bool) -> None:
    """End the running canary now: every replica serves the current version from its next
    request (the manual rollback of a canary; the candidate is kept)."""
    lib = open_library_for(library_path)
    state = LearningState(lib)
    record = state.canary()
    if record is None and not state.canary_path.exists():
        if as_json:
            emit_json({"stopped": None})
        else:
            console().print("no canary runs", markup=False)
        return
    cid = record.id if record is not None else ""
    step = Step("stopped", time.time(), lib.current_id(), canary=cid or None,
                holder="by hand", note=message or "stopped with `whetstone library canary stop`")
    state.end_canary(cid, step)
    if as_json:
        emit_json({"stopped": cid or "(a damaged record)"})
        return
    console().print(f"stopped canary {cid or '(a damaged record)'}: the current version "
                    f"{lib.current_id()} serves every conversation", markup=False)


__all__ = ["canary_group", "step_text", "steps_by_base"]
