"""The image operations behind the visual tools, on decoded PIL images, with their bounds.

Each function takes and returns PIL images (or JSON-safe dicts); arguments out of range raise
``ToolError`` with what is allowed. Pillow and numpy are imported where used.
"""

from __future__ import annotations

import math
from typing import Any

from ..engine.errors import ToolError

MAX_ZOOM = 8.0
MAX_OUTPUT_PIXELS = 16_000_000
MAX_ENHANCE = 10.0
MIN_GRID_STEP = 4
GRID_READABLE_SIDE = 256  # smaller images are enlarged so that grid labels can be read
MAX_BOXES = 20
# The names a colour is reported by: common words, at their CSS values (pillow's ImageColor).
# No "lime": pure (0, 255, 0) is named "green", as people (and easy-VQA) call it.
COLOR_NAMES = ("black", "white", "gray", "silver", "red", "maroon", "brown", "orange",
               "yellow", "olive", "green", "teal", "cyan", "blue", "navy", "purple",
               "magenta", "pink")


def _rgb_like(img: Any) -> Any:
    return img if img.mode in ("RGB", "RGBA", "L") else img.convert("RGBA" if "A" in
                                                                   img.mode else "RGB")


def crop(img: Any, left: int, top: int, right: int, bottom: int) -> Any:
    """The box clamped to the image; an empty box is an error that says the image's size."""
    box = (max(0, left), max(0, top), min(img.width, right), min(img.height, bottom))
    if box[2] <= box[0] or box[3] <= box[1]:
        raise ToolError(f"the box {left},{top},{right},{bottom} holds no pixel of this "
                        f"{img.width}x{img.height} image",
                        hint="left < right and top < bottom, inside the image")
    return img.crop(box)


