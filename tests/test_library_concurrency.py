"""Concurrency: several processes commit at once; every version lands, in order, nothing lost,
and readers never block or see a mix of versions.

Run as a script, this file is one writer (``python test_library_concurrency.py ROOT ID N GO``).
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from itertools import pairwise
from pathlib import Path

import pytest

from whetstone.library_store.store import Library, version_number

WRITERS = 4
COMMITS = 8


def skill(name: str) -> str:
    return f"---\nname: {name}\ndescription: Written by a concurrent writer.\n---\n\n{name}\n"


def writer(root: str, wid: str, n: str, go: str) -> None:
    lib = Library.open(root)
    while not Path(go).exists():  # start together
        time.sleep(0.001)
    rng = random.Random(int(wid))
    for i in range(int(n)):
        name = f"w{wid}-{i}"
        lib.commit({f"skills/{name}/SKILL.md": skill(name)}, method=f"writer-{wid}",
                   message=name)
        time.sleep(rng.uniform(0, 0.01))  # a writer does some work between commits


@pytest.mark.integration
def test_concurrent_writers_all_land_in_order(tmp_path: Path) -> None:
    root = tmp_path / "lib"
    Library.init(root)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, __file__, str(root), str(w), str(COMMITS),
                               str(go)], stderr=subprocess.PIPE) for w in range(WRITERS)]
    seen: list[tuple[str, int]] = []
    stop = threading.Event()

    def reader() -> None:
        lib = Library.open(root)
        while not stop.is_set():
            snap = lib.snapshot()
            # Each version adds exactly one skill: a consistent read has n-1 of them.
            seen.append((snap.id, len(snap.children("skills"))))

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.5)  # let every writer import and wait at the barrier
    go.touch()
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read().decode()
        p.stderr.close()
    stop.set()
    thread.join()

    lib = Library.open(root)
    total = WRITERS * COMMITS
    assert lib.current_id() == f"v{total + 1}"
    log = list(reversed(lib.log()))
    assert [m.id for m in log] == [f"v{n}" for n in range(1, total + 2)]
    assert all(m.parent == prev.id for prev, m in pairwise(log))
    assert all(m.created >= prev.created for prev, m in pairwise(log))
    landed = [m.message for m in log[1:]]
    assert sorted(landed) == sorted(f"w{w}-{i}" for w in range(WRITERS) for i in range(COMMITS))
    order = [m.method for m in log[1:]]
    switches = sum(a != b for a, b in pairwise(order))
    assert switches >= 2 * WRITERS, f"writers did not contend: {order}"
    for w in range(WRITERS):  # each writer's commits in its own order
        mine = [int(msg.split("-")[1]) for msg in landed if msg.startswith(f"w{w}-")]
        assert mine == list(range(COMMITS))
    assert len(lib.snapshot().children("skills")) == total
    assert not lib.edits() and lib.verify() == []
    assert seen and all(n == version_number(vid) - 1 for vid, n in seen)


if __name__ == "__main__":
    writer(*sys.argv[1:5])
