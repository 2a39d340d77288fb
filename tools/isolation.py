"""What a sandboxed call can see: the bubblewrap command line, and the probe that says whether
bubblewrap works here.

Under bubblewrap (https://github.com/containers/bubblewrap) each call runs as uid/gid 65534 in
new user, PID, network, IPC and UTS namespaces with every capability dropped, no further user
namespaces and a seccomp filter (``tools/seccomp.py``); bubblewrap never starts as root (where
Whetstone is root, ``tools/privileges.py`` gives root up first), so the code is never host uid 0:
no network (not even the host's 127.0.0.1: the new network namespace has only its own loopback),
its own ``/proc`` (it cannot see or signal its caller, nor read its environment), and a root
filesystem that holds only ``/usr``, the Python interpreter's prefix, the few packages tools
may import (read-only, under ``/opt/whetstone/site``), a minimal ``/dev``, its own ``/proc``
with ``/proc/sys`` an empty read-only folder, and the call's temp directory: the only writable
place. There is no ``/etc``, no ``/sys``, no home, no ``/root``, no ``/tmp``.

Our own init runs as PID 1 of the namespace (``--as-pid-1``): it starts the program, waits for
it, then kills and reports whatever the program left running, so a ``setsid`` daemon dies with
the call and the caller learns of it. bubblewrap's ``--die-with-parent`` kills the whole
namespace when the caller dies, so nothing outlives a killed ``whetstone`` either.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import site
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .privileges import (
    Drop,
    Identity,
    Stage,
    chown_tree,
    plan_drop,
    reachable,
    stage_point,
)
from .seccomp import Filter

SITE_IN_SANDBOX = "/opt/whetstone/site"
DEFAULT_PACKAGES = ("numpy", "PIL", "sympy", "mpmath")
REPORT_PREFIX = "whetstone-sandbox-report"
_TOP_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_PROBE_TIMEOUT_S = 20.0
_DEVICES = ("null", "zero", "full", "random", "urandom")

# PID 1 of the sandbox (dash or any POSIX sh). A background job's stdin is /dev/null unless
# redirected, so stdin goes through fd 3; ``kill -9 -1`` from PID 1 reaches every other process
# of the namespace and nothing outside it.
INIT_SCRIPT = r"""
report=$1; shift
exec 3<&0
"$@" 0<&3 3<&- &
exec 3<&-
wait "$!"
rc=$?
n=0
for p in /proc/[0-9]*; do
  [ "$p" = /proc/1 ] || n=$((n + 1))
done
if [ "$n" -gt 0 ]; then
  kill -9 -1 2>/dev/null
  printf '\n%s %s\n' "$report" "$n" >&2
fi
exit "$rc"
"""


@dataclass(frozen=True)
class PythonView:
    """The interpreter and packages a sandboxed call sees, as read-only bind mounts."""

    python: str  # the base interpreter (a venv's python is a link to it)
    prefix: str  # the installation the interpreter needs (stdlib, libpython)
    hidden_sites: tuple[str, ...]  # the base installation's own site-packages, hidden
    packages: tuple[tuple[str, str], ...]  # (host path, name under SITE_IN_SANDBOX)
    missing: tuple[str, ...] = ()  # requested packages not installed here

    @classmethod
    def of_this_interpreter(cls, packages: Sequence[str] = DEFAULT_PACKAGES) -> PythonView:
        python = os.path.realpath(sys.executable)
        prefix = os.path.realpath(sys.base_prefix)
        sites = [os.path.realpath(s) for s in site.getsitepackages([sys.base_prefix])]
        binds: list[tuple[str, str]] = []
        missing = []
        for name in packages:
            found = _package_dirs(name)
            if not found:
                missing.append(name)
            binds += found
        return cls(python, prefix, tuple(s for s in sites if os.path.isdir(s)),
                   tuple(dict.fromkeys(binds)), tuple(missing))


def _package_dirs(name: str) -> list[tuple[str, str]]:
    """The folder of package ``name`` and the ``*.libs`` folders its wheel vendored shared
    libraries into (auditwheel names them after the distribution: PIL -> pillow.libs)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    pkg = Path(next(iter(spec.submodule_search_locations))).resolve()
    site_dir = pkg.parent
    out = [(str(pkg), name)]
    for libs in sorted(site_dir.glob("*.libs")):
        dist = libs.name[: -len(".libs")]
        if dist == name or name in _top_level(site_dir, dist):
            out.append((str(libs), libs.name))
    return out


