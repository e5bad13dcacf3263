"""Prefix tokens a SITE fit of every FV task at seeds 0-2 runs: each seed alone, in one loop without sharing,
and in one loop whose seeds of a task share their prompts' prefixes.

Stage 2 runs every training and valid prompt's prefix (all its tokens but the last) once through the model
(``PromptCache``); that is most of a batched fit's time (BENCHMARKS.md, "Many tasks at once"), and its cost is
proportional to the prefix tokens. This counts them, with the model's tokenizer and the fit's own schedules
(``training.schedule``, 400 steps of one prompt, up to 100 valid prompts, the loop's 50-step cache windows):

- alone: one fit per (task, seed), each distinct training prompt of its schedule once, its valid prompts once;
- one loop, no sharing: the seeds side by side, each window caching each seed's draws apart, valid per seed;
- one loop, shared: a task's seeds cache the union of their draws per window, its valid prompts once.

    (OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prefix_sharing.py --data data/fv --window 50; echo
     OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prefix_sharing.py --data data/fv --window 400) \\
        > benchmarks/results/prefix_sharing.txt

The loop chooses its window (``BatchedAlphaTrainer.cache_steps``): the whole schedule (400 steps) where the
prefixes' keys and values fit its memory budget, else shorter ones down to 50.
"""

from __future__ import annotations

import argparse

import site_lens as sl
from site_lens.config import SelectionConfig
from site_lens.stages.objectives import train_valid_examples
from site_lens.stages.training import schedule
from site_lens.tasks import available_tasks, load_task

WINDOW = 50  # BatchedAlphaTrainer.cache_steps (--window)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="the FV task folder")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--window", type=int, default=WINDOW, help=f"steps whose prefixes are cached together (default {WINDOW})")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    cfg = SelectionConfig()
    model = sl.load_model(args.model)
    totals = {"alone": 0, "loop": 0, "shared": 0}
    print(f"{args.model}, seeds {args.seeds}, {args.window}-step windows: prefix tokens of stage 2 per task (training + valid)")
    print(f"{'task':<28} {'train':>6} {'alone':>9} {'loop':>9} {'shared':>9} {'shared/alone':>13}")
    for name in sorted(available_tasks(args.data)):
        train, valid = train_valid_examples(model, load_task(name, data_dir=args.data))
        n = [len(e.tokens) - 1 for e in train]
        va = sum(len(e.tokens) - 1 for e in valid[: cfg.max_valid])
        plans = [schedule(len(train), cfg.steps, cfg.batch_size, s) for s in seeds]
        alone = sum(sum(n[i] for i in {i for b in plan for i in b}) + va for plan in plans)
        loop = shared = 0
        for first in range(0, cfg.steps, args.window):
            drawn = [{i for b in plan[first : first + args.window] for i in b} for plan in plans]
            loop += sum(sum(n[i] for i in d) for d in drawn)
            shared += sum(n[i] for i in set().union(*drawn))
        loop, shared = loop + len(seeds) * va, shared + va
        for k, v in (("alone", alone), ("loop", loop), ("shared", shared)):
            totals[k] += v
        print(f"{name:<28} {len(train):>6} {alone:>9} {loop:>9} {shared:>9} {shared / alone:>13.2f}")
    print(
        f"{'all 45 tasks':<28} {'':>6} {totals['alone']:>9} {totals['loop']:>9} {totals['shared']:>9} "
        f"{totals['shared'] / totals['alone']:>13.2f}"
    )


if __name__ == "__main__":
    main()
