"""Sandbox pieces that do not need a particular machine: where cgroups go (v1 here, v2 on
most current hosts), the report line our init writes, files in and out of a call."""

from __future__ import annotations

from pathlib import Path

import pytest

from whetstone.engine.errors import ToolError
from whetstone.tools.sandbox import default_sandbox
from whetstone.tools.sandbox_io import MAX_OUTPUT_BYTES, Sink
from whetstone.tools.sandbox_limits import (
    CgroupPlace,
    cgroup_candidates,
    parse_mountinfo,
    parse_proc_cgroup,
)

V1_MOUNTS = """\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_OWN = "8:pids:/\n4:memory:/process_api/abc\n0::/\n"
SYSTEMD_V2 = "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
SYSTEMD_OWN = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/term.scope\n"
CONTAINER_V2 = "700 690 0:26 /docker/f00 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n"


def test_cgroup_v1_places_follow_our_own_cgroups() -> None:
    v2, v1 = cgroup_candidates(parse_mountinfo(V1_MOUNTS), parse_proc_cgroup(V1_OWN))
    assert v1 == CgroupPlace("cgroup1", Path("/sys/fs/cgroup/memory/process_api/abc"),
                             Path("/sys/fs/cgroup/pids"))
    assert v2 == [Path("/sys/fs/cgroup/unified")]  # tried first; here it has no controllers


def test_cgroup_v2_places() -> None:
    v2, v1 = cgroup_candidates(parse_mountinfo(SYSTEMD_V2), parse_proc_cgroup(SYSTEMD_OWN))
    # A leaf that holds us cannot have controller-enabled children: its delegated parent can.
    assert v2 == [Path("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice")]
    assert v1 is None
    v2, _ = cgroup_candidates(parse_mountinfo(CONTAINER_V2), parse_proc_cgroup("0::/\n"))
    assert v2 == [Path("/sys/fs/cgroup")]  # a private cgroup namespace: its root


def test_the_init_report_is_taken_off_stderr_even_after_a_flood() -> None:
    small = Sink()
    small.add(b"Traceback...\nboom\n")
    small.add(b"\nwhetstone-sandbox-report-x 2\n")
    assert small.take_line(b"whetstone-sandbox-report-x") == b"whetstone-sandbox-report-x 2"
    assert small.text() == "Traceback...\nboom\n"
    flood = Sink()
    flood.add(b"y" * (MAX_OUTPUT_BYTES * 2))
    flood.add(b"\nwhetstone-sandbox-report-x 1\n")
    assert flood.take_line(b"whetstone-sandbox-report-x") == b"whetstone-sandbox-report-x 1"
    assert flood.text().endswith(f"[{MAX_OUTPUT_BYTES} bytes of output cut]")
    assert Sink().take_line(b"whetstone-sandbox-report-x") is None


def test_a_call_gets_files_in_and_out_but_no_links_out() -> None:
    code = ("import os\n"
            "os.makedirs('out/sub')\n"
            "open('out/a.txt', 'w').write(open('in/data.txt').read().upper())\n"
            "open('out/sub/b.bin', 'wb').write(bytes(range(4)))\n"
            "os.symlink('/etc/hostname', 'out/link')\n"
            "os.symlink('/etc', 'out/dir')\n")
    res = default_sandbox().run_python(code, files={"in/data.txt": "hello",
                                                    "in/raw.bin": b"\x00\xff"},
                                       collect="out")
    assert res.ok, res.stderr
    assert res.outputs == {"a.txt": b"HELLO", "sub/b.bin": b"\x00\x01\x02\x03"}


def test_writing_too_much_is_stopped() -> None:
    code = ("import os\n"
            "for i in range(1000):\n"
            "    with open(f'f{i}', 'wb') as fh:\n"
            "        fh.write(os.urandom(1024 * 1024))\n")
    res = default_sandbox().run_python(code, max_disk_mb=20, timeout_s=20)
    assert res.disk_exceeded and not res.ok
    assert "wrote more than 20 MB" in res.stderr


def test_one_file_may_not_exceed_its_size_limit() -> None:
    code = ("try:\n"
            "    open('big', 'wb').write(b'x' * (30 * 1024 * 1024))\n"
            "except OSError as exc:\n"
            "    print('refused:', exc.strerror)\n")
    res = default_sandbox().run_python(code, max_disk_mb=20, timeout_s=20)
    assert "refused: File too large" in res.stdout


@pytest.mark.parametrize("code", ["import numpy, PIL.Image, sympy; print('ok')"])
def test_the_sandbox_has_the_packages_tools_need(code: str) -> None:
    res = default_sandbox().run_python(code)
    assert res.ok and res.stdout == "ok\n", res.stderr


def test_a_file_name_the_disk_refuses_is_a_clear_error() -> None:
    with pytest.raises(ToolError, match="cannot place"):
        default_sandbox().run_python("print(1)", files={"a" * 300: "x"})
