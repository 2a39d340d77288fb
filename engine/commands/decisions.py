"""How a gate's decision reads on the command line: the verdict first, then the figures, each
reason, and the tasks that flipped with their runs' trace ids. ``evolve``, ``library
candidates show``, ``library show`` and the gated library writes print it the same way.
Everything a person copies (trace ids, task ids, names, commands) is printed whole."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console

from ...library_store.manifest import gate_record
from ..evaluation.gate_rules import FEW_TASKS, verdict_text

SHOWN_FLIPS = 10  # per direction; --json lists them all


def decision_lines(d: Mapping[str, Any]) -> list[str]:
    """The verdict, the figures (difference with its interval, McNemar's p, tokens per task and
    their ratio; on a tie, the regression the dev set could have missed), then each reason.
    ``d`` is a decision's ``to_dict()``."""
    head = (f"gate {'accepted' if d['accepted'] else 'rejected'} ({d['rule']}) on "
            f"{d['task_set']}: {verdict_text(d)}; candidate {d['candidate_score']:.3f} vs "
            f"current {d['current_score']:.3f}")
    figures = [(f"difference {d['difference']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"
                f" on {d['n_tasks']} tasks ({d['wins']} better, {d['losses']} worse)")]
    if d.get("mcnemar_p") is not None:
        figures.append(f"McNemar p = {d['mcnemar_p']:.3g}")
    if d["n_tasks"] < FEW_TASKS:
        figures.append(f"fewer than {FEW_TASKS} paired tasks: a rough interval")
    ratio = d.get("token_ratio")
    figures.append(f"tokens {d.get('candidate_tokens', 0):.0f} vs "
                   f"{d.get('current_tokens', 0):.0f} per task"
                   + (f" ({ratio:.2f}x)" if ratio is not None else ""))
    if d.get("verdict", "tie") == "tie":  # what could hide matters on a tie alone
        figures.append(f"could have missed {d.get('could_miss', 0):.3f} (bound "
                       f"{d.get('power_bound', 0):g})")
    return [head, " · ".join(figures)] + [f"- {why}" for why in d.get("reasons") or ()]


def flipped_lines(d: Mapping[str, Any], most: int = SHOWN_FLIPS) -> list[str]:
    """The tasks whose score changed, better then worse, each with the trace ids of its two
    runs (current, then candidate: `whetstone traces show ID`)."""
    flips: Sequence[Mapping[str, Any]] = d.get("flipped") or ()
    if not flips:
        return []
    out = [(f"tasks that flipped: {d.get('wins', 0)} better, {d.get('losses', 0)} worse "
            "(score current -> candidate; traces current -> candidate)")]
    for sign, better in (("+", True), ("-", False)):
        side = [f for f in flips if (f["candidate"] > f["current"]) is better]
        for f in side[:most]:
            out.append(f"  {sign} {f['task']}: {f['current']:g} -> {f['candidate']:g}  "
                       f"{f.get('current_trace') or '-'} -> {f.get('candidate_trace') or '-'}")
        if len(side) > most:
            out.append(f"  {sign} ... and {len(side) - most} more (--json lists every one)")
    return out


def print_decision(out: Console, d: Mapping[str, Any], *, accepted_style: bool = True
                   ) -> None:
    """``decision_lines`` and ``flipped_lines``: the head line in green or red."""
    head, *rest = decision_lines(d)
    out.print(head, style=("green" if d["accepted"] else "red") if accepted_style else None,
              markup=False, soft_wrap=True, highlight=False)
    for line in rest + flipped_lines(d):
        out.print(f"  {line}", markup=False, soft_wrap=True, highlight=False)


def diff_summary(diff: str) -> list[str]:
    """One line per file a unified diff changes: its path and the lines added and taken out."""
    files: dict[str, list[int]] = {}
    current = ""
    before = ""
    for line in diff.splitlines():
        if line.startswith("--- "):
            before = line[4:].removeprefix("a/")
            continue
        if line.startswith("+++ "):
            after = line[4:].removeprefix("b/")
            current = before if after == "/dev/null" else after
            files.setdefault(current, [0, 0])
            continue
        if current and line.startswith("+"):
            files[current][0] += 1
        elif current and line.startswith("-"):
            files[current][1] += 1
    return [f"{path}: +{added} -{removed} lines" for path, (added, removed) in files.items()]


def gate_line(m: Any) -> str:
    """How a version (a ``Manifest``) went live, in a few words for ``library log``:
    ``gated: a tie (cost_aware, 30 tasks)``, ``UNGATED (library commit)``, ``- (empty)``."""
    record = gate_record(m)
    if record["gated"] is None:
        return "- (the empty start)"
    if not record["gated"]:
        return f"UNGATED ({record.get('by') or m.method})"
    gate = m.scores["gate"]
    line = f"gated: {verdict_text(gate)} ({record['rule']}, {record['n_tasks']} tasks)"
    canary = m.scores.get("canary")
    if isinstance(canary, Mapping) and "difference" in canary:
        line += (f"; canary {canary['difference']:+.3f} [{canary.get('ci_low', 0):+.3f}, "
                 f"{canary.get('ci_high', 0):+.3f}] on {canary.get('n_canary', 0):.0f} live")
    return line


def print_record(out: Console, scores: Mapping[str, Any], costs: Mapping[str, Any]) -> None:
    """A version's or a candidate's record as text: the gate's decision as the gate words it,
    why a change was kept without one, its other scores and its costs as ``key=value``."""
    gate = scores.get("gate")
    if isinstance(gate, Mapping) and "accepted" in gate:
        print_decision(out, gate)
    for key, value in scores.items():
        if key == "gate" and isinstance(gate, Mapping) and "accepted" in gate:
            continue
        if key == "rejected":
            out.print(f"  not decided: {value}", markup=False, soft_wrap=True)
        elif key == "ungated" and isinstance(value, Mapping):
            out.print(f"  ungated: {value.get('note') or 'committed without a gate'}",
                      markup=False, soft_wrap=True)
        else:
            out.print(f"  {key}: {_plain(value)}", markup=False, soft_wrap=True)
    if costs:
        out.print("  costs: " + ", ".join(f"{k}={_plain(v)}" for k, v in costs.items()),
                  markup=False, soft_wrap=True)


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_plain(v)}" for k, v in value.items())
    return str(value)
