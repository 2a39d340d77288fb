"""The program that runs a learned tool inside the sandbox (copied there as ``main.py``).

It reads ``call.json`` (function name, arguments, which arguments are images), opens image
arguments with PIL, imports ``tool.py``, calls the function, and writes ``out/result.json``:
``{"ok": true, "value": ...}`` with returned images saved as ``out/image-N.png`` and given as
``{"$image": "out/image-N.png"}``, or ``{"ok": false, "error": ..., "traceback": ...}``.

It imports nothing of Whetstone's (the sandbox holds only the stdlib, PIL and numpy), and does
its work only when run as a script.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

MAX_ITEMS = 100_000  # elements in a returned array or list, all together


class _Budget:
    def __init__(self, items: int) -> None:
        self.items = items
        self.images = 0

    def spend(self, n: int) -> None:
        self.items -= n
        if self.items < 0:
            raise ValueError(f"the result holds more than {MAX_ITEMS} items; return less")


def _to_json(value: Any, budget: _Budget) -> Any:
    """A JSON-safe copy of ``value``: numpy scalars and arrays become numbers and lists,
    PIL images become PNG files."""
    budget.spend(1)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if "PIL.Image" in sys.modules:  # an image can only come back if the tool used PIL
        from PIL import Image  # heavy: Pillow, only for images

        if isinstance(value, Image.Image):
            name = f"out/image-{budget.images}.png"
            budget.images += 1
            value.save(name, format="PNG")
            return {"$image": name}
    if "numpy" in sys.modules:
        import numpy as np  # heavy: numpy

        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            budget.spend(int(value.size))
            return value.tolist()
    if isinstance(value, dict):
        return {str(k): _to_json(v, budget) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_to_json(v, budget) for v in value]
    raise TypeError(f"the tool returned a {type(value).__name__}, which is not JSON, an image "
                    "or a numpy value")


def _load_tool(function: str) -> Any:
    spec = importlib.util.spec_from_file_location("tool", "tool.py")
    if spec is None or spec.loader is None:
        raise ImportError("cannot load tool.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    args = dict(call["arguments"])
    images: dict[str, str] = call.get("images") or {}
    if images:
        from PIL import Image  # heavy: Pillow, only for images

        Image.MAX_IMAGE_PIXELS = int(call.get("max_pixels") or Image.MAX_IMAGE_PIXELS or 0)
        for name, path in images.items():
            img = Image.open(path)
            img.load()
            args[name] = img
    return args


def main() -> int:
    Path("out").mkdir(exist_ok=True)
    try:
        call = json.loads(Path("call.json").read_text(encoding="utf-8"))
        fn = _load_tool(call["function"])
        value = fn(**_arguments(call))
        result = {"ok": True, "value": _to_json(value, _Budget(MAX_ITEMS))}
    except Exception as exc:  # noqa: BLE001 -- every failure of the tool is its result
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc(limit=-8)}
    # A new file renamed into place: whatever the tool left at out/result.json (a FIFO that
    # would block the write, a link) is replaced, not written through.
    tmp = "out/.result.tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(result))
    os.replace(tmp, "out/result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
