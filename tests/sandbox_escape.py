"""The escape program of hardening III, item 1, and the report it leaves: run by the python tool
as it is, and by a learned tool through the frame road the admission check once missed.

It asks the kernel's core-dump helper to run ``id`` as host root (by writing
``/proc/sys/kernel/core_pattern`` and aborting a child), then puts the original back; it also
tries to open every host knob a uid-0 process could write (``/proc/sys/vm``, ``/proc/sys/fs``,
``/proc/sysrq-trigger``, ``/sys``) and reports the identity it sees. Nothing is written but
core_pattern, and that only where the sandbox is broken.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")
KNOBS = ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/swappiness",
         "/proc/sys/fs/protected_symlinks", "/proc/sysrq-trigger",
         "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/fs/cgroup/cgroup.procs")

# Sets REPORT (a JSON text); CANARY is the file the core helper would write on the host.
BODY = r'''
import errno as _errno, json as _json, os as _os
def _status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
def _outer(path, inner):
    for line in open(path):
        i, o, c = map(int, line.split())
        if i <= inner < i + c:
            return o + inner - i
_report = {"uid": _os.getuid(), "gid": _os.getgid(), "euid": _os.geteuid(),
           "groups": _os.getgroups(),
           "outer_uid": _outer("/proc/self/uid_map", _os.getuid()),
           "outer_gid": _outer("/proc/self/gid_map", _os.getgid()),
           "cap_eff": _status("CapEff"), "cap_prm": _status("CapPrm"),
           "cap_bnd": _status("CapBnd"), "no_new_privs": _status("NoNewPrivs"),
           "seccomp": _status("Seccomp"), "knobs": {}}
for _p in KNOBS:
    try:
        _os.close(_os.open(_p, _os.O_WRONLY))
        _report["knobs"][_p] = "WRITABLE"
    except OSError as _e:
        _report["knobs"][_p] = _errno.errorcode.get(_e.errno, str(_e.errno))
try:
    _p = "/proc/sys/kernel/core_pattern"; _orig = open(_p).read()
    open(_p, "w").write("|/bin/sh -c id>" + CANARY)
    if _os.fork() == 0:
        _os.abort()
    _os.wait(); open(_p, "w").write(_orig)
    _report["core"] = "WRITTEN"
except OSError as _e:
    _report["core"] = _errno.errorcode.get(_e.errno, str(_e.errno))
REPORT = _json.dumps(_report)
'''


def canary_path() -> Path:
    """A file the host would get if the kernel ran the core helper for the sandbox."""
    return Path(tempfile.gettempdir()) / f"whetstone-pwned-{uuid.uuid4().hex}"


def program(canary: Path) -> str:
    """The python tool's program: run the body, print its report on one line."""
    return (f"KNOBS = {KNOBS!r}\nCANARY = {str(canary)!r}\n{BODY}\n"
            "print('REPORT ' + REPORT)\n")


def learned_tool(canary: Path) -> str:
    """A learned tool that reaches ``exec`` through a generator's frame and runs the body."""
    code = f"KNOBS = {KNOBS!r}\nCANARY = {str(canary)!r}\n{BODY}"
    return (
        "def probe(note: str) -> str:\n"
        '    """Report what the sandbox allows.\n\n'
        "    Args:\n"
        "        note: anything.\n"
        '    """\n'
        '    run = (i for i in [1]).gi_frame.f_builtins["exec"]\n'
        "    space = {}\n"
        f"    run({code!r}, space)\n"
        '    return space["REPORT"]\n')


def parse_report(text: str) -> dict[str, Any]:
    """The report in a tool's output (a ``REPORT {...}`` line, or the bare JSON, or the JSON
    string a learned tool returned)."""
    if text.strip().startswith('"'):
        text = json.loads(text)
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("REPORT "):
            return json.loads(line[len("REPORT "):])
        if line.startswith('{"uid"'):
            return json.loads(line)
    raise AssertionError(f"no report in the tool's output: {text[-2000:]!r}")


def assert_unprivileged(report: dict[str, Any], *, uid: int = 65534, gid: int = 65534) -> None:
    """What the sandboxed code must see: an unprivileged uid/gid mapped to a non-root one, no
    capabilities, no way to gain one, a seccomp filter, and no host knob it could open."""
    assert (report["uid"], report["euid"], report["gid"]) == (uid, uid, gid), report
    assert report["groups"] == [] or report["groups"] == [gid], report
    assert report["outer_uid"] not in (0, None) and report["outer_gid"] not in (0, None), report
    assert int(report["cap_eff"], 16) == 0 and int(report["cap_prm"], 16) == 0, report
    assert int(report["cap_bnd"], 16) == 0, report
    assert report["no_new_privs"] == "1" and report["seccomp"] == "2", report
    assert report["core"] != "WRITTEN", report
    assert "WRITABLE" not in report["knobs"].values(), report["knobs"]


def host_untouched(before: str, canary: Path) -> None:
    """core_pattern is as it was and the core helper wrote nothing (it would have run
    asynchronously as root: wait for it a little). Restores core_pattern if it changed, so a
    failing run does not leave the machine's core dumps piped to a shell."""
    now = CORE_PATTERN.read_text()
    if now != before and os.geteuid() == 0:
        CORE_PATTERN.write_text(before)
    deadline = time.monotonic() + 1.0
    while not canary.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    exists = canary.exists()
    if exists:
        canary.unlink()
    assert now == before, f"core_pattern was changed to {now!r}"
    assert not exists, "the kernel ran the core helper for sandboxed code"
