"""MARCH as a hallucination detector on HaluEval QA, against a one-call LLM judge.

For each item of a HaluEval slice, both its right answer (label 0) and its hallucinated answer
(label 1) are checked:

    MARCH   the proposer cuts the answer into claims, the checker answers their questions from
            the evidence without seeing the answer (3 samples, majority vote); flagged = a
            hallucination (engine/methods/march/verifier.py, policy=report)
    judge   one call that sees the evidence, the question and the answer and says Yes/No
            (engine/prompts/hallucination_judge.md)

Both read the same evidence: the top-k passages the library corpus ``halueval`` (every item's
knowledge passage; built here when missing) returns for the question, or with
``--evidence oracle`` the item's own passage. Printed and written side by side: precision,
recall and F1 of the "hallucinated" flag (with a 95% bootstrap interval over items), accuracy,
tokens per item (both answers), malformed replies. Progress is saved per answer to
``--checkpoint``; a run started again resumes there. The JSON result (``--out``) carries a
``markdown`` table for docs/results.md (a scoreboard section).

    .venv/bin/python benchmarks/bench_march_halueval.py --tasks halueval@test:0:100 -j 8
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from whetstone.engine.backends.base import Backend
from whetstone.engine.errors import WhetstoneError
from whetstone.engine.evaluation.benchmarks import load_tasks
from whetstone.engine.evaluation.tasks import TaskRecord, evidence_documents
from whetstone.engine.methods.march.verifier import MarchConfig, MarchVerifier
from whetstone.engine.prompts import render_prompt
from whetstone.engine.types import Passage, Request
from whetstone.library_store.corpus import Corpus

DEFAULT_OUT = REPO / "benchmarks" / "results" / "march-halueval.json"


# --- the judge baseline --------------------------------------------------------------------

def judge(backend: Backend, question: str, answer: str, passages: Sequence[Passage],
          seed: int) -> dict[str, Any]:
    """One call that sees everything; ``flagged`` None when the reply says neither Yes nor
    No (counted as malformed, scored as not flagged)."""
    evidence = "\n".join(f"[{i}] {p.text}" for i, p in enumerate(passages, start=1))
    completion = backend.complete(Request(messages=[{"role": "user", "content": render_prompt(
        "hallucination_judge", evidence=evidence, question=question, answer=answer).strip()}],
        max_tokens=16, temperature=0.0, seed=seed))
    m = re.search(r"\b(yes|no)\b", completion.text, re.IGNORECASE)
    return {"flagged": None if m is None else m.group(1).lower() == "yes",
            "tokens": completion.total_tokens, "raw": completion.text[:200]}


# --- one answer ----------------------------------------------------------------------------

def evidence_of(task: TaskRecord, corpus: Corpus, mode: str, k: int) -> list[Passage]:
    if mode == "oracle":
        return [Passage(task.evidence or "", f"task:{task.id}")]
    return corpus.search(task.question, k)


def check_one(task: TaskRecord, kind: str, verifier: MarchVerifier, backend: Backend,
              corpus: Corpus, args: argparse.Namespace) -> dict[str, Any]:
    answer = task.expected if kind == "right" else task.metadata["hallucinated_answer"]
    passages = evidence_of(task, corpus, args.evidence, args.k)
    record: dict[str, Any] = {
        "task": task.id, "kind": kind, "label": kind == "hallucinated",
        "retrieved_own": any(p.source == f"task:{task.id}" or p.text == task.evidence
                             for p in passages)}
    start = time.perf_counter()
    try:
        result = verifier.verify(task.question, str(answer), passages)
        last = result.rounds[-1]
        record["march"] = {"flagged": result.flagged, "tokens": result.usage.total_tokens,
                           "claims": len(last.claims),
                           "flagged_claims": sum(last.is_flagged(v) for v in last.verdicts),
                           "proposer": {k: last.proposer.get(k) for k in
                                        ("read", "repaired", "dropped", "retries")},
                           "checker": {k: last.checker.get(k) for k in
                                       ("read", "repaired", "dropped", "missing")},
                           "votes": [list(v.votes) for v in last.verdicts]}
    except WhetstoneError as exc:  # an unreadable proposer: recorded, scored as not flagged
        record["march"] = {"flagged": False, "tokens": 0, "error": str(exc)[:400]}
    record["march"]["seconds"] = round(time.perf_counter() - start, 2)
    start = time.perf_counter()
    record["judge"] = judge(backend, task.question, str(answer), passages, args.seed)
    record["judge"]["seconds"] = round(time.perf_counter() - start, 2)
    return record


# --- scoring -------------------------------------------------------------------------------

def scores(records: Sequence[dict[str, Any]], method: str) -> dict[str, float]:
    tp = sum(1 for r in records if r["label"] and r[method]["flagged"])
    fp = sum(1 for r in records if not r["label"] and r[method]["flagged"])
    fn = sum(1 for r in records if r["label"] and not r[method]["flagged"])
    tn = len(records) - tp - fp - fn
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1,
            "accuracy": (tp + tn) / len(records) if records else 0.0,
            "flag_rate": (tp + fp) / len(records) if records else 0.0,
            "tp": tp, "fp": fp, "fn": fn, "tn": tn}


def f1_interval(records: Sequence[dict[str, Any]], method: str, n: int = 2000,
                seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of F1, resampling items (both answers of an item together)."""
    by_item: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_item.setdefault(r["task"], []).append(r)
    items = list(by_item.values())
    rng = random.Random(seed)
    values = sorted(scores([r for _ in items for r in rng.choice(items)], method)["f1"]
                    for _ in range(n))
    return values[int(0.025 * n)], values[int(0.975 * n) - 1]


