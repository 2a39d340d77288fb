"""The versioned, crash-safe library on disk.

Layout under the library root::

    CURRENT              the id of the current version ("v12"); replaced atomically
    versions/vN.json     one manifest per version: parent, time, method, message, scores,
                         costs, and the root of its file tree (path -> sha256, see tree.py)
    blobs/               content-addressed file contents and tree objects (never rewritten)
    skills/ policies/    a plain copy of the current version for people (see view.py)
    candidates/          changes the regression gate rejected, kept to inspect or apply later
    traces/ index/       the trace store, and the retrieval index (derived data)
    state/<method>/      evolvers' resume state, outside every version (see state.py)
    .lock .tmp/ .state/  the writers' lock, temp files of writes in flight, view marker

A commit writes new blobs, tree objects and the manifest aside, runs the library's validator
(given when it is opened; a caller may pass another) on the new version, then makes it current
with ONE ``os.replace`` of ``CURRENT``. A process killed at any point leaves the old or the new
version current, never a mix; its temp files are removed by the next writer. A file lock
serialises writers, ids assigned under it; readers never lock: a ``Snapshot`` resolves
``CURRENT`` once and reads only immutable objects of that version.

With ``store="postgresql://..."`` all but this machine's view, ``state/``, ``work/`` and a
server's trace spool live in PostgreSQL instead (backing.py, pg_library.py).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from ..engine.errors import LibraryError, NotFound, StoreUnavailable
from ..engine.types import LibraryVersion
from .backing import Backing, open_backing
from .blobs import BlobStore, unified_diff
from .candidates import Candidates
from .change_control import check_gated
from .fsutil import clean_dir, make_dirs
from .manifest import Manifest, version_number
from .paths import CORE_ROOTS, Content, check_path, to_bytes
from .pg_connect import RETRY_S, store_spec
from .snapshot import Snapshot
from .state import MethodState, method_state
from .traces import TraceSink, TraceStore
from .transfer import write_folder
from .tree import Trees, group_of
from .validation import Validate, Validator, rejection
from .view import View, ViewEdits, ViewError

log = logging.getLogger("whetstone.library")

BULK_FILES = 256  # above this many files a commit syncs the disk once instead of per file

class Library:
    """A library directory. Construction does no I/O; use ``Library.open`` or ``Library.init``.

    ``validator`` checks every write (commit, rollback, hand edits, candidates) unless the
    write passes ``validate=False``; the faces (``Engine``, the CLI) open libraries with the
    product's rules (``engine/library/opening.py``: the Agent Skills rules, the tool check
    and each method's validator). Without one only the path rules of ``paths.py`` apply.

    ``roots`` are the top-level folders a version may hold besides ``skills/``: the folders
    the installed methods own (``MethodSpec.roots``; ``policies/``, ``memory/``). A library
    opened without a folder keeps its files in every version but does not show or write them.

    ``store``: where the shared state lives, ``postgresql://...`` or ``file`` (default:
    ``$WHETSTONE_STORE``, else the folder itself); ``root`` is this machine's folder either
    way."""

    def __init__(self, root: Path | str, *, durable: bool = True,
                 lock_timeout: float = 60.0, validator: Validator | None = None,
                 roots: Sequence[str] = (), store: str | None = None) -> None:
        self.root = Path(root).expanduser()
        self.roots: tuple[str, ...] = tuple(dict.fromkeys((*CORE_ROOTS, *roots)))
        self.lock_timeout = lock_timeout
        self.validator = validator
        self.store = store_spec(store)
        self.backing: Backing = open_backing(self.store, self.root, durable=durable)
        self.blobs: BlobStore = self.backing.blobs
        self.trees = Trees(self.blobs)
        self.durable = durable
        self.view = View(self.root, self.roots, self.blobs, self.trees, self.root / ".state",
                         self.root / ".tmp")
        self._manifests: dict[str, Manifest] = {}
        self._attempted: Manifest | None = None  # what the commit in progress publishes
        self._thread_lock = threading.RLock()
        self._traces: tuple[dict[str, Any], TraceStore] | None = None
        self._traces_lock = threading.Lock()  # not _thread_lock: a commit may hold that long
        # Told of every trace recorded here (an OpenTelemetry exporter the face added): one
        # list, shared by each store ``traces`` builds, so a sink added now reaches them all.
        self.trace_sinks: list[TraceSink] = []
        # Set when the view (skills/, policies/) could not be brought up to the current
        # version: the versions are intact and every command still works; see ``repair_view``.
        self.view_problem: ViewError | None = None

    # -- opening ---------------------------------------------------------------------------

    @property
    def current_path(self) -> Path:
        return self.root / "CURRENT"

    @property
    def where(self) -> str:
        """Where the versions live, as messages name it (the folder, or the store's URL)."""
        return str(self.root) if self.store is None else self.backing.where

    def is_initialized(self) -> bool:
        return self.backing.initialized()

    @classmethod
    def init(cls, root: Path | str, **kwargs: Any) -> Library:
        """Create the layout and version v1 (empty) unless the library exists already."""
        lib = cls(root, **kwargs)
        lib._make_folders()
        with lib._write_lock(repair=False):
            if not lib.is_initialized():
                empty = lib.trees.apply(lib.trees.empty_root, {})
                first = Manifest(id="v1", parent=None, created=time.time(), method="init",
                                 message="empty library", root=empty, counts={"files": 0})
                lib._publish(first)
                lib.view.sync(None, empty, first.id)
        return lib

    def _make_folders(self) -> None:
        """This machine's folders (a store's library gets them on its first open here)."""
        for sub in (".tmp", ".state", *self.backing.local_folders(), *self.roots):
            make_dirs(self.root / sub, durable=self.durable)

    @classmethod
    def open(cls, root: Path | str, *, create: bool = False, quiet: bool = False,
             **kwargs: Any) -> Library:
        """Open an existing library (``create``: make it when missing) and repair its view.

        A view that cannot be repaired does not stop the opening: the versions are the truth,
        so the library is usable; ``view_problem`` says what failed and how to fix it, and is
        logged as a warning unless ``quiet`` (a caller that reports it itself)."""
        lib = cls(root, **kwargs)
        if not lib.is_initialized():
            if create:
                return cls.init(root, **kwargs)
            store = "" if lib.store is None else " --store URL"
            raise LibraryError(f"no library at {lib.where if lib.store else lib.root.absolute()}",
                               hint=f"check the path, or create it: `whetstone library init "
                                    f"--library {lib.root.absolute()}{store}` (Python: "
                                    "create=True)")
        if lib.store is not None:
            lib._make_folders()
        lib.repair_view(blocking=False)
        if lib.view_problem is not None and not quiet:
            log.warning("%s (%s)", lib.view_problem.message, lib.view_problem.hint)
        return lib

    # -- reading ---------------------------------------------------------------------------

    def current_id(self) -> str:
        """The current version id: ``CURRENT``, read again whenever the file changed (every
        write replaces it), or the store's pointer as its notifications tell it."""
        vid = self.backing.current()
        if vid is None:
            raise LibraryError(f"no library at {self.where}",  # the cause: /health's "missing"
                               hint="create one with `whetstone library init`"
                               ) from FileNotFoundError(errno.ENOENT, "no CURRENT", self.where)
        version_number(vid)
        return vid

    def _manifest(self, vid: str) -> Manifest:
        hit = self._manifests.get(vid)
        if hit is not None:
            return hit
        try:
            m = Manifest.from_json(self.backing.manifest(vid))
        except FileNotFoundError as exc:
            raise NotFound(f"version {vid} not found in {self.where}",
                           hint="`whetstone library log` lists the versions") from exc
        self._manifests[vid] = m  # immutable once reachable from CURRENT
        return m

    def resolve(self, ref: str | None = None) -> str:
        """A version id from ``None``/``current``, ``vN``, ``N`` or ``current~K`` (K back)."""
        current = self.current_id()
        ref = (ref or "current").strip()
        back = 0
        if "~" in ref:
            ref, _, k = ref.partition("~")
            if not (k.isascii() and k.isdigit()) or len(k) > 9:
                raise NotFound(f"bad version reference {ref}~{k}", hint="use e.g. current~1")
            back = int(k)
        if ref in ("current", "HEAD", ""):
            vid = current
        else:
            vid = ref if ref.startswith("v") else f"v{ref}"
            if version_number(vid) > version_number(current):
                raise NotFound(f"version {vid} does not exist (current is {current})",
                               hint="`whetstone library log` lists the versions")
        for _ in range(back):
            parent = self._manifest(vid).parent
            if parent is None:
                raise NotFound(f"{ref}~{back} goes back past the first version")
            vid = parent
        return vid

    def snapshot(self, version: str | None = None) -> Snapshot:
        """A consistent read-only view of one version (the current one by default)."""
        return Snapshot(self, self._manifest(self.resolve(version)))

    def version(self, ref: str | None = None, *, files: bool = True) -> LibraryVersion:
        """One version's record, with its full file map unless ``files=False``."""
        m = self._manifest(self.resolve(ref))
        return m.to_version(self.trees.files(m.root) if files else None)

    def manifest(self, ref: str | None = None) -> Manifest:
        return self._manifest(self.resolve(ref))

    def log(self, limit: int | None = None) -> list[Manifest]:
        """Versions from the current one back to v1 (newest first)."""
        out: list[Manifest] = []
        vid: str | None = self.current_id()
        while vid is not None and (limit is None or len(out) < limit):
            m = self._manifest(vid)
            out.append(m)
            vid = m.parent
        return out

    def changes(self, ref: str | None = None) -> dict[str, tuple[str | None, str | None]]:
        """What a version changed relative to its parent: path -> (old hash, new hash)."""
        m = self._manifest(self.resolve(ref))
        parent_root = self._manifest(m.parent).root if m.parent else self.trees.empty_root
        return self.trees.diff(parent_root, m.root)

    def diff(self, a: str | None, b: str | None, *, context: int = 3) -> str:
        """A unified diff of the files that differ between versions ``a`` and ``b``."""
        va, vb = self.resolve(a), self.resolve(b)
        pairs = self.trees.diff(self._manifest(va).root, self._manifest(vb).root)
        return self.format_diff(pairs, va, vb, context=context)

    def format_diff(self, pairs: Mapping[str, tuple[str | None, str | None]], label_a: str,
                    label_b: str, *, context: int = 3) -> str:
        """Unified diff text for path -> (hash before, hash after) pairs."""
        return unified_diff(self.blobs, pairs, label_a, label_b, context=context)

    @property
    def candidates(self) -> Candidates:
        """Changes the regression gate rejected, kept by name (see candidates.py)."""
        return Candidates(self)

    @property
    def traces(self) -> TraceStore:
        """The trace store at ``<library>/traces``, bounded as ``library.json`` says
        (``trace_keep_days``, ``trace_max_bytes``, ``trace_max_record_bytes``): one store per
        Library (its index and size count are shared by every user), built again only when
        those settings change."""
        settings = self.settings()
        with self._traces_lock:
            if self._traces is None or self._traces[0] != settings:
                self._traces = (settings, self.backing.trace_store(settings))
                self._traces[1].sinks = self.trace_sinks
            return self._traces[1]

    def state(self, method: str, *, legacy: Sequence[str] = ()) -> MethodState:
        """``method``'s resume state in ``<library>/state/<method>/`` (JSON documents by key,
        saved atomically). ``legacy``: folders (relative to the library) where an older
        Whetstone kept it, moved there on first use. Saves are not fsynced: a save lost to a
        power cut costs one step again (a torn file reads as missing), not the library."""
        return method_state(self.root, method, legacy=legacy, durable=False)

    def scratch(self, name: str) -> Path:
        """``<library>/work/<name>/``: files runs write that belong to no version (the images
        learned tools make); created on first use by whoever writes there, safe to delete."""
        return self.root / "work" / name

    def settings(self) -> dict[str, Any]:
        """``library.json`` (e.g. ``{"trace_keep_days": 30}``); empty when absent."""
        return self.backing.settings()

    def update_settings(self, **values: Any) -> dict[str, Any]:
        """Set keys in ``library.json`` (None removes a key)."""
        with self._write_lock():
            data = self.settings()
            for k, v in values.items():
                if v is None:
                    data.pop(k, None)
                else:
                    data[k] = v
            self.backing.write_settings(data)
        return data

    # -- writing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _write_lock(self, *, repair: bool = True) -> Iterator[None]:
        # A short poll keeps waiting writers from starving behind one that commits in a loop.
        lock = FileLock(str(self.root / ".lock"), timeout=self.lock_timeout, poll_interval=0.005)
        with self._thread_lock:
            try:
                lock.acquire()
            except Timeout as exc:
                raise LibraryError(
                    f"the library at {self.root} is locked by another writer "
                    f"(waited {self.lock_timeout:.0f}s)",
                    hint="wait for the other process (an evolve or import) to finish") from exc
            try:
                clean_dir(self.root / ".tmp")  # temp files of a writer that was killed
                # The store's own critical section (PostgreSQL: one transaction holding the
                # writers' advisory lock), inside this folder's.
                with self.backing.transaction(self.lock_timeout):
                    if repair:
                        self._repair_view_tolerant()
                    yield
            finally:
                lock.release()

    def _publish(self, m: Manifest) -> None:
        """Make ``m`` current: the one atomic step of a commit (backing.py)."""
        self._attempted = m
        self.backing.publish(m)
        self._manifests[m.id] = m

    def _view_root(self) -> str | None:
        """The tree the view shows, as its marker says (None: unknown)."""
        marker = self.view.marker()
        return marker.get("root") if marker else None

    def _repair_view_locked(self) -> list[str]:
        current = self._manifest(self.current_id())
        shows = self._view_root()
        stashed = [] if shows == current.root else self.view.sync(shows, current.root, current.id)
        self.view_problem = None
        return stashed

    def _repair_view_tolerant(self) -> list[str]:
        """``_repair_view_locked``, recording a failure in ``view_problem`` instead of raising."""
        try:
            return self._repair_view_locked()
        except ViewError as exc:
            self.view_problem = exc
            return exc.stashed

    def repair_view(self, *, blocking: bool = True) -> list[str]:
        """Bring ``skills/`` and ``policies/`` up to the current version after a crash.

        Non-blocking callers skip the repair while another writer holds the lock (that writer
        repairs it). Returns hand-edited files that were moved to ``.state/stash``.
        Blocking, a file that still cannot be written raises ``ViewError``; non-blocking (how
        ``open`` calls it) the failure is kept in ``view_problem`` and logged.
        """
        if self._view_root() == self._manifest(self.current_id()).root:
            self.view_problem = None
            return []
        lock = FileLock(str(self.root / ".lock"), timeout=self.lock_timeout if blocking else 0)
        with self._thread_lock:
            try:
                lock.acquire()
            except Timeout:
                return []
            try:
                clean_dir(self.root / ".tmp")
                return self._repair_view_locked() if blocking else self._repair_view_tolerant()
            finally:
                lock.release()

    def commit(self, changes: Mapping[str, Content], *, method: str, message: str = "",
               scores: Mapping[str, Any] | None = None, costs: Mapping[str, Any] | None = None,
               validate: Validate = True, expect_parent: str | None = None,
               allow_empty: bool = False) -> LibraryVersion:
        """Make a new version from the current one plus ``changes`` (path -> content; None
        deletes). The library's validator (or ``validate``, see ``Validate``) checks the new
        version before it becomes current; a non-empty list of problems rejects the commit
        with the first one (all are on ``.problems``) and nothing changes.
        ``expect_parent`` refuses the commit if another writer moved the library meanwhile.
        """
        data = {check_path(p, deleting=v is None, roots=self.roots): to_bytes(p, v)
                for p, v in changes.items()}
        return self._commit(data, method=method, message=message, scores=scores, costs=costs,
                            validate=self.validator_for(validate), expect_parent=expect_parent,
                            allow_empty=allow_empty)

    def validator_for(self, validate: Validate) -> Validator | None:
        """The validator a write runs: the library's for True, none for False, else the one
        given."""
        if validate is True:
            return self.validator
        return None if validate is False else validate

    def _commit(self, changes: Mapping[str, bytes | None], **options: Any) -> LibraryVersion:
        """``_commit_once``, again while the store drops the connection (PostgreSQL) for up
        to ``RETRY_S``: the version being published is looked up first and kept if it
        landed, since the lost answer leaves that unknown."""
        deadline = time.monotonic() + RETRY_S
        with self._thread_lock:
            while True:
                self._attempted = None
                try:
                    return self._commit_once(changes, **options)
                except StoreUnavailable:
                    tried = self._attempted
                    if tried is not None and self.backing.landed(tried):
                        self._manifests[tried.id] = tried
                        return tried.to_version()
                    if tried is not None:
                        self._manifests.pop(tried.id, None)
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

    def _commit_once(self, changes: Mapping[str, bytes | None], *, method: str, message: str,
                     scores: Mapping[str, Any] | None, costs: Mapping[str, Any] | None,
                     validate: Validator | None, expect_parent: str | None = None,
                     allow_empty: bool = False,
                     prehashed: Mapping[str, str | None] | None = None) -> LibraryVersion:
        """Commit ``changes`` (contents) and ``prehashed`` (hashes of blobs already stored).
        A library that requires a gate refuses scores without a passing decision."""
        check_gated(self, scores)
        with self._write_lock():
            parent = self._manifest(self.current_id())
            if expect_parent is not None and parent.id != expect_parent:
                raise LibraryError(
                    f"the library moved from {expect_parent} to {parent.id} while this change "
                    "was prepared", hint="prepare the change again against the current version")
            # Blobs are written under the lock, so a writer's cleanup of .tmp never races them.
            hashes = dict(prehashed or {})
            hashes.update(self._put_all(changes))
            effective = {p: h for p, h in hashes.items()
                         if self.trees.lookup(parent.root, p) != h}
            if not effective and not allow_empty:
                raise LibraryError(f"nothing to commit: the change equals {parent.id}",
                                   hint="check the paths and contents of the change")
            for h in effective.values():
                if h is not None and not self.blobs.has(h):
                    raise LibraryError(f"content {h[:12]} is missing from the blob store",
                                       hint="the library was changed outside Whetstone")
            root = self.trees.apply(parent.root, effective)
            new_id = f"v{parent.number + 1}"
            counts = self._counts(parent, effective)
            m = Manifest(id=new_id, parent=parent.id, created=max(time.time(), parent.created),
                         method=method, message=message, root=root, scores=dict(scores or {}),
                         costs=dict(costs or {}), counts=counts)
            if validate is not None:
                problems = list(validate(Snapshot(self, m), sorted(effective)))
                if problems:
                    raise rejection(problems)
            shows = self._view_root()
            self._publish(m)
            self._sync_after_publish(m, parent, shows, effective)
        return m.to_version()

    def _sync_after_publish(self, m: Manifest, parent: Manifest, shows: str | None,
                            effective: Mapping[str, str | None]) -> None:
        """Write the new version's files into the view. When a file this commit changed
        cannot be written, the commit is undone (``CURRENT`` back to the parent) and a
        ``LibraryError`` says why; a failure only on files from before (a view that was
        already broken) keeps the commit and is recorded in ``view_problem``."""
        try:
            self.view.sync(shows, m.root, m.id)
            self.view_problem = None
            return
        except ViewError as exc:
            failed = exc
        if not any(p in effective for p in failed.paths):
            self.view_problem = failed
            log.warning("%s (%s)", failed.message, failed.hint)
            return
        self._unpublish(m, parent)
        raise LibraryError(
            f"version {m.id} was not kept: {failed.message}; the library stays at {parent.id}",
            hint="free disk space or fix the folder's permissions and try again") from failed

    def _unpublish(self, m: Manifest, parent: Manifest) -> None:
        """Make ``parent`` current again after ``m``'s view could not be written, and take
        back the files of ``m`` that did reach the view."""
        self.backing.unpublish(m, parent)
        self._manifests.pop(m.id, None)
        try:
            # The marker still names what the view showed before; only this commit's own
            # writes are undone, so the next repair from that marker stays exact.
            self.view.sync(m.root, parent.root, parent.id, write_marker=False)
        except ViewError:
            self.view.forget_marker()  # the next repair compares every file with the disk

    def _put_all(self, changes: Mapping[str, bytes | None]) -> dict[str, str | None]:
        """Store the contents of a change; a large one is flushed to disk once, not per file."""
        bulk = self.durable and len(changes) > BULK_FILES and self.store is None
        store = BlobStore(self.blobs.root, self.blobs.tmp_dir, durable=False) if bulk \
            else self.blobs
        hashes = {p: (store.put(b) if b is not None else None) for p, b in changes.items()}
        if bulk:
            os.sync()  # one flush for thousands of files, before the manifest can name them
        return hashes

    def preview(self, changes: Mapping[str, Content], *, label: str = "preview",
                method: str = "preview") -> Snapshot:
        """A read-only snapshot of the current version plus ``changes``, never made current.

        For scoring a change before committing it (the regression gate). Its id is
        ``<parent>+<label>``; the objects it wrote are ordinary blobs.
        """
        data = {check_path(p, deleting=v is None, roots=self.roots): to_bytes(p, v)
                for p, v in changes.items()}
        return self._preview({}, data, label=label, method=method)

    def _preview(self, prehashed: Mapping[str, str | None], data: Mapping[str, bytes | None],
                 *, label: str, method: str) -> Snapshot:
        with self._write_lock():
            parent = self._manifest(self.current_id())
            hashes = {**prehashed, **self._put_all(data)}
            effective = {p: h for p, h in hashes.items()
                         if self.trees.lookup(parent.root, p) != h}
            root = self.trees.apply(parent.root, effective) if effective else parent.root
        m = Manifest(id=f"{parent.id}+{label}", parent=parent.id, created=time.time(),
                     method=method, message=f"preview of {label}", root=root,
                     counts=self._counts(parent, effective))
        return Snapshot(self, m)

    def _counts(self, parent: Manifest, effective: Mapping[str, str | None]) -> dict[str, int]:
        added = modified = deleted = 0
        for path, h in effective.items():
            before = self.trees.lookup(parent.root, path)
            if h is None:
                deleted += before is not None
            elif before is None:
                added += 1
            else:
                modified += 1
        files = int(parent.counts.get("files", 0)) + added - deleted
        return {"files": files, "added": added, "modified": modified, "deleted": deleted}

    def rollback(self, ref: str, *, validate: Validate = True, message: str = "",
                 scores: Mapping[str, Any] | None = None) -> LibraryVersion:
        """A new version whose files equal those of ``ref`` (history is never rewritten)."""
        target = self._manifest(self.resolve(ref))
        current = self._manifest(self.current_id())
        hashes = {p: new for p, (_, new) in self.trees.diff(current.root, target.root).items()}
        return self._commit({}, prehashed=hashes, method="rollback",
                            message=message or f"rollback to {target.id}", scores=scores,
                            costs=None, validate=self.validator_for(validate),
                            expect_parent=current.id)

    def export(self, dest: Path | str, *, version: str | None = None, overwrite: bool = False,
               prefix: str = "skills/") -> Path:
        """Write one version's skills as plain ``<name>/SKILL.md`` folders (or a ``.tar.gz``)."""
        snap = self.snapshot(version)
        files = {p[len(prefix):]: self.blobs.get(h) for p, h in snap.files(prefix).items()}
        return write_folder(files, Path(dest), overwrite=overwrite, mtime=snap.manifest.created)

    def delete_unit(self, unit: str) -> dict[str, None]:
        return {p: None for p in self.snapshot().unit(unit)}  # every file of ``skills/<name>``

    # -- the view (hand edits) -------------------------------------------------------------

    def edits(self) -> ViewEdits:
        """Files in ``skills/`` and ``policies/`` that a person changed by hand."""
        return self.view.edits(self.snapshot().root)

    def draft(self, changes: Mapping[str, Content]) -> list[Path]:
        """Write new files into the view as a hand edit would, not as a version: nothing
        reads them until ``commit_view`` (``whetstone library commit``) makes them one. A
        path the current version or the view already holds is refused."""
        data = {check_path(p, roots=self.roots): to_bytes(p, v) for p, v in changes.items()}
        snap = self.snapshot()
        taken = [p for p in data if snap.hash_of(p) is not None or os.path.lexists(self.root / p)]
        if taken:
            raise LibraryError(f"{self.root / taken[0]} already exists",
                               hint="edit it, then `whetstone library commit -m ...`")
        return [self.view.write_new(p, d) for p, d in data.items() if d is not None]

    def view_changes(self, snap: Snapshot | None = None) -> dict[str, Content]:
        """The hand edits (drafts too) as the change set ``commit_view`` would commit."""
        edits = self.view.edits((snap or self.snapshot()).root)
        changes: dict[str, Content] = {p: self.view.read(p) for p in edits.modified + edits.added}
        changes.update({p: None for p in edits.deleted})
        return changes

    def commit_view(self, *, message: str, validate: Validate = True,
                    method: str = "edit") -> LibraryVersion:
        """Turn hand edits in the view into a new version (validated like any commit)."""
        snap = self.snapshot()
        changes = self.view_changes(snap)
        if not changes:
            raise LibraryError("no hand edits to commit: the view equals " + snap.id,
                               hint="edit files under skills/ or policies/ first")
        return self.commit(changes, method=method, message=message, validate=validate,
                           expect_parent=snap.id)

    # -- integrity -------------------------------------------------------------------------

    def verify(self, ref: str | None = None) -> list[str]:
        """Integrity problems of one version: missing or corrupt blobs and tree objects."""
        return self.trees.problems(self._manifest(self.resolve(ref)).root)

    def units(self, ref: str | None = None) -> list[str]:
        """Every unit (``skills/<name>``, ``policies/<file>``) in a version."""
        return sorted({group_of(p) for p in self.snapshot(ref).files()})

