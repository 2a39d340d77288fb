"""One trace builder, one id scheme, one writer (``library_store/trace_build.py``).

Every kind of trace (agent run, direct solver, chat exchange, MARCH verification, MCP log) is
made for real by its own host with the ``scripted:`` backend, then checked for the same id
scheme (``YYYYMMDD-HHMMSS-xxxxxxxx`` from its start time, UTC) and its kind in
``meta["source"]``. Traces written before the builder existed
(``fixtures/traces/before_one_builder.jsonl``, captured from the old code) still load, show and
filter by kind."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from whetstone.cli import cli
from whetstone.engine.api import Engine
from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.errors import ConfigError
from whetstone.engine.evaluation.direct import direct_solver
from whetstone.engine.evaluation.tasks import TaskRecord
from whetstone.engine.types import Step, Trace
from whetstone.library_store.store import Library
from whetstone.library_store.trace_build import TRACE_KINDS, make_trace, new_trace_id, trace_kind
from whetstone.library_store.traces import TraceQuery, TraceStore, parse_trace_filter

ID = re.compile(r"^(\d{8}-\d{6})-[0-9a-f]{8}$")
OLD = Path(__file__).parent / "fixtures" / "traces" / "before_one_builder.jsonl"


def script(tmp_path: Path, replies: list[Any], name: str) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"replies": replies}))
    return f"scripted:{path}"


def assert_built(trace: Trace, kind: str) -> None:
    """The id scheme and the kind every builder gives."""
    m = ID.match(trace.id)
    assert m, f"{kind}: id {trace.id!r} is not of the one scheme"
    # The time part is the trace's own start (second resolution, UTC).
    assert m.group(1) == time.strftime("%Y%m%d-%H%M%S", time.gmtime(trace.started)), kind
    assert trace.meta["source"] == kind and trace_kind(trace) == kind


@pytest.mark.march
def test_every_kind_is_built_with_one_id_scheme_and_its_kind(tmp_path: Path) -> None:
    with Engine(script(tmp_path, ["Final Answer: 391"], "agent"), skills=False,
                checkpointing=False) as engine:
        agent = engine.run("17 * 23?")
    assert_built(agent, "agent")
    assert engine.traces.get(agent.id).meta["source"] == "agent"  # as stored

    direct = direct_solver(ScriptedBackend(["The answer is 4."]))(
        TaskRecord(id="a", question="2+2?"), 0)
    assert_built(direct, "direct")  # was a bare uuid4 hex, unlike every other trace
    assert direct.meta["solver"] == "direct" and direct.total_tokens > 0

    with Engine(script(tmp_path, ["Paris."], "chat"), skills=False,
                checkpointing=False) as engine:
        reply = engine.chat("Capital of France?")
        chat = engine.traces.get(reply.trace_id or "")
    assert_built(chat, "chat")
    assert chat.answer == "Paris." and chat.steps[0].module == "chat"

    proposed = "- Question: Where is the head office? [Answer: Mumbai]"
    check = "1. Evidence: The head office is in Delhi. [Answer: Delhi]"
    with Engine(script(tmp_path, [proposed, check, check, check], "verify"), skills=False,
                checkpointing=False) as engine:
        engine.endpoint("verify", question="Where is the head office?", answer="In Mumbai.",
                        evidence=["The head office is in Delhi."])
        verified = engine.traces.query(TraceQuery(source="verify"))
    assert len(verified) == 1
    assert_built(verified[0], "verify")
    assert verified[0].meta["march"]["flagged_claims"] == 1


def test_an_mcp_log_is_built_by_the_same_builder(tmp_path: Path) -> None:
    from whetstone.engine.integrations.mcp_server import LibraryServer

    lib = Library.open(tmp_path / "lib", create=True)
    server = LibraryServer.open(lib.root, allow_writes=True)
    try:
        logged = server.log_run("2+2?", "4", steps=[{"thought": "add"}], score=1)
    finally:
        server.close()
    trace = lib.traces.get(logged["trace_id"])
    assert_built(trace, "mcp")
    assert trace.score == 1.0 and trace.steps[-1].kind == "finish"


def test_traces_written_by_the_old_code_still_load_show_and_filter(
        whetstone_home: Path) -> None:
    root = whetstone_home / "library" / "traces"
    root.mkdir(parents=True)
    shutil.copy(OLD, root / "2026-12-02.jsonl")
    store = TraceStore(root)
    traces = list(store.latest().values())
    assert not store.problems
    # Old agent and direct traces had no source; the reader tells them apart all the same.
    assert [trace_kind(t) for t in traces] == ["agent", "direct", "chat", "verify"]
    direct = store.query(TraceQuery(**parse_trace_filter("source=direct")))
    assert [t.id for t in direct] == ["ae39c0eefc034c7a84753284b65df860"]  # the old id scheme
    for t in traces:
        res = CliRunner(env={"COLUMNS": "200"}).invoke(cli, ["traces", "show", t.id])
        assert res.exit_code == 0, res.output
        assert f"Task: {t.task}" in res.output
    # An old trace labelled now keeps its id and gains nothing it did not have.
    labelled = store.set_score("ae39c0eefc03", 1.0)
    assert TraceStore(root).get(labelled.id).score == 1.0 and "source" not in labelled.meta


def test_ids_sort_by_start_and_bad_input_says_what_to_do() -> None:
    early = make_trace("agent", task="t", started=1_800_000_000.0)
    late = make_trace("agent", task="t", started=1_800_000_061.0)
    assert early.id < late.id and early.id.startswith("20270115-")
    assert new_trace_id(1_800_000_000.0)[:15] == early.id[:15]
    given = make_trace("chat", task="t", started=0.0, trace_id="abc",
                       meta={"source": "forged", "x": 1},
                       steps=[Step(kind="think", module="chat", tokens=7)])
    assert given.id == "abc" and given.meta == {"source": "chat", "x": 1}
    assert given.total_tokens == 7  # summed from the steps when not given
    with pytest.raises(ConfigError, match="unknown trace kind 'agnet'") as err:
        make_trace("agnet", task="t", started=0.0)
    assert all(k in (err.value.hint or "") for k in TRACE_KINDS)
    with pytest.raises(ConfigError, match="no trace kind 'robot'.*agent, direct, chat"):
        parse_trace_filter("source=robot")


def test_eval_writes_through_the_librarys_bounded_store(tmp_path: Path,
                                                        whetstone_home: Path) -> None:
    """``whetstone eval`` stored traces in a store of default bounds, ignoring the library's
    ``library.json``; it now writes through ``Library.traces`` as every other writer does."""
    library = whetstone_home / "library"
    library.mkdir(parents=True)
    (library / "library.json").write_text(json.dumps({"trace_max_record_bytes": 4096}))
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "question": "2+2?", "expected": "4"}\n')
    spec = script(tmp_path, ["4 " + "x" * 20_000], "long")
    res = CliRunner().invoke(cli, ["eval", "--tasks", str(tasks), "--model", spec,
                                   "--solver", "direct", "-j", "1"])
    assert res.exit_code == 0, res.output
    lines = [ln for f in sorted((library / "traces").glob("*.jsonl"))
             for ln in f.read_text().splitlines()]
    assert len(lines) == 1 and len(lines[0].encode()) <= 4096
    assert "truncated by whetstone" in lines[0]


def test_traces_ls_shows_and_filters_the_kind(whetstone_home: Path) -> None:
    root = whetstone_home / "library" / "traces"
    root.mkdir(parents=True)
    shutil.copy(OLD, root / "2026-12-02.jsonl")
    runner = CliRunner(env={"COLUMNS": "200"})
    res = runner.invoke(cli, ["traces", "ls", "--json"])
    assert res.exit_code == 0, res.output
    assert [t["kind"] for t in json.loads(res.output)] == ["agent", "direct", "chat", "verify"]
    res = runner.invoke(cli, ["traces", "ls", "--kind", "chat"])
    assert res.exit_code == 0 and "kind" in res.output and " chat " in res.output
    assert "direct" not in res.output
    res = runner.invoke(cli, ["traces", "ls", "--kind", "nope"])
    assert res.exit_code != 0 and "known kinds: agent, direct" in res.output
