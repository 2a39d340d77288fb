"""Built-in visual tools (pillow): crop, zoom, rotate, adjust (contrast/brightness), grid
overlay with coordinates, colour at a point, count regions of a colour.

Inputs and outputs are JSON; images are file paths: inputs checked by ``ImageFiles`` (allowed
folders only), outputs written there as PNG files named by their hash.

Why these run in-process and not in the sandbox: no code from a model runs here, only fixed
pillow calls with checked, bounded numbers (crop boxes clamped, zoom at most 8x and 16 Mpx out,
a grid step of at least 4 px). What remains is decoding the input image, the same decoding the
runtime already does to show that image to a VLM; it is narrowed to PNG/JPEG/GIF/BMP/WEBP
(pillow's EPS plugin would start Ghostscript, and exotic decoders are where pillow's CVEs
cluster), and the pixel count is checked from the header before any pixel is decoded. A
sandboxed call costs a process start and ~0.1-0.3 s (benchmarks/bench_sandbox.py) for no gain.
Learned tools, which are code, always run in the sandbox.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any

from ..engine.errors import ToolError
from ..engine.types import ToolSpec
from .base import Tool, ToolResult
from .images import MAX_IMAGE_PIXELS, ImageFiles
from .visual_ops import (
    COLOR_NAMES,
    adjust,
    color_at,
    count_regions,
    crop,
    grid,
    parse_color,
    rotate,
    zoom,
)

DECODE_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")
_IMAGE = {"type": "string", "description": "path of the image (from the task or an earlier "
                                           "tool result)"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}


def open_image(path_arg: Any, images: ImageFiles) -> Any:
    """Decode an allowed image file with a narrowed set of decoders and a size check made
    from the header, before any pixel is decoded."""
    from PIL import Image  # heavy: Pillow, only for images

    path = images.resolve_input(path_arg)
    try:
        img = Image.open(path, formats=DECODE_FORMATS)
    except (OSError, Image.UnidentifiedImageError) as exc:
        raise ToolError(f"{path_arg} is not a PNG, JPEG, GIF, BMP or WEBP image") from exc
    if img.width * img.height > MAX_IMAGE_PIXELS:
        raise ToolError(f"{path_arg} is {img.width}x{img.height}: more than "
                        f"{MAX_IMAGE_PIXELS} pixels", hint="crop a smaller image first")
    img.load()
    return img


def _save(img: Any, images: ImageFiles) -> dict[str, Any]:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    path = images.store_png(buf.getvalue())
    return {"image": str(path), "width": img.width, "height": img.height}


def _spec(name: str, description: str, props: Mapping[str, Any],
          required: tuple[str, ...]) -> ToolSpec:
    return ToolSpec(name=name, description=description,
                    parameters={"type": "object", "properties": dict(props),
                                "required": list(required)},
                    source=f"builtin:{name}")


def _num(args: Mapping[str, Any], key: str, default: float | None = None) -> float:
    value = args.get(key, default)
    if value is None:
        raise ToolError(f"missing {key!r}")
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise ToolError(f"{key!r} must be a number, not {value!r}") from exc


def _int(args: Mapping[str, Any], key: str, default: int | None = None) -> int:
    return round(_num(args, key, default))


Op = Callable[[Mapping[str, Any], Any], tuple[Any, dict[str, Any]]]


def _crop(a: Mapping[str, Any], img: Any) -> tuple[Any, dict[str, Any]]:
    return crop(img, _int(a, "left"), _int(a, "top"), _int(a, "right"), _int(a, "bottom")), {}


def _zoom(a: Mapping[str, Any], img: Any) -> tuple[Any, dict[str, Any]]:
    x, y = a.get("x"), a.get("y")
    center = None if x is None or y is None else (_int(a, "x"), _int(a, "y"))
    return zoom(img, _num(a, "factor", 2.0), center), {}


def _rotate(a: Mapping[str, Any], img: Any) -> tuple[Any, dict[str, Any]]:
    return rotate(img, _num(a, "degrees")), {}


def _adjust(a: Mapping[str, Any], img: Any) -> tuple[Any, dict[str, Any]]:
    return adjust(img, _num(a, "contrast", 1.0), _num(a, "brightness", 1.0)), {}


def _grid(a: Mapping[str, Any], img: Any) -> tuple[Any, dict[str, Any]]:
    step = a.get("step")
    out, info = grid(img, None if step is None else _int(a, "step"))
    return out, info


def _color_at(a: Mapping[str, Any], img: Any) -> tuple[None, dict[str, Any]]:
    return None, color_at(img, _int(a, "x"), _int(a, "y"))


def _count(a: Mapping[str, Any], img: Any) -> tuple[None, dict[str, Any]]:
    color = a.get("color")
    if not isinstance(color, str):
        raise ToolError("'color' must be a colour name or #rrggbb",
                        hint=f"names: {', '.join(COLOR_NAMES)}")
    return None, count_regions(img, parse_color(color), _int(a, "tolerance", 60),
                               _int(a, "min_pixels", 4))


_TOOLS: dict[str, tuple[str, dict[str, Any], tuple[str, ...], Op]] = {
    "crop": (("Cut out the box left,top,right,bottom (pixels; 0,0 is the top-left corner) "
             "and return it as a new image."),
             {"image": _IMAGE, "left": _INT, "top": _INT, "right": _INT, "bottom": _INT},
             ("image", "left", "top", "right", "bottom"), _crop),
    "zoom": (("Enlarge an image by a factor (up to 8). With x and y, enlarge the part around "
             "that point instead, keeping the image's size."),
             {"image": _IMAGE, "factor": {**_NUM, "default": 2.0}, "x": _INT, "y": _INT},
             ("image",), _zoom),
    "rotate": ("Rotate an image counter-clockwise by some degrees (the canvas grows to fit).",
               {"image": _IMAGE, "degrees": _NUM}, ("image", "degrees"), _rotate),
    "adjust": ("Change contrast and brightness (1 keeps them, 2 doubles, 0.5 halves).",
               {"image": _IMAGE, "contrast": {**_NUM, "default": 1.0},
                "brightness": {**_NUM, "default": 1.0}}, ("image",), _adjust),
    "grid": (("Draw a labelled grid over an image, to read off pixel coordinates for crop, "
             "zoom and color_at. step: pixels between lines (default: about 8 cells a side)."),
             {"image": _IMAGE, "step": _INT}, ("image",), _grid),
    "color_at": ("The colour of the pixel at x,y: RGB, hex and the nearest colour name.",
                 {"image": _IMAGE, "x": _INT, "y": _INT}, ("image", "x", "y"), _color_at),
    "count_regions": (("Count the separate regions (connected blobs) of one colour, with "
                      "their bounding boxes. color: a name or #rrggbb; tolerance: how far a "
                      "pixel may be from it (0-441); min_pixels: smaller blobs are ignored."),
                      {"image": _IMAGE, "color": {"type": "string"},
                       "tolerance": {**_INT, "default": 60},
                       "min_pixels": {**_INT, "default": 4}},
                      ("image", "color"), _count),
}
VISUAL_TOOL_NAMES = tuple(_TOOLS)


def _make(name: str, images: ImageFiles) -> Tool:
    description, props, required, op = _TOOLS[name]

    def run(args: Mapping[str, Any]) -> ToolResult:
        img = open_image(args.get("image"), images)
        try:
            out, info = op(args, img)
        except ValueError as exc:  # pillow's own refusals (a bad mode, an empty box)
            raise ToolError(str(exc)) from exc
        meta: dict[str, Any] = {}
        if out is not None:
            saved = _save(out, images)
            meta["images"] = [saved["image"]]
            info = {**saved, **info}
        return ToolResult(json.dumps(info), metadata=meta)

    return Tool(_spec(name, description, props, required), run)


def visual_tools(images: ImageFiles, names: tuple[str, ...] = VISUAL_TOOL_NAMES) -> list[Tool]:
    """The built-in visual tools, reading images under ``images.roots`` and writing to
    ``images.out_dir``."""
    unknown = [n for n in names if n not in _TOOLS]
    if unknown:
        raise ToolError(f"unknown visual tool(s): {', '.join(unknown)}",
                        hint=f"visual tools: {', '.join(VISUAL_TOOL_NAMES)}")
    return [_make(n, images) for n in names]
