"""``whetstone corpus add | ls | rm | query | reindex``: the evidence corpora the verifier and the
``search`` tool read (``library_store/corpus.py``).

A corpus lives in the library folder (``<library>/corpus/<name>``), named with ``--corpus``
(default ``default``). Building HaluEval's corpus from every item's knowledge passage::

    whetstone corpus add --tasks halueval --corpus halueval
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ...library_store import embeddings
from ...library_store.chunking import ChunkSpec, ReadReport, SourceDoc, jsonl_docs, read_path
from ...library_store.corpus import DEFAULT_CORPUS, Corpus, list_corpora
from ...library_store.fsutil import sha256_bytes
from ..errors import ConfigError, EmptyCorpus
from .common import (
    console,
    default_library_path,
    emit_json,
    handle_errors,
    json_option,
    library_option,
)


def corpus_option(fn: Any) -> Any:
    """``--corpus NAME`` (env ``WHETSTONE_CORPUS``; default ``default``)."""
    return click.option("--corpus", "corpus_name", envvar="WHETSTONE_CORPUS",
                        default=DEFAULT_CORPUS, show_default=True,
                        help="Which corpus of the library.")(fn)


def open_corpus(library_path: Path | None, name: str, *, threads: int | None = 1) -> Corpus:
    """A library's corpus with the fastest packaged embedder (ONNX when installed)."""
    # lazy: `whetstone --help` imports every command module
    from ..api import open_library

    # The default library is made on first use; a mistyped --library is an error.
    root = open_library(library_path or default_library_path(), quiet=True).root
    return Corpus.of_library(root, name, embeddings.query_embedder(threads=threads))


@click.group("corpus")
def corpus_group() -> None:
    """Evidence corpora: documents the verifier checks answers against and `search` reads."""


def _stdin_docs(text: str, fmt: str, source: str | None, text_field: str | None) -> Any:
    label = source or f"stdin:{sha256_bytes(text.encode('utf-8'))[:12]}"
    if fmt == "jsonl":
        return jsonl_docs(text, label, text_field)
    if not text.strip():
        raise ConfigError("nothing came on standard input", hint="pipe text in, or give a PATH")
    return ReadReport([SourceDoc(text, label, markdown=fmt == "markdown")])


@corpus_group.command("add")
@click.argument("paths", nargs=-1)
@click.option("--tasks", "tasks_spec", default=None, metavar="SET",
              help="Add each task's evidence passage (e.g. halueval), source task:<id>.")
@click.option("--chunk-size", type=int, default=800, show_default=True,
              help="Most characters in one chunk.")
@click.option("--overlap", type=int, default=150, show_default=True,
              help="Characters a chunk repeats from the one before.")
@click.option("--text-field", default=None,
              help="JSONL field holding the text (default: text, content, knowledge, ...).")
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "jsonl"]),
              default="text", show_default=True, help="What standard input ('-') holds.")
@click.option("--source", default=None, help="Source label for standard input.")
@corpus_option
@library_option
@json_option
@handle_errors
def add_cmd(paths: tuple[str, ...], tasks_spec: str | None, chunk_size: int, overlap: int,
            text_field: str | None, fmt: str, source: str | None, corpus_name: str,
            library_path: Path | None, as_json: bool) -> None:
    """Add files, folders, standard input ('-') or a task set's evidence to a corpus.

    Text, markdown and JSONL (one document per line). Re-adding is cheap: unchanged texts
    are kept, changed ones replaced, records gone from a re-added file dropped."""
    if not paths and not tasks_spec:
        raise ConfigError("nothing to add", hint="whetstone corpus add notes.md docs/ - "
                          "or --tasks halueval")
    spec = ChunkSpec(chunk_size, overlap)
    read = ReadReport()
    replace_under: list[str] = []
    for p in paths:
        got = _stdin_docs(sys.stdin.read(), fmt, source, text_field) if p == "-" \
            else read_path(Path(p), text_field)
        if got.root is not None:  # what was read, never what a refused link points at
            replace_under.append(got.root)
        read.docs += got.docs
        read.skipped += got.skipped
        read.refused += got.refused
    if tasks_spec:
        # lazy: `whetstone --help` imports every command module
        from ..evaluation.benchmarks import load_tasks
        from ..evaluation.tasks import evidence_documents

        tasks = load_tasks(tasks_spec)
        docs = evidence_documents(tasks.tasks)
        if not docs:
            raise ConfigError(f"task set {tasks_spec!r} has no evidence passages",
                              hint="only sets with evidence (e.g. halueval) can fill a corpus")
        read.docs += docs
    corpus = open_corpus(library_path, corpus_name, threads=None)
    err = console(stderr=True)
    try:
        with err.status(f"embedding {len(read.docs)} document(s) into {corpus_name} …",
                        spinner="dots"):
            report = corpus.add(read.docs, spec=spec, replace_under=replace_under,
                                keep=read.refused)
        stats = corpus.stats()
    finally:
        corpus.close()
    report.skipped = read.skipped + report.skipped
    if as_json:
        emit_json({"corpus": stats, **report.to_dict()})
        return
    out = console()
    out.print(f"[bold]{corpus_name}[/]: {report.added} added, {report.duplicates} duplicate, "
              f"{report.unchanged} unchanged, {report.replaced} replaced, {report.removed} "
              f"removed; {report.chunks} chunk(s) cut. Now {stats['documents']} document(s), "
              f"{stats['chunks']} chunk(s).", soft_wrap=True)
    for line in report.skipped[:20]:
        err.print(f"[yellow]skipped:[/] {escape(line)}", soft_wrap=True)
    if len(report.skipped) > 20:
        err.print(f"[yellow]... and {len(report.skipped) - 20} more skipped[/]")


