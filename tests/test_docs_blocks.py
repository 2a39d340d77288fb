"""Every code block of README.md, docs/cli.md, docs/mcp.md and docs/langchain.md runs as
written (issue 37), so a page that drifts from the code fails here: a renamed option, a
command that moved, an example that no longer imports.

What CI cannot have is put in its place by tests/docs_support.py: a model (every spec is a
``scripted:`` double answering the prompts the commands send), the corpus embedder and the
BIG-bench download. Placeholders are filled with real values (``<trace-id>`` an interrupted
run's id, ``NAME`` a learned tool, ``MODULE`` a module with notes), fixed ports with free ones,
``~`` and ``$KEY`` as a shell expands them, and ``a | b | c`` lists of subcommands run one
by one. README's quick start (`make demo`, `make test`) is checked with `make -n`; the
scoreboard's commands run for hours and are not run. ``tests/test_docs_cli.py`` holds
docs/cli.md's tables to the code.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from docs_support import INTERRUPT, install
from servers import free_port

from whetstone.cli import cli

REPO = Path(__file__).resolve().parent.parent
SUPPORT = Path(__file__).resolve().parent / "docs_support.py"
KEY = "docs-test-key"


def blocks(page: str, lang: str) -> list[str]:
    """The ``lang`` code blocks of ``page``, in order."""
    text = (REPO / page).read_text(encoding="utf-8")
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def commands(block: str) -> list[str]:
    """A bash block's commands: comments dropped, continued lines joined, and
    ``whetstone X a | b c | d`` (a list of X's subcommands) as ``whetstone X a``, ..."""
    out, pending = [], ""
    for raw in block.splitlines():
        line = "" if raw.lstrip().startswith("#") else re.sub(r"\s+#\s.*$", "", raw).rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if not line:
            continue
        head, *rest = [part.strip() for part in line.split(" | ")]
        if rest:
            words = head.split()
            out += [head] + [" ".join([*words[:2], alt]) for alt in rest]
        else:
            out.append(head)
    return out


def argv(command: str, fills: dict[str, str]) -> list[str]:
    """The arguments after ``whetstone``, placeholders filled, ``~`` and ``$VAR`` expanded."""
    for placeholder, value in fills.items():
        command = re.sub(rf"(?<![\w-]){re.escape(placeholder)}(?![\w-])", value, command)
    words = shlex.split(command)
    assert words[0] == "whetstone", command
    return [os.path.expandvars(os.path.expanduser(w)) for w in words[1:]]


def invoke(args: list[str], code: int = 0) -> str:
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == code, f"whetstone {shlex.join(args)} -> {res.exit_code}\n{res.output}"
    return res.output


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's machine: HOME (so ~/.whetstone is the default home), a working folder, the
    fakes of docs_support, $KEY."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("WHETSTONE_HOME", raising=False)
    monkeypatch.setenv("KEY", KEY)
    monkeypatch.chdir(work)
    install(monkeypatch, tmp_path / "scratch")
    yield home


def background(args: list[str], tmp: Path, **kw: Any) -> subprocess.Popen[str]:
    """``whetstone ARGS`` in a process of its own, with the fakes, as the docs run it."""
    return subprocess.Popen([sys.executable, str(SUPPORT), str(tmp / "scratch"), *args],
                            cwd=os.getcwd(), env=os.environ.copy(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def wait_for(url: str, proc: subprocess.Popen[str], headers: dict[str, str] | None = None
             ) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                   timeout=2).close()
            return
        except OSError as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"{url} never answered ({exc}): "
                                     f"{proc.communicate()[1][-2000:]}") from None
            time.sleep(0.3)


def listening(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"nothing listens on {port}: "
                                     f"{proc.communicate()[1][-2000:]}") from None
            time.sleep(0.3)


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode


def stdio_server(args: list[str], tmp: Path) -> None:
    """A stdio server the docs start: it loads, and ends cleanly when its client goes."""
    proc = background(args, tmp, stdin=subprocess.PIPE)
    _, err = proc.communicate("", timeout=120)
    assert proc.returncode == 0, f"whetstone {shlex.join(args)} -> {proc.returncode}\n{err}"


def commit_tool_and_notes(home: Path) -> tuple[str, str]:
    """A learned tool and a module's notes in the default library, for the tour's NAME and
    MODULE; (tool, module)."""
    from whetstone import open_library
    from whetstone.engine.library.checks import validate_library

    library = open_library(home / ".whetstone" / "library")
    library.commit({
        "skills/sum-amounts/SKILL.md": "---\nname: sum-amounts\ndescription: Add up prices."
                                       "\n---\n\n# Sum amounts\n\nCall `sum_amounts`.\n",
        "skills/sum-amounts/scripts/sum_amounts.py": textwrap.dedent('''\
            def sum_amounts(amounts: list[float]) -> float:
                """Add up amounts exactly.

                Args:
                    amounts: the numbers to add.
                """
                return sum(amounts)
            '''),
        "policies/think.md": "# Policy notes: think\n[n1] route=* helpful=1 harmful=0 :: "
                             "Check the units before you answer.\n"},
        method="hand", message="a tool and a note for the tour", validate=validate_library)
    return "sum_amounts", "think"


@pytest.mark.integration
def test_the_quick_start_targets_exist() -> None:
    (block,) = [b for b in blocks("README.md", "bash") if "make demo" in b]
    for target in re.findall(r"^make (\w+)", block, flags=re.MULTILINE):
        res = subprocess.run(["make", "-n", target], check=False, cwd=REPO,
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr


@pytest.mark.integration
def test_the_readme_tour_runs_as_written(home: Path, tmp_path: Path) -> None:
    tour = next(b for b in blocks("README.md", "bash") if "whetstone run" in b)
    fills: dict[str, str] = {}
    ran = []
    for command in commands(tour):
        if command.startswith("whetstone run --resume"):
            invoke(["run", INTERRUPT], code=130)  # Ctrl-C in a run: it is resumable
            rows = json.loads(invoke(["traces", "ls", "--json"]))
            fills["<trace-id>"] = next(r["id"] for r in rows if r["outcome"] == "interrupted")
        if command.startswith("whetstone traces show"):
            fills["<trace-id>"] = json.loads(invoke(["traces", "ls", "--json"]))[-1]["id"]
        if command.startswith("whetstone traces import chat-log.jsonl"):  # a team's log
            Path("chat-log.jsonl").write_text(json.dumps({
                "id": "req-1", "expected": "42", "score": 1,
                "messages": [{"role": "user", "content": "What is 12 + 30?"},
                             {"role": "assistant", "content": "42"}]}) + "\n")
        if command == "whetstone library import skills/":  # a folder of skills to import
            Path("skills/word-math").mkdir(parents=True)
            Path("skills/word-math/SKILL.md").write_text(
                "---\nname: word-math\ndescription: Solve arithmetic word problems.\n---\n\n"
                "# Word math\n\n1. Write the numbers down.\n2. Compute, then check.\n")
        if command.startswith("whetstone tools ls"):
            fills["NAME"], fills["MODULE"] = commit_tool_and_notes(home)
            fills["INPUT"] = shlex.quote('{"amounts": [1.5, 2.25]}')
        args = argv(command, fills)
        if "--mcp" in args:
            # The line that reaches mcp-server-sqlite runs from the checkout on the embedded
            # model in tests/test_mcp_docs.py (a scripted model cannot read the shop).
            ran.append(args[0])
            continue
        if args[0] == "serve":
            if "--port" in args:
                args[args.index("--port") + 1] = str(free_port())
            else:
                args += ["--port", str(free_port())]
            port = args[args.index("--port") + 1]
            proc = background(args, tmp_path)
            wait_for(f"http://127.0.0.1:{port}/health", proc)
            assert stop(proc) in (0, 130), proc.communicate()[1]
        elif args[0] == "mcp":
            stdio_server(args, tmp_path)
        elif args[0] == "corpus" and args[1] == "add" and "--tasks" not in args:
            Path("notes").mkdir(exist_ok=True)
            Path("notes/oberoi.md").write_text("The Oberoi Group is based in Mumbai.\n")
            Path("facts.jsonl").write_text('{"text": "Delhi is the capital of India."}\n')
            invoke(args)
        else:
            invoke(args)
        if args[:2] == ["skill", "new"] and len(json.loads(invoke(["library", "log",
                                                                   "--json"]))) == 1:
            # A drafted skill (not yet a version): do what the message says, so the
            # `diff v1 v2` below has its v2.
            invoke(["library", "commit", "-m", f"add {args[2]}"])
        ran.append(args[0])
    assert {"run", "eval", "evolve", "serve", "mcp", "corpus", "verify", "data"} <= set(ran)
    spans = Path("spans.jsonl").read_text()  # the --otel-file lines wrote their spans
    assert '"whetstone.run"' in spans and '"whetstone.chat"' not in spans  # serve answered none
    assert json.loads(invoke(["traces", "ls", "--kind", "import", "--json"]))


def test_the_readme_scorer_example_runs(home: Path) -> None:
    scorer, _ = blocks("README.md", "python")
    Path("scorer.py").write_text(scorer)
    Path("humaneval.jsonl").write_text(json.dumps({
        "id": "add", "question": "Write def add(a, b) that returns the sum.", "expected": "",
        "metadata": {"test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
                     "entry_point": "add"}}) + "\n")
    (line,) = [c for b in blocks("README.md", "bash") for c in commands(b)
               if "--scorer scorer.py" in c]
    invoke(argv(line, {}))


@pytest.mark.trace2skill
def test_the_readme_python_example_runs(home: Path) -> None:
    """On a library of its own: the evolve it ends with learns from the run and the chat
    before it."""
    _, api = blocks("README.md", "python")
    exec(compile(api, "README.md", "exec"), {})  # noqa: S102 - our own docs


def test_the_cli_page_examples_are_a_task_and_a_script_that_work(home: Path) -> None:
    task_line, script = blocks("docs/cli.md", "json")
    Path("one.jsonl").write_text(task_line)
    Path("replies.json").write_text(script)
    out = invoke(["eval", "--tasks", "one.jsonl", "--model", "scripted:replies.json"])
    assert re.search(r"\(\d/1\)  errors 0", out), out  # the line is a task, and it ran
    out = invoke(["run", "What is 17 * 23?", "--model", "scripted:replies.json"])
    assert "Answer: 391" in out


@pytest.mark.integration
def test_the_mcp_page_runs_as_written(home: Path, tmp_path: Path) -> None:
    invoke(["library", "init"])
    # The page's first blocks serve the library; its client section (the other way round)
    # runs against a real MCP server in tests/test_mcp_docs.py.
    block = blocks("docs/mcp.md", "bash")[0]
    config = blocks("docs/mcp.md", "json")[0]
    client = blocks("docs/mcp.md", "python")[0]
    entry = json.loads(config)["mcpServers"]["whetstone"]
    assert entry["command"] == "whetstone"
    # The client's entry, with the page's example home (/home/me) as this one.
    stdio_server([a.replace("/home/me", str(home)) for a in entry["args"]], tmp_path)
    for command in commands(block):
        args = argv(command, {})
        if "--transport" not in args:
            stdio_server(args, tmp_path)
            continue
        port = str(free_port())
        documented = args[args.index("--port") + 1]
        args[args.index("--port") + 1] = port
        proc = background(args, tmp_path)
        try:
            listening(int(port), proc)
            code = client.replace(f":{documented}/", f":{port}/")
            body = textwrap.indent(code, "    ")
            namespace: dict[str, Any] = {"key": KEY}
            exec(compile(f"async def main():\n{body}\n    return hits\n",  # noqa: S102
                         "docs/mcp.md", "exec"), namespace)
            hits = asyncio.run(namespace["main"]())
            assert not hits.is_error and "skills" in hits.structured_content
        finally:
            assert stop(proc) in (0, 130)


def test_the_langchain_page_runs_as_written(home: Path, monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the pages' libraries land here
    invoke(["library", "init"])  # "~/.whetstone/library" of the second block
    namespace: dict[str, Any] = {}
    for code in blocks("docs/langchain.md", "python"):
        exec(compile(code, "docs/langchain.md", "exec"), namespace)  # noqa: S102
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["2.5 hours are 150 minutes.", "['unit-conversion']", "1.0",
                       "Together they cost 5.75.", "['think', 'act', 'think']"]
