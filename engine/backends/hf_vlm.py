"""``hf:<folder>`` for a vision-language model: the processor, the images, the model.

A transformers folder whose ``config.json`` has a ``vision_config`` (LLaVA, Idefics3/SmolVLM,
Qwen2-VL, ...) loads through ``AutoProcessor`` + ``AutoModelForImageTextToText`` and runs on
transformers, white-box like ``@transformers``: the fast ONNX engine is text-only. Generation,
stop strings, streaming and logprobs are ``HFBackend``'s; this module supplies what differs,
the encoding of a request: the conversation rendered by the processor's chat template with an
``{"type": "image"}`` placeholder where each image goes, and the images themselves (data URLs,
local paths or PIL images; see ``whetstone.engine.types.Message``) handed to the processor in order.

Nothing is fetched from the network: a remote image URL is refused with a hint, and so is a
stored ``image_ref`` part (the trace store gives those back as data URLs).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelLoadError
from ..types import Request
from .base import check_local_request
from .chat_template import template_messages
from .local_text import check_prompt_fits


def is_vision_folder(folder: Path) -> bool:
    """Whether a transformers folder holds a vision-language model (its config has a vision
    tower: ``vision_config``), read from ``config.json`` without importing transformers."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # the text loader reports a broken folder with its own error
    return isinstance(data, dict) and isinstance(data.get("vision_config"), dict)


def load_image(payload: Any) -> Any:
    """An image part's payload as an RGB PIL image.

    ``payload``: a PIL image, a ``data:image/...;base64,`` URL, or a local file path.
    """
    from PIL import Image, UnidentifiedImageError  # heavy: Pillow, only for images

    if isinstance(payload, Image.Image):
        return payload.convert("RGB")
    if isinstance(payload, dict):  # a stored image_ref part
        raise ConfigError(
            "a message holds a stored image reference (image_ref), which a model cannot read",
            hint="TraceStore.resolve_images(trace) gives the image back as a data URL")
    if not isinstance(payload, str) or not payload:
        raise ConfigError(f"an image part holds {type(payload).__name__}, not an image",
                          hint="pass a PIL image, a local path or a data:image/... URL")
    if payload.startswith(("http://", "https://")):
        raise ConfigError(
            f"image {payload[:60]!r} is a remote URL; a local model fetches nothing",
            hint="save the image and pass its path, or send it as a data:image/... URL")
    try:
        if payload.startswith("data:"):
            head, _, body = payload.partition(",")
            if not head.endswith(";base64"):
                raise ConfigError("an image data URL must be base64-encoded",
                                  hint="send data:image/png;base64,...")
            data = base64.b64decode(body, validate=True)
            return Image.open(io.BytesIO(data)).convert("RGB")
        path = Path(payload).expanduser()
        if not path.is_file():
            raise ConfigError(f"image part points to {payload!r}, which is not a file",
                              hint="pass an existing image path, a PIL image or a data URL")
        with Image.open(path) as img:
            return img.convert("RGB")
    except (binascii.Error, UnidentifiedImageError, OSError) as exc:
        raise ConfigError(f"an image part could not be read as an image: {exc}",
                          hint="send a PNG or JPEG (a path, a PIL image or a data URL)") \
            from exc


def encode_vision_request(processor: Any, request: Request, native_tools: bool,
                          max_positions: int) -> Any:
    """Model inputs (``input_ids``, ``attention_mask``, ``pixel_values`` ...) for a request.

    The processor's chat template places one image placeholder per image part and the
    processor expands each into the model's image tokens, so the token count checked against
    the context includes the images.
    """
    check_local_request(request)
    msgs = template_messages(request.messages, native_tools, parts=True)
    images = [load_image(p) for m in request.messages for p in m.images]
    prompt = processor.apply_chat_template(
        msgs, tools=[dict(t) for t in request.tools] or None,
        add_generation_prompt=True, tokenize=False,
    )
    # As the processor's own tokenizing path does: the special tokens are the template's,
    # unless it left out a beginning-of-sequence token the tokenizer adds.
    bos = getattr(processor.tokenizer, "bos_token", None)
    try:
        enc = processor(text=prompt, images=images or None, return_tensors="pt",
                        add_special_tokens=not (bos and prompt.startswith(bos)))
    except ValueError as exc:  # e.g. image tokens in the text do not match the images
        raise ConfigError(f"the model's processor rejected the request: {exc}",
                          hint="send images as image parts, not as image tokens in the text") \
            from exc
    check_prompt_fits(int(enc["input_ids"].shape[1]), max_positions)
    return enc


def load_vlm(folder: Path, device: str) -> tuple[Any, Any]:
    """The model (fp32 on CPU, bf16 on a GPU, moved to ``device``) and the processor of a
    vision-language folder; ``HFBackend`` wraps the two."""
    import torch  # heavy: torch
    from transformers import AutoModelForImageTextToText, AutoProcessor  # heavy: transformers

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    try:
        processor = AutoProcessor.from_pretrained(str(folder), local_files_only=True)
        model = AutoModelForImageTextToText.from_pretrained(
            str(folder), local_files_only=True, dtype=dtype)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(
            f"could not load a vision-language model from {folder}: {exc}",
            hint="the folder needs config.json, weights and the processor's files "
                 "(processor_config.json or preprocessor_config.json, the tokenizer)") from exc
    if getattr(processor, "tokenizer", None) is None or not hasattr(processor, "image_processor"):
        raise ModelLoadError(f"{folder} has no image processor and tokenizer pair",
                             hint="save the model's processor (processor.save_pretrained) there")
    model.to(device)
    model.eval()
    return model, processor
