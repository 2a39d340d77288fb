"""The optional in-process backends: ``llamacpp:`` (llama-cpp-python) and ``vllm:`` (CUDA).

Neither package is installed here (llama-cpp-python compiles for ~14 minutes; the vllm wheel
needs a GPU), so their install/GPU errors are tested for real, the llama.cpp plumbing is tested
against a plain object that returns llama-cpp-python's documented shapes, and the real-library
tests skip with their reason.
"""

from __future__ import annotations

import importlib.util
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

from whetstone.engine.backends import BackendOptions, get_backend
from whetstone.engine.backends.llamacpp import LlamaCppBackend
from whetstone.engine.errors import ConfigError, ModelLoadError, ModelNotInstalled
from whetstone.engine.types import Message, Request

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
HAS_VLLM = importlib.util.find_spec("vllm") is not None

CALC = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate arithmetic.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}

CHATML = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# -- install and GPU errors -------------------------------------------------------------------


def test_llamacpp_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    with pytest.raises(ModelNotInstalled) as err:
        get_backend("llamacpp:/models/qwen.gguf")
    assert "'llamacpp:' needs llama-cpp-python" in err.value.message
    assert err.value.hint == (
        "pip install 'whetstone-engine[llamacpp]'  (builds for ~14 min on 2 cores)")


def test_llamacpp_bad_path_is_a_model_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))
    with pytest.raises(ModelNotInstalled, match="no GGUF file"):
        get_backend("llamacpp:/nowhere/model.gguf")
    with pytest.raises(ConfigError, match="needs a GGUF path"):
        get_backend("llamacpp:")
    with pytest.raises(ConfigError, match="unknown embedded model"):
        get_backend("llamacpp:embedded:nope")


def test_vllm_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ModelNotInstalled) as err:
        get_backend("vllm:Qwen/Qwen2.5-0.5B-Instruct")
    assert "pip install 'whetstone-engine[vllm]'" in err.value.hint


@pytest.mark.skipif(_cuda(), reason="this machine has a CUDA GPU")
def test_vllm_without_a_gpu_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # vllm importable (a bare module stands in when it is not installed), but no GPU
    if not HAS_VLLM:
        monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    with pytest.raises(ModelLoadError) as err:
        get_backend("vllm:Qwen/Qwen2.5-0.5B-Instruct")
    assert "needs a CUDA GPU" in err.value.message and "openai:" in err.value.hint


# -- llama.cpp plumbing against a plain object ------------------------------------------------


class PlainLlama:
    """Follows llama-cpp-python's documented ``Llama`` surface with a word-level 'tokenizer'."""

    BOS, EOS = 1, 2

    def __init__(self, reply: str, delay_s: float = 0.0) -> None:
        self.metadata = {"tokenizer.chat_template": CHATML}
        self.reply = reply
        self.delay_s = delay_s
        self.calls: list[dict[str, Any]] = []

    def token_bos(self) -> int:
        return self.BOS

    def token_eos(self) -> int:
        return self.EOS

    def detokenize(self, tokens: list[int], special: bool = False) -> bytes:
        return {self.BOS: b"<s>", self.EOS: b"<|im_end|>"}[tokens[0]]

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return [10 + i for i, _ in enumerate(text.split())]

    def _pieces(self, stop: list[str], stopping_criteria: Any) -> Iterator[tuple[str, str | None]]:
        words = self.reply.split(" ")
        for i, w in enumerate(words):
            time.sleep(self.delay_s)
            if stopping_criteria([], []):
                yield "", "stop"
                return
            yield (w if i == 0 else " " + w), None
        yield "", "stop"

    def create_completion(self, prompt: list[int], stream: bool = False, **kw: Any) -> Any:
        self.calls.append({"prompt": prompt, "stream": stream, **kw})
        pieces = list(self._pieces(kw["stop"], kw["stopping_criteria"]))
        if stream:
            return iter([{"choices": [{"text": t, "index": 0, "logprobs": None,
                                       "finish_reason": r}]} for t, r in pieces])
        text = "".join(t for t, _ in pieces)
        return {"choices": [{"text": text, "index": 0, "logprobs": None,
                             "finish_reason": pieces[-1][1]}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(pieces) - 1}}


def test_llamacpp_complete_renders_the_template_and_parses_calls() -> None:
    llm = PlainLlama('{"name": "calculator", "arguments": {"expression": "17 * 23"}}')
    backend = LlamaCppBackend(llm, name="plain")
    assert backend.capabilities.tool_calls and not backend.capabilities.white_box
    r = Request(messages=[Message("user", "What is 17 * 23?")], tools=[CALC], max_tokens=20)
    c = backend.complete(r)
    assert c.finish_reason == "tool_calls"
    assert c.tool_calls[0].parsed_arguments() == {"expression": "17 * 23"}
    call = llm.calls[0]
    assert call["stop"] == ["<|im_end|>"] and call["temperature"] == 0.0
    assert c.prompt_tokens == len(call["prompt"]) > 0


def test_llamacpp_stream_adds_up_and_timeout_is_reported() -> None:
    backend = LlamaCppBackend(PlainLlama("one two three four"), name="plain")
    r = Request(messages=[Message("user", "count")], max_tokens=20)
    chunks = list(backend.stream(r))
    final = chunks[-1].completion
    assert final is not None and final.text == "one two three four"
    assert "".join(c.text for c in chunks[:-1]) == final.text
    assert final.completion_tokens == 4
    slow = LlamaCppBackend(PlainLlama("a b c d e f", delay_s=0.05), name="plain")
    c = slow.complete(r.with_(timeout=0.12))
    assert c.finish_reason == "timeout" and c.text.startswith("a") and "f" not in c.text


# -- the real libraries (skipped here) ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed "
                    "(pip install 'whetstone-engine[llamacpp]', ~14 min build)")
def test_llamacpp_embedded_tool_call_and_stream() -> None:
    backend = get_backend("llamacpp:embedded", BackendOptions())
    try:
        r = Request(messages=[Message("user", "What is 17 * 23? Use the calculator.")],
                    tools=[CALC], max_tokens=48)
        c = backend.complete(r)
        assert c.tool_calls and c.tool_calls[0].name == "calculator"
        plain = Request(messages=[Message("user", "Name three colors.")], max_tokens=16)
        chunks = list(backend.stream(plain))
        assert "".join(ch.text for ch in chunks[:-1]) == chunks[-1].completion.text
        assert chunks[-1].completion.text == backend.complete(plain).text
    finally:
        backend.close()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not (HAS_VLLM and _cuda()), reason="needs vLLM and a CUDA GPU")
def test_vllm_batch_on_a_gpu() -> None:
    from whetstone.engine.backends.model_cache import dequantized_packaged

    folder = dequantized_packaged("qwen-0.5b", BackendOptions().cache_dir)
    backend = get_backend(f"vllm:{folder}", BackendOptions(extra={"max_model_len": 4096}))
    try:
        reqs = [Request(messages=[Message("user", f"What is {i} + {i}?")], max_tokens=24)
                for i in range(8)]
        outs = backend.batch_sync(reqs)
        assert len(outs) == 8 and all(o.text and o.completion_tokens > 0 for o in outs)
    finally:
        backend.close()
