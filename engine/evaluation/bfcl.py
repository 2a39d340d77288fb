"""BFCL call matching: does one function call match the benchmark's ``possible_answer``?

A re-statement of BFCL's Python AST checker (``bfcl_eval/eval_checker/ast_eval/ast_checker.py``,
``simple_function_checker``), which we cannot import (its package needs dependencies we do not
have). For a call to match:
- its name is the expected function's (``math.factorial``, or ``math_factorial`` as OpenAI
  tool names cannot hold dots);
- every required parameter is present and no unknown one is;
- each value has the documented type (an int is accepted for a float) and is one of the allowed
  values; strings compare case-insensitively, ignoring spaces and ``,./-_*^``;
- a parameter left out is fine only when ``""`` is among its allowed values (optional).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

_PY_TYPES: dict[str, type] = {
    "string": str, "integer": int, "float": float, "number": float, "boolean": bool,
    "array": list, "tuple": list, "dict": dict, "object": dict, "any": str,
}
_NESTED = {"array", "tuple"}


@dataclass(frozen=True)
class CallCheck:
    """The verdict on one call: ``ok`` and, when not, why."""

    ok: bool
    reason: str = ""


def _standardize(s: str) -> str:
    # BFCL's standardize_string: "April 1, 2024" == "april 1 2024".
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


def _std_list(values: Sequence[Any]) -> list[Any]:
    return [_standardize(v) if isinstance(v, str) else v for v in values]


def _first_type(allowed: Sequence[Any]) -> type | None:
    for a in allowed:
        if a != "":
            return type(a)
    return None


def _type_ok(value: Any, allowed: Sequence[Any], expected: type, nested: type | None
             ) -> tuple[bool, bool]:
    """(valid, is_variable), as BFCL's ``type_checker``. A value whose type matches the allowed
    values' type but not the documented one stands for a variable name (BFCL's rule)."""
    answer_type = _first_type(allowed)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for option in allowed:
            if not isinstance(option, list):
                return True, is_variable  # BFCL lets a non-list option (the optional "") pass
            inner = _first_type(option)
            items = cast("Sequence[Any]", value)  # type(value) is expected: a list
            if all(type(v) is nested or (inner is not None and type(v) is inner) for v in items):
                return True, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, is_variable


def _dict_ok(value: Mapping[str, Any], allowed: Sequence[Any]) -> bool:
    for option in allowed:
        if option == "" or not isinstance(option, Mapping):
            continue
        if all(k in option and (_standardize(v) if isinstance(v, str) else v)
               in _std_list(option[k]) for k, v in value.items()) and all(
               k in value or "" in vals for k, vals in option.items()):
            return True
    return False


def _list_of_dicts_ok(value: Sequence[Any], allowed: Sequence[Any]) -> bool:
    for option in allowed:
        if not isinstance(option, list) or len(option) != len(value):
            continue
        if all(isinstance(v, Mapping) and _dict_ok(v, [o]) for v, o in zip(value, option, strict=False)):
            return True
    return False


def check_call(name: str, arguments: Mapping[str, Any], functions: Sequence[Mapping[str, Any]],
               ground_truth: Mapping[str, Mapping[str, Sequence[Any]]]) -> CallCheck:
    """Check one call against one ground-truth entry ``{func_name: {param: [allowed...]}}``.

    ``functions`` are the task's BFCL function documents (for parameter types and required
    parameters); OpenAI tool schemas work too.
    """
    (expected_name, allowed_params), = ground_truth.items()
    if name not in (expected_name, re.sub(r"\.", "_", expected_name)):
        return CallCheck(False, f"called {name!r}, expected {expected_name!r}")
    doc = next((f for f in functions
                if f.get("name") in (expected_name, re.sub(r"\.", "_", expected_name))), None)
    if doc is None:
        return CallCheck(False, f"no function document for {expected_name!r} in the task")
    params = doc.get("parameters") or {}
    details: Mapping[str, Any] = params.get("properties") or {}
    for p in params.get("required") or ():
        if p not in arguments:
            return CallCheck(False, f"missing required parameter {p!r}")
    for p, value in arguments.items():
        if p not in details or p not in allowed_params:
            return CallCheck(False, f"unexpected parameter {p!r}")
        allowed = list(allowed_params[p])
        type_name = details[p].get("type", "string")
        expected_type = _PY_TYPES.get(type_name, str)
        nested = None
        if type_name in _NESTED:
            items = details[p].get("items") or {}
            nested = _PY_TYPES.get(items.get("type", ""))
        if type_name in ("float", "number") and type(value) is int:
            value = float(value)  # Python would accept an int here, and so does BFCL
        valid, is_variable = _type_ok(value, allowed, expected_type, nested)
        if not valid:
            return CallCheck(False, f"parameter {p!r}: expected type {type_name}, got "
                                    f"{type(value).__name__} ({value!r})")
        if not is_variable:
            if expected_type is dict:
                if not _dict_ok(value, allowed):
                    return CallCheck(False, f"parameter {p!r}: {value!r} is not allowed")
                continue
            if expected_type is list and nested is dict:
                if not _list_of_dicts_ok(value, allowed):
                    return CallCheck(False, f"parameter {p!r}: {value!r} is not allowed")
                continue
            if expected_type is str:
                if _standardize(value) not in [_standardize(a) for a in allowed
                                               if isinstance(a, str)]:
                    return CallCheck(False, f"parameter {p!r}: {value!r} is not one of "
                                            f"{allowed!r}")
                continue
            if expected_type is list:
                # BFCL reads the optional "" as an empty list.
                options = [_std_list(a) for a in allowed if isinstance(a, list) or a == ""]
                if _std_list(value) not in options:
                    return CallCheck(False, f"parameter {p!r}: {value!r} is not one of "
                                            f"{allowed!r}")
                continue
        if value not in allowed:
            return CallCheck(False, f"parameter {p!r}: {value!r} is not one of {allowed!r}")
    for p, choices in allowed_params.items():
        if p not in arguments and "" not in choices:
            return CallCheck(False, f"parameter {p!r} left out but it is not optional")
    return CallCheck(True)


def check_calls(calls: Sequence[tuple[str, Mapping[str, Any]]],
                functions: Sequence[Mapping[str, Any]],
                ground_truth: Sequence[Mapping[str, Mapping[str, Sequence[Any]]]]) -> CallCheck:
    """Check the calls a model made against BFCL's ground truth (simple and multiple: one
    expected call, and the first call made is the one judged)."""
    if not ground_truth:
        return CallCheck(False, "the task has no ground truth")
    if not calls:
        return CallCheck(False, "no function call was made")
    name, arguments = calls[0]
    return check_call(name, arguments, functions, ground_truth[0])
