"""How high must a skill score before the runtime shows it? Measured, not guessed.

    .venv/bin/python benchmarks/bench_skill_threshold.py [--gsm8k 50]

Through the real skills index and retriever (the int8 embedder the agent and the server use),
on the fixture library (34 skills) it prints, for each candidate floor on the cosine score:
- top-1 / top-3 of the 35 labelled queries with the floor applied (the right skill shown);
- the false-injection rate on 30 prompts no fixture skill is about
  (``tests/fixtures/skills/unrelated.json``: "say hello world", trivia, poems): any skill shown;
- the leave-one-out false-injection rate: each labelled query against the library without its
  own skill (a task the library does not cover, phrased like one it does);
- with ``--gsm8k N`` (needs the packaged GSM8K), the share of N GSM8K dev questions that still
  see the fixture's ``math-word-problems`` skill: a real task against a general skill.

The default floor (``SkillsConfig.min_score``) is read from this table: the highest floor that
keeps top-3 of the labelled queries, chosen where unrelated prompts inject nothing.

With ``--examples`` (needs the BIG-bench cache: ``whetstone data fetch bigbench``) it prints,
for the hand-written procedure skills of ``benchmarks/fixtures/procedure_tools``, how close
30 test tasks of each family (and GSM8K, and the unrelated prompts) are to each skill's
verified examples: the evidence behind ``SkillsConfig.require_tool_at``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from whetstone.library_store.embeddings import skill_embedder
from whetstone.library_store.store import Library
from whetstone.skills.index import LibraryIndex
from whetstone.skills.retrieval import SkillRetriever
from whetstone.skills.transfer import import_skills

FIXTURES = REPO / "tests" / "fixtures" / "skills"
FLOORS = (0.0, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4)


def scores(retriever: SkillRetriever, queries: list[str], k: int) -> list[list[tuple[str, float]]]:
    return [[(m.name, m.score) for m in retriever.search(q, k=k)] for q in queries]


def examples_table(unrelated: list[str]) -> None:
    """Nearest-example similarity of each family's test tasks to each procedure skill."""
    import numpy as np

    from whetstone.engine.evaluation.benchmarks import load_tasks
    from whetstone.skills.examples import ExampleRetriever
    from whetstone.skills.format import parse_examples

    base = REPO / "benchmarks" / "fixtures" / "procedure_tools"
    skills = sorted(p.name for p in base.iterdir() if (p / "references").is_dir())
    examples = {s: parse_examples((base / s / "references" / "examples.md").read_text())[0]
                for s in skills}
    ranker = ExampleRetriever(skill_embedder(threads=1))
    sets = ["bigbench:word_sorting", "bigbench:dyck_languages",
            "bigbench:tracking_shuffled_objects/three_objects",
            "bigbench:tracking_shuffled_objects/five_objects",
            "bigbench:logical_deduction/three_objects",
            "bigbench:logical_deduction/five_objects", "gsm8k"]
    rows = {s: [t.question for t in load_tasks(f"{s}@test:0:30")] for s in sets}
    rows["unrelated prompts"] = unrelated
    print("nearest verified example, min / median / max over each row's tasks:")
    print(" " * 50 + "".join(f"{s:>22}" for s in skills))
    for name, questions in rows.items():
        cells = []
        for s in skills:
            sc = [ranker.rank(q, examples[s])[0][1] for q in questions]
            cells.append(f"{min(sc):.2f}/{float(np.median(sc)):.2f}/{max(sc):.2f}")
        print(f"{name:<50}" + "".join(f"{c:>22}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gsm8k", type=int, default=0, help="GSM8K dev questions to add (0: none)")
    ap.add_argument("--examples", action="store_true",
                    help="only the verified-example table of the procedure skills")
    args = ap.parse_args()
    if args.examples:
        examples_table(json.loads((FIXTURES / "unrelated.json").read_text()))
        return
    labelled = json.loads((FIXTURES / "queries.json").read_text())
    unrelated = json.loads((FIXTURES / "unrelated.json").read_text())
    embedder = skill_embedder(threads=1)
    with tempfile.TemporaryDirectory() as tmp:
        lib = Library.init(Path(tmp) / "lib")
        import_skills(lib, FIXTURES / "library")
        index = LibraryIndex(lib, embedder)
        index.ensure()
        retriever = SkillRetriever(lib, index, k=40)
        ranked = scores(retriever, [q["query"] for q in labelled], 40)
        noise = scores(retriever, unrelated, 1)
        gsm = []
        if args.gsm8k:
            from whetstone.engine.evaluation.benchmarks import load_tasks
            gsm = [dict(r) for r in scores(
                retriever, [t.question for t in load_tasks(f"gsm8k@dev:0:{args.gsm8k}")], 40)]
        index.close()

    def right(rank: list[tuple[str, float]], skill: str, floor: float, top: int) -> bool:
        return any(n == skill and s >= floor for n, s in rank[:top])

    print(f"fixture library: 34 skills; {len(labelled)} labelled queries; "
          f"{len(unrelated)} unrelated prompts" + (f"; {len(gsm)} GSM8K dev questions"
                                                   if gsm else ""))
    head = "floor   top-1   top-3   unrelated injected   leave-one-out injected"
    print(head + ("   gsm8k sees its skill" if gsm else ""))
    for floor in FLOORS:
        top1 = sum(right(r, q["skill"], floor, 1) for r, q in zip(ranked, labelled, strict=False)) / len(labelled)
        top3 = sum(right(r, q["skill"], floor, 3) for r, q in zip(ranked, labelled, strict=False)) / len(labelled)
        fp = sum(bool(n) and n[0][1] >= floor for n in noise) / len(noise)
        loo = sum(max((s for n, s in r if n != q["skill"]), default=0.0) >= floor
                  for r, q in zip(ranked, labelled, strict=False)) / len(labelled)
        line = f"{floor:5.2f}   {top1:5.3f}   {top3:5.3f}   {fp:18.3f}   {loo:22.3f}"
        if gsm:
            line += f"   {sum(r.get('math-word-problems', 0.0) >= floor for r in gsm) / len(gsm):20.3f}"
        print(line)
    right_scores = sorted(dict(r)[q["skill"]] for r, q in zip(ranked, labelled, strict=False))
    print(f"\nthe right skill's score: min {right_scores[0]:.3f}, "
          f"10th pct {right_scores[len(right_scores) // 10]:.3f}, "
          f"median {right_scores[len(right_scores) // 2]:.3f}")
    top_noise = sorted((n[0][1], q, n[0][0]) for n, q in zip(noise, unrelated, strict=False) if n)
    print("highest unrelated: " + ", ".join(f"{s:.3f} ({q!r} -> {n})"
                                            for s, q, n in top_noise[-4:]))


if __name__ == "__main__":
    main()
