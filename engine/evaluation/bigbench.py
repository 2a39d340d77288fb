"""BIG-bench JSON tasks as task sets: ``bigbench:<task>`` (``bigbench:<task>/<subtask>``).

The data is the ``task.json`` of each task folder in the ``bigbench==1.0.0`` sdist (Apache-2.0).
``whetstone data fetch bigbench`` gets the sdist through pip, checks its pinned sha256 and
extracts only those files into the cache (``$WHETSTONE_CACHE`` or ``$WHETSTONE_HOME/cache``)::

    bigbench-1.0.0/manifest.json                      what was extracted, from which sdist
    bigbench-1.0.0/benchmark_tasks/<task>/task.json   one JSON task (subtasks in subfolders)

A JSON task holds ``examples`` with an ``input`` and either ``target`` (a string or a list of
acceptable strings: scored with ``exact_text``, or ``number`` when every target is a number)
or ``target_scores`` (option -> score: multiple choice). Multiple choice with at most
``MAX_LISTED_OPTIONS`` options is shown with lettered options and scored with ``choice``;
with more (an answer to write rather than pick), the correct option is the text to produce.
A task whose folder holds no examples but subtask folders is the union of its subtasks.
Task ids are ``bigbench-<task>-<index>`` (``/`` as ``-``), so splits are stable hashes of them.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import EvalError
from ..paths import cache_dir
from ..prompts import render_prompt
from .answers import extract_number
from .scorers import words_to_digits
from .tasks import TaskRecord, TaskSet, split_of

PACKAGE = "bigbench"
VERSION = "1.0.0"
SDIST = f"{PACKAGE}-{VERSION}.tar.gz"
SDIST_SHA256 = "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2"
# pip 24+ refuses this sdist's metadata ("cannot declare direct URL dependencies"), even for
# `pip download --no-deps`; 23.2.1 still reads it, so downloads run in a throwaway venv with it.
PIP_PIN = "pip==23.2.1"
FETCH_HINT = "whetstone data fetch bigbench  (or --from bigbench-1.0.0.tar.gz if you have it)"
MAX_LISTED_OPTIONS = 26  # one letter each
_CHUNK = 1 << 20
# The only members ever extracted: a task.json under bigbench/benchmark_tasks/, plain names.
_MEMBER = re.compile(
    r"^[^/]+/bigbench/benchmark_tasks/(?P<rel>(?:[A-Za-z0-9_][A-Za-z0-9_.-]*/)+)task\.json$")
_TASK_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$")


def data_dir(cache: Path | None = None) -> Path:
    """Where the extracted tasks live: ``<cache>/bigbench-1.0.0``."""
    return (cache_dir() if cache is None else Path(cache)) / f"{PACKAGE}-{VERSION}"


# --- fetching ------------------------------------------------------------------------------

@dataclass(frozen=True)
class FetchResult:
    """What ``install_sdist`` did: where the tasks are, how many files, and the timings."""

    path: Path
    files: int
    bytes: int
    sha256: str
    download_s: float = 0.0
    extract_s: float = 0.0
    replaced: bool = False


def _sha256_stream(f: BinaryIO) -> str:
    h = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        h.update(chunk)
    return h.hexdigest()


class _HashingReader:
    """The sdist as tarfile streams it, hashed on the way: what was extracted is what was
    hashed, byte for byte, whatever happens to the file or its path meanwhile."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.hash = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.hash.update(data)
        return data

    def hexdigest(self) -> str:
        """The hash of every byte of the file: the rest after the archive's end included."""
        while self.read(_CHUNK):
            pass
        return self.hash.hexdigest()


Runner = Callable[..., subprocess.CompletedProcess[str]]


