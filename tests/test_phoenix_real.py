"""Issue 39 against a real Arize Phoenix (``arize-phoenix`` 20.26.1, SQLite, on 127.0.0.1).

A Phoenix server is started from its own virtualenv (``scripts/phoenix.sh`` makes it, in
``.cache/phoenix-venv``; ~140 packages, so never in ``make test`` or CI). ``whetstone run``
(content off and on), ``whetstone serve`` (an exchange and its feedback) and ``whetstone eval``
send spans to it over OTLP/HTTP, and the tests read them back through Phoenix's own REST API:
names, parent/child structure, the span kinds Phoenix shows (LLM, TOOL, AGENT, CHAIN,
EVALUATOR), token counts (each LLM span's and Phoenix's sum per trace), the library version.
Then the round trip: an eval's traces, annotated in Phoenix, come back with ``whetstone traces
import --phoenix`` into another library, whole, and ``evolve memory`` learns from them with
its gate run on their tasks.

Runs only with ``WHETSTONE_TEST_PHOENIX=1`` (``make test-real`` sets it) and the Phoenix
virtualenv present (``WHETSTONE_PHOENIX_VENV``, default ``.cache/phoenix-venv``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from otel_support import serve_one_exchange
from servers import free_port, wait_healthy
from test_traces_import import evolve_memory, imported, new_library, run

from whetstone.library_store.store import Library

REPO = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("WHETSTONE_PHOENIX_VENV") or REPO / ".cache" / "phoenix-venv")
PHOENIX = VENV / "bin" / "phoenix"
TASK = "What is 17 * 23?"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("WHETSTONE_TEST_PHOENIX") != "1",
                       reason="a real Phoenix server runs only with WHETSTONE_TEST_PHOENIX=1 "
                              "(make test-real sets it)"),
    pytest.mark.skipif(not PHOENIX.exists(),
                       reason=f"no Phoenix at {PHOENIX}: scripts/phoenix.sh installs it"),
]


class Phoenix(NamedTuple):
    url: str  # the REST API and OTLP/HTTP
    grpc: str  # OTLP/gRPC


@pytest.fixture(scope="module")
def phoenix_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """A Phoenix server on 127.0.0.1 with a fresh SQLite database."""
    work = tmp_path_factory.mktemp("phoenix")
    port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PHOENIX_", "OTEL_"))}
    env.update(PHOENIX_WORKING_DIR=str(work / "data"), PHOENIX_HOST="127.0.0.1",
               PHOENIX_PORT=str(port), PHOENIX_GRPC_PORT=str(grpc_port),
               PHOENIX_TELEMETRY_ENABLED="false", PHOENIX_ALLOW_EXTERNAL_RESOURCES="false")
    log = work / "phoenix.log"
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen([str(PHOENIX), "serve"], cwd=work, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, proc, log, 180, path="/healthz")
        print(f"\nPhoenix started in {time.monotonic() - started:.1f} s")
        yield Phoenix(url, f"http://127.0.0.1:{grpc_port}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def phoenix(phoenix_server: Phoenix) -> str:
    """The server's base URL."""
    return phoenix_server.url


def get(url: str) -> Any:
    r = httpx.get(url, timeout=30)
    assert r.status_code == 200, f"{url}: {r.status_code} {r.text}"
    return r.json()


def spans_of(url: str, project: str, n: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The project's spans through ``GET /v1/projects/{project}/spans``, once ``n`` are
    there (Phoenix inserts what it receives in batches, a moment after the export)."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(f"{url}/v1/projects/{project}/spans", params={"limit": 1000}, timeout=30)
        data = r.json()["data"] if r.status_code == 200 else []
        if len(data) >= n or time.monotonic() > deadline:
            assert len(data) == n, [s.get("name") for s in data]
            return list(data)
        time.sleep(0.25)


def traces_of(url: str, project: str) -> list[dict[str, Any]]:
    """Phoenix's own view of the project's traces, with the token counts it summed."""
    return list(get(f"{url}/v1/projects/{project}/traces?limit=100")["data"])


def _env(tmp_path: Path, endpoint: str, project: str,
         protocol: str = "http/protobuf") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "WHETSTONE_"))}
    env.update(WHETSTONE_HOME=str(tmp_path / "home"), OPENAI_API_KEY="",
               WHETSTONE_CACHE=str(REPO / ".cache" / "whetstone"),
               OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
               OTEL_RESOURCE_ATTRIBUTES=f"openinference.project.name={project}")
    return env


def _whetstone(tmp_path: Path, endpoint: str, project: str, *args: str,
               protocol: str = "http/protobuf") -> str:
    res = subprocess.run([sys.executable, "-m", "whetstone", *args], check=False, cwd=REPO,
                         env=_env(tmp_path, endpoint, project, protocol), capture_output=True,
                         text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _script(tmp_path: Path, name: str, replies: list[str]) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"replies": replies}))
    return f"scripted:{path}"


