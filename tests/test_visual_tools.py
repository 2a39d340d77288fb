"""The built-in visual tools on generated images and on easy-VQA's shape images."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from whetstone.tools.base import Toolbox
from whetstone.tools.images import ImageFiles
from whetstone.tools.visual import VISUAL_TOOL_NAMES, visual_tools
from whetstone.tools.visual_ops import nearest_name


@pytest.fixture
def scene(tmp_path: Path) -> tuple[Toolbox, Path]:
    """120x80 white, two red squares, one blue circle, a green pixel at (5, 70)."""
    img = Image.new("RGB", (120, 80), "white")
    draw = ImageDraw.Draw(img)
    draw.rectangle((10, 10, 29, 29), fill=(255, 0, 0))
    draw.rectangle((60, 10, 69, 19), fill=(255, 0, 0))
    draw.ellipse((80, 40, 109, 69), fill=(0, 0, 255))
    img.putpixel((5, 70), (0, 128, 0))
    src = tmp_path / "task"
    src.mkdir()
    path = src / "scene.png"
    img.save(path)
    return Toolbox.of(visual_tools(ImageFiles(tmp_path / "out", (src,)))), path


def call(box: Toolbox, name: str, **args: Any) -> dict[str, Any]:
    res = box.call(name, args)
    assert res.ok, res.error
    return json.loads(res.output)


def test_crop_and_zoom_chain(scene: tuple[Toolbox, Path]) -> None:
    box, path = scene
    part = call(box, "crop", image=str(path), left=5, top=5, right=35, bottom=35)
    assert (part["width"], part["height"]) == (30, 30)
    assert Image.open(part["image"]).getpixel((15, 15)) == (255, 0, 0)
    big = call(box, "zoom", image=part["image"], factor=4)
    assert (big["width"], big["height"]) == (120, 120)
    assert Image.open(big["image"]).getpixel((2, 2)) == (255, 255, 255)  # colours stay exact
    around = call(box, "zoom", image=str(path), factor=4, x=95, y=55)
    assert (around["width"], around["height"]) == (120, 80)
    assert Image.open(around["image"]).getpixel((60, 40)) == (0, 0, 255)
    clamped = call(box, "crop", image=str(path), left=-10, top=-10, right=500, bottom=500)
    assert (clamped["width"], clamped["height"]) == (120, 80)


def test_rotate_adjust_and_grid(scene: tuple[Toolbox, Path]) -> None:
    box, path = scene
    turned = call(box, "rotate", image=str(path), degrees=90)
    assert (turned["width"], turned["height"]) == (80, 120)
    assert Image.open(turned["image"]).getpixel((15, 100)) == (255, 0, 0)
    flat = call(box, "adjust", image=str(path), contrast=0)
    assert len(Image.open(flat["image"]).getcolors() or []) == 1  # contrast 0: one grey
    dark = call(box, "adjust", image=str(path), brightness=0.5)
    assert Image.open(dark["image"]).getpixel((0, 0))[0] < 140
    g = call(box, "grid", image=str(path), step=20)
    assert g["step"] == 20 and g["scale"] == 3
    grid_img = Image.open(g["image"]).convert("RGB")
    assert grid_img.width > 120 * 3 and (255, 0, 255) in {c for _, c in grid_img.getcolors(10**6)}


def test_color_at_and_count_regions(scene: tuple[Toolbox, Path]) -> None:
    box, path = scene
    assert call(box, "color_at", image=str(path), x=5, y=70) == {
        "x": 5, "y": 70, "rgb": [0, 128, 0], "hex": "#008000", "name": "green"}
    red = call(box, "count_regions", image=str(path), color="red")
    assert red["regions"] == 2 and red["pixels"] == 400 + 100
    assert red["boxes"] == [[10, 10, 30, 30], [60, 10, 70, 20]]
    blue = call(box, "count_regions", image=str(path), color="#0000ff", tolerance=0)
    assert blue["regions"] == 1
    assert call(box, "count_regions", image=str(path), color="0,128,0",
                min_pixels=1)["regions"] == 1
    assert call(box, "count_regions", image=str(path), color="green")["regions"] == 0


def test_bad_inputs_are_observations(scene: tuple[Toolbox, Path], tmp_path: Path) -> None:
    box, path = scene
    errors = {
        "crop": {"image": str(path), "left": 50, "top": 0, "right": 10, "bottom": 10},
        "zoom": {"image": str(path), "factor": 100},
        "color_at": {"image": str(path), "x": 500, "y": 0},
        "count_regions": {"image": str(path), "color": "not-a-colour"},
        "adjust": {"image": str(path), "contrast": -1},
        "rotate": {"image": str(path), "degrees": "x"},
        "grid": {"image": str(path), "step": 1},
    }
    for name, args in errors.items():
        res = box.call(name, args)
        assert res.error and not res.output, (name, res)
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(path.read_bytes())
    assert "not in a folder tools may read" in (box.call("zoom", {"image": str(outside)}).error
                                                 or "")
    text = path.parent / "notes.png"
    text.write_text("not an image")
    assert "is not a PNG, JPEG" in (box.call("zoom", {"image": str(text)}).error or "")
    eps = path.parent / "x.eps"  # pillow would start Ghostscript for this one
    eps.write_text("%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n")
    assert "is not a PNG, JPEG" in (box.call("zoom", {"image": str(eps)}).error or "")
    huge = path.parent / "huge.png"
    Image.new("1", (10_000, 5_000)).save(huge)
    assert "more than" in (box.call("color_at", {"image": str(huge), "x": 0, "y": 0}).error
                           or "")


def test_easy_vqa_shapes(tmp_path: Path) -> None:
    easy_vqa = pytest.importorskip("easy_vqa")
    paths = easy_vqa.get_train_image_paths()
    questions, answers, image_ids = easy_vqa.get_train_questions()
    colour_of = {}
    for q, a, i in zip(questions, answers, image_ids, strict=True):
        if q == "what color is the shape?":
            colour_of.setdefault(i, a)
    box = Toolbox.of(visual_tools(ImageFiles(tmp_path / "out", (Path(paths[0]).parent,))))
    checked = 0
    for image_id, colour in list(colour_of.items())[:40]:
        # easy-VQA draws "green" as pure (0, 255, 0), which CSS calls lime.
        css = "lime" if colour == "green" else colour
        found = call(box, "count_regions", image=paths[image_id], color=css, tolerance=10)
        assert found["regions"] == 1, (image_id, colour, found)
        left, top, right, bottom = found["boxes"][0]
        centre = call(box, "color_at", image=paths[image_id], x=(left + right) // 2,
                      y=(top + bottom) // 2)
        assert centre["name"] == colour, (image_id, centre)
        checked += 1
    assert checked == 40


def test_names_and_palette() -> None:
    assert VISUAL_TOOL_NAMES == ("crop", "zoom", "rotate", "adjust", "grid", "color_at",
                                 "count_regions")
    assert nearest_name((250, 10, 10)) == "red" and nearest_name((0, 128, 128)) == "teal"
