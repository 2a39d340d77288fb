"""Sandboxed code never holds a host-privileged identity (hardening III, item 1).

Under bubblewrap started by root, the sandbox's uid 0 was host uid 0: with every capability
dropped it still wrote ``/proc/sys/kernel/core_pattern`` (the kernel checks that write by uid),
and the kernel's core-dump helper then ran a shell command as host root. The escape program
(``tests/sandbox_escape.py``) runs here through every face that runs model-written code: the
python tool by ``whetstone tools test`` and by a model's tool call in ``whetstone run``, and a
learned tool by ``whetstone tools test``, over MCP's HTTP transport with a key, and as a
LangChain tool. Each time the code must see uid/gid 65534 mapped to a non-root host uid, no
capabilities, ``no_new_privs`` and a seccomp filter, no host knob it can open, and the host's
core_pattern must be unchanged with no file left by the core helper. The assertions are on the
identity the code sees, so they mean the same as a normal user (the last tests run as one).

The learned tool reaches ``exec`` through a generator's frame, a road the admission check now
refuses. To show the sandbox holds where the check misses a road, those tests take the frame
names out of the check's list for the process that loads the tool (``relaxed_check``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox_escape import (
    CORE_PATTERN,
    assert_unprivileged,
    canary_path,
    host_untouched,
    learned_tool,
    parse_report,
    program,
)
from tests.sandbox_support import marker, processes_with
from whetstone.tools import validate
from whetstone.tools.sandbox import default_sandbox
from whetstone.tools.validate import check_tool_code

REPO = Path(__file__).resolve().parent.parent
FRAME_NAMES = ("gi_frame", "f_builtins")
SKILL = textwrap.dedent("""\
    ---
    name: probe-sandbox
    description: Report what the sandbox allows. Use when asked to probe the sandbox.
    ---
    # Probe
    Call `probe` with any note.
    """)
# Loaded first by every process of a test that serves the learned tool: the check forgets the
# frame road there, as if it had never been found.
SITECUSTOMIZE = ("from whetstone.tools import validate\n"
                 f"for _n in {FRAME_NAMES!r}:\n"
                 "    validate.DENIED_ATTRIBUTES.pop(_n, None)\n")


@pytest.fixture(autouse=True)
def needs_bubblewrap() -> None:
    status = default_sandbox().status
    if status.isolation != "bwrap":
        pytest.skip("the sandbox runs without bubblewrap here: " + "; ".join(status.warnings))


@pytest.fixture
def core_before() -> Iterator[str]:
    before = CORE_PATTERN.read_text()
    yield before
    if os.geteuid() == 0 and CORE_PATTERN.read_text() != before:
        CORE_PATTERN.write_text(before)  # a broken sandbox must not leave the machine broken


@pytest.fixture
def relaxed_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The check misses the frame road in this process and in the processes started with the
    returned environment."""
    for name in FRAME_NAMES:
        monkeypatch.delitem(validate.DENIED_ATTRIBUTES, name, raising=False)
    site = tmp_path / "relaxed-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


def cli(*args: str, home: Path, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "whetstone", *args], cwd=REPO,
                          capture_output=True, text=True, check=False, timeout=timeout,
                          env={**os.environ, "WHETSTONE_HOME": str(home), **(env or {})})


def probe_library(root: Path, canary: Path) -> Path:
    from whetstone.engine.library.checks import validate_library
    from whetstone.library_store.store import Library

    lib = Library.open(root, create=True)
    lib.commit({"skills/probe-sandbox/SKILL.md": SKILL,
                "skills/probe-sandbox/scripts/probe.py": learned_tool(canary)},
               method="test", validate=validate_library)
    return root


def test_the_frame_road_is_refused_at_admission() -> None:
    problems = check_tool_code(learned_tool(canary_path()), path="probe.py")
    frame = "reaches an interpreter frame or code object (its builtins and globals)"
    assert {p.detail for p in problems} >= {f"reads .gi_frame: {frame}",
                                            f"reads .f_builtins: {frame}"}
    aliased = check_tool_code('import string\nf = "{0.gi_frame}".format\n'
                              "g = string.Formatter().get_field\n")
    assert [p.rule for p in aliased] == ["format", "format"]
    assert check_tool_code('def f(image: str) -> bool:\n    """x"""\n'
                           '    return image.format == "PNG"\n') == []