@pytest.mark.integration
@pytest.mark.parametrize("content", [False, True], ids=["content-off-grpc", "content-on-http"])
def test_run_spans_read_back_through_phoenix(phoenix_server: Phoenix, tmp_path: Path,
                                             content: bool) -> None:
    phoenix = phoenix_server.url
    project = f"whetstone-run-{'content' if content else 'plain'}"
    spec = _script(tmp_path, "run", ["Thought: multiply\nAction: calculator[17*23]",
                                     "Final Answer: 391"])
    # content off goes over OTLP/gRPC (Phoenix's gRPC port), content on over OTLP/HTTP
    endpoint, protocol = ((phoenix, "http/protobuf") if content
                          else (phoenix_server.grpc, "grpc"))
    trace = json.loads(_whetstone(tmp_path, endpoint, project, "run", TASK, "--model", spec,
                                  "--json", "--otel", *(["--otel-content"] if content else []),
                                  protocol=protocol))
    spans = spans_of(phoenix, project, 1 + len(trace["steps"]))
    (root,) = [s for s in spans if s["parent_id"] is None]
    attrs = root["attributes"]
    assert (root["name"], root["span_kind"]) == ("whetstone.run", "AGENT")
    assert attrs["whetstone.trace.id"] == trace["id"]
    assert attrs["whetstone.library.version"] == trace["library_version"] == "v1"
    assert attrs["whetstone.total_tokens"] == trace["total_tokens"]
    assert attrs["whetstone.outcome"] == "answered" and attrs["whetstone.skills"] == []
    assert {s["context"]["trace_id"] for s in spans} == {root["context"]["trace_id"]}
    children = sorted((s for s in spans if s["parent_id"]),
                      key=lambda s: s["attributes"]["whetstone.step.index"])
    assert all(s["parent_id"] == root["context"]["span_id"] for s in children)
    model = trace["steps"][1]["output"]["completion"]["model"]
    assert [(s["name"], s["span_kind"]) for s in children] == [
        ("whetstone.prepare", "CHAIN"), (f"chat {model}", "LLM"),
        ("execute_tool calculator", "TOOL"), (f"chat {model}", "LLM"),
        ("whetstone.finish", "CHAIN")]
    assert all(s["status_code"] == "UNSET" for s in spans)
    # token counts: each model call's as Phoenix stored it, and Phoenix's own sum per trace
    llm = [s["attributes"] for s in children if s["span_kind"] == "LLM"]
    thinks = [st for st in trace["steps"] if st["kind"] == "think"]
    for a, step in zip(llm, thinks, strict=True):
        assert a["llm.token_count.prompt"] == step["meta"]["prompt_tokens"]
        assert a["llm.token_count.completion"] == step["meta"]["completion_tokens"]
        assert a["llm.token_count.total"] == step["tokens"]
    (summed,) = traces_of(phoenix, project)
    assert summed["trace_id"] == root["context"]["trace_id"]
    assert summed["token_count_total"] == trace["total_tokens"]
    assert summed["token_count_prompt"] == sum(st["meta"]["prompt_tokens"] for st in thinks)
    text = json.dumps([s["attributes"] for s in spans])
    if content:
        assert (attrs["input.value"], attrs["output.value"]) == (TASK, "391")
        assert llm[0]["llm.input_messages.1.message.content"] == TASK
        assert llm[1]["llm.output_messages.0.message.content"] == "Final Answer: 391"
        tool = children[2]["attributes"]
        assert (tool["tool.name"], tool["output.value"]) == ("calculator", "391")
        assert "input.value" not in children[4]["attributes"]  # `finish` has no input
    else:
        # no content left: neither the task nor the answer is anywhere in what Phoenix holds
        assert "17 * 23" not in text and "391" not in text
        assert "input.value" not in attrs and "whetstone.task" not in attrs


@pytest.mark.integration
def test_serve_exchange_and_feedback_read_back_through_phoenix(phoenix: str,
                                                               tmp_path: Path) -> None:
    project = "whetstone-serve"
    port = free_port()
    (tmp_path / "lib").mkdir()
    log = tmp_path / "serve.log"
    trace_id, usage = serve_one_exchange(
        [sys.executable, "-m", "whetstone", "serve", "--model",
         _script(tmp_path, "serve", ["Paris.", "Rome."]), "--library", str(tmp_path / "lib"),
         "--no-library", "--port", str(port), "--served-name", "tiny", "--log-level",
         "warning", "--otel"],
        env=_env(tmp_path, phoenix, project), port=port, log=log)
    spans = spans_of(phoenix, project, 3)
    (root,) = [s for s in spans if s["parent_id"] is None]
    assert (root["name"], root["span_kind"]) == ("whetstone.chat", "CHAIN")
    assert root["attributes"]["whetstone.trace.id"] == trace_id
    by_kind = {s["span_kind"]: s for s in spans if s["parent_id"]}
    assert set(by_kind) == {"LLM", "EVALUATOR"}
    llm, fb = by_kind["LLM"], by_kind["EVALUATOR"]
    assert llm["parent_id"] == fb["parent_id"] == root["context"]["span_id"]
    assert llm["attributes"]["llm.token_count.prompt"] == usage["prompt_tokens"]
    assert llm["attributes"]["llm.token_count.completion"] == usage["completion_tokens"]
    # the label, sent after the exchange, joined its trace; its comment stayed home
    assert fb["name"] == "whetstone.feedback"
    assert fb["context"]["trace_id"] == root["context"]["trace_id"]
    assert fb["attributes"]["whetstone.feedback.score"] == 0.25
    assert "whetstone.feedback.comment" not in fb["attributes"]
    assert [e["name"] for e in fb["events"]] == ["whetstone.feedback"]
    (summed,) = traces_of(phoenix, project)
    assert summed["token_count_total"] == usage["total_tokens"]


