"""Task records, JSONL task files, the task-set spec syntax and stable splits.

A task set is named by a spec string::

    gsm8k                 the whole packaged set (see ``whetstone.engine.evaluation.benchmarks``)
    gsm8k:0:30            a slice, Python-style: tasks 0..29 (either bound may be empty)
    gsm8k@dev             a split (train | dev | test), chosen by hashing each task id
    gsm8k@dev:0:20        the first 20 tasks of the dev split
    bigbench:word_sorting a namespaced set (``whetstone.engine.evaluation.bigbench``), same @split and :slice
    path/to/tasks.jsonl   a JSONL file of task records (also with @split and :slice)

Splits are stable: a task belongs to ``train`` when the first 8 bytes of sha256(id), read as a
fraction of 2**64, are below 0.6, to ``dev`` below 0.8, else to ``test`` (60/20/20). They do not
depend on the order of the file, on which other tasks exist, or on the machine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from whetstone.engine.errors import EvalError
from whetstone.engine.types import Message, Trace, messages_from
from whetstone.library_store.chunking import SourceDoc

log = logging.getLogger("whetstone.tasks")

Split = Literal["train", "dev", "test"]
SPLITS: tuple[Split, ...] = ("train", "dev", "test")
# Cumulative upper bounds of the 60/20/20 split on the hash fraction.
_SPLIT_BOUNDS: tuple[tuple[Split, float], ...] = (("train", 0.6), ("dev", 0.8), ("test", 1.0))


TASK_FIELDS = ("id", "question", "messages", "image", "evidence", "expected", "tools",
               "scorer", "metadata")
# What other task files (GSM8K and most Hugging Face datasets, BIG-bench, classification sets)
# call our fields. Read only when a record names exactly one of the names of a field.
FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "expected": ("answer", "target", "label"),
    "question": ("prompt", "input"),
}


def _with_aliases(d: Mapping[str, Any]) -> dict[str, Any]:
    """``d`` with an alias renamed to our field; two names for one field are refused, since
    either could be the one meant."""
    out = dict(d)
    for field_name, aliases in FIELD_ALIASES.items():
        given = [n for n in (field_name, *aliases) if n in out]
        if len(given) > 1:
            raise EvalError(
                f"the record names {' and '.join(f'`{n}`' for n in given)}, which all mean "
                f"`{field_name}`",
                hint="keep one of them (or move the others under `metadata`)")
        if given and given[0] != field_name:
            out[field_name] = out.pop(given[0])
    return out


def content_id(question: Any, messages: Any) -> str:
    """A stable id for a record that has none: a hash of its prompt, so the split of a task
    does not depend on its line number (the same prompt twice is one task)."""
    prompt = question if isinstance(question, str) and question.strip() else messages
    text = json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)
    return "sha-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


@dataclass(frozen=True)
class TaskRecord:
    """One labelled task.

    ``question`` is the prompt text; ``messages`` (OpenAI chat format) replaces it for chat-shaped
    tasks (BFCL). ``expected`` is the answer the scorer compares against: a string or number, a
    list of acceptable strings, or for BFCL the ``possible_answer`` ground-truth list.
    ``tools`` are OpenAI function schemas offered to the agent; ``scorer`` names the set's
    default scorer (``whetstone.engine.evaluation.scorers``).
    """

    id: str
    question: str = ""
    messages: tuple[Message, ...] = ()
    image: str | None = None
    evidence: str | None = None
    expected: Any = None
    tools: tuple[Mapping[str, Any], ...] = ()
    scorer: str = "normalised"
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id.strip():
            raise EvalError(f"task id must be a non-empty string, got {self.id!r}",
                            hint="give every task record a unique string `id`")
        if not isinstance(self.question, str):
            raise EvalError(f"task {self.id}: `question` must be a string",
                            hint="put chat-shaped prompts in `messages` instead")
        if not isinstance(self.scorer, str):
            raise EvalError(f"task {self.id}: `scorer` must be a string naming one scorer, "
                            f"not a {type(self.scorer).__name__}",
                            hint='e.g. "scorer": "numeric"; leave it out for the default')
        object.__setattr__(self, "messages", messages_from(self.messages))
        object.__setattr__(self, "tools", tuple(dict(t) for t in self.tools))
        object.__setattr__(self, "metadata", dict(self.metadata))
        if not self.question.strip() and not self.messages:
            raise EvalError(f"task {self.id} has neither `question` nor `messages`",
                            hint="every task needs a prompt: a `question` string or `messages`")

    @property
    def prompt(self) -> str:
        """The task's text: ``question``, else the last user message's text."""
        if self.question:
            return self.question
        users = [m for m in self.messages if m.role == "user"]
        return (users[-1] if users else self.messages[-1]).text

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id}
        if self.question:
            d["question"] = self.question
        if self.messages:
            d["messages"] = [m.to_dict() for m in self.messages]
        for name in ("image", "evidence"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        d["expected"] = self.expected
        if self.tools:
            d["tools"] = [dict(t) for t in self.tools]
        d["scorer"] = self.scorer
        if self.metadata:
            d["metadata"] = dict(self.metadata)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskRecord:
        """A record from its JSON object. The names other datasets use for the same fields
        (``FIELD_ALIASES``: ``answer``/``target``/``label``, ``prompt``/``input``) are read as
        ours when the record names one of them only; a record without ``id`` gets one from its
        content (``content_id``), so splits stay stable."""
        if not isinstance(d, Mapping):
            raise EvalError(f"a task record must be a JSON object, got {type(d).__name__}",
                            hint='write one object per line: {"id": ..., "question": ...}')
        d = _with_aliases(d)
        unknown = set(d) - set(TASK_FIELDS)
        if unknown:
            raise EvalError(f"unknown task field(s) {sorted(unknown)}",
                            hint=f"the fields are {', '.join(TASK_FIELDS)}; put extra "
                                 "information under `metadata`")
        kw: dict[str, Any] = {k: d[k] for k in d if k in {"question", "image", "evidence",
                                                          "expected", "scorer"}}
        if d.get("messages"):
            kw["messages"] = messages_from(d["messages"])
        if "id" in d:
            kw["id"] = str(d["id"]) if isinstance(d["id"], int) else d["id"]
        elif not d.get("question") and not d.get("messages"):
            raise EvalError("task record has neither `question` nor `messages`",
                            hint="every task needs a prompt: a `question` string or `messages`")
        else:
            kw["id"] = content_id(kw.get("question"), d.get("messages"))
        if d.get("tools"):
            kw["tools"] = tuple(d["tools"])
        if d.get("metadata"):
            kw["metadata"] = dict(d["metadata"])
        return cls(**kw)

    def with_(self, **changes: Any) -> TaskRecord:
        return replace(self, **changes)


@dataclass(frozen=True)
class TaskSet:
    """Tasks loaded from a spec, with the problems met while loading (bad lines, duplicates)."""

    name: str
    tasks: tuple[TaskRecord, ...]
    problems: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[TaskRecord]:
        return iter(self.tasks)

    def __getitem__(self, i: int) -> TaskRecord:
        return self.tasks[i]

    @property
    def scorer(self) -> str:
        """The set's default scorer: the one most of its tasks name."""
        names = [t.scorer for t in self.tasks]
        return max(set(names), key=names.count) if names else "normalised"