def download_sdist(dest: Path, *, python: str = sys.executable,
                   run: Runner = subprocess.run) -> Path:
    """Download the sdist into ``dest`` with ``pip download`` by package name, run by a pinned
    older pip in a throwaway venv (the project's own pip is never changed). pip's own index
    configuration (``PIP_INDEX_URL``, pip.conf) applies."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    venv = dest / "pip-venv"
    vpy = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    steps = [
        [python, "-m", "venv", str(venv)],
        [str(vpy), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", PIP_PIN],
        [str(vpy), "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
         "--no-binary", ":all:", "-d", str(dest), f"{PACKAGE}=={VERSION}"],
    ]
    try:
        for cmd in steps:
            proc = run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout or "").strip()[-1500:]
                raise EvalError(f"`{' '.join(cmd[2:5])} ...` failed (exit {proc.returncode}):"
                                f"\n{tail}",
                                hint="check pip can reach your package index, or download "
                                     f"{SDIST} yourself and pass it: whetstone data fetch "
                                     "bigbench --from PATH")
    finally:
        shutil.rmtree(venv, ignore_errors=True)
    sdist = dest / SDIST
    if not sdist.is_file():
        raise EvalError(f"pip reported success but {sdist} is missing",
                        hint="pass the sdist yourself: whetstone data fetch bigbench --from PATH")
    return sdist


def _extract(stream: _HashingReader, into: Path) -> tuple[int, int]:
    """Copy each ``task.json`` member into ``into/benchmark_tasks/<rel>``: regular files only,
    names matched against a strict pattern (no ``..``, no absolute paths, no links). The
    archive is read as a stream, front to back, so every byte goes through the hash once."""
    files = size = 0
    with tarfile.open(fileobj=stream, mode="r|*") as tar:  # type: ignore[call-overload]
        for member in tar:
            m = _MEMBER.match(member.name)
            if not m or not member.isfile():
                continue
            rel = m.group("rel")
            if any(part in ("", ".", "..") for part in rel.rstrip("/").split("/")):
                continue
            target = into / "benchmark_tasks" / rel / "task.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            if src is None:
                continue
            with src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
            files += 1
            size += member.size
    return files, size


def _wrong_hash(sdist: Path, got: str, want: str) -> EvalError:
    return EvalError(f"{sdist} has sha256 {got}, expected {want} ({SDIST})",
                     hint="the file is not the pinned sdist or is truncated: delete it and "
                          "run `whetstone data fetch bigbench` without --from")


def install_sdist(sdist: Path, cache: Path | None = None, *, sha256: str | None = None,
                  force: bool = False, download_s: float = 0.0) -> FetchResult:
    """Check the sdist's sha256, extract its task files aside, then rename them into place:
    a killed run leaves the old cache or none, never half of one. ``sha256`` defaults to the
    pinned ``SDIST_SHA256``.

    The file is opened once: it is hashed, then extracted through the same descriptor and
    hashed again on the way, so a file swapped or rewritten after the check is never
    extracted (the second hash fails and the extracted files are dropped)."""
    sdist = Path(sdist)
    sha256 = sha256 or SDIST_SHA256
    if not sdist.is_file():
        raise EvalError(f"{sdist} does not exist", hint=f"pass the path of {SDIST}")
    with open(sdist, "rb") as f:  # one descriptor for the check and the extraction
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise EvalError(f"{sdist} is not a regular file", hint=f"pass the path of {SDIST}")
        got = _sha256_stream(f)
        if got != sha256:
            raise _wrong_hash(sdist, got, sha256)
        final = data_dir(cache)
        if final.exists() and not force:
            return FetchResult(final, _count(final), 0, got, download_s)
        f.seek(0)
        return _install(sdist, _HashingReader(f), final, sha256, download_s)


def _install(sdist: Path, stream: _HashingReader, final: Path, sha256: str,
             download_s: float) -> FetchResult:
    final.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is readable like the models'
    try:
        try:
            files, size = _extract(stream, tmp)
        except tarfile.TarError as exc:
            got = stream.hexdigest()
            if got != sha256:  # rewritten into something else since the check
                raise _wrong_hash(sdist, got, sha256) from None
            raise EvalError(f"cannot read {sdist}: {exc}", hint=f"pass the {SDIST} sdist") from exc
        got = stream.hexdigest()
        if got != sha256:  # changed in place since the check: what was extracted is dropped
            raise _wrong_hash(sdist, got, sha256)
        if not files:
            raise EvalError(f"{sdist} holds no bigbench/benchmark_tasks/*/task.json",
                            hint=f"pass the {SDIST} sdist")
        manifest = {"package": PACKAGE, "version": VERSION, "sdist": sdist.name,
                    "sha256": got, "files": files, "bytes": size}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        replaced = final.exists()
        old = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.old")
        if replaced:
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return FetchResult(final, files, size, got, download_s, time.perf_counter() - t0, replaced)


def fetch(cache: Path | None = None, *, sdist: Path | None = None, force: bool = False,
          keep: Path | None = None, run: Runner = subprocess.run) -> FetchResult:
    """``whetstone data fetch bigbench``: install from ``sdist`` when given, else download it
    with pip (into ``keep`` when given, else a temporary folder removed afterwards)."""
    if sdist is not None:
        return install_sdist(sdist, cache, force=force)
    if data_dir(cache).exists() and not force:
        return FetchResult(data_dir(cache), _count(data_dir(cache)), 0, SDIST_SHA256)
    with tempfile.TemporaryDirectory(prefix="whetstone-bigbench-") as scratch:
        t0 = time.perf_counter()
        path = download_sdist(Path(keep) if keep else Path(scratch), run=run)
        return install_sdist(path, cache, force=force, download_s=time.perf_counter() - t0)


def _count(root: Path) -> int:
    manifest = root / "manifest.json"
    try:
        return int(json.loads(manifest.read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return sum(1 for _ in (root / "benchmark_tasks").rglob("task.json"))


def cached_tasks(cache: Path | None = None) -> list[str]:
    """The names of the cached tasks (``word_sorting``, ``logical_deduction`` and its
    ``logical_deduction/three_objects``), sorted; ``[]`` when nothing is fetched."""
    root = data_dir(cache) / "benchmark_tasks"
    if not root.is_dir():
        return []
    return sorted(p.parent.relative_to(root).as_posix() for p in root.rglob("task.json"))


def describe(cache: Path | None = None) -> dict[str, Any]:
    """What ``whetstone data ls`` shows for this data set."""
    root = data_dir(cache)
    info: dict[str, Any] = {"name": PACKAGE, "version": VERSION, "path": str(root),
                            "cached": root.is_dir(), "fetch": FETCH_HINT}
    if root.is_dir():
        try:
            info.update(json.loads((root / "manifest.json").read_text()))
        except (OSError, ValueError):
            info["files"] = _count(root)
        info["tasks"] = cached_tasks(cache)
    return info


# --- loading -------------------------------------------------------------------------------

# A task folder with subtasks, as help texts show one.
EXAMPLE_TASK = "logical_deduction/three_objects"


def load_bigbench(name: str, cache: Path | None = None) -> TaskSet:
    """The tasks of ``bigbench:<name>``, in the file's order (subtasks one after another)."""
    name = name.strip().strip("/")
    if not _TASK_NAME.match(name) or ".." in name.split("/"):
        raise EvalError(f"bad BIG-bench task name {name!r}",
                        hint="name a task folder, e.g. bigbench:word_sorting or "
                             f"bigbench:{EXAMPLE_TASK}")
    root = data_dir(cache) / "benchmark_tasks"
    if not root.is_dir():
        raise EvalError(f"task set 'bigbench:{name}' needs the BIG-bench task files, "
                        f"which are not in the cache ({data_dir(cache)})", hint=FETCH_HINT)
    folder = root / name
    if not (folder / "task.json").is_file():
        close = difflib.get_close_matches(name, cached_tasks(cache), n=3, cutoff=0.6)
        raise EvalError(f"no BIG-bench JSON task {name!r} in {root}",
                        hint=(f"did you mean {', '.join('bigbench:' + c for c in close)}? "
                              if close else "") + "`whetstone data ls` lists the tasks "
                             "(programmatic tasks, with task.py, are not supported)")
    tasks: list[TaskRecord] = []
    for path in [folder / "task.json", *sorted(folder.glob("*/task.json"))]:
        sub = path.parent.relative_to(root).as_posix()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            tasks += tasks_from_json(data, sub)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EvalError(f"BIG-bench task {sub!r}: {path} could not be read "
                            f"({type(exc).__name__}: {exc})",
                            hint="fetch again: whetstone data fetch bigbench --force") from exc
        if tasks and path == folder / "task.json":
            break  # a task with its own examples: its subfolders are not part of it
    if not tasks:
        raise EvalError(f"BIG-bench task {name!r} has no examples",
                        hint="name one of its subtasks: " + ", ".join(
                            "bigbench:" + t for t in cached_tasks(cache)
                            if t.startswith(name + "/")))
    return TaskSet(name=f"bigbench:{name}", tasks=tuple(tasks))