@pytest.mark.integration
@pytest.mark.memory
def test_round_trip_eval_to_phoenix_import_back_and_evolve(phoenix: str,
                                                           tmp_path: Path) -> None:
    """An eval's traces (content on) in Phoenix, annotated there, imported into another
    library through Phoenix's REST API, whole; ``evolve memory`` learns from them and its gate
    runs on their tasks; importing again stores nothing twice."""
    project = "whetstone-eval"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps({"id": f"t{i}", "question": f"What is {i} * 3?",
                                           "expected": str(3 * i), "scorer": "numeric"})
                               for i in range(1, 5)) + "\n")
    spec = _script(tmp_path, "eval", ["Action: calculator[1*3]", "Final Answer: 3",
                                      "Final Answer: 6", "Final Answer: 9", "Final Answer: 13"])
    source = new_library(tmp_path, "source")
    _whetstone(tmp_path, phoenix, project, "eval", "--tasks", str(tasks), "--model", spec,
               "--library", str(source), "-j", "1", "--otel", "--otel-content")
    originals = {t.id: t for t in Library.open(source).traces.query()}
    assert len(originals) == 4
    spans = spans_of(phoenix, project, sum(1 + len(t.steps) for t in originals.values()))
    roots = {s["attributes"]["whetstone.trace.id"]: s for s in spans if s["parent_id"] is None}
    assert set(roots) == set(originals)
    # annotations made in Phoenix: one on a root span, one on a whole trace
    by_task = {t.task: t.id for t in originals.values()}
    one, two = roots[by_task["What is 1 * 3?"]], roots[by_task["What is 2 * 3?"]]
    r = httpx.post(f"{phoenix}/v1/span_annotations?sync=true", timeout=30, json={"data": [{
        "span_id": one["context"]["span_id"], "name": "correctness", "annotator_kind": "HUMAN",
        "result": {"score": 1.0, "label": "correct", "explanation": "checked by hand"}}]})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{phoenix}/v1/trace_annotations?sync=true", timeout=30, json={"data": [{
        "trace_id": two["context"]["trace_id"], "name": "review", "annotator_kind": "HUMAN",
        "result": {"label": "fine", "explanation": "looks right"}}]})
    assert r.status_code == 200, r.text

    target = new_library(tmp_path, "target")
    code, out, text = run("traces", "import", "--phoenix", phoenix, "--project", project,
                          "--library", str(target), "--json")
    assert code == 0, text
    report = json.loads(out)
    assert report["imported"] == 4 and report["skipped"] == [] and report["notes"] == []
    back = {t.id: t for t in imported(target)}
    assert set(back) == set(originals)  # each trace keeps its id across libraries
    for tid, t in back.items():
        was = originals[tid]
        assert (t.task, t.answer, t.label, t.score, t.total_tokens, t.outcome) == (
            was.task, was.answer, was.label, was.score, was.total_tokens, was.outcome)
        assert [s.kind for s in t.steps] == [s.kind for s in was.steps if s.kind != "prepare"]
        assert t.meta["origin"]["format"] == "phoenix"
        assert t.meta["origin"]["library_version"] == "v1"
    assert back[one["attributes"]["whetstone.trace.id"]].meta["feedback"] == "checked by hand"
    assert back[two["attributes"]["whetstone.trace.id"]].meta["feedback"] == "looks right"
    # the tool call came back with its arguments and result
    act = next(s for s in back[by_task["What is 1 * 3?"]].steps if s.kind == "act")
    assert act.input["tool"] == "calculator" and "3" in str(act.output)

    result = evolve_memory(tmp_path, target, ["3", "6", "9", "12"])
    assert result["traces"] == 4 and result["decision"]["n_tasks"] == 4
    memory = Library.open(target).snapshot().read_text("memory/demonstrations.md")
    assert "What is 1 * 3?" in memory and "What is 4 * 3?" not in memory  # 13 was wrong

    code, out, text = run("traces", "import", "--phoenix", phoenix, "--project", project,
                          "--library", str(target), "--json")
    assert code == 0 and json.loads(out)["duplicates"] == 4, text
