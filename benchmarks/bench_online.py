"""Learning in production, measured on a replay (issue 48): a frozen server and a learning
server answer the same stream of questions side by side, a feedback client scores every reply
against the task's label as a user's thumbs-up would, and ``whetstone learn`` beside the
learning server turns that feedback into canaries, promotions and rollbacks.

    .venv/bin/python benchmarks/bench_online.py [--model embedded] [--stage env_ledger]
        [--requests 1500] [--method memory] [--analyst SPEC] [--every 50] [--share 0.25]
        [--min-scored 50]
        [-j 2] [--no-adversarial]
    .venv/bin/python benchmarks/bench_online.py --render     # the page section from the saved run

Processes, as a team would run them: one model server (``whetstone serve --no-library
--no-record`` on ``--model``; ``--model scripted``: a scripted model of the stage for tests,
which answers a third of the questions right, all when shown worked examples), and in
front of it two ``whetstone serve`` replicas with ``--methods METHOD``, each on its own copy
of an empty library: the frozen one, and the learning one with ``whetstone learn --method
METHOD`` beside it (the stage's MCP servers as the gate's tools, scorer ``value``).

The client is a team's app: an OpenAI client through each server, the stage's MCP tools as its
functions, running the calls itself through Whetstone's MCP client until the model answers
(at most ``--max-turns`` replies that call tools). It asks the stage's questions in a seeded order, each once,
``-j`` conversations at a time, through eight API keys; every final reply is scored against
the task's label (scorer ``value``) and the score and the label are sent to ``/v1/feedback``.

A second replay (skip it with ``--no-adversarial``) runs another learning server on a fresh
library with the same stream, where one key (``--adversary-share`` of the requests) up-votes
every wrong answer with its answer as the label and down-votes the right ones: no canary whose
true live accuracy (the client's own scores) is below the current version's may be promoted.

Written: ``benchmarks/results/online.json`` (every request, the learner's steps, the figures,
the page section) and ``docs/online-accuracy.png`` (served accuracy per window of
``--window`` requests, both servers, promotions marked). Printed: when the first promotion
came, the last 300 requests' accuracy of each server with intervals and their paired
difference, the windows where the learning server fell below the frozen one, and the
adversarial replay's canaries with their true differences.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_middleware import free_port, start
from online_report import analyse, markdown, plot, summary_lines

SYSTEM = ("You answer the team's questions about its environment. Use the tools to look "
          "things up, then answer with the value alone.")
CONVERSATION_HEADER = "X-Whetstone-Conversation"
RESULT = REPO / "benchmarks" / "results" / "online.json"
PNG = REPO / "docs" / "online-accuracy.png"


def load_stage(stage: str, tasks: Path | None) -> tuple[list[dict[str, Any]], Path]:
    """The stage's task records and its MCP config."""
    folder = REPO / "benchmarks" / "fixtures" / stage
    path = tasks or folder / "tasks.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records, folder / "servers.json"


