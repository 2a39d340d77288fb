"""Memory and process-count limits for a whole sandboxed call, not per process.

A call gets its own cgroup where one can be made here (cgroup v2 with the memory and pids
controllers, or the v1 ``memory`` and ``pids`` hierarchies), so the kernel counts every process
the call starts together and refuses the fork or OOM-kills past the limit. Where no cgroup is
writable (a non-root user outside a delegated subtree), a watchdog walks the call's process tree
at every tick, sums resident memory and tasks, and stops the call when either goes over: weaker
(a burst between two ticks is not seen), and reported as such. Per-process rlimits apply in every
mode: ``RLIMIT_AS`` turns one huge allocation into a clean ``MemoryError``, ``RLIMIT_FSIZE`` caps
a file, ``RLIMIT_CORE`` 0.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
import signal
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

LimitKind = Literal["cgroup2", "cgroup1", "watchdog"]
Tripped = Literal["memory", "processes"]
_PREFIX = "whetstone-sbx-"
_EMPTY_WAIT_S = 2.0  # how long to wait for a killed cgroup to empty before removing it
_ZAP_WAIT_S = 5.0  # how long a PID namespace may take to die (thousands of processes)
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Limits:
    """What one call may use, all its processes together."""

    memory_mb: int = 512
    max_tasks: int = 64  # processes and threads, the sandbox's own helpers included
    max_file_mb: int = 64  # the largest file it may write


class CallLimiter(Protocol):
    """Limits applied to one call: attach the (gated, not yet running) first process, poll,
    and kill everything at the end."""

    kind: LimitKind

    def attach(self, pid: int, is_reaped: Callable[[], bool] | None = None) -> None:
        """Apply the limits to ``pid`` (not yet running the program); ``is_reaped`` says when
        that pid no longer names our child."""

    def tripped(self) -> Tripped | None: ...

    def kill_all(self, first: Callable[[], None] | None = None) -> int:
        """Kill every process of the call (calling ``first`` once the limiter knows where
        they are: the caller's own kill goes there); returns how many were killed."""

    def close(self) -> None: ...


def set_rlimits(pid: int, limits: Limits) -> None:
    """Per-process limits on ``pid``, inherited by everything it starts."""
    mem = limits.memory_mb * 1024 * 1024
    fsize = limits.max_file_mb * 1024 * 1024
    for res, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, fsize),
                       (resource.RLIMIT_CORE, 0)):
        resource.prlimit(pid, res, (value, value))


# --- cgroups -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CgroupPlace:
    """Where call cgroups are made: the parent folder per hierarchy (one for v2, two for v1)."""

    kind: LimitKind
    memory: Path
    pids: Path


Mount = tuple[str, str, str, frozenset[str]]  # (root, mount point, fs type, super options)


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup mounts in a /proc/self/mountinfo text."""
    out = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) >= 5 and len(rparts) >= 3 and rparts[0] in ("cgroup", "cgroup2"):
            out.append((parts[3], parts[4], rparts[0], frozenset(rparts[2].split(","))))
    return out


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Controller (``""`` for v2) -> cgroup path, from a /proc/self/cgroup text."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError:
        return ""


def _dir_for(mount_root: str, mount_point: str, path: str) -> Path:
    # Inside a cgroup namespace the paths are relative to the namespace's root already.
    rel = path.removeprefix(mount_root)
    return Path(mount_point) / rel.lstrip("/")


def cgroup_candidates(mounts: list[Mount], own: dict[str, str]
                      ) -> tuple[list[Path], CgroupPlace | None]:
    """Where call cgroups could go: the cgroup v2 folders to try, and the v1 memory and pids
    folders (None unless both hierarchies are mounted)."""
    v2: list[Path] = []
    v1: dict[str, Path] = {}
    for root, point, fstype, opts in mounts:
        if fstype == "cgroup2" and "" in own:
            here = _dir_for(root, point, own[""])
            # Our own cgroup can hold children with controllers only when it is the mount's
            # root (a container's private namespace); else its parent, when delegated to us.
            v2.append(here if here == Path(point) else here.parent)
        for controller in ("memory", "pids"):
            if fstype == "cgroup" and controller in opts and controller in own:
                v1[controller] = _dir_for(root, point, own[controller])
    place = CgroupPlace("cgroup1", v1["memory"], v1["pids"]) if set(v1) == {"memory", "pids"} \
        else None
    return v2, place


def _try_make(parent: Path, name: str) -> Path | None:
    try:
        path = parent / name
        path.mkdir()
        return path
    except OSError:
        return None


def find_cgroup_place() -> CgroupPlace | None:
    """A place where this process can make per-call cgroups with memory and pids limits, or
    None. Probes by making (and removing) one; sweeps cgroups left by dead processes."""
    name = f"{_PREFIX}probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    v2, v1 = cgroup_candidates(parse_mountinfo(_read("/proc/self/mountinfo")),
                               parse_proc_cgroup(_read("/proc/self/cgroup")))
    for parent in v2:
        probe = _try_make(parent, name)
        if probe is None:
            continue
        try:
            ok = {"memory", "pids"} <= set((probe / "cgroup.controllers").read_text().split())
        except OSError:
            ok = False
        _remove(probe)
        if ok:
            _sweep(parent)
            return CgroupPlace("cgroup2", parent, parent)
    if v1 is None:
        return None
    made = [p for p in (_try_make(v1.memory, name), _try_make(v1.pids, name)) if p is not None]
    for p in made:
        _remove(p)
    if len(made) != 2:
        return None
    _sweep(v1.memory)
    _sweep(v1.pids)
    return v1


def _procs(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_procs(path: Path) -> int:
    """SIGKILL every process in a cgroup, again until none is left or it stops forking."""
    killed: set[int] = set()
    for _ in range(50):
        pids = _procs(path)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.005)
    return len(killed)


def _remove(path: Path) -> None:
    """Remove a call cgroup once it is empty (the kernel frees dying processes shortly)."""
    deadline = time.monotonic() + _EMPTY_WAIT_S
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return  # swept by a later probe once its processes are gone
            _kill_procs(path)
            time.sleep(0.01)


def _sweep(parent: Path) -> None:
    """Remove call cgroups whose owner process died without cleaning up (a kill -9)."""
    with contextlib.suppress(OSError):
        for child in parent.iterdir():
            if not child.name.startswith(_PREFIX) or not child.is_dir():
                continue
            owner = child.name[len(_PREFIX):].split("-", 1)[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                _kill_procs(child)
                _remove(child)


def _read_counter(path: Path, key: str) -> int:
    """``key N`` from a flat-keyed cgroup file (memory.events, pids.events, oom_control)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


