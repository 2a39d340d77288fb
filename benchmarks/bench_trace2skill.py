"""Trace2Skill map-phase parallelism, measured side by side in one run.

An analyst that takes a fixed time per call (default 1 s), 20 traces: the map phase with 4
workers against the same map run one call at a time, and against the --sequential baseline
(which must also wait for each edit before the next call). Prints the ratios; the target is
about a quarter (0.25) of the one-at-a-time time with 4 workers.

    .venv/bin/python benchmarks/bench_trace2skill.py [--traces 20] [--workers 4] [--delay 1.0]
"""

from __future__ import annotations

import argparse
import json
import time

from whetstone.engine.backends.base import Backend, Capabilities
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.methods.trace2skill.evolver import Trace2Skill, Trace2SkillConfig, draft_skill
from whetstone.engine.types import Completion, Request, Trace


def reply(r: Request) -> str:
    n = sum(map(ord, r.messages[1].text)) % 5
    return json.dumps({"reasoning": "r", "changelog": "c", "edits": [
        {"file": "SKILL.md", "op": "append_to_section", "target_section": "Pitfalls",
         "content": f"- lesson {n}"}]})


class BlockingAnalyst(Backend):
    """Each call holds a thread for ``delay`` s, like a local model behind ``to_thread``."""

    capabilities = Capabilities(max_concurrency=64)

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def complete(self, request: Request) -> Completion:
        time.sleep(self.delay)
        return Completion(text=reply(request), prompt_tokens=100, completion_tokens=30,
                          latency_s=self.delay)


def analyst(delay: float, blocking: bool) -> Backend:
    """An analyst whose every call takes ``delay`` s: awaiting (a remote API) or blocking."""
    return BlockingAnalyst(delay) if blocking else ScriptedBackend(responder=reply, delay_s=delay)


def timed(config: Trace2SkillConfig, traces: list[Trace], backend: Backend) -> float:
    lib = {f"skills/bench/{k}": v for k, v in draft_skill("bench", "Bench skill.").items()}
    start = time.perf_counter()
    Trace2Skill(config).fit(traces, lib, backend)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=20)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--delay", type=float, default=1.0)
    args = ap.parse_args()
    traces = [Trace(f"t{i}", f"task {i}", answer="1", label="2", outcome="answered", score=0.0)
              for i in range(args.traces)]
    print(f"{args.traces} traces, analyst {args.delay:g} s per call")
    for blocking in (False, True):
        kind = "thread-blocking analyst" if blocking else "async analyst"
        one = timed(Trace2SkillConfig("bench", workers=1), traces, analyst(args.delay, blocking))
        par = timed(Trace2SkillConfig("bench", workers=args.workers), traces,
                    analyst(args.delay, blocking))
        seq = timed(Trace2SkillConfig("bench", sequential=True), traces,
                    analyst(args.delay, blocking))
        print(f"[{kind}] map 1 worker {one:6.2f} s | map {args.workers} workers {par:6.2f} s | "
              f"--sequential {seq:6.2f} s")
        print(f"[{kind}] ratio {args.workers} workers / 1 worker = {par / one:.3f} "
              f"(ideal {1 / args.workers:.3f}); vs --sequential = {par / seq:.3f}")


if __name__ == "__main__":
    main()