def stream(records: list[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` questions in a seeded order, each once (``n`` beyond the stage: an error)."""
    if n > len(records):
        raise SystemExit(f"--requests {n} is more than the stage's {len(records)} questions")
    order = list(records)
    random.Random(seed).shuffle(order)
    return order[:n]


# --- the scripted model of a stage (--model scripted) ------------------------------------------

def serve_toy(port: int, tasks: Path) -> None:
    """A model that knows the stage's labels: it looks around with a tool first when it has
    tools, then answers a third of the questions right, and every one when the system message
    shows it worked examples (what learning can gain: a test double, not a measurement)."""
    import uvicorn

    from whetstone.engine.backends.scripted import ScriptedBackend
    from whetstone.engine.server import create_app

    labels = {}
    for line in tasks.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            labels[" ".join(rec["question"].split())] = rec["expected"]

    def respond(request: Any) -> Any:
        asked = next((m.text for m in request.messages if m.role == "user"), "")
        system = " ".join(m.text for m in request.messages if m.role == "system")
        if request.tools and not any(m.role == "tool" for m in request.messages):
            first = request.tools[0].get("function", request.tools[0])
            return {"tool_calls": [{"name": first["name"], "arguments": {}}]}
        label = labels.get(" ".join(asked.split()))
        third = int(hashlib.sha256(asked.encode()).hexdigest(), 16) % 3
        shown = "worked example" in system.lower()
        if label is not None and (third == 0 or shown):
            return str(label)
        return "I could not find it."

    backend = ScriptedBackend(responder=respond, max_concurrency=64)
    uvicorn.run(create_app(backend, model_name="model"), host="127.0.0.1", port=port,
                log_level="warning")


# --- processes -----------------------------------------------------------------------------------

@dataclass
class Setup:
    tmp: Path
    env: dict[str, str]
    model_spec: str  # what serve and learn take: openai:model@http://127.0.0.1:PORT/v1
    keys: list[str]
    keys_file: Path
    servers_json: Path
    procs: list[subprocess.Popen[str]]


def start_model(args: argparse.Namespace, setup: Setup, tasks: Path) -> None:
    port = free_port()
    if args.model == "scripted":
        cmd = [sys.executable, __file__, "--serve-toy", str(port), "--tasks", str(tasks)]
    else:
        cmd = [sys.executable, "-m", "whetstone", "serve", "--upstream", args.model,
               "--no-library", "--no-record", "--served-name", "model", "--port", str(port),
               "--log-level", "warning", "--upstream-timeout", "900"]
    print(f"starting the model server ({args.model}) …", flush=True)
    setup.procs.append(start(cmd, setup.env, f"http://127.0.0.1:{port}/health",
                             "the model server", log=setup.tmp / "model.log"))
    setup.model_spec = f"openai:model@http://127.0.0.1:{port}/v1"


def start_server(args: argparse.Namespace, setup: Setup, name: str) -> tuple[str, Path]:
    """A ``whetstone serve`` replica on a fresh library; (its base URL, the library)."""
    library = setup.tmp / f"lib-{name}"
    subprocess.run([sys.executable, "-m", "whetstone", "library", "init", "--library",
                    str(library)], cwd=REPO, env=setup.env, check=True, capture_output=True)
    port = free_port()
    setup.procs.append(start(
        [sys.executable, "-m", "whetstone", "serve", "--upstream", setup.model_spec,
         "--library", str(library), "--methods", args.method, "--port", str(port),
         "--api-keys-file", str(setup.keys_file), "--feedback-rate", "0", "--log-level",
         "warning", "--upstream-timeout", "900", "--max-concurrency", "64"],
        setup.env, f"http://127.0.0.1:{port}/health", f"whetstone serve ({name})",
        log=setup.tmp / f"serve-{name}.log"))
    return f"http://127.0.0.1:{port}", library


def start_learner(args: argparse.Namespace, setup: Setup, library: Path, name: str) -> None:
    log = setup.tmp / f"learn-{name}.log"
    out = open(log, "w")  # noqa: SIM115 - closed with the process
    cmd = [sys.executable, "-m", "whetstone", "learn", "--library", str(library),
           "--model", setup.model_spec, "--method", args.method, "--mcp-config",
           str(setup.servers_json), "--tools", "", "--scorer", "value", "--every",
           str(args.every), "--share", str(args.share), "--min-scored", str(args.min_scored),
           "--min-rollback", str(args.min_rollback), "--max-scored", str(args.max_scored),
           "--poll", "2", "--solver", args.solver, "--seed", str(args.seed), "--limit",
           str(args.limit),
           # The model runs on these cores and keeps them busy: in the idle class the learner
           # would wait for the replay's end; at nice 10 it learns beside it.
           "--no-idle",
           *(["--analyst", args.analyst] if args.analyst else []),
           *[x for o in args.option for x in ("--option", o)]]
    setup.procs.append(subprocess.Popen(cmd, cwd=REPO, env=setup.env, stdout=out,
                                        stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + 600
    while "holds the lease" not in log.read_text(errors="replace"):
        if setup.procs[-1].poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"whetstone learn ({name}) did not start:\n"
                             f"{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)


# --- the client ----------------------------------------------------------------------------------

@dataclass
class Asked:
    replay: str
    server: str
    i: int
    task: str
    kind: str
    key: int
    version: str
    right: float
    turns: int
    started: float
    ended: float
    answer: str
    error: str = ""  # the server refused or failed the reply (scored 0, no feedback sent)


class Client:
    """A team's app (see the module docstring); thread-safe."""

    def __init__(self, setup: Setup, args: argparse.Namespace) -> None:
        from whetstone.tools.base import Toolbox
        from whetstone.tools.mcp_config import load_mcp_config
        from whetstone.tools.toolset import ToolSet

        self.args = args
        self.keys = setup.keys
        self.toolset = ToolSet(load_mcp_config(setup.servers_json))
        self.toolbox = Toolbox.of(self.toolset.tools())
        self.schemas = self.toolbox.schemas()
        self._local = threading.local()

    def _http(self) -> Any:
        import httpx

        if not hasattr(self._local, "http"):
            self._local.http = httpx.Client(timeout=900)
        return self._local.http

    def converse(self, base: str, key: str, conversation: str, question: str
                 ) -> tuple[str, str, str, int, str]:
        """(the final answer, its trace id, the version that served it, tool calls run, the
        error that ended it); a reply that still calls tools after ``--max-turns`` rounds
        answers with its text. A reply the server fails (a conversation whose tool results
        outgrew the model's context: 502) ends the conversation as a team's app would show
        it, with no answer: it scores 0 and gets no feedback."""
        from openai import APIStatusError, OpenAI

        client = OpenAI(base_url=base + "/v1", api_key=key, http_client=self._http(),
                        max_retries=2)
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": question}]
        calls = 0
        for turn in range(self.args.max_turns + 1):
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="model", messages=messages, tools=self.schemas,  # type: ignore
                    temperature=0, max_tokens=self.args.max_tokens,
                    extra_headers={CONVERSATION_HEADER: conversation})
            except APIStatusError as e:
                return "", "", e.response.headers.get("x-whetstone-library-version", ""), \
                    calls, f"{e.status_code}: {e.message}"[:300]
            reply = raw.parse().choices[0].message
            trace, version = raw.headers.get("x-whetstone-trace-id", ""), \
                raw.headers.get("x-whetstone-library-version", "")
            if not reply.tool_calls or turn == self.args.max_turns:
                return reply.content or "", trace, version, calls, ""
            messages.append(reply.model_dump(exclude_none=True))
            for call in reply.tool_calls:
                calls += 1
                result = self.toolbox.call(call.function.name, call.function.arguments or "{}")
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": result.output if result.ok else
                                 f"error: {result.error}"})
        return "", "", "", calls, ""

    def ask(self, replay: str, server: str, base: str, i: int, task: dict[str, Any],
            key_index: int, flip: bool) -> Asked:
        from whetstone.engine.evaluation.scorers import get_scorer
        from whetstone.engine.evaluation.tasks import TaskRecord

        started = time.time()
        key = self.keys[key_index]
        answer, trace, version, calls, error = self.converse(base, key, f"{replay}-{i}",
                                                             task["question"])
        record = TaskRecord(id=task["id"], question=task["question"], expected=task["expected"],
                            scorer="value", metadata=task.get("metadata") or {})
        right = float(get_scorer("value")(answer, record))
        if trace:
            score = 1.0 - right if flip else right
            label = answer if flip and not right else str(task["expected"])
            if flip and right:
                label = None  # a down-vote of a right answer carries no label
            body = {"trace_id": trace, "score": score, **({"label": label} if label else {})}
            self._http().post(base + "/v1/feedback", json=body,
                              headers={"Authorization": f"Bearer {key}"}).raise_for_status()
        return Asked(replay, server, i, task["id"], str((task.get("metadata") or {}).get(
            "kind", "")), key_index, version, right, calls, started, time.time(), answer[:200],
            error)

    def close(self) -> None:
        self.toolset.close()


def replay(client: Client, args: argparse.Namespace, name: str, servers: dict[str, str],
           tasks: list[dict[str, Any]], adversary: bool) -> list[Asked]:
    """Every task to every server, ``-j`` at a time; progress every window."""
    rng = random.Random(args.seed + 1)
    keys = [(0 if adversary and rng.random() < args.adversary_share
             else 1 + i % (len(client.keys) - 1)) for i in range(len(tasks))]
    out: list[Asked] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        for server, base in servers.items():
            got = client.ask(name, server, base, i, tasks[i], keys[i],
                             flip=adversary and keys[i] == 0)
            with lock:
                out.append(got)
        if (i + 1) % args.window == 0:
            print(f"  {name}: {i + 1}/{len(tasks)} requests", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        list(pool.map(one, range(len(tasks))))
    return sorted(out, key=lambda a: (a.i, a.server))


def steps_of(library: Path) -> list[dict[str, Any]]:
    from whetstone.library_store.learning import LearningState
    from whetstone.library_store.store import Library

    return [s.to_dict() for s in LearningState(Library.open(library)).steps()]


def run(args: argparse.Namespace) -> dict[str, Any]:
    records, servers_json = load_stage(args.stage, args.tasks)
    tasks = stream(records, args.requests, args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-online-"))
    env = {**os.environ, "WHETSTONE_HOME": str(tmp / "home"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OPENAI_API_KEY": ""}
    keys = [f"user-{k}-{os.urandom(4).hex()}" for k in range(8)]
    (tmp / "keys.txt").write_text("\n".join(keys) + "\n")
    setup = Setup(tmp, env, "", keys, tmp / "keys.txt", servers_json, [])
    started = time.time()
    client: Client | None = None
    try:
        start_model(args, setup, args.tasks or servers_json.parent / "tasks.jsonl")
        frozen, _ = start_server(args, setup, "frozen")
        learning, lib = start_server(args, setup, "learning")
        start_learner(args, setup, lib, "learning")
        client = Client(setup, args)
        print(f"replay: {len(tasks)} requests to each server", flush=True)
        asked = replay(client, args, "honest", {"frozen": frozen, "learning": learning},
                       tasks, adversary=False)
        steps = {"honest": steps_of(lib)}
        if args.adversarial:
            adv, adv_lib = start_server(args, setup, "adversarial")
            start_learner(args, setup, adv_lib, "adversarial")
            print(f"adversarial replay: {len(tasks)} requests, one key up-voting wrong answers",
                  flush=True)
            asked += replay(client, args, "adversarial", {"learning": adv}, tasks,
                            adversary=True)
            steps["adversarial"] = steps_of(adv_lib)
    finally:
        if client is not None:
            client.close()
        for p in reversed(setup.procs):
            p.terminate()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                if k not in ("render", "serve_toy", "out", "png", "keep")}
    return {"settings": settings, "minutes": round((time.time() - started) / 60, 1),
            "requests": [asdict(a) for a in asked], "steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded",
                    help="The model spec the model server loads; 'scripted': the scripted "
                         "model of the stage (tests).")
    ap.add_argument("--stage", default="env_ledger",
                    help="A folder of benchmarks/fixtures (tasks.jsonl, servers.json).")
    ap.add_argument("--tasks", type=Path, default=None, help="Another tasks.jsonl.")
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--method", default="memory",
                    help="The learner's evolver and the servers' runtime method.")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="An option of the method (whetstone learn --option).")
    ap.add_argument("--analyst", default="",
                    help="The learner's analyst model (default: the served model), e.g. "
                         "embedded:qwen-1.5b, loaded in the learner's own process.")
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--min-scored", type=int, default=50)
    ap.add_argument("--min-rollback", type=int, default=20)
    ap.add_argument("--max-scored", type=int, default=300)
    ap.add_argument("--limit", type=int, default=400,
                    help="The newest scored traces each evolve reads (its held-out fifth is "
                         "the gate's tasks: the gate's cost grows with it).")
    ap.add_argument("--solver", default="agent", choices=["agent", "direct"],
                    help="How the learner's gate answers (agent: with the stage's tools).")
    ap.add_argument("--max-turns", type=int, default=6,
                    help="Replies that call tools per conversation (each may call several); "
                         "the one after them is the answer.")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("-j", "--concurrency", type=int, default=2,
                    help="Conversations in flight (each to both servers in turn).")
    ap.add_argument("--adversary-share", type=float, default=0.3)
    ap.add_argument("--adversarial", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULT)
    ap.add_argument("--png", type=Path, default=PNG)
    ap.add_argument("--render", action="store_true",
                    help="Write the page section and the figure again from --out.")
    ap.add_argument("--keep", action="store_true", help="Keep the scratch folder (logs).")
    ap.add_argument("--serve-toy", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_toy is not None:
        serve_toy(args.serve_toy, args.tasks)
        return
    data = json.loads(args.out.read_text()) if args.render else run(args)
    data["analysis"] = analyse(data)
    plot(data, args.png)
    data["markdown"] = markdown(data, args.png.relative_to(REPO / "docs")
                                if args.png.is_relative_to(REPO / "docs") else args.png)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print("\n".join(summary_lines(data)))
    print(f"\nwrote {args.out} and {args.png}")


if __name__ == "__main__":
    main()