def tasks_from_json(data: Mapping[str, Any], name: str) -> list[TaskRecord]:
    """Task records from one parsed task.json (``name``: its folder under benchmark_tasks)."""
    prefix = str(data.get("task_prefix") or "")
    input_prefix = str(data.get("example_input_prefix") or "")
    preferred = str(data.get("preferred_score") or "")
    base_id = "bigbench-" + name.replace("/", "-")
    return [_record(ex, f"{base_id}-{i}", name, prefix, input_prefix, preferred)
            for i, ex in enumerate(data.get("examples") or [])]


def _record(ex: Mapping[str, Any], task_id: str, name: str, prefix: str, input_prefix: str,
            preferred: str) -> TaskRecord:
    question = (prefix + input_prefix + str(ex["input"])).strip()
    meta: dict[str, Any] = {"bigbench_task": name}
    scores = ex.get("target_scores")
    if isinstance(scores, Mapping) and scores and (
            "target" not in ex or preferred == "multiple_choice_grade"):
        options = [str(o) for o in scores]
        best = max(float(v) for v in scores.values())
        correct = [o for o in options if float(scores[o]) == best]
        meta |= {"options": options, "target_scores": dict(scores)}
        expected: Any = correct[0] if len(correct) == 1 else correct
        if len(options) > MAX_LISTED_OPTIONS:  # too many to list: write the answer out
            # BIG-bench scores an option as a continuation of the input, so the input
            # followed by the option is the same answer.
            meta["continues"] = str(ex["input"])
            return TaskRecord(id=task_id, question=question, expected=expected,
                              scorer="exact_text", metadata=meta)
        letters = [chr(ord("A") + k) for k in range(len(options))]
        meta |= {"letters": letters,
                 "correct_letters": [letters[options.index(o)] for o in correct]}
        listed = "\n".join(f"({x}) {o.strip()}" for x, o in zip(letters, options, strict=False))
        return TaskRecord(id=task_id, expected=expected, scorer="choice", metadata=meta,
                          question=render_prompt("bigbench_choice", question=question,
                                                 options=listed).strip())
    target = ex["target"]
    targets = [str(t) for t in target] if isinstance(target, list) else [str(target)]
    meta["target"] = target
    scorer = "number" if all(_is_number(t) for t in targets) else "exact_text"
    return TaskRecord(id=task_id, question=question, metadata=meta, scorer=scorer,
                      expected=targets[0] if len(targets) == 1 else targets)


def _is_number(text: str) -> bool:
    """Whether a target is one number, in digits or words ("7", "seven", "-2.5")."""
    converted = words_to_digits(text.strip())
    return bool(re.fullmatch(r"[-+]?\d[\d,]*(?:\.\d+)?", converted)) and \
        extract_number(converted) is not None


def split_counts(tasks: Sequence[TaskRecord]) -> dict[str, int]:
    """How many tasks fall in each split of the stable id-hash split."""
    counts = {"train": 0, "dev": 0, "test": 0}
    for t in tasks:
        counts[split_of(t.id)] += 1
    return counts