@pytest.mark.integration
def test_python_tool_by_tools_test(tmp_path: Path, core_before: str) -> None:
    canary = canary_path()
    res = cli("tools", "test", "python", json.dumps({"code": program(canary)}), "--json",
              home=tmp_path / "home")
    out = json.loads(res.stdout)
    host_untouched(core_before, canary)
    assert_unprivileged(parse_report(out["output"]))
    assert out["metadata"]["sandbox"]["isolation"] == "bwrap"


@pytest.mark.integration
def test_python_tool_called_by_the_model_in_run(tmp_path: Path, core_before: str) -> None:
    canary = canary_path()
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"tool_calls": True, "replies": [
        {"tool_calls": [{"name": "python", "arguments": {"code": program(canary)}}]},
        "Final Answer: done"]}))
    res = cli("run", "Probe the sandbox.", "--model", f"scripted:{script}", "--tools",
              "python", "--json", home=tmp_path / "home")
    assert res.returncode == 0, res.stderr[-2000:]
    trace = json.loads(res.stdout)
    acts = [s for s in trace["steps"] if s["kind"] == "act"]
    assert acts, trace["steps"]
    host_untouched(core_before, canary)
    assert_unprivileged(parse_report(acts[0]["output"]["observation"]))


@pytest.mark.integration
def test_learned_tool_by_tools_test(tmp_path: Path, core_before: str,
                                    relaxed_check: dict[str, str]) -> None:
    canary = canary_path()
    lib = probe_library(tmp_path / "lib", canary)
    res = cli("tools", "test", "probe", '{"note": "x"}', "--json", "--library", str(lib),
              home=tmp_path / "home", env=relaxed_check)
    out = json.loads(res.stdout)
    host_untouched(core_before, canary)
    assert_unprivileged(parse_report(out["output"]))


def test_learned_tool_as_a_langchain_tool(tmp_path: Path, core_before: str,
                                          relaxed_check: dict[str, str]) -> None:
    from whetstone.engine.integrations.langchain_tools import library_tools_for_langchain

    canary = canary_path()
    lib = probe_library(tmp_path / "lib", canary)
    tools = {t.name: t for t in library_tools_for_langchain(str(lib))}
    content = tools["probe"].invoke({"note": "x"})
    host_untouched(core_before, canary)
    assert_unprivileged(parse_report(str(content)))


@contextlib.contextmanager
def serving_mcp(lib: Path, env: dict[str, str]) -> Iterator[str]:
    """`whetstone mcp` over streamable HTTP with the key k1; yields its URL."""
    from servers import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "whetstone", "mcp", "--transport", "http", "--port",
         str(port), "--library", str(lib), "--api-key", "k1", "--log-level", "warning"],
        cwd=REPO, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the MCP server did not start: {proc.stderr.read()}"
                                       ) from exc
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.integration
async def test_learned_tool_over_mcp_http_with_a_key(tmp_path: Path, core_before: str,
                                                     relaxed_check: dict[str, str]) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    canary = canary_path()
    lib = probe_library(tmp_path / "lib", canary)
    env = {"WHETSTONE_HOME": str(tmp_path / "home"), **relaxed_check}
    with serving_mcp(lib, env) as url:
        client = create_mcp_http_client(headers={"Authorization": "Bearer k1"})
        async with client, streamable_http_client(url, http_client=client) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            ran = await session.call_tool("probe", {"note": "x"})
    host_untouched(core_before, canary)
    assert not ran.is_error, ran
    assert_unprivileged(parse_report(ran.content[0].text))


def test_learned_tool_that_skipped_admission_from_python(tmp_path: Path,
                                                         core_before: str) -> None:
    """``run_learned`` (what the agent, MCP and LangChain call) with a definition whose code
    never passed the check: the sandbox alone holds."""
    from dataclasses import replace

    from whetstone.tools.images import ImageFiles
    from whetstone.tools.learned import define_tool
    from whetstone.tools.learned_run import run_learned

    canary = canary_path()
    benign = ('def probe(note: str) -> str:\n    """Echo.\n\n    Args:\n'
              '        note: anything.\n    """\n    return note\n')
    definition, problems = define_tool(benign, name="probe", skill="probe-sandbox")
    assert definition is not None, problems
    evil = replace(definition, source=learned_tool(canary))
    res = run_learned(evil, {"note": "x"}, images=ImageFiles(tmp_path / "img", (tmp_path,)))
    host_untouched(core_before, canary)
    assert_unprivileged(parse_report(res.output))