def read_jsonl(path: Path | str, *, trust_scorers: bool = False) -> TaskSet:
    """Read task records from a JSONL file. A broken line is reported with its line number
    in ``TaskSet.problems`` and skipped; reading goes on. Duplicate ids too. The log gets one
    warning per file that lost lines (the CLI prints each problem itself). A file where no line
    gives a task is an ``EvalError`` that says why (the first problem).

    A task's ``scorer`` may name a built-in scorer only: a ``module:function`` scorer would
    let the file choose code to run, so it is an ``EvalError`` naming the line, unless
    ``trust_scorers`` (the person running whetstone vouches for the file and its code)."""
    path = Path(path)
    if not path.is_file():
        raise EvalError(f"task file {path} does not exist",
                        hint="pass a .jsonl file of task records or a packaged set name")
    tasks: list[TaskRecord] = []
    problems: list[str] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                task = TaskRecord.from_dict(json.loads(line))
            except json.JSONDecodeError as exc:
                problems.append(f"{path}:{lineno}: not valid JSON ({exc.msg} at column "
                                f"{exc.colno}); line skipped")
                continue
            except (EvalError, TypeError, ValueError, KeyError) as exc:
                msg = exc.message if isinstance(exc, EvalError) else str(exc)
                problems.append(f"{path}:{lineno}: bad task record ({msg}); line skipped")
                continue
            if not trust_scorers:
                _refuse_code_scorer(task, f"{path}:{lineno}")
            if task.id in seen:
                problems.append(f"{path}:{lineno}: duplicate task id {task.id!r}; line skipped")
                continue
            seen.add(task.id)
            tasks.append(task)
    if not tasks:
        _refuse_empty(path, problems)
    if problems:
        log.warning("%s: %d line(s) skipped, the first: %s", path, len(problems), problems[0])
    return TaskSet(name=str(path), tasks=tuple(tasks), problems=tuple(problems))


