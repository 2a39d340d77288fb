"""The evidence corpus: chunking, reading sources, idempotent adds, removal, repair after a
crash, search with the packaged embedder, the ``search`` tool and ``whetstone corpus``."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from whetstone.engine.commands.corpus import corpus_group
from whetstone.engine.errors import ConfigError, EmptyCorpus, LibraryError, NotFound
from whetstone.engine.types import Passage
from whetstone.library_store.chunking import (
    ChunkSpec,
    SourceDoc,
    chunk_document,
    chunk_text,
    jsonl_docs,
    read_path,
)
from whetstone.library_store.corpus import Corpus, corpus_path
from whetstone.library_store.embeddings import Embedder, query_embedder
from whetstone.tools.base import Toolbox
from whetstone.tools.search import format_passages, make_search_tool

FACTS = [
    "The Eiffel Tower in Paris was completed in 1889 for the World's Fair.",
    "Mount Everest is 8,849 metres tall and lies on the border of Nepal and China.",
    "The Amazon is the largest rainforest on Earth, mostly in Brazil.",
    "Marie Curie won Nobel Prizes in both physics and chemistry.",
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return query_embedder(threads=1)


@pytest.fixture
def corpus(tmp_path: Path, embedder: Embedder) -> Corpus:
    c = Corpus(tmp_path / "corpus" / "facts", embedder)
    yield c
    c.close()


# --- chunking ----------------------------------------------------------------------------------

def test_chunks_stay_within_the_size_and_overlap_their_neighbours() -> None:
    text = " ".join(f"Sentence {i} is about topic {i % 7} and nothing else." for i in range(80))
    chunks = chunk_text(text, ChunkSpec(size=200, overlap=60))
    assert len(chunks) > 5 and all(len(c) <= 200 for c in chunks)
    for a, b in itertools.pairwise(chunks):
        first = b.split(". ")[0]
        assert first in a, "each chunk starts with the end of the one before"
    # Every sentence survives somewhere.
    assert all(f"Sentence {i} " in " ".join(chunks) for i in range(80))


def test_a_word_longer_than_a_chunk_is_cut_and_the_cutting_ends() -> None:
    chunks = chunk_text("x" * 500 + " tail", ChunkSpec(size=100, overlap=20))
    assert all(len(c) <= 100 for c in chunks) and chunks[-1].endswith("tail")
    assert "".join(c for c in chunks if set(c) == {"x"}) == "x" * 500


def test_markdown_chunks_carry_their_heading_trail() -> None:
    md = "intro\n\n# Paris\n\nCapital of France.\n\n## History\n\nFounded by the Parisii.\n" \
         "```\n# a comment, not a heading\n```\n"
    chunks = chunk_document(SourceDoc(md, "x.md", markdown=True), ChunkSpec())
    assert chunks[0] == "intro"
    assert chunks[1] == "Paris\nCapital of France."
    assert chunks[2].startswith("Paris > History\nFounded by the Parisii.")
    assert "a comment, not a heading" in chunks[2]


@pytest.mark.parametrize("size,overlap", [(10, 0), (200, 100), (200, -1)])
def test_bad_chunk_settings_are_refused_with_a_hint(size: int, overlap: int) -> None:
    with pytest.raises(ConfigError) as err:
        ChunkSpec(size, overlap)
    assert err.value.hint


def test_jsonl_lines_become_documents_and_bad_lines_are_listed() -> None:
    text = '{"id": 7, "text": "alpha", "title": "A", "lang": "en"}\n\nnot json\n[1]\n' \
           '{"knowledge": "beta"}\n{"other": "x"}\n'
    got = jsonl_docs(text, "/d/f.jsonl")
    assert [(d.text, d.source, d.title) for d in got.docs] == [
        ("alpha", "/d/f.jsonl#7", "A"), ("beta", "/d/f.jsonl#L5", "")]
    assert got.docs[0].metadata == {"lang": "en"}
    assert [s.split(": ", 1)[0] for s in got.skipped] == [
        "/d/f.jsonl:3", "/d/f.jsonl:4", "/d/f.jsonl:6"]
    assert jsonl_docs('{"body": "b", "text": "t"}', "s", "body").docs[0].text == "b"


def test_unreadable_and_missing_sources_are_clear_errors(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(LibraryError) as err:
        read_path(bad)
    assert "not UTF-8" in err.value.message and "iconv" in err.value.hint
    with pytest.raises(LibraryError, match="does not exist"):
        read_path(tmp_path / "nope.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LibraryError, match="holds no file"):
        read_path(tmp_path / "empty")


def test_a_folder_is_read_recursively_without_hidden_files(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_text("A text.")
    (tmp_path / "d" / "sub" / "b.md").write_text("# B\n\nB text.")
    (tmp_path / "d" / ".hidden.txt").write_text("secret")
    (tmp_path / "d" / "image.png").write_bytes(b"\x89PNG")
    got = read_path(tmp_path / "d")
    assert sorted(Path(d.source).name for d in got.docs) == ["a.txt", "b.md"]
    assert [d.markdown for d in got.docs] == [False, True]
    assert len(got.skipped) == 1 and "image.png" in got.skipped[0]


# --- the store ---------------------------------------------------------------------------------

def docs_of(*texts: str, prefix: str = "src") -> list[SourceDoc]:
    return [SourceDoc(t, f"{prefix}#{i}") for i, t in enumerate(texts)]


def test_adding_is_idempotent_by_content_hash(corpus: Corpus) -> None:
    first = corpus.add(docs_of(*FACTS))
    assert (first.added, first.chunks) == (4, 4)
    again = corpus.add(docs_of(*FACTS))
    assert (again.added, again.unchanged, again.chunks) == (0, 4, 0)
    dup = corpus.add([SourceDoc(FACTS[0], "elsewhere")])
    assert dup.duplicates == 1 and corpus.stats()["documents"] == 4
    assert corpus.documents()[0].sources == ("src#0", "elsewhere")
    assert corpus.stats()["chunks"] == 4 == corpus.state()["chunks"]


def test_a_changed_source_replaces_its_text_and_dropped_records_go(corpus: Corpus) -> None:
    corpus.add(docs_of(*FACTS, prefix="/f.jsonl"), replace_under=["/f.jsonl"])
    changed = docs_of("The Eiffel Tower was finished in 1889.", *FACTS[1:3], prefix="/f.jsonl")
    report = corpus.add(changed, replace_under=["/f.jsonl"])
    assert (report.replaced, report.unchanged, report.removed) == (1, 2, 1)
    texts = {c for d in corpus.documents() for c in d.chunks}
    assert "The Eiffel Tower was finished in 1889." in texts and FACTS[0] not in texts
    assert FACTS[3] not in texts  # record #3 is gone from the re-added file
    assert corpus._indexed_ids() == {i for d in corpus.documents() for i in d.chunk_ids()}


def test_re_cutting_the_same_text_replaces_its_chunks(corpus: Corpus) -> None:
    long = " ".join(FACTS * 6)
    corpus.add([SourceDoc(long, "long")], spec=ChunkSpec(800, 150))
    before = corpus.documents()[0]
    corpus.add([SourceDoc(long, "long")], spec=ChunkSpec(200, 50))
    after = corpus.documents()[0]
    assert len(after.chunks) > len(before.chunks) and after.chunking == "200/50"
    assert corpus._indexed_ids() == set(after.chunk_ids())


def test_search_finds_the_passage_about_the_query(corpus: Corpus) -> None:
    corpus.add(docs_of(*FACTS))
    hits = corpus.search("How tall is Everest?", k=2)
    assert len(hits) == 2 and hits[0].text == FACTS[1] and hits[0].source == "src#1"
    assert hits[0].score > hits[1].score
    assert corpus.search("Who won two Nobel prizes?", k=1)[0].text == FACTS[3]
    assert len(corpus.search("anything", k=50)) == 4


def test_an_empty_corpus_says_how_to_fill_it(corpus: Corpus) -> None:
    with pytest.raises(EmptyCorpus) as err:
        corpus.search("question")
    assert "is empty" in err.value.message and "whetstone corpus add" in err.value.hint
    assert not corpus.path.exists(), "asking an empty corpus creates nothing"
    corpus.add(docs_of("only one"))
    corpus.remove("src#0")
    with pytest.raises(EmptyCorpus):
        corpus.search("question")
    with pytest.raises(ConfigError, match="empty"):
        corpus.search("  ")


def test_remove_by_source_folder_or_key(corpus: Corpus, tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, fact in enumerate(FACTS[:3]):
        (folder / f"{i}.txt").write_text(fact)
    corpus.add(read_path(folder).docs)
    corpus.add([SourceDoc(FACTS[3], "other")])
    assert len(corpus.remove(str(folder / "0.txt"))) == 1
    key = next(d.key for d in corpus.documents() if d.sources == ("other",))
    assert corpus.remove(key[:8]) == [key]
    assert len(corpus.remove(str(folder))) == 2
    assert corpus.documents() == []
    with pytest.raises(NotFound) as err:
        corpus.remove("no-such-source")
    assert "corpus ls" in err.value.hint


def test_a_writer_killed_half_way_is_repaired_by_the_next_reader(corpus: Corpus,
                                                                  embedder: Embedder) -> None:
    corpus.add(docs_of(*FACTS[:2]))
    # A writer that wrote the catalog and died before syncing: the collection lags behind.
    docs = corpus.documents()
    docs.append(docs[0].__class__("f" * 16, ("late",), (FACTS[2],), "", "800/150", 10))
    corpus._write_catalog(docs)
    state = corpus.state()
    corpus._write_state(**{**state, "pending": True})
    other = Corpus(corpus.path, embedder)
    try:
        assert other.search("largest rainforest", k=1)[0].text == FACTS[2]
        assert other.state()["pending"] is False and other.state()["chunks"] == 3
    finally:
        other.close()


def test_readers_do_not_wait_for_a_writer_at_work(corpus: Corpus) -> None:
    from filelock import FileLock

    corpus.add(docs_of(*FACTS[:2]))
    corpus._write_state(**{**corpus.state(), "pending": True})  # a long add in progress
    with FileLock(str(corpus.path / ".lock"), timeout=1):
        assert corpus.search("Everest", k=1)[0].text == FACTS[1]  # what is indexed now
    assert corpus.search("Everest", k=1)[0].text == FACTS[1]
    assert corpus.state()["pending"] is False  # the next reader with the lock free repairs


def test_reindex_rebuilds_a_lost_collection(corpus: Corpus) -> None:
    import shutil

    corpus.add(docs_of(*FACTS))
    corpus.close()
    shutil.rmtree(corpus.path / "chroma")
    assert corpus.reindex() == 4
    assert corpus.search("Nobel prizes", k=1)[0].text == FACTS[3]


def test_corpus_names_are_checked(tmp_path: Path) -> None:
    assert corpus_path(tmp_path, "halueval") == tmp_path / "corpus" / "halueval"
    for bad in ("", "../x", "A", "a/b"):
        with pytest.raises(ConfigError):
            corpus_path(tmp_path, bad)


# --- the search tool ---------------------------------------------------------------------------

def test_the_search_tool_returns_numbered_passages(corpus: Corpus) -> None:
    corpus.add(docs_of(*FACTS))
    box = Toolbox.of([make_search_tool(corpus, k=2)])
    result = box.call("search", {"query": "Everest height"})
    assert result.ok and result.output.startswith("[1] (source: src#1)\n" + FACTS[1])
    assert result.output.count("[") == 2
    assert box.call("search", "Nobel").output.startswith("[1]")  # text call fills 'query'
    assert box.call("search", {"query": "x", "k": 99}).output.count("(source:") == 4


def test_the_search_tool_reports_failures_as_observations(corpus: Corpus) -> None:
    box = Toolbox.of([make_search_tool(corpus)])
    empty = box.call("search", {"query": "anything"})
    assert not empty.ok and "is empty" in empty.error
    missing = box.call("search", {"k": 2})
    # Checked against the tool's schema before the call (tools/arguments.py).
    assert not missing.ok and "missing argument(s) query" in missing.error


def test_format_passages_cuts_long_text() -> None:
    text = format_passages([Passage("a" * 50, "s", 0.5)], max_chars=10)
    assert text == "[1] (source: s)\n" + "a" * 10 + " …"
    assert format_passages([]) == "No passage found."


# --- the command line --------------------------------------------------------------------------

def run_cli(*args: str, input: str | None = None) -> object:
    res = CliRunner().invoke(corpus_group, list(args), input=input, catch_exceptions=False)
    return res


def test_corpus_commands_end_to_end(tmp_path: Path) -> None:
    lib = str(tmp_path / "lib")
    Path(lib).mkdir()  # an empty folder: the library is made there
    notes = tmp_path / "notes.md"
    notes.write_text("# Everest\n\nMount Everest is 8,849 metres tall.\n")
    res = run_cli("add", str(notes), "--library", lib, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["added"] == 1
    res = run_cli("add", "-", "--source", "note:berlin", "--library", lib, "--json",
                  input="Berlin is the capital of Germany.")
    assert json.loads(res.stdout)["corpus"]["documents"] == 2
    res = run_cli("query", "capital of Germany", "-k", "1", "--library", lib, "--json")
    assert json.loads(res.stdout)["passages"][0]["source"] == "note:berlin"
    listing = json.loads(run_cli("ls", "--library", lib, "--json").stdout)
    assert sorted(d["sources"][0] for d in listing["documents"]) == sorted(
        ["note:berlin", str(notes.resolve())])
    assert run_cli("rm", "note:berlin", "--library", lib).exit_code == 0
    res = run_cli("query", "x", "--corpus", "other", "--library", lib)
    assert res.exit_code == EmptyCorpus.exit_code and "is empty" in res.stderr
    assert run_cli("add", "--library", lib).exit_code == ConfigError.exit_code


def test_a_task_sets_evidence_fills_a_corpus(tmp_path: Path) -> None:
    tasks = tmp_path / "qa.jsonl"
    rows = [{"id": f"q{i}", "question": f"Q{i}?", "evidence": fact, "expected": "x"}
            for i, fact in enumerate(FACTS)] + [{"id": "q9", "question": "No evidence?"}]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lib = str(tmp_path / "lib")
    Path(lib).mkdir()  # an empty folder: the library is made there
    res = run_cli("add", "--tasks", str(tasks), "--corpus", "qa", "--library", lib, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["corpus"]["documents"] == 4
    res = run_cli("query", "rainforest", "-k", "1", "--corpus", "qa", "--library", lib,
                  "--json")
    assert json.loads(res.stdout)["passages"][0]["source"] == "task:q2"


def test_an_agent_searches_the_library_corpus(tmp_path: Path, embedder: Embedder) -> None:
    from whetstone.engine.api import Engine
    from whetstone.engine.backends.scripted import ScriptedBackend

    lib = tmp_path / "lib"
    Corpus.of_library(lib, "facts", embedder).add(docs_of(*FACTS))
    backend = ScriptedBackend([
        {"tool_calls": [{"name": "search", "arguments": {"query": "Everest height"}}]},
        "Final Answer: 8,849 metres"], tool_calls=True)
    with Engine(backend, library=lib, tools=("search",), corpus="facts", skills=False,
                checkpointing=False, create=True) as engine:
        trace = engine.run("How tall is Everest?")
    act = next(s for s in trace.steps if s.kind == "act")
    assert act.input["tool"] == "search" and FACTS[1] in act.output["observation"]
    assert trace.answer == "8,849 metres"
    # Offered in the system message (the compact tool list small models read), not as a schema.
    system = backend.requests[0].messages[0]
    assert system.role == "system" and "search" in str(system.content)
