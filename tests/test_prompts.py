"""Prompts are data, filled strictly: a placeholder left unfilled is an error, never text that
reaches the model; every call site in the code gives every placeholder its prompt has."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from whetstone.engine.errors import ConfigError
from whetstone.engine.methods.registry import default_registry
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


@pytest.mark.trace2skill
def test_yaml_tables_hold_short_templates() -> None:
    assert load_prompt("analyst_trace.yaml#task") == "Task: $task"
    assert placeholders("whetstone.engine.methods.trace2skill:batch_run.yaml#failure") == {
        "number", "expected", "trace"}
    with pytest.raises(ConfigError, match="has no text entry 'nope'") as err:
        load_prompt("analyst_trace.yaml#nope")
    assert "task" in (err.value.hint or "")
    with pytest.raises(ConfigError, match="not found in engine/prompts"):
        load_prompt("no_such_prompt")


@pytest.mark.march
@pytest.mark.nlpg
def test_a_method_reads_its_own_prompts_by_short_name() -> None:
    from whetstone.engine.methods.march import PROMPTS

    assert PROMPTS.load("solver") == load_prompt("whetstone.engine.methods.march:solver.md")
    assert "$question" in PROMPTS.load("solver")
    assert PROMPTS.load("parts.yaml#question") == "$number. $question"
    # a qualified name passes through: another package's prompt, or the core's
    assert PROMPTS.qualify("whetstone.engine.methods.nlpg:curator") == \
        "whetstone.engine.methods.nlpg:curator"
    with pytest.raises(ConfigError, match="not found in whetstone.engine.methods.march's "
                                          "prompts/ folder"):
        PROMPTS.load("no_such_prompt")
    with pytest.raises(ConfigError, match="not found in no_such_package's prompts/ folder"):
        load_prompt("no_such_package:solver")


def _calls(kind: str = "render") -> list[tuple[str, int, str, set[str]]]:
    """(file, line, prompt name, keywords given) of each ``render_prompt`` call, and each
    method's ``PROMPTS.render``, with a literal prompt name, across the package (``kind``
    "load": of each ``load_prompt`` and ``PROMPTS.load``)."""
    found = []
    for root in ("engine", "skills", "tools", "library_store"):
        for path in (REPO / root).rglob("*.py"):
            rel = path.relative_to(REPO)
            # a method module's PROMPTS are its package's: engine/methods/<name>/...
            method = rel.parts[2] if rel.parts[:2] == ("engine", "methods") and \
                len(rel.parts) > 3 else None
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and node.args):
                    continue
                first = node.args[0]  # a literal, or a choice of two ("a" if x else "b")
                names = [first.value] if isinstance(first, ast.Constant) else \
                    [b.value for b in (first.body, first.orelse) if isinstance(b, ast.Constant)] \
                    if isinstance(first, ast.IfExp) else []
                if getattr(node.func, "id", "") == f"{kind}_prompt":
                    pass
                elif isinstance(node.func, ast.Attribute) and node.func.attr == kind \
                        and getattr(node.func.value, "id", "") == "PROMPTS" and method:
                    names = [n if ":" in n else f"whetstone.engine.methods.{method}:{n}"
                             for n in names]
                else:
                    continue
                keys = {k.arg for k in node.keywords if k.arg is not None}
                found += [(str(rel), node.lineno, name, keys) for name in names]
    return found


def test_every_prompt_a_call_site_loads_exists() -> None:
    loads = _calls("load")
    assert len(loads) >= 10
    for file, line, name, _ in loads:
        assert load_prompt(name), f"{file}:{line}"


def test_every_call_site_fills_every_placeholder_of_its_prompt() -> None:
    calls = _calls()
    assert len(calls) >= 10  # the scan sees the call sites
    # and the methods' own: about two call sites for each method with prompts installed
    with_prompts = [s for s in default_registry().specs() if s.prompts is not None]
    assert sum(":" in name for _, _, name, _ in calls) >= 2 * len(with_prompts)
    bad = [f"{f}:{line} {name} lacks {sorted(placeholders(name) - keys)}"
           for f, line, name, keys in calls if placeholders(name) - keys]
    assert bad == []