def is_user_scorer(name: str) -> bool:
    """Whether ``whetstone.engine.evaluation.scorers.get_scorer(name)`` would import code: a
    ``module:function`` or ``file.py:function`` name. Built-in names hold no colon but
    ``numeric:TOL`` and ``value:TOL``. A data file may not name one (``read_jsonl``): that
    would let the file choose code to run."""
    head, sep, tail = name.strip().partition(":")
    return bool(sep and tail) and head.strip().lower() not in ("numeric", "value")


def _refuse_code_scorer(task: TaskRecord, where: str) -> None:
    """Stop when a task file's own ``scorer`` names code (``module:function``): reading a
    data file must not import or run anything. Raised, not a skipped line, so the run does not
    go on quietly without the tasks the file meant."""
    if not is_user_scorer(task.scorer):
        return
    raise EvalError(
        f"{where}: task {task.id!r} names the scorer {task.scorer!r}, which is code to "
        "import and run; a task file may name only a built-in scorer (exact, normalised, "
        "numeric[:TOL], contains, f1, ...: `whetstone eval --help`)",
        hint=f"choose the scorer yourself: `whetstone eval --scorer {task.scorer}` (it then "
             "scores every task), or, if you trust this file and the code it names, "
             "`whetstone eval --trust-task-scorers` (Python: load_tasks(spec, "
             "trust_scorers=True), or evaluate(tasks, solver, scorer=...))")


def _refuse_empty(path: Path, problems: Sequence[str]) -> None:
    """The error for a task file that gives no task: empty, or every line refused."""
    if not problems:
        raise EvalError(f"task file {path} holds no task record",
                        hint='write one JSON object per line: {"id": "1", "question": "...", '
                             '"expected": "..."} (docs/cli.md, "Task files")')
    raise EvalError(f"no line of {path} is a task: all {len(problems)} were refused; the "
                    f"first: {problems[0]}",
                    hint=f"each line needs `question` (or `messages`) and usually `expected`; "
                         f"the fields are {', '.join(TASK_FIELDS)} (docs/cli.md, "
                         f'"Task files")')