def failed(record: dict[str, Any]) -> bool:
    """An answer either detector could not check (a proposer reply with no claim after its
    retry; a judge reply with neither Yes nor No): left out of both detectors' scores, never
    scored as "not flagged"."""
    return "error" in record["march"] or record["judge"]["flagged"] is None


def summary(records: Sequence[dict[str, Any]], method: str) -> dict[str, Any]:
    items = len({r["task"] for r in records})
    out: dict[str, Any] = scores([r for r in records if not failed(r)], method)
    out["f1_ci95"] = list(f1_interval([r for r in records if not failed(r)], method))
    out["scored"] = sum(1 for r in records if not failed(r))
    out["tokens_per_item"] = sum(r[method]["tokens"] for r in records) / max(1, items)
    out["seconds_per_answer"] = sum(r[method]["seconds"] for r in records) / max(1, len(records))
    if method == "march":
        out["errors"] = sum(1 for r in records if "error" in r["march"])
        out["proposer_dropped"] = sum((r["march"].get("proposer") or {}).get("dropped") or 0
                                      for r in records)
        out["checker_dropped"] = sum((r["march"].get("checker") or {}).get("dropped") or 0
                                     for r in records)
        out["checker_repaired"] = sum((r["march"].get("checker") or {}).get("repaired") or 0
                                      for r in records)
        out["claims_per_answer"] = sum(r["march"].get("claims", 0) for r in records) / max(
            1, len(records))
    else:
        out["errors"] = sum(1 for r in records if r["judge"]["flagged"] is None)
    return out


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    rows = [(f"MARCH (proposer + checker x{cfg['samples']}, majority)", result["march"]),
            ("LLM judge (one call, sees the answer)", result["judge"])]
    head = (f"HaluEval QA `{cfg['tasks']}`: {result['items']} items, {result['answers']} "
            f"answers (each item's right and hallucinated answer), both detectors scored on "
            f"the {result['march']['scored']} that neither failed; model `{cfg['model']}`; "
            f"evidence: {cfg['evidence_desc']}. Positive class: hallucinated.")
    columns = ("| detector | precision | recall | F1 [95% CI] | accuracy | flag rate "
               "| tokens/item | malformed |")
    lines = [head, "", columns, "|---|---|---|---|---|---|---|---|"]
    for name, s in rows:
        lo, hi = s["f1_ci95"]
        lines.append(f"| {name} | {s['precision']:.3f} | {s['recall']:.3f} | {s['f1']:.3f} "
                     f"[{lo:.3f}, {hi:.3f}] | {s['accuracy']:.3f} | {s['flag_rate']:.3f} | "
                     f"{s['tokens_per_item']:.0f} | {s['errors']} |")
    m = result["march"]
    note = (f"MARCH: {m['claims_per_answer']:.2f} claims per answer; malformed = proposer "
            f"replies with no claim after a retry ({m['errors']}, left out of both scores); "
            f"checker lines repaired {m['checker_repaired']}, dropped {m['checker_dropped']}. "
            f"Judge malformed = neither Yes nor No (left out of both scores). Wall time "
            f"{result['seconds'] / 60:.1f} min"
            + (f" for the {result['checked']} answers this run checked (the others came "
               f"from its checkpoint)." if result.get("checked", result["answers"])
               < result["answers"] else "."))
    lines += ["", note]
    if result.get("retrieval_hit") is not None:
        lines.append(f"Retrieval: the item's own passage was among the top {cfg['k']} for "
                     f"{result['retrieval_hit']:.0%} of answers.")
    return "\n".join(lines)


