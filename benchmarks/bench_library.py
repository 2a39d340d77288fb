"""Library benchmark: retrieval latency and the time to write a version, at 100, 10,000 and
100,000 skills, measured side by side in one run.

    .venv/bin/python benchmarks/bench_library.py [--scales 100,10000,100000] [--queries 200]
    .venv/bin/python benchmarks/bench_library.py --quality     (the quality check alone)

First, retrieval quality: top-1 and top-3 on the fixture library's labelled queries for each
embedder the skills index can use (the served one, int8, must keep the float model's top-3).

For each scale it builds a library of synthetic skills (one commit), indexes it, then measures
- retrieval p50/p95 with the query embedding (MiniLM on the task text) and without it (a
  precomputed query vector): index check + chromadb query + hash checks + prompt packing with
  two skill bodies;
- the chromadb query alone;
- writing a version: one changed SKILL.md, validated, committed (manifest, atomic switch,
  view update); and re-syncing the index after it (re-embeds the one changed skill).

Embedding 100,000 texts at ~130/s on 2 cores takes too long, so only the first
``--real`` descriptions are embedded with the model; every other skill's vector is one of those
vectors plus Gaussian noise (cosine ~0.85 to its base), re-normalised. Queries are embedded for
real. The output says so.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from whetstone.library_store.embeddings import TextEmbedder
from whetstone.library_store.store import Library
from whetstone.skills.index import LibraryIndex, skill_document_text
from whetstone.skills.loader import validate_snapshot
from whetstone.skills.retrieval import SkillRetriever

VERBS = ["extract", "convert", "summarise", "validate", "clean", "merge", "plot", "translate",
         "debug", "optimise", "schedule", "classify", "deduplicate", "compress", "encrypt",
         "parse", "index", "monitor", "migrate", "benchmark", "audit", "format", "estimate",
         "reconcile", "forecast", "annotate", "backup", "deploy", "profile", "scrape"]
OBJECTS = ["pdf invoices", "csv exports", "sql queries", "docker images", "log files",
           "json payloads", "time zones", "unit measures", "email threads", "meeting notes",
           "spreadsheet formulas", "git histories", "regular expressions", "web pages",
           "bank statements", "shipping labels", "sensor readings", "survey answers",
           "api responses", "image thumbnails", "audio transcripts", "citations",
           "recipes", "travel plans", "tax forms", "password hashes", "unit tests",
           "latex equations", "markdown tables", "geometric shapes", "kubernetes manifests",
           "http errors", "word problems", "loan payments", "product reviews", "chat logs",
           "contract clauses", "medical codes", "chemistry formulas", "map coordinates"]
CONTEXTS = ["for a small business", "before a release", "for a research paper",
            "on a laptop without internet", "for a dashboard", "in a nightly job",
            "for a customer reply", "with strict privacy rules", "for a mobile app",
            "during an incident", "for a school assignment", "across many files"]
TASKS = ["my {o} are a mess, can you {v} them {c}?", "how do I {v} {o} {c}",
         "I need to {v} some {o} quickly", "what is the best way to {v} {o}?"]


def synthetic(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (name, description) pairs, all different."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        v, o, c = rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(CONTEXTS)
        name = f"{v}-{o.split()[0]}-{i}"
        desc = (f"{v.capitalize()} {o} {c}, with steps, checks and pitfalls. Use when someone "
                f"needs to {v} {o}.")
        out.append((name, desc))
    return out


def skill_md(name: str, desc: str, extra: str = "") -> str:
    body = "".join(f"{j}. Step {j} for {name}.\n" for j in range(1, 13))
    return f"---\nname: {name}\ndescription: {desc}\n---\n\n# {name}\n\n{body}{extra}"


class TableEmbedder:
    """Vectors looked up by text (precomputed); anything else goes to the real model."""

    def __init__(self, table: dict[str, np.ndarray], model: TextEmbedder) -> None:
        self.table, self.model, self.name = table, model, model.name

    @property
    def dim(self) -> int:
        return self.model.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in texts if t not in self.table]
        fresh = dict(zip(missing, self.model.embed(missing), strict=False)) if missing else {}
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self.table[t] if t in self.table else fresh[t] for t in texts])


def vectors_for(pairs: list[tuple[str, str]], model: TextEmbedder, n_real: int,
                seed: int = 0) -> dict[str, np.ndarray]:
    texts = [skill_document_text(n, d) for n, d in pairs]
    real = model.embed(texts[:n_real])
    rng = np.random.default_rng(seed)
    base = real[rng.integers(0, len(real), len(texts) - len(real))]  # (m, d)
    noisy = base + rng.normal(0, 0.0316, base.shape).astype(np.float32)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    return dict(zip(texts, np.concatenate([real, noisy.astype(np.float32)]), strict=False))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def run_scale(n: int, model: TextEmbedder, n_real: int, n_queries: int, n_commits: int,
              workdir: Path) -> dict[str, float]:
    pairs = synthetic(n)
    t = time.perf_counter()
    table = vectors_for(pairs, model, min(n_real, n))
    t_vectors = time.perf_counter() - t

    lib = Library.init(workdir / f"lib-{n}")
    t = time.perf_counter()
    lib.commit({f"skills/{name}/SKILL.md": skill_md(name, d) for name, d in pairs},
               method="bench", message=f"{n} synthetic skills")
    t_bulk = time.perf_counter() - t

    index = LibraryIndex(lib, TableEmbedder(table, model), batch_size=2000)
    t = time.perf_counter()
    index.ensure()
    t_index = time.perf_counter() - t

    rng = random.Random(7)
    tasks = [rng.choice(TASKS).format(v=rng.choice(VERBS), o=rng.choice(OBJECTS),
                                      c=rng.choice(CONTEXTS)) for _ in range(n_queries)]
    qvecs = model.embed(tasks)
    retriever = SkillRetriever(lib, index, k=5, budget_tokens=1500, max_bodies=2)
    retriever.retrieve(tasks[0])  # warm caches (tree buckets, chromadb graph)

    def cycle(fn: Callable[[int], object]) -> Callable[[], object]:
        it = iter(range(10**9))
        return lambda: fn(next(it) % n_queries)

    model.threads = None  # torch's default: one intra-op thread per core
    incl = timed(cycle(lambda j: retriever.retrieve(tasks[j])), n_queries)
    model.threads = 1
    incl_1t = timed(cycle(lambda j: retriever.retrieve(tasks[j])), n_queries)
    model.threads = None
    excl = timed(cycle(lambda j: retriever.retrieve("", query_vector=qvecs[j])), n_queries)
    raw = timed(cycle(lambda j: index.query(qvecs[j], k=5)), n_queries)

    commit_ms: dict[bool, list[float]] = {True: [], False: []}
    reindex_ms = []
    writers = {durable: Library(lib.root, durable=durable) for durable in (True, False)}
    for i in range(n_commits):
        for durable, writer in writers.items():  # side by side: fsync per file, or not
            name, desc = pairs[rng.randrange(n)]
            change = {f"skills/{name}/SKILL.md": skill_md(name, desc,
                                                           f"\nRevision {i} {durable}.\n")}
            t = time.perf_counter()
            writer.commit(change, method="bench", message=f"edit {i}",
                          validate=validate_snapshot)
            commit_ms[durable].append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        index.ensure()
        reindex_ms.append((time.perf_counter() - t) * 1000)
    assert index.check(lib.snapshot()) == [], "the index must match the library"
    index.close()
    shutil.rmtree(workdir / f"lib-{n}", ignore_errors=True)
    return {
        "n": n, "vectors_s": t_vectors, "bulk_s": t_bulk, "index_s": t_index,
        "incl_p50": pct(incl, 0.5), "incl_p95": pct(incl, 0.95),
        "incl1_p50": pct(incl_1t, 0.5), "incl1_p95": pct(incl_1t, 0.95),
        "excl_p50": pct(excl, 0.5), "excl_p95": pct(excl, 0.95),
        "raw_p50": pct(raw, 0.5), "raw_p95": pct(raw, 0.95),
        "commit_p50": pct(commit_ms[True], 0.5), "commit_p95": pct(commit_ms[True], 0.95),
        "fast_p50": pct(commit_ms[False], 0.5), "fast_p95": pct(commit_ms[False], 0.95),
        "reindex_p50": pct(reindex_ms, 0.5),
    }


def quality(workdir: Path) -> list[tuple[str, float, float, float]]:
    """Retrieval quality on the fixture library (34 skills, 35 labelled queries), through the
    real index and retriever, for each embedder the skills index can use: (embedder, top-1,
    top-3, ms a query embedding). The float model is the reference; ``skill_embedder`` (int8
    ONNX, what the server and the agent use) must keep its top-3."""
    import json

    from whetstone.library_store.embeddings import OnnxTextEmbedder
    from whetstone.skills.transfer import import_skills

    fixtures = REPO / "tests" / "fixtures" / "skills"
    queries = json.loads((fixtures / "queries.json").read_text())
    rows = []
    for label, embedder in (("MiniLM float (torch)", TextEmbedder(threads=1)),
                            ("MiniLM float (ONNX)", OnnxTextEmbedder(threads=1)),
                            ("MiniLM int8 (ONNX)", OnnxTextEmbedder(threads=1, quantized=True))):
        lib = Library.init(workdir / f"quality-{len(rows)}")
        import_skills(lib, fixtures / "library")
        index = LibraryIndex(lib, embedder)
        index.ensure()
        retriever = SkillRetriever(lib, index, k=3)
        ranked = [[m.name for m in retriever.search(q["query"])] for q in queries]
        embed_ms = timed(lambda e=embedder: e.embed([queries[0]["query"]]), 30)
        index.close()
        rows.append((label, sum(r[:1] == [q["skill"]] for r, q in zip(ranked, queries, strict=False))
                     / len(queries), sum(q["skill"] in r for r, q in zip(ranked, queries, strict=False))
                     / len(queries), pct(embed_ms, 0.5)))
    return rows


def print_quality(rows: list[tuple[str, float, float, float]]) -> None:
    print("retrieval quality, fixture library (34 skills, 35 labelled queries):")
    for label, top1, top3, ms in rows:
        print(f"  {label:<22} top-1 {top1:.3f}  top-3 {top3:.3f}  query embedding p50 "
              f"{ms:.1f} ms")
    ref, served = rows[0][2], rows[-1][2]
    print(f"  top-3 of the served embedder (int8) vs the float reference: {served:.3f} vs "
          f"{ref:.3f}: {'held' if served >= ref else 'LOWER'}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="100,10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--commits", type=int, default=30)
    ap.add_argument("--real", type=int, default=2000,
                    help="descriptions embedded with the model per scale (the rest perturbed)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--quality", action="store_true",
                    help="Only the retrieval-quality check (top-1/top-3 per embedder).")
    args = ap.parse_args()
    scales = [int(s) for s in args.scales.split(",")]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="whetstone-bench-"))
    model = TextEmbedder()
    model.embed(["warm up"])
    try:
        print_quality(quality(workdir))
        if not args.quality:
            _run(args, scales, workdir, model)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(args: argparse.Namespace, scales: list[int], workdir: Path, model: TextEmbedder
         ) -> None:
    load = os.getloadavg()
    print(f"bench_library: {os.cpu_count()} CPUs, load average {load[0]:.1f} at start; "
          f"{args.queries} queries, {args.commits} commits per scale")
    print(f"embeddings: the first {args.real} skill descriptions per scale are embedded with "
          "all-MiniLM-L6-v2; the others are perturbed copies of those vectors (cos ~0.85); "
          "queries are embedded for real\n")
    rows = []
    for n in scales:
        start = time.perf_counter()
        rows.append(run_scale(n, model, args.real, args.queries, args.commits, workdir))
        print(f"  measured {n} skills in {time.perf_counter() - start:.0f} s", file=sys.stderr,
              flush=True)
    cols = [("skills", 8), ("retrieve+embed p50/p95", 22), ("same, 1 thread", 17),
            ("retrieve p50/p95", 17), ("query p50/p95", 15), ("commit p50/p95", 17),
            ("no-fsync commit", 17), ("reindex p50", 11), ("build: commit / index", 22)]
    head = " | ".join(f"{c:>{w}}" for c, w in cols)
    print(head)
    print("-" * len(head))
    for r in rows:
        cells = [f"{r['n']}", f"{r['incl_p50']:.1f} / {r['incl_p95']:.1f} ms",
                 f"{r['incl1_p50']:.1f} / {r['incl1_p95']:.1f} ms",
                 f"{r['excl_p50']:.1f} / {r['excl_p95']:.1f} ms",
                 f"{r['raw_p50']:.1f} / {r['raw_p95']:.1f} ms",
                 f"{r['commit_p50']:.1f} / {r['commit_p95']:.1f} ms",
                 f"{r['fast_p50']:.1f} / {r['fast_p95']:.1f} ms", f"{r['reindex_p50']:.1f} ms",
                 f"{r['bulk_s']:.1f} s / {r['index_s']:.1f} s"]
        print(" | ".join(f"{c:>{w}}" for c, (_, w) in zip(cells, cols, strict=False)))
    first, last = rows[0], rows[-1]
    print("\nretrieve = index check + chromadb query (k=5) + hash checks + prompt packing with "
          "2 bodies; query = chromadb alone; commit = 1 changed SKILL.md, validated, fsynced; "
          "no-fsync commit = the same without fsync (still atomic against a killed process, "
          "not against power loss); reindex = index sync after a commit (1 re-embedding)")
    print(f"ratios, {last['n']} vs {first['n']} skills: retrieve x"
          f"{last['excl_p50'] / first['excl_p50']:.2f}, commit x"
          f"{last['commit_p50'] / first['commit_p50']:.2f}; at {last['n']}: query embedding "
          f"{1 - last['excl_p50'] / last['incl_p50']:.0%} of retrieval, 1 torch thread vs "
          f"default x{last['incl1_p50'] / last['incl_p50']:.2f}, fsync vs none x"
          f"{last['commit_p50'] / last['fast_p50']:.2f}")
    for label, key in (("retrieval without query embedding", "excl_p50"),
                       ("retrieval with query embedding (1 thread)", "incl1_p50"),
                       ("commit (fsync)", "commit_p50"), ("commit (no fsync)", "fast_p50")):
        verdict = "met" if last[key] < 20 else "NOT met"
        print(f"target p50 < 20 ms at {last['n']} skills, {label}: {last[key]:.1f} ms, {verdict}")


if __name__ == "__main__":
    main()
