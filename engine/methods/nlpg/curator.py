"""The NLPG curator: turns a step's folded corrections for one module into operations.

``analyst`` asks the analyst for ADD / EDIT / AGREE / REMOVE operations on the module's notes
(``prompts/curator.md``); its reply is repaired where it can be (an op name in
lower case, a bare list, an unknown route read as ``*``) and each operation it cannot use is
dropped and counted. A reply that cannot be read at all, after one retry, falls back to the
``rules`` curator (``whetstone.engine.methods.nlpg.memory.rules_curator``). Either way the bound and the
budget are enforced afterwards by ``apply_ops``, never trusted to the curator.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...backends.base import Backend
from ...errors import ParseError
from ...replies import extract_json_object
from ..analyst import AnalystStats, ask_parsed
from . import PROMPTS
from .backward import CorrectionGroup
from .memory import (
    OP_KINDS,
    Op,
    TokenCount,
    clean_text,
    note_tokens,
    rules_curator,
)
from .notes import MAX_NOTE_CHARS, ROUTE_RE, PolicyNote


@dataclass(frozen=True)
class CuratorReply:
    ops: tuple[Op, ...]
    repairs: tuple[str, ...] = ()
    dropped: int = 0


def curator_messages(module: str, notes: Sequence[PolicyNote],
                     groups: Sequence[CorrectionGroup], *, budget: int, max_ops: int,
                     count: TokenCount) -> list[dict[str, str]]:
    """The analyst's prompt for one module's update."""
    note_lines = [PROMPTS.render("curator.yaml#note", id=n.id, route=n.route,
                                 helpful=n.helpful, harmful=n.harmful, text=n.text)
                  for n in notes]
    group_lines = [PROMPTS.render("curator.yaml#correction", route=g.route,
                                  support=f"{g.support:.2f}", text=g.text) for g in groups[:8]]
    user = PROMPTS.render("curator", module=module,
                          notes="\n".join(note_lines) or PROMPTS.load("curator.yaml#no_notes"),
                          corrections="\n".join(group_lines), budget=budget,
                          used=note_tokens(notes, count), max_ops=max_ops)
    return [{"role": "user", "content": user}]


def _op_list(raw: str) -> tuple[list[Any], list[str]]:
    start = raw.find("[")
    if start >= 0 and (raw.find("{") < 0 or start < raw.find("{")):
        try:  # a bare list of operations
            found = json.loads(raw[start: raw.rfind("]") + 1])
            if isinstance(found, list):
                return found, ["the ops came as a bare list"]
        except json.JSONDecodeError:
            pass
    data = extract_json_object(raw, what="an object of operations",
                               hint='reply with {"ops": [{"op": "ADD", "route": "*", '
                                    '"text": "..."}]}')
    if isinstance(data, Mapping) and isinstance(data.get("ops"), list):
        return list(data["ops"]), []
    if isinstance(data, Mapping) and str(data.get("op", "")).upper() in OP_KINDS:
        return [data], ["a single op without a list"]
    raise ParseError('the reply has no "ops" list', raw,
                     hint='reply with {"ops": [...]}, each op ADD, EDIT, AGREE or REMOVE')


def parse_ops(raw: str, *, ids: Collection[str], routes: Collection[str]) -> CuratorReply:
    """The operations in a curator reply: each repaired where it can be, or dropped and
    counted (unknown op or note id, no text); ``ParseError`` when there is no list at all."""
    items, repairs = _op_list(raw)
    ops: list[Op] = []
    dropped = 0
    for item in items:
        op = _one_op(item, ids=ids, routes=routes, repairs=repairs)
        if op is None:
            dropped += 1
        else:
            ops.append(op)
    return CuratorReply(tuple(ops), tuple(repairs), dropped)


def _one_op(item: Any, *, ids: Collection[str], routes: Collection[str],
            repairs: list[str]) -> Op | None:
    if not isinstance(item, Mapping):
        return None
    kind = str(item.get("op") or item.get("type") or "").strip().upper()
    if kind not in OP_KINDS:
        return None
    if kind != str(item.get("op")):
        repairs.append(f"op {item.get('op') or item.get('type')!r} read as {kind}")
    note_id = str(item.get("id") or "").strip().strip("[]")
    text = clean_text(item.get("text") or "")
    if len(text) > MAX_NOTE_CHARS:
        return None
    if kind == "ADD":
        route = str(item.get("route") or "*").strip()
        if route not in routes or not ROUTE_RE.match(route):
            repairs.append(f"route {route!r} read as *")
            route = "*"
        return Op("ADD", route=route, text=text, reason="curator") if text else None
    if note_id not in ids or (kind == "EDIT" and not text):
        return None
    return Op(kind, id=note_id, text=text if kind == "EDIT" else "",  # type: ignore[arg-type]
              reason="curator")


@dataclass
class CuratorResult:
    ops: list[Op]
    stats: AnalystStats
    repairs: int = 0
    dropped_ops: int = 0
    fallback: bool = False


async def curate(module: str, notes: Sequence[PolicyNote], groups: Sequence[CorrectionGroup],
                 *, analyst: Backend | None, max_ops: int, budget: int, count: TokenCount,
                 temperature: float = 0.3, max_tokens: int = 512, seed: int = 0
                 ) -> CuratorResult:
    """Operations for one module: the analyst's (``analyst`` given) or the rules'."""
    stats = AnalystStats()
    if analyst is not None:
        routes = {g.route for g in groups} | {n.route for n in notes} | {"*"}
        reply = await ask_parsed(
            analyst, curator_messages(module, notes, groups, budget=budget, max_ops=max_ops,
                                      count=count),
            lambda raw: parse_ops(raw, ids={n.id for n in notes}, routes=routes),
            temperature=temperature, max_tokens=max_tokens, seed=seed)
        stats.add(reply.stats)
        got = reply.value
        # Every op unusable reads as a failed reply, not as "change nothing".
        if got is not None and (got.ops or not got.dropped):
            return CuratorResult(list(got.ops), stats, len(got.repairs), got.dropped)
        dropped = got.dropped if got is not None else 0
        ops = rules_curator(notes, groups, max_ops=max_ops, budget=budget, count=count)
        return CuratorResult(ops, stats, dropped_ops=dropped, fallback=True)
    return CuratorResult(rules_curator(notes, groups, max_ops=max_ops, budget=budget,
                                       count=count), stats)
