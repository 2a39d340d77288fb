"""Retrieval under the engine's own concurrency: many threads opening and querying one index.

chromadb cannot open one folder from two threads at once (issue 27: ``Could not connect to
tenant default_tenant``, ``'RustBindingsAPI' object has no attribute 'bindings'``, ``KeyError``
on the path, and an ``eval -j auto`` that scored those tasks 0). Every holder goes through
``whetstone.library_store.chroma_client``: one client per folder per process.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from whetstone.engine.backends.scripted import ScriptedBackend
from whetstone.engine.commands.eval import eval_cmd
from whetstone.engine.evaluation.results import load_results
from whetstone.engine.evaluation.runner import Solver
from whetstone.engine.types import Request
from whetstone.library_store import chroma_client
from whetstone.library_store.chunking import SourceDoc
from whetstone.library_store.corpus import Corpus
from whetstone.library_store.embeddings import Embedder, skill_embedder
from whetstone.library_store.store import Library
from whetstone.skills.index import LibraryIndex
from whetstone.skills.retrieval import SkillRetriever
from whetstone.skills.transfer import import_skills

FIXTURES = Path(__file__).parent / "fixtures" / "skills" / "library"
SKILLS = ["csv-cleanup", "email-drafting", "chart-plotting", "docker-troubleshooting"]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return skill_embedder(threads=1)


def four_skill_library(root: Path, embedder: Embedder) -> Library:
    """A library of 4 skills whose index a previous process built (and closed)."""
    src = root / "src"
    for name in SKILLS:
        shutil.copytree(FIXTURES / name, src / name)
    lib = Library.init(root / "lib")
    import_skills(lib, src)
    built = LibraryIndex(lib, embedder)
    built.ensure()
    built.close()
    return lib


def hammer(n: int, fn: Callable[[int], Any]) -> tuple[list[Any], list[BaseException]]:
    """Run ``fn(i)`` in ``n`` threads released together; results and exceptions."""
    barrier = threading.Barrier(n)

    def go(i: int) -> Any:
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(go, i) for i in range(n)]
    results, errors = [], []
    for f in futures:
        exc = f.exception()
        (errors.append(exc) if exc is not None else results.append(f.result()))
    return results, errors


def test_threads_opening_one_index_at_once_all_get_the_same_answer(
        tmp_path: Path, embedder: Embedder) -> None:
    """8 threads, one retriever over a freshly opened index, 5 fresh libraries: the old code
    failed 32 of these 40 searches."""
    for rep in range(5):
        lib = four_skill_library(tmp_path / str(rep), embedder)
        retriever = SkillRetriever(lib, LibraryIndex(lib, embedder), k=2)
        try:
            results, errors = hammer(8, lambda i, r=retriever: [
                m.name for m in r.search("clean up the columns of a csv file")])
        finally:
            retriever.index.close()
        assert errors == []
        assert {tuple(r) for r in results} == {tuple(results[0])}
        assert results[0][0] == "csv-cleanup"


def test_one_index_object_per_thread_share_one_client_and_survive_each_others_close(
        tmp_path: Path, embedder: Embedder) -> None:
    """Two engines over one home (``eval --compare``) each hold an index of the same folder:
    closing one must not stop the client the other is reading through."""
    lib = four_skill_library(tmp_path, embedder)
    indexes = [LibraryIndex(lib, embedder) for _ in range(8)]

    def search_then_close(i: int) -> str:
        retriever = SkillRetriever(lib, indexes[i], k=1)
        first = retriever.search("draft a polite email")[0].name
        if i % 2:
            indexes[i].close()  # the others keep reading
        return first

    results, errors = hammer(8, search_then_close)
    assert errors == [] and set(results) == {"email-drafting"}
    shared = {id(ix._shared) for ix in indexes if ix._shared is not None}
    assert len(shared) == 1  # one client for the folder, whoever opened it
    assert SkillRetriever(lib, indexes[0], k=1).search("plot a chart")[0].name == \
        "chart-plotting"
    for ix in indexes:
        ix.close()
    entry = chroma_client.acquire(lib.root / "index" / "chroma")
    try:
        assert entry.refs == 1 and not entry.is_open  # the last close closed the client
    finally:
        chroma_client.release(entry)


def test_pinned_indexes_open_under_threads(tmp_path: Path, embedder: Embedder) -> None:
    """An eval pinned to an older version reads a pinned index: its first open is raced by
    every worker thread too."""
    lib = four_skill_library(tmp_path, embedder)
    old = lib.snapshot()
    lib_src = tmp_path / "more"
    shutil.copytree(FIXTURES / "bash-scripting", lib_src / "bash-scripting")
    import_skills(lib, lib_src)
    assert lib.snapshot().root != old.root
    for _ in range(3):
        retriever = SkillRetriever(lib, LibraryIndex(lib, embedder), k=4)
        try:
            results, errors = hammer(8, lambda i, r=retriever: sorted(
                m.name for m in r.search("write a shell script", snapshot=old)))
        finally:
            retriever.close()
            retriever.index.close()
        assert errors == [] and {tuple(r) for r in results} == {tuple(sorted(SKILLS))}


def test_the_shared_client_reopens_when_another_process_resynced(tmp_path: Path) -> None:
    shared = chroma_client.acquire(tmp_path / "chroma")
    try:
        with shared.use() as first:
            pass
        shared.refresh("t1")  # the state moved on while the client was open: re-open
        assert not shared.is_open and shared.token == "t1"
        with shared.use() as second:
            assert second is not first
        shared.refresh("t1")  # same token: nothing to do
        assert shared.is_open
        with shared.use(), pytest.raises(RuntimeError, match="inside a call"):
            shared.close()  # would wait for itself forever
    finally:
        chroma_client.release(shared)
    assert not shared.is_open


def test_threads_searching_a_freshly_opened_corpus(tmp_path: Path, embedder: Embedder
                                                   ) -> None:
    """The evidence corpus opens its collection the same way (MARCH and the search tool
    query it from the eval's threads)."""
    writer = Corpus(tmp_path / "corpus", embedder)
    writer.add([SourceDoc("The Eiffel Tower is in Paris and was finished in 1889.", "a.md"),
                SourceDoc("Mount Everest is the highest mountain above sea level.", "b.md")])
    writer.close()
    for _ in range(3):
        corpus = Corpus(tmp_path / "corpus", embedder)
        try:
            results, errors = hammer(8, lambda i, c=corpus: c.search(
                "when was the Eiffel Tower finished", k=1)[0].text)
        finally:
            corpus.close()
        assert errors == [] and all("1889" in r for r in results)


ARITH = Path(__file__).parent / "fixtures" / "tasks" / "arith.jsonl"


def engine_factory(embedder: Embedder) -> Callable[[str, Path, str | None], Solver]:
    """The real ``Engine`` direct solver (skills retrieved per task through chromadb and the
    real embedder) over a scripted model that answers every task right."""
    from whetstone.engine.api import Engine

    def respond(req: Request) -> str:
        a, b = (int(x) for x in req.messages[-1].text.rstrip("?").split()[-3::2])
        return f"The answer is {a + b}."

    def factory(model: str, library: Path, version: str | None) -> Solver:
        engine = Engine(ScriptedBackend(responder=respond), library=library, version=version,
                        solver="direct", checkpointing=False)
        return engine.solver()

    return factory


def test_eval_j_auto_with_a_four_skill_library_fails_no_task(
        tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27 item 1: ``whetstone eval -j auto`` with 4 skills, the index built by an earlier
    process. 5 fresh homes, 16+ tasks each: every task is scored, none failed."""
    for rep in range(5):
        home = tmp_path / f"home{rep}"
        monkeypatch.setenv("WHETSTONE_HOME", str(home))
        lib = four_skill_library(home / "build", embedder)
        res = CliRunner().invoke(
            eval_cmd, ["--tasks", str(ARITH), "--library", str(lib.root), "-j", "auto",
                       "--model", "scripted:"],
            obj={"solver_factory": engine_factory(embedder)}, catch_exceptions=False)
        assert res.exit_code == 0, res.output
        (saved,), _ = load_results(home / "evals")
        assert saved.n == 20 and saved.meta["concurrency"] > 1
        assert [r.error for r in saved.results if r.error] == []
        assert saved.accuracy == 1.0
