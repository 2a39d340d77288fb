"""A tool call's arguments checked against the tool's JSON schema before the call, for every kind
of tool (built-in, learned, the user's functions, LangChain tools, MCP servers' tools): the
``Toolbox`` runs ``check_arguments`` on each call, and a mismatch is the model's observation,
naming the field (``missing argument(s) expression``, ``unit must be one of ['c', 'f'], not
'k'``), never an exception and never a call the tool would refuse or misread.

The schema is read with the ``jsonschema`` package (required fields, types, enums, nested
objects and arrays, ``additionalProperties: false``). Before the check, what a model writes
loosely is taken as meant where nothing else could be meant: a number written as text for a
number field, a number for a text field, and, for a tool of one parameter, that parameter
under another name (``{"expr": "17*23"}`` for the calculator's ``expression``).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..engine.types import ToolSpec

log = logging.getLogger("whetstone.tools")

_SHOWN_ERRORS = 3
_INTEGER = re.compile(r"\s*-?\d+\s*")


def _loosely(args: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """``args`` with the loose forms of the module docstring taken as meant (top level)."""
    props: Mapping[str, Any] = schema.get("properties") or {}
    if len(props) == 1 and len(args) == 1:
        (only,), (given,) = props, args
        if given not in props and schema.get("additionalProperties", True) is not False:
            args = {only: args[given]}
    out = dict(args)
    for key, value in args.items():
        kind = (props.get(key) or {}).get("type") if isinstance(props.get(key), Mapping) \
            else None
        if kind == "integer" and isinstance(value, str) and _INTEGER.fullmatch(value):
            out[key] = int(value)
        elif kind == "number" and isinstance(value, str):
            with contextlib.suppress(ValueError):
                out[key] = float(value) if not _INTEGER.fullmatch(value) else int(value)
        elif kind == "string" and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            out[key] = str(value)
    return out


def _where(path: Sequence[Any]) -> str:
    """``items[0].name`` for a path into the arguments."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string",
               list: "array", dict: "object", type(None): "null"}


def _problem(error: Any) -> str:
    """One ``jsonschema`` error as a sentence naming the field."""
    where = _where(list(error.absolute_path))
    inside = f" in {where}" if where else ""
    if error.validator == "required":
        present = error.instance if isinstance(error.instance, Mapping) else {}
        missing = [k for k in error.validator_value if k not in present]
        return f"missing argument(s) {', '.join(missing)}{inside}"
    if error.validator == "additionalProperties":
        known = set(error.schema.get("properties") or {})
        extra = sorted(k for k in (error.instance or {}) if k not in known)
        return f"unknown argument(s) {', '.join(extra)}{inside}"
    name = where or "the arguments"
    if error.validator == "type":
        got = _JSON_TYPES.get(type(error.instance), type(error.instance).__name__)
        want = error.validator_value
        want = " or ".join(want) if isinstance(want, list) else want
        return f"{name} must be {want}, not {got}"
    if error.validator == "enum":
        return f"{name} must be one of {list(error.validator_value)}, not {error.instance!r}"
    return f"{name}: {error.message}"


def signature(spec: ToolSpec) -> str:
    """``expression (string, required), precision (integer)``: what the tool takes."""
    params = spec.parameters
    required = set(params.get("required") or ())
    parts = []
    for name, schema in (params.get("properties") or {}).items():
        kind = schema.get("type") if isinstance(schema, Mapping) else None
        notes = [" or ".join(kind) if isinstance(kind, list) else kind] if kind else []
        notes += ["required"] if name in required else []
        parts.append(f"{name} ({', '.join(notes)})" if notes else name)
    return ", ".join(parts) or "no arguments"


def check_arguments(spec: ToolSpec, args: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``args`` as the tool should get them (the loose forms taken as meant), and what does
    not fit the tool's schema (None: they fit). A schema the checker cannot read lets the
    arguments through as given: the tool itself is the judge then."""
    schema = spec.parameters
    if not isinstance(schema, Mapping) or not schema:
        return dict(args), None
    fixed = _loosely(dict(args), schema)
    # heavy: jsonschema and its referencing (~40 ms), loaded with the first call
    from jsonschema.validators import Draft202012Validator, validator_for

    try:
        validator = validator_for(schema, default=Draft202012Validator)(schema)
        errors = sorted(validator.iter_errors(fixed), key=lambda e: list(e.absolute_path))
        problems = list(dict.fromkeys(_problem(e) for e in errors))
    except Exception as exc:  # noqa: BLE001 - a schema we cannot read must not block the tool
        log.debug("cannot check the arguments of %s against its schema: %s", spec.name, exc)
        return fixed, None
    if not problems:
        return fixed, None
    shown = "; ".join(problems[:_SHOWN_ERRORS]) + (
        f"; and {len(problems) - _SHOWN_ERRORS} more" if len(problems) > _SHOWN_ERRORS else "")
    return fixed, f"{shown} ({spec.name} takes {signature(spec)})"


__all__ = ["check_arguments", "signature"]
