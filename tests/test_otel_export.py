"""Issue 39: recorded traces exported as OpenTelemetry spans.

The receivers are built on the maintained ``opentelemetry-proto`` package: a gRPC
``TraceService`` and an OTLP/HTTP endpoint that decode each ``ExportTraceServiceRequest`` and
keep it; the tests read the spans back from them. ``whetstone run`` and ``whetstone serve`` run
as real processes with export on (and off)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from otel_support import Receiver, grpc_receiving, http_receiving, serve_one_exchange
from servers import free_port

REPO = Path(__file__).resolve().parent.parent
CONTENT_KEYS = {"input.value", "output.value", "gen_ai.input.messages", "gen_ai.output.messages",
                "gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "whetstone.task",
                "whetstone.answer", "whetstone.label", "whetstone.feedback.comment"}
TASK = "What is 17 * 23?"


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[Receiver, str]]:
    with grpc_receiving() as got:
        yield got


@pytest.fixture
def http_receiver() -> Iterator[tuple[Receiver, str]]:
    with http_receiving() as got:
        yield got


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "WHETSTONE_"))}
    env.update({"WHETSTONE_HOME": str(tmp_path / "home"), "OPENAI_API_KEY": ""}, **extra)
    env.setdefault("WHETSTONE_CACHE", str(REPO / ".cache" / "whetstone"))
    return env


def _script(tmp_path: Path, replies: list[Any]) -> str:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps({"replies": replies}))
    return f"scripted:{path}"


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    spec = _script(tmp_path, ["Thought: multiply\nAction: calculator[17*23]",
                              "Final Answer: 391"])
    return subprocess.run([sys.executable, "-m", "whetstone", "run", TASK, "--model", spec,
                           "--json", *args], check=False, cwd=REPO,
                          env=_env(tmp_path, **env), capture_output=True, text=True, timeout=120)


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_run_sends_one_tree_per_trace_over_grpc(grpc_receiver: tuple[Receiver, str],
                                                tmp_path: Path) -> None:
    receiver, endpoint = grpc_receiver
    res = _run(tmp_path, "--otel", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
               OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    assert res.returncode == 0, res.stderr
    trace = json.loads(res.stdout)
    spans = receiver.spans()  # the run flushed before it exited: nothing to wait for
    roots = [s for s in spans if not s.parent]
    assert [r.name for r in roots] == ["whetstone.run"]
    root = roots[0]
    assert {s.trace_id for s in spans} == {root.trace_id}
    children = [s for s in spans if s.parent]
    assert all(s.parent == root.span_id for s in children)
    assert [s.name for s in children] == [
        "whetstone.prepare", f"chat {trace['steps'][1]['output']['completion']['model']}",
        "execute_tool calculator", f"chat {trace['steps'][3]['output']['completion']['model']}",
        "whetstone.finish"]
    # token counts: each model call's, and their sum the trace's
    llm = [s for s in children if s.attrs["openinference.span.kind"] == "LLM"]
    thinks = [st for st in trace["steps"] if st["kind"] == "think"]
    for span, step in zip(llm, thinks, strict=True):
        assert span.attrs["gen_ai.usage.input_tokens"] == step["meta"]["prompt_tokens"]
        assert span.attrs["gen_ai.usage.output_tokens"] == step["meta"]["completion_tokens"]
        assert span.attrs["llm.token_count.total"] == step["tokens"]
        assert span.attrs["gen_ai.operation.name"] == "chat"
    assert sum(s.attrs["llm.token_count.total"] for s in llm) == trace["total_tokens"]
    assert root.attrs["whetstone.total_tokens"] == trace["total_tokens"]
    assert root.attrs["whetstone.library.version"] == trace["library_version"] == "v1"
    assert root.attrs["whetstone.trace.id"] == trace["id"]
    assert root.attrs["whetstone.skills"] == []
    assert root.attrs["whetstone.outcome"] == "answered"
    assert root.resource["service.name"] == "whetstone"
    assert root.resource["service.version"]
    tool = next(s for s in children if s.name == "execute_tool calculator")
    assert tool.attrs["gen_ai.tool.name"] == "calculator"
    # no content leaves unless asked: no content attribute, and the task nowhere
    for s in spans:
        assert not CONTENT_KEYS & set(s.attrs), s.name
        # the task's words, not a bare "17": a trace id holds the time and random digits
        assert not any("17 * 23" in str(v) for v in s.attrs.values()), s.name


@pytest.mark.integration
def test_content_capture_and_the_otlp_json_file(tmp_path: Path) -> None:
    # --otel-file alone: no endpoint needed, nothing sent over the network
    out = tmp_path / "spans.jsonl"
    res = _run(tmp_path, "--otel-file", str(out),
               OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true")
    assert res.returncode == 0, res.stderr
    trace = json.loads(res.stdout)
    lines = out.read_text().splitlines()
    spans = [sp for line in lines for rs in json.loads(line)["resourceSpans"]
             for ss in rs["scopeSpans"] for sp in ss["spans"]]
    by_name = {s["name"]: s for s in spans}
    root = by_name["whetstone.run"]
    attrs = {a["key"]: next(iter(a["value"].values())) for a in root["attributes"]}
    assert attrs["whetstone.task"] == TASK and attrs["whetstone.answer"] == "391"
    assert int(attrs["whetstone.total_tokens"]) == trace["total_tokens"]  # int64 as a string
    # OTLP/JSON: ids are hex (protobuf's own mapping would give base64)
    assert len(root["traceId"]) == 32 and int(root["traceId"], 16)
    tool = by_name["execute_tool calculator"]
    assert tool["parentSpanId"] == root["spanId"]
    tool_attrs = {a["key"]: a["value"]["stringValue"] for a in tool["attributes"]
                  if "stringValue" in a["value"]}
    assert json.loads(tool_attrs["gen_ai.tool.call.arguments"]) == "17*23"
    assert tool_attrs["gen_ai.tool.call.result"] == "391"


@pytest.mark.integration
def test_export_off_sends_nothing_and_loads_no_exporter(
        grpc_receiver: tuple[Receiver, str], tmp_path: Path) -> None:
    receiver, endpoint = grpc_receiver
    res = _run(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    assert res.returncode == 0, res.stderr
    assert receiver.spans() == []
    # langgraph's langsmith imports the OpenTelemetry API and SDK on its own; what export
    # adds (the span processors, the OTLP exporters, gRPC) must stay unloaded when it is off
    spec = _script(tmp_path, ["Final Answer: 4", "Final Answer: 4"])
    probe = ("import sys\nfrom click.testing import CliRunner\nfrom whetstone.cli import cli\n"
             f"r = CliRunner().invoke(cli, ['run', '2+2', '--model', {spec!r}])\n"
             "assert r.exit_code == 0, r.output\n"
             "print(sorted(m for m in sys.modules if m.startswith(("
             "'opentelemetry.exporter', 'opentelemetry.sdk.trace.export', 'grpc'))))\n")
    env = _env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
    out = _python(probe, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
    # the probe can fail: with export on, the same run loads them
    on = _python(probe.replace("'2+2',", "'2+2', '--otel',"), env)
    assert "opentelemetry.exporter.otlp.proto.grpc" in on.stdout, on.stderr
    # and `whetstone --help` imports no OpenTelemetry at all
    helped = _python("import sys\nfrom whetstone.cli import main\n"
                     "sys.argv = ['whetstone', '--help']\ntry:\n    main()\n"
                     "except SystemExit:\n    pass\n"
                     "print([m for m in sys.modules if m.startswith('opentelemetry')])", env)
    assert helped.stdout.strip().splitlines()[-1] == "[]", helped.stderr


@pytest.mark.integration
def test_otel_without_an_endpoint_is_a_clear_error(tmp_path: Path) -> None:
    res = _run(tmp_path, "--otel")
    assert res.returncode == 2, res.stderr
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in res.stderr


@pytest.mark.integration
def test_serve_sends_each_exchange_and_its_feedback_over_http(
        http_receiver: tuple[Receiver, str], tmp_path: Path) -> None:
    receiver, endpoint = http_receiver
    port = free_port()
    spec = _script(tmp_path, ["Paris.", "Rome."])
    log = tmp_path / "serve.log"
    (tmp_path / "lib").mkdir()
    trace_id, usage = serve_one_exchange(
        [sys.executable, "-m", "whetstone", "serve", "--model", spec, "--library",
         str(tmp_path / "lib"), "--no-library", "--port", str(port), "--served-name", "tiny",
         "--log-level", "warning", "--otel"],
        env=_env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
                 OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_SERVICE_NAME="proxy"),
        port=port, log=log)
    spans = receiver.spans()
    root = next(s for s in spans if s.name == "whetstone.chat")
    assert root.attrs["whetstone.trace.id"] == trace_id and not root.parent
    assert root.resource["service.name"] == "proxy"  # OTEL_SERVICE_NAME wins
    (llm,) = [s for s in spans if s.parent == root.span_id and s.name.startswith("chat ")]
    assert llm.trace_id == root.trace_id and llm.kind == 3  # SPAN_KIND_CLIENT
    assert llm.attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert llm.attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    # feedback joins the same trace, under the root, without its comment (content is off)
    (fb,) = [s for s in spans if s.name == "whetstone.feedback"]
    assert (fb.trace_id, fb.parent) == (root.trace_id, root.span_id)
    assert fb.attrs["whetstone.feedback.score"] == 0.25 and fb.events == ["whetstone.feedback"]
    assert "whetstone.feedback.comment" not in fb.attrs
    # and the exchange was not sent twice when its labelled copy was written
    assert [s.name for s in spans].count("whetstone.chat") == 1


def test_no_module_imports_opentelemetry_at_top_level() -> None:
    # Export is optional: a top-level import would make every command pay for it.
    bad = []
    for root in ("engine", "library_store", "skills", "tools"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                bad += [f"{path.relative_to(REPO)}:{node.lineno}" for n in names
                        if n.split(".")[0] in ("opentelemetry", "grpc")]
    assert bad == []


def _memory_sink(content: bool = False) -> tuple[Any, Any]:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from whetstone.library_store.otel_export import OtelSink

    exporter = InMemorySpanExporter()
    return OtelSink([SimpleSpanProcessor(exporter)], content=content), exporter


def test_engine_sinks_see_each_trace_once_and_its_feedback(tmp_path: Path) -> None:
    from whetstone.engine.api import Engine
    from whetstone.engine.backends.scripted import ScriptedBackend
    from whetstone.library_store.otel_spans import otel_span_id, otel_trace_id

    sink, exporter = _memory_sink()
    (tmp_path / "lib").mkdir()
    with Engine(ScriptedBackend(["Final Answer: 4"]), library=tmp_path / "lib",
                checkpointing=False, trace_sinks=[sink], otel=False) as engine:
        trace = engine.run("2+2")
        names = [s.name for s in exporter.get_finished_spans()]
        assert names.count("whetstone.run") == 1  # not the `running` record too
        engine.traces.append(trace)  # the same trace written again: not a second tree
        assert [s.name for s in exporter.get_finished_spans()] == names
        engine.feedback(trace.id, 1.0, "right")
    fb = exporter.get_finished_spans()[-1]
    assert fb.name == "whetstone.feedback" and fb.attributes is not None
    assert fb.context is not None and fb.parent is not None
    assert (fb.context.trace_id, fb.parent.span_id) == (otel_trace_id(trace.id),
                                                        otel_span_id(trace.id, "root"))
    assert fb.attributes["whetstone.feedback.score"] == 1.0
    assert "whetstone.feedback.comment" not in fb.attributes


def test_span_attributes_of_skills_errors_and_content() -> None:
    from whetstone.engine.types import Step, Trace
    from whetstone.library_store.otel_spans import trace_spans

    think = Step(kind="think", module="think", input={"messages": [
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "data:x"}}]}]},
        error="BackendError: upstream down", started=10.0, duration_s=1.0)
    trace = Trace(id="20261205-000000-abcdef01", task="secret task", steps=(think,),
                  outcome="error", model="m", started=10.0, ended=12.0, label="L",
                  meta={"skills": {"shown": ["word-math"]}, "error": "BackendError: down",
                        "source": "agent"})
    root, call = trace_spans(trace)
    assert root.attributes["whetstone.skills"] == ["word-math"]
    assert (root.error, call.error) == ("BackendError", "BackendError")  # no text when off
    assert call.name == "chat m" and call.attributes["error.type"] == "BackendError"
    assert not any("secret" in str(v) for v in root.attributes.values())
    root, call = trace_spans(trace, content=True)
    assert root.attributes["whetstone.task"] == "secret task"
    assert root.attributes["whetstone.label"] == "L"
    assert call.attributes["llm.input_messages.0.message.content"] == "look\n[image]"
    assert (root.start_ns, root.end_ns) == (10_000_000_000, 12_000_000_000)


@pytest.mark.integration
def test_eval_exports_each_scored_task(grpc_receiver: tuple[Receiver, str],
                                       tmp_path: Path) -> None:
    receiver, endpoint = grpc_receiver
    spec = _script(tmp_path, ["Final Answer: 3", "Final Answer: 12"])
    res = subprocess.run(
        [sys.executable, "-m", "whetstone", "eval", "--tasks",
         str(REPO / "tests" / "fixtures" / "tasks" / "arith.jsonl"), "--limit", "2", "-j", "1",
         "--model", spec, "--json", "--otel"], check=False, cwd=REPO, capture_output=True,
        text=True, timeout=120, env=_env(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
                                         OTEL_EXPORTER_OTLP_PROTOCOL="grpc"))
    assert res.returncode == 0, res.stderr
    roots = sorted((s for s in receiver.spans() if not s.parent),
                   key=lambda s: s.attrs["whetstone.score"], reverse=True)
    assert [r.name for r in roots] == ["whetstone.run", "whetstone.run"]
    assert [r.attrs["whetstone.score"] for r in roots] == [1.0, 0.0]  # 4 + 9 is not 12
    assert all(r.attrs["whetstone.task_set"].endswith("arith.jsonl") for r in roots)
    assert len({r.trace_id for r in roots}) == 2


async def test_mcp_log_run_and_feedback_join_one_trace(tmp_path: Path) -> None:
    from whetstone.engine.integrations.mcp_server import LibraryServer
    from whetstone.library_store.otel_export import OtelSettings

    (tmp_path / "lib").mkdir()
    out = tmp_path / "spans.jsonl"
    server = LibraryServer.open(tmp_path / "lib", allow_writes=True,
                                otel=OtelSettings(otlp=False, file=out))
    try:
        logged = server.log_run("2+2?", "4")
        await server.record_feedback(logged["trace_id"], 0.5)
    finally:
        server.close()  # flushes the file
    spans = [sp for line in out.read_text().splitlines()
             for rs in json.loads(line)["resourceSpans"]
             for ss in rs["scopeSpans"] for sp in ss["spans"]]
    root = next(s for s in spans if s["name"] == "whetstone.log_run")
    fb = next(s for s in spans if s["name"] == "whetstone.feedback")
    assert (fb["traceId"], fb["parentSpanId"]) == (root["traceId"], root["spanId"])


@pytest.mark.integration
def test_an_exported_file_imports_back_as_the_same_run(tmp_path: Path) -> None:
    out = tmp_path / "spans.jsonl"
    res = _run(tmp_path, "--otel-file", str(out), "--otel-content")
    assert res.returncode == 0, res.stderr
    trace = json.loads(res.stdout)
    other = tmp_path / "other"
    imported = subprocess.run([sys.executable, "-m", "whetstone", "traces", "import", str(out),
                               "--json"], check=False, cwd=REPO, capture_output=True,
                              text=True, timeout=120, env=_env(other))
    assert imported.returncode == 0, imported.stderr
    (trace_id,) = json.loads(imported.stdout)["ids"]
    shown = subprocess.run([sys.executable, "-m", "whetstone", "traces", "show", trace_id,
                            "--json"], check=False, cwd=REPO, capture_output=True, text=True,
                           timeout=120, env=_env(other))
    back = json.loads(shown.stdout)
    assert (back["task"], back["answer"], back["total_tokens"]) == (
        TASK, "391", trace["total_tokens"])