_counter = itertools.count()


class CgroupLimiter:
    """One call's cgroup(s): memory and pids limits that hold for all its processes at once."""

    def __init__(self, place: CgroupPlace, limits: Limits) -> None:
        self.kind: LimitKind = place.kind
        name = f"{_PREFIX}{os.getpid()}-{next(_counter)}-{uuid.uuid4().hex[:6]}"
        self.limits = limits
        self.memory = place.memory / name
        self.pids = place.pids / name if place.kind == "cgroup1" else self.memory
        self.dirs = [self.memory] if self.pids == self.memory else [self.memory, self.pids]
        try:
            for d in self.dirs:
                d.mkdir()
            self._configure()
        except OSError:
            self.close()
            raise

    def _configure(self) -> None:
        mem = str(self.limits.memory_mb * 1024 * 1024)
        tasks = str(self.limits.max_tasks)
        if self.kind == "cgroup2":
            (self.memory / "memory.max").write_text(mem)
            with contextlib.suppress(OSError):  # absent without swap accounting
                (self.memory / "memory.swap.max").write_text("0")
            with contextlib.suppress(OSError):  # one OOM kill takes the whole call (4.19+)
                (self.memory / "memory.oom.group").write_text("1")
            (self.pids / "pids.max").write_text(tasks)
            return
        (self.memory / "memory.limit_in_bytes").write_text(mem)
        with contextlib.suppress(OSError):  # memory+swap, where swap accounting is on
            (self.memory / "memory.memsw.limit_in_bytes").write_text(mem)
        (self.pids / "pids.max").write_text(tasks)

    def attach(self, pid: int, is_reaped: Callable[[], bool] | None = None) -> None:
        set_rlimits(pid, self.limits)
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid))

    def tripped(self) -> Tripped | None:
        if self.kind == "cgroup2":
            oom = _read_counter(self.memory / "memory.events", "oom_kill")
        else:
            oom = _read_counter(self.memory / "memory.oom_control", "oom_kill")
        if oom > 0:
            return "memory"
        if _read_counter(self.pids / "pids.events", "max") > 0:
            return "processes"
        return None

    def kill_all(self, first: Callable[[], None] | None = None) -> int:
        if first is not None:
            first()
        if self.kind == "cgroup2":
            with contextlib.suppress(OSError):  # 5.14+: the kernel kills the whole subtree
                (self.memory / "cgroup.kill").write_text("1")
        return max(_kill_procs(d) for d in self.dirs)

    def close(self) -> None:
        for d in self.dirs:
            _remove(d)


# --- the watchdog ------------------------------------------------------------------------------

def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (of all its threads)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text()
                        .split()]
    return out