def _top_level(site_dir: Path, dist: str) -> set[str]:
    names: set[str] = set()
    for info in site_dir.glob(f"{dist}-*.dist-info"):
        with contextlib.suppress(OSError):
            names |= set((info / "top_level.txt").read_text().split())
    return names


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class Launch:
    """Everything a bubblewrap start needs besides the call itself: the executable, the view
    of Python, the identity the code runs as, and, where Whetstone runs as root, how root is
    given up first (``drop``) and which host folders are staged for that uid."""

    bwrap: str
    view: PythonView
    identity: Identity = field(default_factory=Identity)
    drop: Drop | None = None  # None: we are not root, bubblewrap starts as we are
    stages: tuple[Stage, ...] = ()  # the view's folders the uid cannot reach

    @classmethod
    def plan(cls, bwrap: str, view: PythonView, identity: Identity) -> Launch | str:
        """The launch for this process (root or not), or why root cannot be given up."""
        if os.geteuid() != 0:
            return cls(bwrap, view, identity)
        sources = [(view.prefix, False)] if not _under(view.prefix, "/usr") else []
        sources += [(os.path.dirname(host), False) for host, _ in view.packages]
        sources = list(dict.fromkeys(s for s in sources if not reachable(s[0], identity)))
        drop = plan_drop(identity, need_stages=bool(sources))
        if isinstance(drop, str):
            return drop
        stages = tuple(Stage(src, stage_point(drop, f"s{i}"), False)
                       for i, (src, _) in enumerate(sources))
        return cls(bwrap, view, identity, drop, stages)

    def argv(self, workdir: str, env: Mapping[str, str], command: Sequence[str], report: str,
             seccomp_fd: int | None = None) -> list[str]:
        """The full command line of one call: giving root up (as root), bubblewrap, our init
        as PID 1, then ``command``. ``workdir`` must be the uid's own (see ``work_parent``)."""
        inner = bwrap_argv(self.bwrap, self.view, workdir, env, command, report,
                           identity=self.identity, stages=self.stages, seccomp_fd=seccomp_fd)
        return inner if self.drop is None else self.drop.argv(inner, self.stages)


def _staged(path: str, stages: Sequence[Stage]) -> str:
    """Where bubblewrap finds host ``path``: under its stage, when it has one."""
    for s in stages:
        if _under(path, s.source):
            return s.target + path[len(s.source.rstrip("/")):]
    return path


