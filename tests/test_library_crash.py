"""Crash safety: a writer is SIGKILLed at random points, many times, while it commits versions
(and, in some rounds, while it syncs the index). Every time, the library must open at the old
or the new version, hold exactly that version's files, validate, show them in its view, and
its index must match it.

Run as a script, this file is the writer (``python test_library_crash.py ROOT PROGRESS MODE``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest

from whetstone.engine.api import open_library
from whetstone.library_store.fsutil import atomic_write, sha256_bytes
from whetstone.library_store.store import version_number

ROUNDS = 30  # kills while committing
INDEX_ROUNDS = 3  # of which the last ones also sync the index in the writer


def change_set(k: int) -> dict[str, str | None]:
    """The k-th commit of the writer (k = 1, 2, ...): edits, additions, deletions, a big file."""
    i = k % 7
    changes: dict[str, str | None] = {
        f"skills/s{i}/SKILL.md": f"---\nname: s{i}\ndescription: Skill s{i} for crash tests, "
                                 f"revision {k}.\n---\n\n# s{i}\n\nrevision {k}\n",
        "policies/big.md": "".join(f"[n{j}] helpful={k} :: note {j} of revision {k}\n"
                                   for j in range(2000)),
    }
    if k % 3 == 0:
        changes[f"skills/n{k}/SKILL.md"] = (f"---\nname: n{k}\ndescription: Added at commit {k} "
                                            f"to test crashes.\n---\n\nBody {k}\n")
        changes[f"skills/n{k}/references/notes.md"] = f"notes {k}\n"
        if k >= 9:
            changes[f"skills/n{k - 6}/SKILL.md"] = None
            changes[f"skills/n{k - 6}/references/notes.md"] = None
    return changes


def expected_files(k: int) -> dict[str, str]:
    """path -> sha256 after commits 1..k, replayed in memory."""
    files: dict[str, str] = {}
    for j in range(1, k + 1):
        for path, text in change_set(j).items():
            if text is None:
                files.pop(path, None)
            else:
                files[path] = sha256_bytes(text.encode())
    return files


def writer(root: str, progress: str, mode: str) -> None:

    lib = open_library(root)
    index = None
    if mode == "index":
        from whetstone.skills.index import LibraryIndex

        index = LibraryIndex(lib)
        index.ensure()
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, b"ready\n")
    k = version_number(lib.current_id())  # commit k makes version v(k+1)
    while True:
        os.write(fd, f"start {k}\n".encode())
        lib.commit(change_set(k), method="crash-test", message=f"k={k}", validate=True)
        os.write(fd, f"done {k}\n".encode())
        if index is not None:
            index.ensure()
            os.write(fd, f"indexed {k}\n".encode())
        k += 1


def run_round(root: Path, progress: Path, mode: str, rng: random.Random) -> list[str]:
    progress.write_text("")
    proc = subprocess.Popen([sys.executable, __file__, str(root), str(progress), mode],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    # Kill at a random moment after the writer's first commit of the round has landed, not
    # after a fixed delay from its start: on a loaded machine a fixed delay can end before a
    # commit begins, and the rounds would test nothing.
    while "done" not in progress.read_text():
        if proc.poll() is not None:
            raise AssertionError(f"writer died: {proc.stderr.read().decode()}")
        assert time.monotonic() < deadline, "writer never committed"
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.3 if mode == "files" else 2.0))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    proc.stderr.close()
    return progress.read_text().split()


def check_library(root: Path, lines: list[str]) -> tuple[int, bool]:
    """Asserts the invariants; returns the committed k and whether the kill hit a commit."""

    started = [int(x) for a, x in pairwise(lines) if a == "start"]
    done = [int(x) for a, x in pairwise(lines) if a == "done"]
    lib = open_library(root)  # opening repairs the view after a crash
    k = version_number(lib.current_id()) - 1
    last_done = max(done, default=k if not started else started[0] - 1)
    mid_commit = bool(started) and started[-1] == last_done + 1
    # The old version or the new one, nothing else.
    assert k == last_done or (mid_commit and k == started[-1]), (k, lines[-6:])
    snap = lib.snapshot()
    assert snap.files() == expected_files(k)
    assert lib.verify() == []
    assert lib.validator is not None and lib.validator(snap) == []
    assert not lib.edits(), lib.edits()
    assert [m.id for m in lib.log()] == [f"v{n}" for n in range(k + 1, 0, -1)]
    return k, mid_commit


@pytest.mark.integration
def test_sigkill_at_random_points_leaves_the_old_or_the_new_version(tmp_path: Path) -> None:
    from whetstone.library_store.embeddings import TextEmbedder
    from whetstone.skills.index import LibraryIndex

    root = tmp_path / "lib"
    open_library(root, create=True)
    rng = random.Random(1234)
    index = LibraryIndex(open_library(root), TextEmbedder())
    hits_mid_commit = 0
    committed = 0
    for r in range(ROUNDS):
        mode = "index" if r >= ROUNDS - INDEX_ROUNDS else "files"
        lines = run_round(root, tmp_path / f"progress-{r}", mode, rng)
        k, mid = check_library(root, lines)
        hits_mid_commit += mid
        committed = k
        # The index (left half-synced by the killed writer in index rounds) must be brought
        # to exactly this version.
        index.library = open_library(root)
        snap = index.library.snapshot()
        index.ensure(snap)
        assert index.check(snap) == [], f"round {r}"
        newest = max((n for n in range(3, k + 1, 3) if n > k - 6), default=None)
        if newest is not None:  # the graph this process queries is not stale
            doc = f"n{newest}: Added at commit {newest} to test crashes."
            top = index.query(index.embed_query(doc), k=1)[0]
            assert (top.key, top.hash) == (f"n{newest}",
                                           snap.hash_of(f"skills/n{newest}/SKILL.md"))
    index.close()
    assert committed > ROUNDS  # the writers made progress between kills
    assert hits_mid_commit >= ROUNDS // 3, "kills should often land inside a commit"
    # Temp files a killed writer left are removed by the next write.
    lib = open_library(root)
    lib.commit({"skills/final/SKILL.md": "---\nname: final\ndescription: d\n---\n"},
               method="final")
    assert list((root / ".tmp").iterdir()) == []


if __name__ == "__main__":
    writer(*sys.argv[1:4])


@pytest.mark.integration
def test_a_file_memo_reads_again_whenever_the_file_is_replaced(tmp_path: Path) -> None:
    """CURRENT and the index state are read on every request through a stat-keyed memo: a
    replace (what every writer does) is seen at once; a missing file raises as open does."""
    from whetstone.library_store.fsutil import FileMemo

    target = tmp_path / "CURRENT"
    memo = FileMemo(target, str.strip)
    with pytest.raises(FileNotFoundError):
        memo.get()
    for vid in ("v1", "v2", "v3"):  # same size each time: only the new inode/times tell
        atomic_write(target, f"{vid}\n".encode(), tmp_dir=tmp_path / ".tmp", durable=False)
        assert memo.get() == vid
    target.write_text("v4\n")  # written in place (by hand): new times
    assert memo.get() == "v4"