def process_tree(root: int, limit: int = 100_000) -> list[int]:
    """``root`` and its descendants, at most ``limit`` of them. Orphans of a PID namespace are
    re-parented to its init, which is in the tree, so a sandbox's whole namespace is found
    from the outside."""
    seen: dict[int, None] = {}
    todo = [root]
    while todo and len(seen) < limit:
        pid = todo.pop()
        if pid not in seen:
            seen[pid] = None
            todo += children(pid)
    return list(seen)


def _tasks_and_anon_rss(pid: int) -> tuple[int, int]:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        statm = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:
        return 0, 0
    threads = next((int(line.split()[1]) for line in status.splitlines()
                    if line.startswith("Threads:")), 1)
    resident, shared = int(statm[1]), int(statm[2])  # shared: file-backed, e.g. libraries
    return threads, (resident - shared) * _PAGE


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, a process's identity."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def _wait_gone(pids: Iterable[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.005)


def stop_and_kill(find: Callable[[set[int]], Iterable[int]], rounds: int = 200) -> set[int]:
    """Kill a set of processes that may be forking as fast as it can (a fork bomb): SIGSTOP
    everything ``find`` returns (it is given what was found so far, to walk from), again until
    nothing new turns up, then SIGKILL them all. A stopped process cannot fork, and a stopped
    parent keeps its children in its tree, so the set stops growing. Returns the pids killed."""
    frozen: set[int] = set()
    for _ in range(rounds):
        new = {p for p in find(frozen) if p not in frozen and _running(p)}
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        frozen |= new
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    _wait_gone(frozen, _EMPTY_WAIT_S)
    return frozen


def _pss(pid: int) -> int:
    """Proportional set size: a page shared by n processes counts 1/n in each (after fork)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class WatchdogLimiter:
    """Limits by polling the call's process tree: the fallback where no cgroup is writable.

    Pids are only trusted while they mean the same process: the root while it is not reaped
    (``is_reaped``), the others by their start time, so a pid the system gave to some other
    process after ours died is never signalled."""

    kind: LimitKind = "watchdog"

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.root: int | None = None
        self.is_reaped: Callable[[], bool] = lambda: False
        self.seen: dict[int, int] = {}  # pid -> start time, of every process seen at a tick

    def attach(self, pid: int, is_reaped: Callable[[], bool] | None = None) -> None:
        set_rlimits(pid, self.limits)
        self.root = pid
        self.is_reaped = is_reaped or self.is_reaped

    def _tree(self, limit: int = 100_000) -> list[int]:
        if self.root is None or self.is_reaped():
            return []
        tree = process_tree(self.root, limit)
        for pid in tree:
            if pid not in self.seen and (start := start_time(pid)) is not None:
                self.seen[pid] = start
        return tree

    def tripped(self) -> Tripped | None:
        # Counting stops past the limit: a fork bomb makes a full walk slow exactly when speed
        # matters (its processes compete with us for the CPU).
        tree = self._tree(limit=self.limits.max_tasks + 1)
        if len(tree) > self.limits.max_tasks:
            return "processes"
        tasks, anon = 0, 0
        for pid in tree:
            t, a = _tasks_and_anon_rss(pid)
            tasks, anon = tasks + t, anon + a
        if tasks > self.limits.max_tasks:
            return "processes"
        limit = self.limits.memory_mb * 1024 * 1024
        # Anonymous RSS counts pages shared after a fork once per process; confirm with PSS
        # (costlier: the kernel walks the page tables) before calling it over.
        if anon > limit and sum(_pss(pid) for pid in tree) > limit:
            return "memory"
        return None

    def kill_all(self, first: Callable[[], None] | None = None) -> int:
        # Snapshot before ``first`` kills our child: under bubblewrap the namespace's processes
        # are below it only while it lives (then they die with the namespace; we wait for it).
        tree = self._tree()
        known = set(tree) | {p for p, t in self.seen.items() if start_time(p) == t}
        heads = children(self.root) if tree and self.root is not None else []
        if first is not None:
            first()
            # Under bubblewrap the head is the namespace's init: the kernel kills everything
            # else in the namespace before init finishes dying, faster than we could.
            _wait_gone(heads, _ZAP_WAIT_S)
        # Walk from the root, from what was seen, and from each stopped process: its children
        # stay put, while an orphan (its parent died on its own) is no longer below the root.
        killed = stop_and_kill(lambda found: self._tree() + list(known) + [
            c for p in found for c in children(p)])
        return len(killed - {self.root})

    def close(self) -> None:
        return None


def make_limiter(place: CgroupPlace | None, limits: Limits) -> CallLimiter:
    """A cgroup limiter where ``place`` allows one, else the watchdog."""
    if place is not None:
        with contextlib.suppress(OSError):
            return CgroupLimiter(place, limits)
    return WatchdogLimiter(limits)
