"""Prompts are data, filled strictly: a placeholder left unfilled is an error, never text that
reaches the model; every call site in the code gives every placeholder its prompt has."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from whetstone.engine.errors import ConfigError
from whetstone.engine.prompts import load_prompt, placeholders, render_prompt

REPO = Path(__file__).resolve().parent.parent


def test_a_missing_placeholder_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"'agent_parse_error' needs \$expected") as err:
        render_prompt("agent_parse_error", error="no action")
    assert "expected=..." in (err.value.hint or "")
    text = render_prompt("agent_parse_error", error="no action", expected="Answer.")
    assert "$" not in text and "no action" in text and "Answer." in text


def test_a_dollar_that_starts_no_name_is_plain_text_and_values_are_not_expanded() -> None:
    # Values may hold "$", "${x}" or "$1.50" (model output, skills): they go in as written.
    out = render_prompt("analyst_retry", error="costs $1.50 and ${skill} and $error")
    assert "costs $1.50 and ${skill} and $error" in out


def test_yaml_tables_hold_short_templates() -> None:
    assert load_prompt("analyst_trace.yaml#task") == "Task: $task"
    assert placeholders("trace2skill_batch_run.yaml#failure") == {"number", "expected", "trace"}
    with pytest.raises(ConfigError, match="has no text entry 'nope'") as err:
        load_prompt("analyst_trace.yaml#nope")
    assert "task" in (err.value.hint or "")
    with pytest.raises(ConfigError, match="not found in engine/prompts"):
        load_prompt("no_such_prompt")


def _calls() -> list[tuple[str, int, str, set[str]]]:
    """(file, line, prompt name, keywords given) of each render_prompt call with a literal
    prompt name, across the package."""
    found = []
    for root in ("engine", "skills", "tools", "library_store"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "render_prompt" \
                        and node.args and isinstance(node.args[0], ast.Constant):
                    keys = {k.arg for k in node.keywords if k.arg is not None}
                    found.append((str(path.relative_to(REPO)), node.lineno, node.args[0].value,
                                  keys))
    return found


def test_every_call_site_fills_every_placeholder_of_its_prompt() -> None:
    calls = _calls()
    assert len(calls) >= 10  # the scan sees the call sites
    bad = [f"{f}:{line} {name} lacks {sorted(placeholders(name) - keys)}"
           for f, line, name, keys in calls if placeholders(name) - keys]
    assert bad == []