def write_jsonl(tasks: Sequence[TaskRecord], path: Path | str) -> Path:
    """Write task records, one JSON object per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(t.to_dict(), ensure_ascii=False) + "\n" for t in tasks)
    return path


def split_of(task_id: str) -> Split:
    """The stable split of a task id (60/20/20 train/dev/test by sha256 of the id)."""
    digest = hashlib.sha256(task_id.encode("utf-8")).digest()
    frac = int.from_bytes(digest[:8], "big") / 2**64
    for name, bound in _SPLIT_BOUNDS:
        if frac < bound:
            return name
    return "test"  # unreachable: frac < 1.0


@dataclass(frozen=True)
class TaskSpec:
    """A parsed task-set spec: the set (a packaged name or a file), split and slice."""

    source: str
    split: Split | None = None
    start: int | None = None
    end: int | None = None

    def __str__(self) -> str:
        s = self.source + (f"@{self.split}" if self.split else "")
        if self.start is not None or self.end is not None:
            lo = "" if self.start is None else self.start
            s += f":{lo}:{'' if self.end is None else self.end}"
        return s


# A set may be namespaced, ``bigbench:word_sorting``: the part after the colon starts with a
# letter or underscore, so ``gsm8k:0:30`` stays a slice and ``gsm8k:0`` stays an error.
_SPEC = re.compile(
    r"^(?P<source>[^@:]+?(?::[A-Za-z_][^@:]*?)?)(?:@(?P<split>[^:]*))?"
    r"(?::(?P<start>[^:@]*):(?P<end>[^:@]*))?$")


def parse_spec(spec: str) -> TaskSpec:
    """Parse ``SET[@SPLIT][:START:END]``; a string naming an existing file is that file.
    SET may carry a namespace: ``bigbench:word_sorting@test:0:50``."""
    spec = spec.strip()
    if not spec:
        raise EvalError("empty task-set spec", hint="e.g. --tasks gsm8k:0:30")
    if Path(spec).is_file():
        return TaskSpec(source=spec)
    m = _SPEC.match(spec)
    if not m:
        raise EvalError(f"cannot read task-set spec {spec!r}",
                        hint="use SET, SET:START:END, SET@SPLIT or SET@SPLIT:START:END, "
                             "split before slice (e.g. gsm8k@dev:0:20, "
                             "bigbench:word_sorting@test:0:50)")
    split = m.group("split")
    if split is not None and split not in SPLITS:
        raise EvalError(f"unknown split {split!r} in {spec!r}",
                        hint=f"splits are {', '.join(SPLITS)}")
    bounds: list[int | None] = []
    for name in ("start", "end"):
        raw = m.group(name)
        if raw is None or raw == "":
            bounds.append(None)
            continue
        try:
            bounds.append(int(raw))
        except ValueError:
            raise EvalError(f"slice bound {raw!r} in {spec!r} is not an integer",
                            hint="use SET:START:END with integers, e.g. gsm8k:0:30") from None
    return TaskSpec(source=m.group("source"), split=split,  # type: ignore[arg-type]
                    start=bounds[0], end=bounds[1])


def select(tasks: Sequence[TaskRecord], split: Split | None = None, start: int | None = None,
           end: int | None = None) -> tuple[TaskRecord, ...]:
    """Keep the tasks of ``split`` (in their original order), then slice ``[start:end]``."""
    chosen = [t for t in tasks if split is None or split_of(t.id) == split]
    return tuple(chosen[start:end])


def tasks_from_traces(traces: Sequence[Trace], scorer: str = "normalised",
                      name: str = "traces", *, scorer_wins: bool = False) -> TaskSet:
    """Labelled traces as tasks, so the gate can score a library on the traces' own
    (held-out) tasks.

    A trace needs a ``label`` (the expected answer); ``meta["task_id"]`` (set by evaluation)
    keeps the original id, and ``meta["scorer"]`` the original scorer. A label holding a JSON
    list or object (BFCL ground truth) is parsed back. Repeated task ids are kept once.
    A recorded scorer that names code (``helper.py:score``) is stored data choosing code, as
    a task file's would be: such a trace is skipped (with a warning) unless ``scorer``, the
    caller's own choice, names the same code. ``scorer_wins``: every task is scored by
    ``scorer`` whatever its trace recorded (the person chose it: ``--scorer``).
    """
    tasks: list[TaskRecord] = []
    seen: set[str] = set()
    problems: list[str] = []
    refused: set[str] = set()
    for t in traces:
        if t.label is None:
            continue
        task_id = str(t.meta.get("task_id") or t.id)
        if task_id in seen:
            continue
        expected: Any = t.label
        if t.label[:1] in ("[", "{"):
            try:
                expected = json.loads(t.label)
            except json.JSONDecodeError:
                pass  # plain text that starts with a bracket
        named = scorer if scorer_wins else str(t.meta.get("scorer") or scorer)
        if is_user_scorer(named) and named != scorer:
            problems.append(f"trace {t.id} names the scorer {named!r}, code a stored trace "
                            "may not choose; skipped")
            refused.add(named)
            continue
        try:
            tasks.append(TaskRecord(id=task_id, question=t.task, expected=expected,
                                    scorer=named, metadata={"trace_id": t.id}))
        except EvalError as exc:
            problems.append(f"trace {t.id}: {exc.message}; skipped")
            continue
        seen.add(task_id)
    if refused:
        names = ", ".join(map(repr, sorted(refused)[:3]))
        hint = ("score them with tasks you choose: --gate-tasks SET (built-in scorers), or in "
                "Python gate_tasks=load_tasks(FILE, trust_scorers=True)")
        if not tasks:
            raise EvalError(f"every labelled trace names a scorer that is code ({names}); a "
                            "stored trace may not choose code to run", hint=hint)
        log.warning("%d trace(s) left out: they name the scorer %s, code a stored trace may "
                    "not choose; %s", sum("code a stored trace" in p for p in problems),
                    names, hint)
    return TaskSet(name=name, tasks=tuple(tasks), problems=tuple(problems))


def evidence_documents(tasks: Sequence[TaskRecord]) -> list[SourceDoc]:
    """Each task's evidence as a corpus document, its source ``task:<id>``: how a corpus is
    built from a task set's knowledge (``whetstone corpus add --tasks halueval``). Tasks
    without evidence give none."""
    return [SourceDoc(t.evidence, f"task:{t.id}") for t in tasks
            if isinstance(t.evidence, str) and t.evidence.strip()]
