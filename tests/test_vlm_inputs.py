"""VLM inputs across the faces: an image part sent by the ``openai:`` backend reaches a
``whetstone serve`` server well formed (a data URL of the file's bytes), and the exchange it
records keeps the image by content hash, not inline."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
from PIL import Image
from servers import Servers

from whetstone.engine.backends.registry import get_backend
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.server import create_app
from whetstone.engine.types import Message, Request
from whetstone.library_store.traces import TraceStore


@pytest.mark.integration
def test_an_openai_request_with_an_image_part_is_well_formed(tmp_path: Path) -> None:
    img = tmp_path / "red.png"
    Image.new("RGB", (16, 16), "red").save(img)
    upstream = ScriptedBackend(["a red square"], vision=True)
    store = TraceStore(tmp_path / "traces")
    with Servers() as servers:
        url = servers.start(create_app(upstream, model_name="tiny-vlm", traces=store))
        backend = get_backend(f"openai:tiny-vlm@{url}/v1")
        try:
            reply = backend.complete(Request(messages=[Message("user", (
                {"type": "image", "image": str(img)},
                {"type": "text", "text": "What colour is it?"}))], max_tokens=8))
        finally:
            backend.close()
        deadline = time.monotonic() + 10
        while not store.query() and time.monotonic() < deadline:
            time.sleep(0.05)  # the server writes its traces off the response path
    assert reply.text == "a red square"
    parts = upstream.requests[0].messages[-1].content
    assert isinstance(parts, tuple) and [p["type"] for p in parts] == ["image_url", "text"]
    sent = parts[0]["image_url"]["url"]
    assert sent == "data:image/png;base64," + base64.b64encode(img.read_bytes()).decode()
    assert parts[1]["text"] == "What colour is it?"
    recorded = store.query()
    assert len(recorded) == 1
    line = next(store.root.glob("*.jsonl")).read_text()
    assert "base64" not in line and '"image_ref"' in line
