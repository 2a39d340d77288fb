"""The CLI: `whetstone run`, `traces`, `models`; errors and exit codes; interrupt and resume."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.cli import cli

REPO = Path(__file__).resolve().parent.parent


def script(tmp_path: Path, replies: list, name: str = "replies.json", **extra: object) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"replies": replies, **extra}))
    return f"scripted:{path}"


def test_run_streams_steps_and_answers(tmp_path: Path) -> None:
    spec = script(tmp_path, ["Thought: multiply\nAction: calculator[17*23]", "Final Answer: 391"])
    res = CliRunner().invoke(cli, ["run", "What is 17 * 23?", "--model", spec])
    assert res.exit_code == 0, res.output
    out = res.output
    assert out.index("Thought: multiply") < out.index("Action: calculator[17*23]") \
        < out.index("Observation: 391") < out.index("Answer: 391")


def test_run_json_prints_the_trace(tmp_path: Path) -> None:
    spec = script(tmp_path, ["Final Answer: 4"])
    res = CliRunner().invoke(cli, ["run", "2+2", "--model", spec, "--json"])
    assert res.exit_code == 0, res.output
    trace = json.loads(res.stdout)
    assert trace["answer"] == "4" and trace["outcome"] == "answered"
    assert [s["kind"] for s in trace["steps"]] == ["prepare", "think", "finish"]


def test_run_without_answer_exits_8_and_traces_say_why(tmp_path: Path) -> None:
    spec = script(tmp_path, ["hmm"] * 5)
    runner = CliRunner()
    res = runner.invoke(cli, ["run", "x", "--model", spec, "--max-steps", "2"])
    assert res.exit_code == 8
    assert "No answer (horizon)" in res.output
    listing = runner.invoke(cli, ["traces", "ls", "--json"])
    rows = json.loads(listing.stdout)
    assert rows[-1]["outcome"] == "horizon"
    shown = runner.invoke(cli, ["traces", "show", rows[-1]["id"][:12]])
    assert shown.exit_code == 0 and "step horizon" in shown.output


def test_model_text_with_markup_brackets_prints_as_written(tmp_path: Path) -> None:
    # rich would parse "[/b]" as a closing tag (and crash) and "[red]" as a style.
    spec = script(tmp_path, ["Thought: see [/b] and [red]\nAction: calculator[2*3]",
                             "oops [/i] no action",
                             "Final Answer: use [bold]x[/bold] = 6"])
    res = CliRunner().invoke(cli, ["run", "What is [b]2*3[/b]?", "--model", spec])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "Thought: see [/b] and [red]" in out
    assert "Action: calculator[2*3]" in out
    assert "Unparseable reply: " in out and "Unparseable reply: unparseable" not in out
    assert "Answer: use [bold]x[/bold] = 6" in out
    rows = json.loads(CliRunner().invoke(cli, ["traces", "ls", "--json"]).stdout)
    shown = CliRunner().invoke(cli, ["traces", "show", rows[-1]["id"]])
    assert shown.exit_code == 0 and "Task: What is [b]2*3[/b]?" in shown.output


def test_unknown_spec_lists_the_known_ones() -> None:
    res = CliRunner().invoke(cli, ["run", "x", "--model", "gpt5:turbo"])
    assert res.exit_code == 2
    assert "unknown model spec 'gpt5:turbo'" in res.output
    for prefix in ("embedded", "hf:", "openai:", "llamacpp:", "vllm:", "scripted:"):
        assert prefix in res.output


def test_missing_trace_is_a_clear_error() -> None:
    res = CliRunner().invoke(cli, ["traces", "show", "nope"])
    assert res.exit_code == 6 and "no trace with id 'nope'" in res.output


def test_models_lists_every_spec_with_install_state() -> None:
    res = CliRunner().invoke(cli, ["models", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["spec"]: r for r in json.loads(res.stdout)}
    assert {"embedded", "embedded:smollm2", "embedded:qwen-1.5b"} <= set(rows)
    assert rows["embedded"]["installed"] is True
    llama = next(r for r in rows.values() if r["prefix"] == "llamacpp")
    assert "pip install" in llama["install"]


def test_models_table_shows_whole_install_commands_and_reads_at_80_columns() -> None:
    """Issue 37 item 7: the llamacpp/vllm rows read ``pip install 'whetstone-engine'`` (the
    extra eaten as markup) and at 80 columns each cell wrapped over 6-8 lines."""
    res = CliRunner(env={"COLUMNS": "80"}).invoke(cli, ["models"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "pip install 'whetstone-engine[llamacpp]'" in out
    assert "pip install 'whetstone-engine[vllm]'" in out
    rows = json.loads(CliRunner().invoke(cli, ["models", "--json"]).stdout)
    lines = out.splitlines()
    for r in rows:  # one line per spec, whole, with its state
        (line,) = [x for x in lines if x.startswith(f"  {r['spec']} ")]
        assert ("not installed" in line) != r["installed"], line
        assert ("white-box" in line) == r["white_box"], line
        if not r["installed"]:  # the whole command, on one (terminal-folded) line
            assert f"    {r['install']}" in lines
    # Only the install commands run past 80 columns (the terminal folds them, so they copy
    # whole); nothing is cut.
    assert all(len(x) <= 80 for x in lines if not x.startswith("    pip install")), out
    assert "…" not in out


def test_a_model_path_that_does_not_exist_exits_3_as_the_table_says(tmp_path: Path) -> None:
    """Issue 37 item 9: ``--model hf:/nonexistent/model`` exited 2 (usage); docs/cli.md's
    table gives 3 to a model that is not installed."""
    for spec in (f"hf:{tmp_path}/nonexistent/model", f"hf:{tmp_path}#missing.gguf"):
        res = CliRunner().invoke(cli, ["run", "hi", "--model", spec])
        assert res.exit_code == 3, res.output
        assert "nothing is downloaded" in res.output or "check the name" in res.output


def _whetstone(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from whetstone.cli import main; main()", *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _read_until(proc: subprocess.Popen[str], marker: str, timeout: float = 60) -> str:
    seen = ""
    deadline = time.time() + timeout
    assert proc.stdout is not None
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
        if marker in line:
            return seen
    raise AssertionError(f"never saw {marker!r}; output so far:\n{seen}")


def _interrupt_then_resume(tmp_path: Path, sig: int) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    slow = script(tmp_path, ["Action: calculator[17*23]", "Action: calculator[391+0]",
                             "Final Answer: 391"], name="slow.json", delay_s=1.5)
    proc = _whetstone("run", "17*23?", "--model", slow, env=env)
    _read_until(proc, "Observation: 391")
    proc.send_signal(sig)  # lands while the second model call is in flight
    out, _ = proc.communicate(timeout=60)
    store_lines = [json.loads(line) for p in
                   (Path(env["WHETSTONE_HOME"]) / "library" / "traces").glob("*.jsonl")
                   for line in p.read_text().splitlines()]
    run_id = store_lines[-1]["id"]
    if sig == signal.SIGINT:
        assert proc.returncode == 130, out
        assert f"whetstone run --resume {run_id}" in out
        assert store_lines[-1]["outcome"] == "interrupted"
    else:
        assert proc.returncode == -signal.SIGKILL
        assert store_lines[-1]["outcome"] == "running"  # killed: no chance to write more
    rest = script(tmp_path, ["Final Answer: 391"], name="rest.json")
    res = subprocess.run([sys.executable, "-c", "from whetstone.cli import main; main()", "run",
                          "--resume", run_id, "--model", rest, "--json"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    trace = json.loads(res.stdout)
    assert trace["id"] == run_id and trace["answer"] == "391"
    tools = [s["input"]["tool"] for s in trace["steps"] if s["kind"] == "act"]
    assert tools[0] == "calculator"  # the step before the interruption is kept
    again = subprocess.run([sys.executable, "-c", "from whetstone.cli import main; main()", "run",
                            "--resume", run_id, "--model", rest], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 6 and "no checkpoint to resume" in again.stderr


@pytest.mark.integration
def test_ctrl_c_saves_an_interrupted_trace_and_resume_continues(tmp_path: Path) -> None:
    _interrupt_then_resume(tmp_path, signal.SIGINT)


@pytest.mark.integration
def test_killed_run_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    _interrupt_then_resume(tmp_path, signal.SIGKILL)


@pytest.mark.integration
def test_help_is_instant_and_imports_nothing_heavy() -> None:
    code = ("import sys; from whetstone.cli import cli; "
            "print(sorted(m for m in ('torch','transformers','chromadb','langgraph') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"
    assert re.search(r"run\s+Run an agent", CliRunner().invoke(cli, ["--help"]).output)


def test_error_messages_keep_their_bracketed_rule_names(capsys: object) -> None:
    import pytest

    from whetstone.engine.commands.common import fail
    from whetstone.engine.errors import ValidationError

    with pytest.raises(SystemExit) as exit_info:
        fail(ValidationError("skills/x/SKILL.md", "name", "must match the folder", line=2,
                             hint="rename [the folder]"))
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert exit_info.value.code == 5
    assert "skills/x/SKILL.md:2: [name] must match the folder" in err
    assert "rename [the folder]" in err


def test_traces_ls_never_cuts_an_id(tmp_path: Path) -> None:
    spec = script(tmp_path, ["Final Answer: 4"] * 2)
    runner = CliRunner()
    task = "What is two plus two? " * 8  # a task far wider than the terminal
    for _ in range(2):
        assert runner.invoke(cli, ["run", task, "--model", spec]).exit_code == 0
    ids = [r["id"] for r in json.loads(runner.invoke(cli, ["traces", "ls", "--json"]).stdout)]
    for columns in ("50", "80", "120"):
        res = CliRunner(env={"COLUMNS": columns}).invoke(cli, ["traces", "ls"])
        assert res.exit_code == 0, res.output
        assert all(i in res.output for i in ids), (columns, res.output)
        assert max(len(line) for line in res.output.splitlines()) <= int(columns)
        assert "answered" in res.output


def test_quiet_hides_progress_and_warnings_but_not_results_or_errors(tmp_path: Path) -> None:
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "question": "2+2?", "expected": "4"}\n{"id": "b", \n')
    spec = script(tmp_path, ["4"])
    loud = CliRunner().invoke(cli, ["eval", "--tasks", str(tasks), "--model", spec,
                                    "--solver", "direct"])
    assert loud.exit_code == 0 and "not valid JSON" in loud.stderr
    spec = script(tmp_path, ["4"], name="again.json")
    quiet = CliRunner().invoke(cli, ["-q", "eval", "--tasks", str(tasks), "--model", spec,
                                     "--solver", "direct"])
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr
    assert "accuracy 1.000" in quiet.stdout
    failed = CliRunner().invoke(cli, ["-q", "traces", "show", "nope"])
    assert failed.exit_code == 6 and "no trace with id 'nope'" in failed.stderr


def test_verbose_shows_the_engines_log_and_the_level_can_come_from_the_environment(
        tmp_path: Path) -> None:
    import logging

    from whetstone.engine.commands.common import configure_logging

    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "question": "2+2?", "expected": "4"}\n{"id": "b", \n')
    res = CliRunner().invoke(cli, ["-v", "eval", "--tasks", str(tasks), "--model",
                                   script(tmp_path, ["4"]), "--solver", "direct"])
    assert res.exit_code == 0, res.output
    assert "warning: whetstone.tasks: " in res.stderr  # -v names the logger
    assert configure_logging(2, False, None) == logging.DEBUG
    assert configure_logging(0, False, "INFO") == logging.INFO
    assert configure_logging(0, False, None) == logging.WARNING
    assert logging.getLogger("whetstone").level == logging.NOTSET  # default: inherited
    res = CliRunner(env={"WHETSTONE_LOG_LEVEL": "loud"}).invoke(cli, ["traces", "ls"])
    assert res.exit_code == 2 and "WHETSTONE_LOG_LEVEL='loud'" in res.stderr
    res = CliRunner().invoke(cli, ["-v", "-q", "traces", "ls"])
    assert res.exit_code == 2 and "cannot be combined" in res.stderr
