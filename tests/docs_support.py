"""What the docs tests (tests/test_docs_blocks.py) put in place of what CI cannot have: a model
(every spec resolves to a ``scripted:`` double that answers the prompts the docs' commands
send), an embedding model for evidence corpora (a hashed bag of words, so `corpus add
--tasks halueval` takes seconds, not a quarter of an hour on 2 cores) and the BIG-bench
download (a small sdist in the real one's layout). Nothing of Whetstone's own code is
replaced. ``install`` puts them in place in this process; a server the docs start runs
through ``python tests/docs_support.py ARGS...``, which installs them and runs the CLI.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from whetstone.engine.types import Request

REPO = Path(__file__).resolve().parent.parent
INTERRUPT = "interrupt this run"  # a task the fake model stops at, once (Ctrl-C)
_interrupted: set[str] = set()


def fake_model(request: Request) -> str:
    """A model for the docs' commands: MARCH's proposer and checker get replies in their
    formats, a code task gets a function, anything else a final answer."""
    text = "\n".join(m.text for m in request.messages)
    last = request.messages[-1].text if request.messages else ""
    if INTERRUPT in text and INTERRUPT not in _interrupted:
        _interrupted.add(INTERRUPT)
        raise KeyboardInterrupt
    if "Break the answer below into its atomic facts" in last:
        return "- Question: In what city is the Oberoi Group based? [Answer: Mumbai]"
    if "Answer each numbered question using only the evidence" in last:
        return "1. Evidence: The Oberoi Group is based in Mumbai. [Answer: Mumbai]"
    if "def add" in text:
        return "Final Answer:\n```python\ndef add(a, b):\n    return a + b\n```"
    numbers = re.findall(r"\d+", last)
    return f"Final Answer: {numbers[-1] if numbers else 42}"


class HashEmbedder:
    """Texts -> L2-normalised hashed bags of words (64 dims): the corpus embedder's
    contract, at no cost."""

    name = "docs-test-hash-64"
    dim = 64

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.clip(norms, 1e-9, None)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


def bigbench_sdist(path: Path) -> str:
    """A small sdist in bigbench-1.0.0's layout holding logical_deduction/three_objects (the
    README's example task); its sha256."""
    examples = [{"input": f"Three books sit on a shelf. Book {i} is left of the others. "
                          "Which book is leftmost?",
                 "target_scores": {f"Book {i}": 1, "Book 0": 0 if i else 1, "Book 9": 0}}
                for i in range(1, 30)]
    task = {"name": "logical_deduction", "description": "Order three objects.",
            "keywords": ["multiple choice"], "metrics": ["multiple_choice_grade"],
            "preferred_score": "multiple_choice_grade", "append_choices_to_input": False,
            "examples": examples}
    top = "bigbench-1.0.0"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (
                (f"{top}/bigbench/benchmark_tasks/logical_deduction/three_objects/task.json",
                 json.dumps(task).encode()), (f"{top}/setup.py", b"x=1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def install(monkeypatch: Any, scratch: Path) -> None:
    """The fakes above, in this process (``monkeypatch``: pytest's, or ``_Patch``)."""
    from whetstone.engine.backends import registry
    from whetstone.engine.backends.scripted import ScriptedBackend
    from whetstone.engine.evaluation import bigbench
    from whetstone.library_store import embeddings

    original = registry.BackendRegistry.create

    def create(self: Any, spec: str, options: Any = None) -> Any:
        if spec.strip().startswith("scripted"):
            return original(self, spec, options)
        backend = ScriptedBackend(responder=fake_model)
        backend.spec = spec.strip()
        return backend

    monkeypatch.setattr(registry.BackendRegistry, "create", create)
    monkeypatch.setattr(embeddings, "query_embedder", lambda *a, **k: HashEmbedder())
    scratch.mkdir(parents=True, exist_ok=True)
    sdist = scratch / "bigbench-1.0.0.tar.gz"
    digest = bigbench_sdist(sdist)

    def download(dest: Path, **_: Any) -> Path:
        Path(dest).mkdir(parents=True, exist_ok=True)
        return Path(sdist)

    monkeypatch.setattr(bigbench, "download_sdist", download)
    monkeypatch.setattr(bigbench, "SDIST_SHA256", digest)
    # The shared test cache must not get the small sdist's tasks: a private data folder.
    data = scratch / "bigbench-1.0.0"
    monkeypatch.setattr(bigbench, "data_dir", lambda cache=None: data)


class _Patch:
    """``monkeypatch.setattr`` for a process that is not a test."""

    @staticmethod
    def setattr(target: Any, name: str, value: Any) -> None:
        setattr(target, name, value)


if __name__ == "__main__":  # python tests/docs_support.py SCRATCH ARGS...: the CLI, faked
    sys.path.insert(0, str(REPO))  # this checkout's whetstone, as the tests import it
    install(_Patch(), Path(sys.argv[1]))
    from whetstone.cli import cli

    cli(args=sys.argv[2:], prog_name="whetstone")
