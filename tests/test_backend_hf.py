"""The transformers backends: tool-call parsing, stream gating, template input, ``hf:`` specs,
and (slow) the real embedded model's template and the small variant. What every backend must
do with a real model (stop strings, tool calls, streaming, counts, seeds) is in
``test_backend_conformance.py``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from whetstone.engine.backends import BackendOptions, get_backend
from whetstone.engine.backends.chat_template import render_chat_template, template_messages
from whetstone.engine.backends.hf import HFBackend
from whetstone.engine.backends.toolcall_format import (
    StreamGate,
    format_tool_calls,
    offered_tool_names,
    parse_tool_calls,
)
from whetstone.engine.errors import ConfigError, ModelLoadError, ModelNotInstalled
from whetstone.engine.types import Message, Request, ToolCall

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression, e.g. 2 * (3 + 4).",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}

# -- tool-call parsing ------------------------------------------------------------------------


def test_one_tagged_call() -> None:
    text, calls = parse_tool_calls(
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>'
    )
    assert text == ""
    assert calls == (ToolCall("calculator", '{"expression": "17 * 23"}', "call_0"),)


def test_several_calls_with_text_around() -> None:
    raw = ('Let me compute both.\n<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
           'and\n<tool_call>{"name": "b", "arguments": {}}</tool_call>\nDone.')
    text, calls = parse_tool_calls(raw)
    assert text == "Let me compute both.\nand\nDone."
    assert [(c.name, c.parsed_arguments(), c.id) for c in calls] == [
        ("a", {"x": 1}, "call_0"), ("b", {}, "call_1")]


def test_malformed_json_is_kept_verbatim() -> None:
    raw = '<tool_call>{"name": "calculator", "arguments": {"expression": 17 * 23}}</tool_call>'
    _, (call,) = parse_tool_calls(raw)
    assert call.name == "calculator"
    assert call.arguments == '{"expression": 17 * 23}}'
    with pytest.raises(json.JSONDecodeError):
        call.parsed_arguments()


def test_missing_outer_brace_and_closing_tag_are_forgiven() -> None:
    raw = 'ok <tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}\n'
    text, (call,) = parse_tool_calls(raw)
    assert text == "ok"
    assert call.parsed_arguments() == {"expression": "2+2"}


def test_unparseable_block_without_name_keeps_raw_text() -> None:
    _, (call,) = parse_tool_calls("<tool_call>calculator(2+2)</tool_call>")
    assert call.name == "" and call.arguments == "calculator(2+2)"


def test_string_arguments_and_parameters_key() -> None:
    _, calls = parse_tool_calls(
        '<tool_call>{"name": "a", "arguments": "{\\"x\\": 2}"}</tool_call>'
        '<tool_call>{"name": "b", "parameters": {"y": 3}}</tool_call>'
    )
    assert calls[0].parsed_arguments() == {"x": 2}
    assert calls[1].parsed_arguments() == {"y": 3}


def test_bare_call_counts_only_for_an_offered_tool() -> None:
    raw = '{"name": "calculator", "arguments": {"expression": "17 * 23"}}'
    assert parse_tool_calls(raw) == (raw, ())
    assert parse_tool_calls(raw, tool_names={"search"}) == (raw, ())
    text, (call,) = parse_tool_calls(raw, tool_names={"calculator"})
    assert text == "" and call.parsed_arguments() == {"expression": "17 * 23"}


def test_bare_call_in_a_fence_with_text() -> None:
    raw = ('I will use the tool.\n```json\n{"name": "calculator", "arguments": '
           '{"expression": "1+1"}}\n```')
    text, (call,) = parse_tool_calls(raw, tool_names={"calculator"})
    assert text == "I will use the tool." and call.name == "calculator"


def test_unbalanced_bare_call_is_a_malformed_call() -> None:
    raw = '{"name": "calculator", "arguments": {"expression": "1+1"'
    _, (call,) = parse_tool_calls(raw, tool_names={"calculator"})
    assert call.name == "calculator" and call.arguments == '{"expression": "1+1"'


def test_plain_json_answer_is_not_a_call() -> None:
    raw = 'Here:\n{"name": "Alice", "age": 3}'
    assert parse_tool_calls(raw, tool_names={"calculator"}) == (raw, ())


def test_format_is_the_inverse_of_parse() -> None:
    calls = (ToolCall("a", '{"x": 1}', "call_0"), ToolCall("b", "not json", "call_1"))
    _, back = parse_tool_calls(format_tool_calls(calls))
    assert [(c.name, c.arguments) for c in back] == [(c.name, c.arguments) for c in calls]


def test_offered_tool_names() -> None:
    assert offered_tool_names([CALC, {"name": "flat"}, {"type": "x"}]) == {"calculator", "flat"}


# -- stream gating --------------------------------------------------------------------------


def _stream(pieces: list[str], final: str, stops: tuple[str, ...] = (), tools: bool = False
            ) -> str:
    gate = StreamGate(stops, hold_tool_calls=tools)
    shown = "".join(gate.feed(p) for p in pieces)
    return shown + gate.finish(final)


def test_gate_never_shows_a_stop_string_split_across_pieces() -> None:
    gate = StreamGate(["STOP"])
    shown = [gate.feed(p) for p in ["Hello wor", "ld ST", "OP and more"]]
    assert "".join(shown) == "Hello world"
    assert "S" not in "".join(shown)
    assert gate.finish("Hello world") == ""


def test_gate_chunks_add_up_to_the_final_text() -> None:
    raw = ["I will call it.", "\n<tool", '_call>{"name": "a"', ', "arguments": {}}</tool_call>',
           "\nThen answer."]
    final, _ = parse_tool_calls("".join(raw))
    assert _stream(raw, final, tools=True) == final == "I will call it.\nThen answer."
    bare = ["Sure.\n", "{", '"name": "calculator", "arguments": {}}']
    final, calls = parse_tool_calls("".join(bare), tool_names={"calculator"})
    assert calls and _stream(bare, final, tools=True) == final == "Sure."
    plain = ["  Hi", " there ", " "]
    assert _stream(plain, "Hi there") == "Hi there"


# -- template input and spec errors ----------------------------------------------------------


def test_template_messages_turn_arguments_into_mappings() -> None:
    msgs = [Message("user", "hi"),
            Message("assistant", "", tool_calls=(ToolCall("calculator", '{"e": "1"}', "c1"),)),
            Message("tool", "1", tool_call_id="c1", name="calculator")]
    native = template_messages(msgs, native_tools=True)
    assert native[1]["tool_calls"][0]["function"]["arguments"] == {"e": "1"}
    assert native[2] == {"role": "tool", "content": "1", "name": "calculator",
                         "tool_call_id": "c1"}
    textual = template_messages(msgs, native_tools=False)
    assert "tool_calls" not in textual[1] and "<tool_call>" in textual[1]["content"]


def test_template_messages_refuse_images_and_empty_input() -> None:
    with pytest.raises(ConfigError):
        template_messages([], native_tools=True)
    img = Message("user", ({"type": "image_url", "image_url": {"url": "data:,"}},))
    with pytest.raises(ConfigError, match="image"):
        template_messages([img], native_tools=True)


def test_jinja_renderer_handles_a_chatml_template() -> None:
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                "{% endfor %}{% if tools %}{{ tools[0] | tojson }}{% endif %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    out = render_chat_template(template, [{"role": "user", "content": "héllo"}], [CALC])
    assert out.startswith("<|im_start|>user\nhéllo<|im_end|>\n{\"type\": \"function\"")
    assert out.endswith("<|im_start|>assistant\n")
    with pytest.raises(ConfigError, match="rejected"):
        render_chat_template("{{ raise_exception('no system role') }}", [])


def test_hf_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs a model path"):
        get_backend("hf:")
    # A model that is not there is not installed (exit 3, docs/cli.md), not a usage error.
    with pytest.raises(ModelNotInstalled, match="no model at"):
        get_backend(f"hf:{tmp_path}/nothing-here")
    with pytest.raises(ModelNotInstalled, match="nor in the local Hugging Face cache"):
        get_backend("hf:nobody/no-such-model")  # a hub id is looked up locally, never fetched
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="not a .gguf"):
        get_backend(f"hf:{tmp_path}/notes.txt")
    with pytest.raises(ModelNotInstalled, match="no GGUF file"):
        get_backend(f"hf:{tmp_path}#missing.gguf")


def test_a_corrupt_gguf_is_a_load_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="could not load"):
        get_backend(f"hf:{bad}", BackendOptions(cache_dir=tmp_path / "cache"))
    assert not (tmp_path / "cache" / "models" / "bad").exists()


def test_a_model_without_chat_template_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="no chat template"):
        HFBackend(SimpleNamespace(), SimpleNamespace(chat_template=None), name="base-model")


# -- the real embedded model (slow) -----------------------------------------------------------


@pytest.mark.slow
def test_tool_history_renders_like_transformers(embedded_backend: Any) -> None:
    msgs = template_messages([
        Message("user", "What is 17 * 23? Use the calculator."),
        Message("assistant", "", tool_calls=(ToolCall("calculator", '{"expression": "17 * 23"}',
                                                      "call_1"),)),
        Message("tool", "391", tool_call_id="call_1", name="calculator"),
    ], native_tools=True)
    tok = embedded_backend.tokenizer
    ours = render_chat_template(tok.chat_template, msgs, [CALC])
    theirs = tok.apply_chat_template(msgs, tools=[CALC], add_generation_prompt=True,
                                     tokenize=False)
    assert ours == theirs
    assert '"arguments": {"expression": "17 * 23"}' in ours  # a mapping, not quoted JSON text
    assert "<tool_response>\n391\n</tool_response>" in ours


@pytest.mark.slow
def test_smollm2_loads_and_generates() -> None:
    backend = get_backend("embedded:smollm2")
    try:
        c = backend.complete(Request(messages=[Message("user", "Hi!")], max_tokens=8))
        assert c.text and c.completion_tokens > 0 and c.model == "embedded:smollm2"
        assert not backend.capabilities.tool_calls  # its template has no tools
    finally:
        backend.close()