def test_the_host_sees_an_unprivileged_uid(tmp_path: Path) -> None:
    """From outside: the sandboxed program's host uid and gid (``/proc/PID/status``) are
    65534 where Whetstone is root, and the caller's own where it is not: never 0."""
    word = marker()
    box = default_sandbox()
    import threading

    done = threading.Event()
    thread = threading.Thread(target=lambda: (box.run_python(
        "import sys, time\ntime.sleep(3)\n", args=(word,), timeout_s=8), done.set()))
    thread.start()
    try:
        deadline = time.monotonic() + 6
        pids: list[int] = []
        while not pids and time.monotonic() < deadline:
            pids = [p for p in processes_with(word)
                    if Path(f"/proc/{p}/exe").exists() and "python" in
                    os.path.basename(os.readlink(f"/proc/{p}/exe"))]
            time.sleep(0.05)
        assert pids, "the sandboxed program was not seen"
        status = Path(f"/proc/{pids[0]}/status").read_text()
        uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
        gids = next(line for line in status.splitlines() if line.startswith("Gid:")).split()[1:]
        want = "65534" if os.geteuid() == 0 else str(os.geteuid())
        assert set(uids) == {want} and "0" not in gids, status
        said = box.status.runs_as
        assert said.startswith("uid 65534, gid 65534") if os.geteuid() == 0 else \
            f"your uid {os.geteuid()}" in said
    finally:
        thread.join(timeout=15)
    assert done.is_set()


# --- as a normal user ------------------------------------------------------------------------

NORMAL_UID = 4242  # no account needed: setpriv takes a number


@pytest.fixture
def normal_user_tree() -> Iterator[Path]:
    """This checkout's code where a normal user can read it (CI's clone may sit in a private
    folder), run by the system's Python of the same version."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user: run as that user, the other tests "
                    "here already are the normal-user case")
    system = Path(f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}")
    if not system.exists() or shutil.which("setpriv") is None:
        pytest.skip(f"no {system} (or setpriv) to run as a normal user with")
    # Not under tmp_path: pytest's folder is private to root.
    top = Path(tempfile.mkdtemp(prefix="whetstone-as-user-"))
    for name in ("whetstone", "engine", "tools", "skills", "library_store"):
        shutil.copytree(REPO / name, top / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "cli.py"):
        shutil.copy(REPO / name, top / name)
    import pyseccomp

    shutil.copy(pyseccomp.__file__, top / "pyseccomp.py")
    for here, _dirs, files in os.walk(top):
        os.chmod(here, 0o755)
        for f in files:
            os.chmod(os.path.join(here, f), 0o644)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def run_as_user(tree: Path, code: str) -> subprocess.CompletedProcess[str]:
    system = f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"
    return subprocess.run(
        ["setpriv", f"--reuid={NORMAL_UID}", f"--regid={NORMAL_UID}", "--clear-groups", "--",
         system, "-s", "-c", code], cwd=tree, capture_output=True, text=True, check=False,
        timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree),
                          "HOME": str(tree), "TMPDIR": "/tmp"})


@pytest.mark.integration
def test_as_a_normal_user_the_sandbox_holds_too(normal_user_tree: Path,
                                                core_before: str) -> None:
    canary = canary_path()
    caller = textwrap.dedent(f"""\
        import json, os
        from whetstone.tools.sandbox import Sandbox
        box = Sandbox.detect()
        res = box.run_python({program(canary)!r})
        weak = Sandbox.detect(isolation="process").run_python(
            "import os; print(os.getuid(), os.getgid())")
        print(json.dumps({{"status": box.status.to_dict(), "out": res.stdout,
                          "err": res.stderr, "weak": weak.stdout, "me": os.getuid()}}))
        """)
    res = run_as_user(normal_user_tree, caller)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    host_untouched(core_before, canary)
    assert got["me"] == NORMAL_UID
    assert got["status"]["isolation"] == "bwrap", got["status"]
    assert got["status"]["runs_as"].startswith(f"uid 65534 in its own user namespace, your "
                                               f"uid {NORMAL_UID}")
    assert_unprivileged(parse_report(got["out"]))
    # Process mode as a normal user runs as that user: weak, but never root.
    assert got["weak"].split() == [str(NORMAL_UID), str(NORMAL_UID)]