def zoom(img: Any, factor: float, center: tuple[int, int] | None = None) -> Any:
    """Enlarge by ``factor`` (nearest neighbour: colours stay exact for color_at); around
    ``center``, enlarge that part and keep the size."""
    from PIL import Image  # heavy: Pillow, only for images

    if not 1.0 <= factor <= MAX_ZOOM:
        raise ToolError(f"factor must be between 1 and {MAX_ZOOM:g}, not {factor:g}",
                        hint="to see a part, crop it first or pass x and y")
    if center is None:
        size = (max(1, round(img.width * factor)), max(1, round(img.height * factor)))
        if size[0] * size[1] > MAX_OUTPUT_PIXELS:
            raise ToolError(f"{size[0]}x{size[1]} would be more than {MAX_OUTPUT_PIXELS} "
                            "pixels", hint="crop first, or pass x and y")
        return img.resize(size, Image.Resampling.NEAREST)
    x, y = center
    if not (0 <= x < img.width and 0 <= y < img.height):
        raise ToolError(f"the point {x},{y} is outside this {img.width}x{img.height} image")
    w, h = max(1, round(img.width / factor)), max(1, round(img.height / factor))
    left = min(max(0, x - w // 2), img.width - w)
    top = min(max(0, y - h // 2), img.height - h)
    return img.crop((left, top, left + w, top + h)).resize(img.size, Image.Resampling.NEAREST)


def rotate(img: Any, degrees: float) -> Any:
    """Counter-clockwise; the canvas grows so nothing is cut, new corners are white."""
    from PIL import Image  # heavy: Pillow, only for images

    if not math.isfinite(degrees):
        raise ToolError("degrees must be a finite number")
    src = _rgb_like(img)
    fill = 255 if src.mode == "L" else (255, 255, 255, 0) if src.mode == "RGBA" \
        else (255, 255, 255)
    return src.rotate(degrees, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=fill)


def adjust(img: Any, contrast: float, brightness: float) -> Any:
    from PIL import ImageEnhance  # heavy: Pillow, only for images

    for name, value in (("contrast", contrast), ("brightness", brightness)):
        if not 0.0 <= value <= MAX_ENHANCE:
            raise ToolError(f"{name} must be between 0 and {MAX_ENHANCE:g}, not {value:g}")
    out = ImageEnhance.Contrast(_rgb_like(img)).enhance(contrast)
    return ImageEnhance.Brightness(out).enhance(brightness)


def _nice_step(side: int) -> int:
    """About 8 cells a side, on a 1-2-5 scale (8, 10, 20, 50, ...)."""
    raw = max(MIN_GRID_STEP, side / 8)
    base = 10 ** math.floor(math.log10(raw))
    return max(MIN_GRID_STEP, int(next(m * base for m in (1, 2, 5, 10) if m * base >= raw)))


def grid(img: Any, step: int | None) -> tuple[Any, dict[str, Any]]:
    """Grid lines every ``step`` pixels, labelled with the original image's coordinates in a
    margin (so the labels cover nothing); small images are enlarged to be readable."""
    from PIL import Image, ImageDraw, ImageFont  # heavy: Pillow, only for images

    step = step or _nice_step(max(img.width, img.height))
    if step < MIN_GRID_STEP:
        raise ToolError(f"step must be at least {MIN_GRID_STEP} pixels")
    scale = max(1, min(int(MAX_ZOOM), math.ceil(GRID_READABLE_SIDE / max(img.width,
                                                                        img.height))))
    if img.width * img.height * scale * scale > MAX_OUTPUT_PIXELS:
        scale = 1
    font = ImageFont.load_default()
    label_w = int(font.getlength(str(max(img.width, img.height)))) + 6
    margin_left, margin_top = label_w, 14
    body = _rgb_like(img).convert("RGB").resize((img.width * scale, img.height * scale),
                                                Image.Resampling.NEAREST)
    canvas = Image.new("RGB", (body.width + margin_left, body.height + margin_top), "white")
    canvas.paste(body, (margin_left, margin_top))
    draw = ImageDraw.Draw(canvas)
    line = (255, 0, 255)
    for x in range(0, img.width + 1, step):
        px = margin_left + min(x * scale, body.width - 1)
        draw.line([(px, margin_top), (px, canvas.height - 1)], fill=line)
        draw.text((px + 1, 1), str(x), fill="black", font=font)
    for y in range(0, img.height + 1, step):
        py = margin_top + min(y * scale, body.height - 1)
        draw.line([(margin_left, py), (canvas.width - 1, py)], fill=line)
        draw.text((1, py + 1), str(y), fill="black", font=font)
    return canvas, {"step": step, "scale": scale,
                    "note": "labels are pixel coordinates of the original image"}


def parse_color(text: str) -> tuple[int, int, int]:
    """A colour name (CSS), ``#rgb``/``#rrggbb`` or ``r,g,b``."""
    from PIL import ImageColor  # heavy: Pillow, only for images

    value = text.strip().lower()
    parts = value.split(",")
    try:
        if len(parts) == 3:
            rgb = tuple(int(p) for p in parts)
            if all(0 <= c <= 255 for c in rgb):
                return rgb  # type: ignore[return-value]
            raise ValueError(value)
        got = ImageColor.getrgb(value)
        return got[0], got[1], got[2]
    except ValueError as exc:
        raise ToolError(f"{text!r} is not a colour", hint="a name (" + ", ".join(COLOR_NAMES)
                        + "), #rrggbb or r,g,b") from exc


def nearest_name(rgb: tuple[int, int, int]) -> str:
    return min(COLOR_NAMES, key=lambda n: sum((a - b) ** 2 for a, b in
                                              zip(parse_color(n), rgb, strict=True)))


def color_at(img: Any, x: int, y: int) -> dict[str, Any]:
    if not (0 <= x < img.width and 0 <= y < img.height):
        raise ToolError(f"the point {x},{y} is outside this {img.width}x{img.height} image",
                        hint="x from 0 to width-1, y from 0 to height-1; the grid tool shows "
                             "coordinates")
    r, g, b = img.convert("RGB").getpixel((x, y))
    return {"x": x, "y": y, "rgb": [r, g, b], "hex": f"#{r:02x}{g:02x}{b:02x}",
            "name": nearest_name((r, g, b))}


def _runs(row: Any) -> list[tuple[int, int]]:
    """[start, end) of each run of True in a boolean row."""
    import numpy as np  # heavy: numpy

    padded = np.concatenate(([False], row, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def _label(mask: Any) -> dict[int, list[int]]:
    """Connected components (8-connected) of a boolean mask: root -> [pixels, l, t, r, b].
    Union-find over row runs: a run joins the runs of the row above that touch it."""
    parent: list[int] = []
    runs: list[tuple[int, int, int]] = []  # (y, start, end)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    above: list[int] = []
    for y in range(mask.shape[0]):
        here = []
        for start, end in _runs(mask[y]):
            idx = len(runs)
            runs.append((y, start, end))
            parent.append(idx)
            for j in above:
                _, a0, a1 = runs[j]
                if a0 <= end and start <= a1:  # overlapping or touching diagonally
                    parent[find(j)] = find(idx)
            here.append(idx)
        above = here
    comps: dict[int, list[int]] = {}
    for i, (y, start, end) in enumerate(runs):
        c = comps.setdefault(find(i), [0, start, y, end, y + 1])
        c[0] += end - start
        c[1], c[2] = min(c[1], start), min(c[2], y)
        c[3], c[4] = max(c[3], end), max(c[4], y + 1)
    return comps


def count_regions(img: Any, rgb: tuple[int, int, int], tolerance: int,
                  min_pixels: int) -> dict[str, Any]:
    """How many separate blobs of a colour, their sizes and boxes (largest first)."""
    import numpy as np  # heavy: numpy

    if not 0 <= tolerance <= 442:
        raise ToolError("tolerance must be between 0 and 441 (the RGB cube's diagonal)")
    pixels = np.asarray(img.convert("RGB"), dtype=np.int32)  # (H, W, 3)
    dist2 = ((pixels - np.array(rgb, dtype=np.int32)) ** 2).sum(axis=2)  # (H, W)
    comps = [c for c in _label(dist2 <= tolerance * tolerance).values()
             if c[0] >= max(1, min_pixels)]
    comps.sort(key=lambda c: -c[0])
    return {"color": "#{:02x}{:02x}{:02x}".format(*rgb), "regions": len(comps),
            "pixels": int(sum(c[0] for c in comps)),
            "boxes": [[c[1], c[2], c[3], c[4]] for c in comps[:MAX_BOXES]],
            "sizes": [c[0] for c in comps[:MAX_BOXES]]}