# --- the run -------------------------------------------------------------------------------

def ensure_corpus(corpus: Corpus, say: Callable[[str], None]) -> None:
    if corpus.exists() and corpus.stats()["chunks"]:
        return
    say(f"building the corpus {corpus.path} from every HaluEval knowledge passage …")
    report = corpus.add(evidence_documents(load_tasks("halueval").tasks))
    say(f"  {report.added} documents, {report.chunks} chunks")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="halueval@test:0:100")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--analyst", default=None, help="proposer/checker model (default: --model)")
    ap.add_argument("--library", default=str(Path.home() / ".whetstone" / "bench-march"),
                    help="library folder holding the corpus")
    ap.add_argument("--corpus", default="halueval")
    ap.add_argument("--evidence", choices=("corpus", "oracle"), default="corpus")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-j", "--concurrency", type=int, default=1, help="answers in flight")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--checkpoint", default=None,
                    help="per-answer progress (default: <out>.partial.jsonl)")
    args = ap.parse_args()

    from whetstone.engine.backends.registry import get_backend
    from whetstone.library_store.embeddings import query_embedder

    tasks = load_tasks(args.tasks)
    backend = get_backend(args.model)
    analyst = get_backend(args.analyst) if args.analyst else None
    corpus = Corpus.of_library(args.library, args.corpus, query_embedder(threads=1))
    if args.evidence == "corpus":
        ensure_corpus(corpus, print)
    config = MarchConfig(k=args.k, samples=args.samples, seed=args.seed, policy="report")
    verifier = MarchVerifier(backend, proposer=analyst, config=config)
    checkpoint = Path(args.checkpoint or args.out + ".partial.jsonl")
    done: dict[tuple[str, str], dict[str, Any]] = {}
    if checkpoint.exists():
        for line in checkpoint.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                done[(r["task"], r["kind"])] = r
        print(f"resuming: {len(done)} answers already checked ({checkpoint})")
    todo = [(t, kind) for t in tasks for kind in ("right", "hallucinated")
            if (t.id, kind) not in done]
    lock = threading.Lock()
    start = time.perf_counter()
    checkpoint.parent.mkdir(parents=True, exist_ok=True)

    def run(job: tuple[TaskRecord, str]) -> None:
        record = check_one(job[0], job[1], verifier, backend, corpus, args)
        with lock:
            done[(record["task"], record["kind"])] = record
            with open(checkpoint, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            if len(done) % 10 == 0 or len(done) == 2 * len(tasks):
                print(f"  {len(done)}/{2 * len(tasks)} answers", flush=True)

    with ThreadPoolExecutor(max_workers=max(1, args.concurrency)) as pool:
        list(pool.map(run, todo))
    records = [done[(t.id, kind)] for t in tasks for kind in ("right", "hallucinated")]
    hit = [r["retrieved_own"] for r in records] if args.evidence == "corpus" else []
    result: dict[str, Any] = {
        "config": {"tasks": args.tasks, "model": args.model, "analyst": args.analyst,
                   "evidence": args.evidence, "k": args.k, "samples": args.samples,
                   "seed": args.seed, "evidence_desc":
                       f"top {args.k} passages of the corpus of all 10,000 knowledge passages"
                       if args.evidence == "corpus" else "the item's own knowledge passage"},
        "items": len(tasks), "answers": len(records),
        "march": summary(records, "march"), "judge": summary(records, "judge"),
        "retrieval_hit": sum(hit) / len(hit) if hit else None,
        "seconds": time.perf_counter() - start, "checked": len(todo), "records": records}
    result["markdown"] = markdown(result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(result["markdown"])
    print(f"wrote {args.out}")
    corpus.close()
    backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