def bwrap_argv(bwrap: str, view: PythonView, workdir: str, env: Mapping[str, str],
               command: Sequence[str], report: str, *, identity: Identity | None = None,
               stages: Sequence[Stage] = (), seccomp_fd: int | None = None) -> list[str]:
    """bubblewrap's command line: our init as PID 1, then ``command``. Inside, the code is
    ``identity``'s uid and gid (65534 by default) whoever starts bubblewrap; ``stages`` say
    where host folders were staged for an unprivileged uid; ``seccomp_fd`` holds the filter."""
    ident = identity or Identity()
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox",
            "--uid", str(ident.uid), "--gid", str(ident.gid)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in _TOP_DIRS:
        host = f"/{top}"
        if os.path.islink(host):
            argv += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            argv += ["--ro-bind", host, host]
    if not _under(view.prefix, "/usr"):
        argv += ["--ro-bind", _staged(view.prefix, stages), view.prefix]
    for hidden in view.hidden_sites:
        if _under(hidden, "/usr") or _under(hidden, view.prefix):
            argv += ["--tmpfs", hidden, "--remount-ro", hidden]
    for host, name in view.packages:
        argv += ["--ro-bind", _staged(host, stages), f"{SITE_IN_SANDBOX}/{name}"]
    # Its own /proc, with /proc/sys an empty read-only folder; no /sys. A /dev of the few
    # harmless devices (not bubblewrap's --dev: its devpts needs uid 0 in a first namespace).
    argv += ["--proc", "/proc", "--tmpfs", "/proc/sys", "--remount-ro", "/proc/sys",
             "--tmpfs", "/dev"]
    for dev in _DEVICES:
        argv += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        argv += ["--symlink", f"/proc/self/fd/{i}", f"/dev/{name}"]
    argv += ["--symlink", "/proc/self/fd", "/dev/fd", "--remount-ro", "/dev",
             "--bind", _staged(workdir, stages), workdir, "--chdir", workdir,
             "--remount-ro", "/", "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    return [*argv, "--", "/bin/sh", "-c", INIT_SCRIPT, "whetstone-init", report, *command]


@dataclass(frozen=True)
class BwrapProbe:
    """Whether bubblewrap can run a sandboxed Python here, and if not, why."""

    path: str | None
    version: str | None
    works: bool
    problem: str | None = None
    launch: Launch | None = None


def find_bwrap() -> str | None:
    """The bubblewrap executable on PATH or in the usual places."""
    return shutil.which("bwrap") or next(
        (p for p in ("/usr/bin/bwrap", "/usr/local/bin/bwrap") if os.access(p, os.X_OK)), None)


def probe_bwrap(view: PythonView, scratch: str, bwrap: str | None,
                identity: Identity | None = None, seccomp: Filter | None = None) -> BwrapProbe:
    """Run ``python -c ...`` under the real command line once (user namespaces may be
    disabled, a kernel may refuse a mount, root may not be able to give itself up): a sandbox
    that cannot start is reported, not assumed. The program checks the identity it got."""
    ident = identity or Identity()
    if bwrap is None:
        return BwrapProbe(None, None, False, "bubblewrap (bwrap) is not installed")
    if not os.access(bwrap, os.X_OK):
        return BwrapProbe(None, None, False, f"no bubblewrap executable at {bwrap}")
    launch = Launch.plan(bwrap, view, ident)
    if isinstance(launch, str):
        return BwrapProbe(bwrap, None, False, launch)
    check = f"import os, sys; sys.exit(0 if os.getuid() == {ident.uid} else 3)"
    fd = seccomp.open_fd() if seccomp is not None and seccomp.program else None
    try:
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True,
                                 check=False, timeout=_PROBE_TIMEOUT_S).stdout.strip() or None
        if launch.drop is not None:
            chown_tree(scratch, ident)
        argv = launch.argv(scratch, {"PATH": "/usr/bin:/bin"},
                           [view.python, "-s", "-B", "-c", check], REPORT_PREFIX, fd)
        run = subprocess.run(argv, capture_output=True, text=True, check=False,
                             timeout=_PROBE_TIMEOUT_S, env={"PATH": "/usr/bin:/bin"},
                             stdin=subprocess.DEVNULL, pass_fds=() if fd is None else (fd,))
    except (OSError, subprocess.SubprocessError) as exc:
        return BwrapProbe(bwrap, None, False, f"{bwrap} could not run: {exc}")
    finally:
        if fd is not None:
            os.close(fd)
    if run.returncode != 0:
        detail = (run.stderr.strip().splitlines() or [f"exit code {run.returncode}"])[-1]
        who = (f" as uid {ident.uid} (root gives itself up first)"
               if launch.drop is not None else "")
        return BwrapProbe(bwrap, version, False, f"{bwrap} failed{who}: {detail}")
    return BwrapProbe(bwrap, version, True, launch=launch)
