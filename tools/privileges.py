"""Who sandboxed code runs as: never a host-privileged identity.

bubblewrap maps the sandbox's uid onto the uid that starts it. Started by root, that is host
uid 0 even inside a new user namespace with every capability dropped, and the kernel checks
some writes by uid alone: a write to ``/proc/sys/kernel/core_pattern`` hands a command line to
the kernel's core-dump helper, which runs it as host root. So where Whetstone runs as root it
first gives root up for an unprivileged uid and gid (65534, ``nobody``/``nogroup``, by default),
with no supplementary groups, no capabilities and no way back (``setpriv`` from util-linux),
and bubblewrap starts from there, exactly as it does for a normal user.

A folder that uid cannot reach (a Python installed under ``/root``, a checkout in a private
temporary folder) is staged first: in a mount namespace of the call's own (``unshare``), root
binds it onto an empty folder that uid can reach, then gives root up. Nothing is mounted where
the host sees it, and the mounts vanish with the call.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

SANDBOX_UID = 65534  # nobody
SANDBOX_GID = 65534  # nogroup

# Binds each (options, source, target) triple, then runs the rest. Runs as root in the call's
# own mount namespace, before any code of the call: it only mounts what we name.
STAGE_SCRIPT = r"""
mount=$1; shift
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  "$mount" --bind -o "$1" "$2" "$3" || { echo "whetstone-stage: cannot bind $2" >&2; exit 125; }
  shift 3
done
shift
exec "$@"
"""


@dataclass(frozen=True)
class Identity:
    """The host uid and gid sandboxed code runs as (no supplementary groups)."""

    uid: int = SANDBOX_UID
    gid: int = SANDBOX_GID

    def describe(self) -> str:
        return f"uid {self.uid}, gid {self.gid}, no groups, no capabilities"


@dataclass(frozen=True)
class Stage:
    """A host folder bound, for one call, where the unprivileged uid can reach it."""

    source: str
    target: str
    writable: bool = False


@dataclass(frozen=True)
class Drop:
    """How a call started by root gives root up before its code runs."""

    identity: Identity
    setpriv: str
    unshare: str | None  # None: nothing can be staged here
    mount: str | None
    stage_dir: str | None  # empty folders the stages are bound onto (reachable by the uid)

    def argv(self, command: Sequence[str], stages: Sequence[Stage] = ()) -> list[str]:
        """``command`` run as the unprivileged identity, after ``stages`` are bound."""
        ident = self.identity
        drop = [self.setpriv, f"--reuid={ident.uid}", f"--regid={ident.gid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--", *command]
        if not stages:
            return drop
        if self.unshare is None or self.mount is None:
            raise OSError("cannot stage folders here: util-linux's unshare and mount are needed")
        binds: list[str] = []
        for s in stages:
            binds += ["rw,nosuid,nodev" if s.writable else "ro,nosuid,nodev", s.source, s.target]
        return [self.unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                STAGE_SCRIPT, "whetstone-stage", self.mount, *binds, "--", *drop]


def _tool(name: str) -> str | None:
    return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")


def plan_drop(identity: Identity, need_stages: bool) -> Drop | str:
    """How root gives root up here, or why it cannot (a sentence naming what is missing)."""
    setpriv = _tool("setpriv")
    if setpriv is None:
        return "setpriv (util-linux) is not installed, so root cannot be given up"
    unshare, mount = _tool("unshare"), _tool("mount")
    stage_dir = None
    if need_stages:
        if unshare is None or mount is None:
            return ("a folder the sandbox needs is not readable by uid "
                    f"{identity.uid}, and util-linux's unshare and mount are missing to stage it")
        stage_dir = make_stage_dir(identity)
        if stage_dir is None:
            return (f"no temporary folder is reachable by uid {identity.uid} to stage the "
                    "sandbox's folders in (set TMPDIR to one, e.g. /tmp)")
    return Drop(identity, setpriv, unshare, mount, stage_dir)


def work_parent(identity: Identity) -> str | None:
    """The first temporary folder ``identity`` can reach: where call folders and the stage
    folder are made (a call folder under an unreachable TMPDIR could not be entered)."""
    for parent in dict.fromkeys([tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"]):
        if os.path.isdir(parent) and reachable(parent, identity):
            return parent
    return None


def make_stage_dir(identity: Identity) -> str | None:
    """An empty, root-owned folder the uid can search; the stages' mount points are made
    inside it (they stay empty on the host: the binds live in each call's namespace)."""
    parent = work_parent(identity)
    if parent is None:
        return None
    try:
        path = tempfile.mkdtemp(prefix="whetstone-stage-", dir=parent)
        os.chmod(path, 0o755)
    except OSError:
        return None
    return path


def remove_stage_dir(path: str) -> None:
    """Remove a stage folder and its (empty) mount points; what is in use stays."""
    with contextlib.suppress(OSError):
        for name in os.listdir(path):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(path, name))
        os.rmdir(path)


def stage_point(drop: Drop, key: str) -> str:
    """The mount point for ``key`` in the stage folder (made once, empty on the host)."""
    assert drop.stage_dir is not None
    path = os.path.join(drop.stage_dir, key)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o755)
    return path


def _allows(st: os.stat_result, identity: Identity, bits: int) -> bool:
    """Whether the mode of ``st`` grants every permission in ``bits`` (``rwx`` as 4/2/1)."""
    if st.st_uid == identity.uid:
        shift = 6
    elif st.st_gid == identity.gid:
        shift = 3
    else:
        shift = 0
    return (st.st_mode >> shift) & bits == bits


def reachable(path: str, identity: Identity, *, write: bool = False) -> bool:
    """Whether ``identity`` can reach ``path`` by its name: search permission on every folder
    above it, and read (and search, for a folder; and write, if asked) on it. Links are
    followed, as a bind mount follows them."""
    try:
        real = os.path.realpath(path)
        above = []
        here = real
        while here != "/":
            here = os.path.dirname(here)
            above.append(here)
        if not all(_allows(os.stat(d), identity, 1) for d in above):
            return False
        st = os.stat(real)
    except OSError:
        return False
    want = 4 | (1 if stat.S_ISDIR(st.st_mode) else 0) | (2 if write else 0)
    return _allows(st, identity, want)


def chown_tree(root: str, identity: Identity) -> None:
    """Give the call's folder and what was placed in it to the sandbox's uid (links are not
    followed: a name in the folder never turns the chown onto a host file)."""
    for here, dirs, files in os.walk(root):
        os.lchown(here, identity.uid, identity.gid)
        for name in (*dirs, *files):
            os.lchown(os.path.join(here, name), identity.uid, identity.gid)
