"""Traces recorded elsewhere, read into the trace store (``whetstone traces import``).

One reader per format turns source records into whole ``Trace`` objects of kind ``import``
(``otlp.py``: OTLP JSON files; ``phoenix.py``: a Phoenix server's REST API; ``openai_log.py``:
OpenAI chat-completion logs as JSONL; ``langsmith.py``: LangSmith run exports); ``spans.py``
reads the OpenInference and GenAI attributes both span formats carry. ``import_traces``
stores what they built through ``TraceStore.append_records``, the store's one writer, so the
record-size and store-size caps hold; a record already imported (the same origin key, or the
same trace id) is counted, not stored again. docs/observability.md describes the formats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from whetstone.engine.errors import ConfigError
from whetstone.engine.types import Trace
from whetstone.library_store.trace_import.common import (
    KIND,
    ORIGIN,
    Imported,
    ImportReport,
    known_keys,
    parse_json,
)
from whetstone.library_store.trace_import.langsmith import read_langsmith
from whetstone.library_store.trace_import.openai_log import read_openai
from whetstone.library_store.trace_import.otlp import read_otlp
from whetstone.library_store.trace_import.phoenix import Fetch, http_fetch, read_phoenix
from whetstone.library_store.traces import TraceStore

FORMATS = ("auto", "otlp-json", "openai", "langsmith")
MAX_FILE_BYTES = 1024 ** 3  # a file read whole; past this, split it
_BATCH = 500  # records per append: one lock per batch, a bounded list in memory


def detect_format(text: str, path: Path) -> str:
    """The format of a file by its content: OTLP (``resourceSpans``), a LangSmith export
    (runs with ``run_type``) or an OpenAI log (``messages``); ``ConfigError`` otherwise."""
    head = text.lstrip()[:200_000]
    first = head.splitlines()[0] if head else ""
    for sample in (head, first):
        try:
            data = parse_json(sample)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("runs"), list):
            data = data["runs"]
        item = data[0] if isinstance(data, list) and data else data
        if isinstance(item, dict):
            if "resourceSpans" in item or "resource_spans" in item:
                return "otlp-json"
            if "run_type" in item:
                return "langsmith"
            if "messages" in item or "request" in item:
                return "openai"
    if '"resourceSpans"' in first or '"resource_spans"' in first:
        return "otlp-json"
    raise ConfigError(f"cannot tell the format of {path}",
                      hint="pass --format otlp-json, openai or langsmith")


def read_file(path: Path, fmt: str, report: ImportReport) -> Iterator[Imported]:
    """The traces of one file; what cannot be read goes to ``report.skipped``."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{path} is {size} bytes; at most {MAX_FILE_BYTES} are read",
                              hint="split the file and import the parts")
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}",
                          hint="check the path") from None
    if fmt == "auto":
        fmt = detect_format(text, path)
    report.sources[str(path)] = fmt
    readers = {"otlp-json": read_otlp, "openai": read_openai, "langsmith": read_langsmith}
    if fmt not in readers:
        raise ConfigError(f"unknown trace format {fmt!r}", hint="formats: " + ", ".join(FORMATS))
    yield from readers[fmt](text, str(path), report.skipped)


def write(store: TraceStore, found: Iterable[Imported], report: ImportReport,
          prepare: Callable[[Trace], Trace] | None = None) -> None:
    """Store ``found`` whole, skipping what the store (or this import) already holds, in
    batches through the store's append path. What the size cap drops is reported: the
    store's files, how many of its own traces went, and how many imported ones remain.
    ``prepare`` may change each new trace before it is stored (the face scores it)."""
    keys, ids = known_keys(store.latest().values())
    had = set(ids)  # the store's own traces, before this import
    before = set(store.files())
    pruned = store.pruned
    batch = []
    for item in found:
        if item.key in keys or item.trace.id in ids:
            report.duplicates += 1
            continue
        keys.add(item.key)
        ids.add(item.trace.id)
        record = store.encode(prepare(item.trace) if prepare is not None else item.trace)
        report.truncated += record.truncated
        batch.append(record)
        report.imported.append(item.trace.id)
        if len(batch) >= _BATCH:
            store.append_records(batch)
            batch = []
    store.append_records(batch)
    report.dropped_files = sorted(str(p) for p in before - set(store.files()))
    report.kept = len(report.imported)
    if store.pruned != pruned:  # the size cap dropped files: say whose traces went
        now = set(store.latest())
        report.evicted = len(had - now)
        report.kept = len(now.intersection(report.imported))


def import_traces(store: TraceStore, paths: Sequence[Path] = (), *, fmt: str = "auto",
                  phoenix: str | None = None, project: str | None = None,
                  fetch: Fetch = http_fetch,
                  prepare: Callable[[Trace], Trace] | None = None) -> ImportReport:
    """Import ``paths`` (and a Phoenix project) into ``store``; the report says what was
    stored, what was there already, and every record skipped with why. ``ConfigError`` when
    nothing was given or nothing in it could be read. ``prepare`` may change each new trace
    before it is stored."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown trace format {fmt!r}", hint="formats: " + ", ".join(FORMATS))
    if (phoenix is None) != (project is None):
        raise ConfigError("--phoenix and --project go together",
                          hint="e.g. --phoenix http://127.0.0.1:6006 --project default")
    if not paths and phoenix is None:
        raise ConfigError("nothing to import", hint="name files, or --phoenix URL --project P")
    for path in paths:  # before anything is stored: a mistyped name stores nothing
        if not Path(path).is_file():
            raise ConfigError(f"no file {path}", hint="check the path")
    report = ImportReport()

    def everything() -> Iterator[Imported]:
        for path in paths:
            yield from read_file(Path(path), fmt, report)
        if phoenix is not None and project is not None:
            report.sources[f"{phoenix} project {project}"] = "phoenix"
            yield from read_phoenix(phoenix, project, report.skipped, report.notes, fetch)

    write(store, everything(), report, prepare)
    if not report.imported and not report.duplicates:
        why = "; ".join(report.skipped[:3]) or "the sources hold no traces"
        raise ConfigError(f"nothing could be imported: {why}"
                          + (f" (and {len(report.skipped) - 3} more)"
                             if len(report.skipped) > 3 else ""),
                          hint="docs/observability.md shows what each format must hold")
    return report


__all__ = ["FORMATS", "KIND", "ORIGIN", "ImportReport", "detect_format", "import_traces"]
