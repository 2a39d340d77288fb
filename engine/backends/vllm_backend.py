"""``vllm:<model>`` — an in-process ``vllm.LLM`` for high-throughput batches on a CUDA GPU.

``<model>`` is a local folder or a hub id already in the local Hugging Face cache (nothing is
downloaded). ``batch`` hands every request to vLLM in one ``LLM.chat`` call so its scheduler
batches them; ``complete`` is a batch of one. Tool calls are parsed from the generated text like
the other local backends. For a vLLM server, use ``openai:<model>@<url>`` instead.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..errors import BackendError, ConfigError, ModelLoadError, ModelNotInstalled
from ..types import Completion, Request
from .base import Backend, Capabilities, check_local_request
from .hf import resolve_local_model
from .registry import BackendOptions
from .toolcall_format import offered_tool_names, parse_tool_calls

INSTALL_HINT = "pip install 'whetstone-engine[vllm]'  (needs a CUDA GPU)"


def import_vllm() -> Any:
    """The ``vllm`` module, or ``ModelNotInstalled`` saying how to get it."""
    try:
        import vllm  # optional extra: vllm
    except ImportError as exc:
        raise ModelNotInstalled("'vllm:' needs vLLM, which is not installed",
                                hint=INSTALL_HINT) from exc
    return vllm


def require_cuda() -> None:
    """``ModelLoadError`` unless torch sees a CUDA GPU (the vllm wheel runs on GPUs only)."""
    import torch  # heavy: torch

    if not torch.cuda.is_available():
        raise ModelLoadError(
            "'vllm:' needs a CUDA GPU, and torch sees none on this machine",
            hint="on CPU use embedded, hf:<path> or llamacpp:<file.gguf>; or run `vllm serve` "
                 "on a GPU machine and use openai:<model>@<url>",
        )


class VLLMBackend(Backend):
    """A ``vllm.LLM`` behind the backend contract."""

    def __init__(self, llm: Any, *, name: str = "", max_concurrency: int = 256) -> None:
        self.llm = llm
        self.name = name
        self.spec = f"vllm:{name}"
        self._lock = threading.Lock()  # LLM is not thread-safe; batches queue behind each other
        self.capabilities = Capabilities(logprobs=True, tool_calls=True,
                                         max_concurrency=max_concurrency)

    def _sampling(self, request: Request) -> Any:
        check_local_request(request)
        from vllm import SamplingParams  # optional extra: vllm

        return SamplingParams(
            max_tokens=request.max_tokens,
            temperature=max(0.0, request.temperature),
            top_p=request.top_p if request.temperature > 0 else 1.0,
            stop=list(request.stop) or None,
            seed=request.seed,
            logprobs=0 if request.logprobs else None,  # 0: only the sampled token's logprob
        )

    def _run(self, requests: Sequence[Request]) -> list[Completion]:
        """One ``LLM.chat`` call for all requests (grouped by tool list, which chat takes once)."""
        results: list[Completion | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(repr(r.tools), []).append(i)
        for idx in groups.values():
            tools = [dict(t) for t in requests[idx[0]].tools] or None
            convs = [[m.to_dict() for m in requests[i].messages] for i in idx]
            params = [self._sampling(requests[i]) for i in idx]
            start = time.perf_counter()
            try:
                with self._lock:
                    outs = self.llm.chat(convs, sampling_params=params, tools=tools,
                                         use_tqdm=False)
            except (ValueError, RuntimeError) as exc:
                raise BackendError(f"vLLM failed: {exc}",
                                   hint="check the request against the model's limits") from exc
            latency = time.perf_counter() - start
            for i, out in zip(idx, outs, strict=False):
                results[i] = self._completion(requests[i], out, latency)
        return [c for c in results if c is not None]

    def _completion(self, request: Request, out: Any, latency: float) -> Completion:
        gen = out.outputs[0]
        finish = "length" if gen.finish_reason == "length" else "stop"
        if request.tools:
            text, calls = parse_tool_calls(gen.text, lambda i: f"call_{uuid.uuid4().hex[:12]}",
                                           offered_tool_names(request.tools))
        else:
            text, calls = gen.text.strip(), ()
        if calls and finish == "stop":
            finish = "tool_calls"
        logprobs = None
        if request.logprobs and gen.logprobs:
            # one {token_id: Logprob} per generated token; the sampled token is always present
            logprobs = tuple(float(step[tok].logprob) for step, tok in
                             zip(gen.logprobs, gen.token_ids, strict=False))
        return Completion(
            text=text, finish_reason=finish, prompt_tokens=len(out.prompt_token_ids or ()),
            completion_tokens=len(gen.token_ids), latency_s=latency, tool_calls=calls,
            logprobs=logprobs, model=self.name,
        )

    def complete(self, request: Request) -> Completion:
        return self._run([request])[0]

    async def batch(self, requests: Sequence[Request], concurrency: int | None = None
                    ) -> list[Completion]:
        """All requests in one vLLM call: its scheduler does the batching."""
        return await asyncio.to_thread(self._run, list(requests))

    def count_tokens(self, text: str) -> int:
        if not text:
            return 0
        return len(self.llm.get_tokenizer().encode(text, add_special_tokens=False))

    def close(self) -> None:
        self.llm = None


def make_vllm(arg: str, options: BackendOptions) -> VLLMBackend:
    """``vllm:<folder or cached hub id>``. ``options.extra`` is passed on to ``vllm.LLM``
    (e.g. ``gpu_memory_utilization``, ``max_model_len``, ``tensor_parallel_size``)."""
    vllm = import_vllm()
    require_cuda()
    if not arg.strip():
        raise ConfigError("vllm: needs a model", hint="e.g. vllm:/models/qwen2.5-0.5b-instruct")

    path = resolve_local_model(arg.strip())
    try:
        llm = vllm.LLM(model=str(path), **dict(options.extra))
    except (ValueError, RuntimeError, OSError) as exc:
        raise ModelLoadError(f"vLLM could not load {path}: {exc}",
                             hint="check the model folder and the GPU's free memory") from exc
    return VLLMBackend(llm, name=arg.strip())