@corpus_group.command("ls")
@click.option("--limit", "-n", type=click.IntRange(min=0), default=50, show_default=True,
              help="Show at most N documents (0: all).")
@corpus_option
@library_option
@json_option
@handle_errors
def ls_cmd(limit: int, corpus_name: str, library_path: Path | None, as_json: bool) -> None:
    """List a corpus's documents: key, chunks, characters, sources."""
    corpus = open_corpus(library_path, corpus_name)
    docs = corpus.documents()
    shown = docs if limit == 0 else docs[:limit]
    others = [n for n in list_corpora(library_path or default_library_path())
              if n != corpus_name]
    if as_json:
        emit_json({"corpus": corpus.stats(), "corpora": [corpus_name, *others],
                   "documents": [{"key": d.key, "sources": list(d.sources),
                                  "chunks": len(d.chunks), "chars": d.chars,
                                  "title": d.title} for d in shown]})
        return
    out = console()
    if not docs:
        out.print(f"corpus [bold]{corpus_name}[/] is empty; add documents with `whetstone "
                  f"corpus add PATH --corpus {corpus_name}`", soft_wrap=True)
    else:
        table = Table("key", "chunks", "chars", "source", box=None)
        for d in shown:
            more = f" (+{len(d.sources) - 1} more)" if len(d.sources) > 1 else ""
            table.add_row(d.key, str(len(d.chunks)), str(d.chars),
                          escape(d.sources[0] if d.sources else "") + more)
        out.print(table)
        stats = corpus.stats()
        out.print(f"{stats['documents']} document(s), {stats['chunks']} chunk(s) in "
                  f"{escape(stats['path'])}" + (f"; showing {len(shown)}"
                                                if len(shown) < len(docs) else ""),
                  soft_wrap=True)
    if others:
        out.print(f"other corpora: {', '.join(others)}", soft_wrap=True)


@corpus_group.command("rm")
@click.argument("target")
@corpus_option
@library_option
@json_option
@handle_errors
def rm_cmd(target: str, corpus_name: str, library_path: Path | None, as_json: bool) -> None:
    """Remove a source (file, folder, file#id, task:<id>) or a document (key prefix)."""
    corpus = open_corpus(library_path, corpus_name)
    try:
        removed = corpus.remove(target)
        stats = corpus.stats()
    finally:
        corpus.close()
    if as_json:
        emit_json({"removed": removed, "corpus": stats})
        return
    console().print(f"removed {len(removed)} document(s) from {corpus_name}; "
                    f"{stats['documents']} left", soft_wrap=True)


@corpus_group.command("query")
@click.argument("text")
@click.option("-k", "k", type=click.IntRange(min=1), default=5, show_default=True,
              help="How many passages.")
@corpus_option
@library_option
@json_option
@handle_errors
def query_cmd(text: str, k: int, corpus_name: str, library_path: Path | None,
              as_json: bool) -> None:
    """Show the passages nearest to TEXT, best first, with their scores."""
    corpus = open_corpus(library_path, corpus_name)
    try:
        passages = corpus.search(text, k)
    finally:
        corpus.close()
    if as_json:
        emit_json({"query": text, "passages": [p.to_dict() for p in passages]})
        return
    out = console()
    for i, p in enumerate(passages, start=1):
        out.print(f"[bold][{i}][/] {p.score:.3f}  [dim]{escape(p.source)}[/]", soft_wrap=True)
        out.print(escape(p.text), soft_wrap=True)


@corpus_group.command("reindex")
@corpus_option
@library_option
@json_option
@handle_errors
def reindex_cmd(corpus_name: str, library_path: Path | None, as_json: bool) -> None:
    """Rebuild the corpus's chromadb collection from its documents file."""
    corpus = open_corpus(library_path, corpus_name, threads=None)
    if not corpus.exists():
        raise EmptyCorpus(f"corpus {corpus_name!r} has no documents to index",
                          hint=f"whetstone corpus add PATH --corpus {corpus_name}")
    try:
        with console(stderr=True).status("re-embedding …", spinner="dots"):
            chunks = corpus.reindex()
    finally:
        corpus.close()
    if as_json:
        emit_json({"corpus": corpus_name, "chunks": chunks})
        return
    console().print(f"reindexed {corpus_name}: {chunks} chunk(s)")
