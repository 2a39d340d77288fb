"""Tiny random vision-language models built from a config, for tests (nothing downloaded).

No package ships VLM weights, so the tests build a LLaVA (CLIP vision tower + Qwen2 language
model, ~5 M parameters with a real vocabulary) from a config and save it, with a processor
(a CLIP image processor and the given tokenizer), as a transformers folder that ``hf:`` loads.
Its answers are noise: the tests check the plumbing, not the vision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

IMAGE_SIZE, PATCH = 32, 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # CLIP adds a CLS token; "default" drops it

# A processor chat template in the Qwen2-VL style: every content is a list of typed parts and
# an image part becomes the image token, which the processor expands to IMAGE_TOKENS copies.
CHATML_VLM_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}{{ image_open }}{{ image_token }}{{ image_close }}"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN_IMAGE = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")  # Qwen's own tokens


def tiny_llava(tokenizer: Any, image_token: str = QWEN_IMAGE[1], seed: int = 0,
               context: int = 512) -> Any:
    """A random LLaVA whose vocabulary is ``tokenizer``'s; images are 32x32, 16 tokens;
    ``context``: its language model's positions (an agent's prompt needs a few thousand)."""
    import torch
    from transformers import (
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        Qwen2Config,
    )

    torch.manual_seed(seed)
    text = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=context, tie_word_embeddings=True,
                       eos_token_id=tokenizer.eos_token_id)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH)
    cfg = LlavaConfig(text_config=text, vision_config=vision,
                      image_token_index=tokenizer.convert_tokens_to_ids(image_token),
                      image_seq_length=IMAGE_TOKENS, vision_feature_layer=-1,
                      vision_feature_select_strategy="default")
    model = LlavaForConditionalGeneration(cfg).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    return model


def tiny_processor(tokenizer: Any, image_token: str = QWEN_IMAGE[1],
                   image_open: str = QWEN_IMAGE[0], image_close: str = QWEN_IMAGE[2]) -> Any:
    """A LLaVA processor for ``tiny_llava``: images resized and cropped to 32x32, the chat
    template writing ``image_open image_token image_close`` for each image part."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    # the PIL image processor: the default one needs torchvision, which is not installed
    images = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                   crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    template = (CHATML_VLM_TEMPLATE.replace("{{ image_open }}", image_open)
                .replace("{{ image_token }}", image_token)
                .replace("{{ image_close }}", image_close))
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=PATCH,
                          vision_feature_select_strategy="default", image_token=image_token,
                          num_additional_image_tokens=1, chat_template=template)


def save_tiny_vlm(folder: Path, tokenizer: Any, context: int = 512, **tokens: str) -> Path:
    """``tiny_llava`` and ``tiny_processor`` saved as one transformers folder for ``hf:``."""
    image_token = tokens.get("image_token", QWEN_IMAGE[1])
    tiny_llava(tokenizer, image_token, context=context).save_pretrained(folder)
    tiny_processor(tokenizer, **tokens).save_pretrained(folder)
    return folder


def word_tokenizer(words: list[str], image_token: str = "<image>") -> Any:
    """An in-memory word-level tokenizer (fast tests: no model files) with ``image_token``
    as a special token, so the processor's run of image tokens splits into single ones."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = ["<unk>", "<eos>", "<|im_start|>", "<|im_end|>", image_token, *words]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.add_special_tokens([AddedToken(t, special=True) for t in vocab[:5]])
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>",
                                   pad_token="<eos>")
