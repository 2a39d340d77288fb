"""``hf:<folder>`` with a vision-language model: a tiny random LLaVA built from a config (see
``vlm_support``) loads through the processor, reads image parts in every form the project
uses, and runs an easy-VQA task end to end through the agent; a text model still refuses
images. The fast tests use a word-level tokenizer; the end-to-end run uses the embedded
model's real tokenizer (``slow``: the first run builds its cached folder)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED_CACHE
from PIL import Image
from vlm_support import IMAGE_TOKENS, save_tiny_vlm, word_tokenizer

from whetstone.engine.backends import get_backend
from whetstone.engine.backends.catalog import describe_models
from whetstone.engine.backends.hf_vlm import is_vision_folder, load_image
from whetstone.engine.errors import ConfigError
from whetstone.engine.types import Message, Request

WORDS = ["user", "assistant", "system", "What", "shape", "colour", "is", "it?", "red", "blue"]


def ask(*parts: Any, **kw: Any) -> Request:
    return Request(messages=[Message("user", tuple(parts))], max_tokens=kw.pop("max_tokens", 6),
                   **kw)


def text(t: str) -> dict[str, str]:
    return {"type": "text", "text": t}


def data_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def vlm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llava")
    return save_tiny_vlm(folder, word_tokenizer(WORDS), image_token="<image>",
                         image_open="", image_close="")


@pytest.fixture(scope="module")
def vlm(vlm_folder: Path) -> Any:
    backend = get_backend(f"hf:{vlm_folder}")
    yield backend
    backend.close()


def test_a_vision_folder_loads_on_transformers_with_vision(vlm: Any, vlm_folder: Path) -> None:
    assert is_vision_folder(vlm_folder)
    assert type(vlm.model).__name__ == "LlavaForConditionalGeneration"
    assert vlm.capabilities.vision and vlm.capabilities.white_box
    assert vlm.spec == f"hf:{vlm_folder}"
    with pytest.raises(ConfigError, match="ONNX engine is text-only") as err:
        get_backend(f"hf:{vlm_folder}@onnx")
    assert "@onnx" in (err.value.hint or "")
    hf_row = next(r for r in describe_models() if r["prefix"] == "hf")
    assert "vision-language" in hf_row["summary"] and "text-only" in hf_row["summary"]


def test_the_image_reaches_the_model(vlm: Any, tmp_path: Path) -> None:
    """The same question about a red and a blue square: the image tokens are counted in the
    prompt, and the pixels change what the model computes (its greedy logprobs)."""
    red, blue = Image.new("RGB", (64, 64), "red"), Image.new("RGB", (64, 64), "blue")
    q = text("What colour is it?")
    plain = vlm.complete(ask(q, logprobs=True))
    on_red = vlm.complete(ask({"type": "image", "image": red}, q, logprobs=True))
    on_blue = vlm.complete(ask({"type": "image", "image": blue}, q, logprobs=True))
    assert on_red.prompt_tokens == plain.prompt_tokens + IMAGE_TOKENS
    assert on_red.logprobs != on_blue.logprobs
    # the same pixels as a data URL and as a file path give the same completion
    path = tmp_path / "red.png"
    red.save(path)
    as_url = vlm.complete(ask({"type": "image_url", "image_url": {"url": data_url(red)}}, q,
                              logprobs=True))
    as_path = vlm.complete(ask({"type": "image", "image": str(path)}, q, logprobs=True))
    assert as_url.logprobs == as_path.logprobs == on_red.logprobs
    two = vlm.complete(ask({"type": "image", "image": red}, {"type": "image", "image": blue}, q))
    assert two.prompt_tokens == plain.prompt_tokens + 2 * IMAGE_TOKENS
    chunks = list(vlm.stream(ask({"type": "image", "image": red}, q, logprobs=True)))
    assert chunks[-1].completion.logprobs == on_red.logprobs


def test_unreadable_images_are_clear_errors(vlm: Any, tmp_path: Path) -> None:
    q = text("What shape is it?")
    cases = [
        ({"type": "image_url", "image_url": {"url": "https://example.org/a.png"}},
         "remote URL"),
        ({"type": "image", "image": str(tmp_path / "missing.png")}, "not a file"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}},
         "could not be read"),
        ({"type": "image_ref", "sha256": "0" * 64, "media_type": "image/png"}, "image_ref"),
    ]
    for part, message in cases:
        with pytest.raises(ConfigError, match=message) as err:
            vlm.complete(ask(part, q))
        assert err.value.hint


def test_load_image_converts_to_rgb(tmp_path: Path) -> None:
    grey = Image.new("L", (5, 7), 128)
    assert load_image(grey).mode == "RGB"
    assert load_image(data_url(grey)).size == (5, 7)


def test_a_text_hf_model_refuses_an_image(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = word_tokenizer(WORDS)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    folder = tmp_path / "tiny-text"
    # a Llama: transformers maps no tokenizer class to it, so the word-level one loads as saved
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1)).save_pretrained(folder)
    tok.save_pretrained(folder)
    assert not is_vision_folder(folder)
    backend = get_backend(f"hf:{folder}@transformers")
    assert not backend.capabilities.vision
    with pytest.raises(ConfigError, match="reads text only") as err:
        backend.complete(ask({"type": "image", "image": Image.new("RGB", (8, 8))},
                             text("What shape is it?")))
    assert "vision-language" in (err.value.hint or "")
    assert backend.complete(ask(text("What shape is it?"))).completion_tokens >= 1


@pytest.mark.slow
def test_an_easy_vqa_task_runs_end_to_end_through_the_agent(tmp_path: Path) -> None:
    """The tiny VLM with Qwen's real tokenizer answers an easy-VQA question through the agent
    loop (the answer is noise); the trace keeps the image once, by content hash."""
    import easy_vqa
    from transformers import AutoTokenizer

    from whetstone.engine.api import Engine
    from whetstone.engine.backends.model_cache import dequantized_packaged
    from whetstone.engine.runtime.state import RunConfig

    tok = AutoTokenizer.from_pretrained(str(dequantized_packaged("qwen-0.5b", SHARED_CACHE)),
                                        local_files_only=True)
    folder = save_tiny_vlm(tmp_path / "tiny-llava-qwen", tok, context=4096)
    questions, _, image_ids = easy_vqa.get_train_questions()
    question, image = questions[0], easy_vqa.get_train_image_paths()[image_ids[0]]
    messages = [{"role": "user", "content": [{"type": "image", "image": image},
                                             {"type": "text", "text": question}]}]
    config = RunConfig(max_steps=3, max_tokens_per_call=24)  # noise: keep each call short
    engine = Engine(model=f"hf:{folder}", library=tmp_path / "lib", create=True, checkpointing=False,
                    config=config)
    try:
        assert engine.backend.capabilities.vision
        trace = engine.agent.run(question, messages=messages)
        stored = engine.traces.get(trace.id)
    finally:
        engine.close()
    assert stored.outcome in ("answered", "horizon", "budget")  # noise, but a finished run
    thinks = [s for s in stored.steps if s.kind == "think"]
    assert len(thinks) >= 2 and all(s.output for s in thinks)
    refs = [p for s in thinks for m in s.input["messages"] if isinstance(m["content"], list)
            for p in m["content"] if p.get("type") == "image_ref"]
    assert len(refs) == len(thinks) and len({r["sha256"] for r in refs}) == 1
    assert engine.traces.images.get(refs[0]["sha256"]) == Path(image).read_bytes()
    assert "base64" not in json.dumps(stored.to_dict())
