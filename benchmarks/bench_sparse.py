"""Sparse SITE's cost against a SITE fit: the same steps with the L1 and the L0 (hard-concrete) penalty.

One process, one model, one task; each round fits SITE, sparse L1 and sparse L0 from scratch
with the same ``--steps`` (the order rotates between rounds), timing ``SparseTrainer.fit`` /
``AlphaTrainer.fit`` alone (caches, steps, validation), after one untimed warm-up fit. Medians over
the rounds and their ratios to SITE are printed and written as JSON.

    .venv/bin/python benchmarks/bench_sparse.py --data data/fv --task antonym \\
        --out benchmarks/results/sparse.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import site_lens as sl
from site_lens.config import SelectionConfig, SparsityConfig
from site_lens.stages.embeddings import embedding_prompts
from site_lens.stages.selection import AlphaTrainer
from site_lens.stages.sparse import SparseTrainer
from site_lens.tasks import zero_shot_prompts
from site_lens.tokens import make_examples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default="data/fv", help="FV task folders (default: data/fv, from site-lens data fv)")
    ap.add_argument("--task", default="antonym")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--weight", type=float, default=0.01)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = sl.load_model(args.model)
    task = sl.load_task(args.task, args.data)
    cfg = sl.EmbeddingConfig()
    t = sl.build_task_embedding(model, [p for p, _ in embedding_prompts(task, cfg, 0)])
    train = make_examples(model, zero_shot_prompts(task.train))
    valid = make_examples(model, zero_shot_prompts(task.valid))
    sel = SelectionConfig(steps=args.steps)
    trainers = {
        "site": lambda: AlphaTrainer(model, t, sel, seed=0),
        "sparse_l1": lambda: SparseTrainer(model, t, sel, SparsityConfig("l1", args.weight), seed=0),
        "sparse_l0": lambda: SparseTrainer(model, t, sel, SparsityConfig("l0", args.weight), seed=0),
    }
    AlphaTrainer(model, t, SelectionConfig(steps=20), seed=0).fit(train, valid)  # warm-up
    times: dict[str, list[float]] = {k: [] for k in trainers}
    names = list(trainers)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            tr = trainers[name]()
            t0 = time.perf_counter()
            tr.fit(train, valid)
            times[name].append(time.perf_counter() - t0)
            print(f"round {r} {name}: {times[name][-1]:.1f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {
        "model": args.model,
        "task": args.task,
        "steps": args.steps,
        "weight": args.weight,
        "rounds": args.rounds,
        "seconds": times,
        "median_s": med,
        "ratio_to_site": {k: med[k] / med["site"] for k in med},
    }
    print(json.dumps({"median_s": med, "ratio_to_site": res["ratio_to_site"]}, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
