"""Stage 2 of many tasks in one loop against one task at a time: tasks fitted per hour, side by side.

For each batch size B (up to ``--fit-max``), the same B FV tasks are trained two ways with the same settings
(``SelectionConfig`` defaults: batch 1, lr 0.2, validation every ``eval_every`` steps, but
``--steps`` steps): each task alone (``AlphaTrainer``, what ``fit_site`` runs) and all B
together (``BatchedAlphaTrainer``, what ``fit_site_many`` runs). The rounds alternate which
goes first; medians over rounds. One-at-a-time fits every task of the batch (``--single k``
times only the first k and scales to B: cheaper, but biased where prompt lengths differ, as
ag_news's 58-token prefixes against the 10-14 of the tasks sorted before it). For every B, one training
step of the B tasks together and of one task alone are timed apart (``--reps`` steps each).

Stage 2's cost does not depend on t's values, so t is stage 1 with few prompts
(``--prompts``, timed apart and reported, not counted). Each fit's time includes building its
prompt cache (the prefixes of every scheduled prompt), as a real fit's does.

Beside the times: the step's bytes read (every weight matrix but the embedding table, once in
the forward and once in the backward) and FLOPs (4 x those weights x rows: a forward and a
backward to the activations, no weight gradients), this machine's measured memory bandwidth (a
large tensor summed) and arithmetic rate (a float32 matrix product of the step's shape), and how
close one batched step comes to the larger of bytes / bandwidth and FLOPs / rate.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_multitask.py --model smollm2-135m \\
        --data data/fv --batch-sizes 8,45 --out benchmarks/results/multitask_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

import site_lens as sl
from site_lens.config import EmbeddingConfig, SelectionConfig
from site_lens.stages.embeddings import task_embedding
from site_lens.stages.objectives import train_valid_examples
from site_lens.stages.selection import AlphaTrainer
from site_lens.stages.selection_batched import BatchedAlphaTrainer
from site_lens.tasks import available_tasks, load_task


def machine_rates(rows: int, d_model: int, d_mlp: int) -> dict[str, float]:
    """Measured memory bandwidth (GB/s, summing a 512 MB tensor) and float32 matmul rate (GFLOP/s) of a
    (rows, d_model) @ (d_model, d_mlp) product, the step's own shape (best of five)."""
    x = torch.ones(128 * 1024 * 1024)  # 512 MB
    bw = []
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        bw.append(x.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    a, b = torch.randn(rows, d_model), torch.randn(d_model, d_mlp)
    fl = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20):
            a @ b
        fl.append(20 * 2 * rows * d_model * d_mlp / (time.perf_counter() - t0) / 1e9)
    return {"bandwidth_gb_s": max(bw), "matmul_gflop_s": max(fl)}


def step_ms(model, ts, trains, reps: int) -> float:
    """Median ms of one training step of ``len(ts)`` tasks together (one prompt each: forward, backward, Adam),
    on a cache of each task's first ``reps`` + 2 prompts; one task is the single-task step."""
    from site_lens.engine.backend import backend_for
    from site_lens.engine.prompt_cache import PromptCache

    n = len(ts)
    trainer = BatchedAlphaTrainer(model, ts, SelectionConfig())
    per = reps + 2
    cache = PromptCache(model, [tr[i] for tr in trains for i in range(per)], backend=backend_for(model),
                        owners=[k for k in range(n) for _ in range(per)], ragged=True)  # fmt: skip
    opt = torch.optim.Adam([trainer.theta], lr=0.2)
    times = []
    for r in range(per):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        trainer.task_losses(cache, [[k * per + r] for k in range(n)]).sum().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[2:])  # two warm-up steps


def fit_seconds(model, ts, trains, valids, cfg, seed, batched: bool) -> float:
    t0 = time.perf_counter()
    if batched:
        BatchedAlphaTrainer(model, ts, cfg, seed=seed).fit(trains, valids)
    else:
        for t, tr, va in zip(ts, trains, valids):
            AlphaTrainer(model, t, cfg, seed=seed).fit(tr, va)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", required=True, help="the FV task folder")
    ap.add_argument("--batch-sizes", default="8,45")
    ap.add_argument("--steps", type=int, default=40, help="training steps per fit (the default fit has 400)")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--single", type=int, default=0, help="tasks timed one at a time per round, scaled to B (0: all B)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fit-max", type=int, default=8, help="whole fits timed up to this B (steps alone above it)")
    ap.add_argument("--reps", type=int, default=10, help="steps timed alone (after two warm-up steps)")
    ap.add_argument("--prompts", type=int, default=2, help="stage 1 prompts per task (t's values do not change the cost)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    threads = torch.get_num_threads()
    model = sl.load_model(args.model)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    names = sorted(available_tasks(args.data))[: max(sizes)]
    cfg = SelectionConfig(steps=args.steps, eval_every=args.eval_every)
    t0 = time.perf_counter()
    tasks = [load_task(n, data_dir=args.data) for n in names]
    ts = [task_embedding(model, task, EmbeddingConfig(n_prompts=args.prompts), 0) for task in tasks]
    stage1 = time.perf_counter() - t0
    data = [train_valid_examples(model, task) for task in tasks]
    trains, valids = [d[0] for d in data], [d[1][: cfg.max_valid] for d in data]
    # the matrices a step multiplies by: every weight but the embedding table (a lookup)
    weights = [p for n, p in model.named_parameters() if not n.endswith(("embed.W_E", "embed_tokens.weight"))]
    params = sum(p.numel() for p in weights)
    weight_bytes = sum(p.numel() * p.element_size() for p in weights)
    print(f"{args.model}: {params / 1e6:.1f} M parameters multiplied per token, {threads} thread(s); "
          f"stage 1 for the t's {stage1:.0f} s", flush=True)  # fmt: skip
    # what every fit pays whatever B is: the prefixes of its scheduled training prompts and of its valid prompts
    from site_lens.engine.prompt_cache import PromptCache
    from site_lens.stages.training import schedule

    prefill = []
    fitted = [b for b in sizes if b <= args.fit_max]
    for tr, va in list(zip(trains, valids))[: args.single or max(fitted, default=min(sizes))]:
        used = sorted({i for b in schedule(len(tr), args.steps, 1, 0) for i in b})
        t0 = time.perf_counter()
        PromptCache(model, [tr[i] for i in used] + list(va))
        prefill.append(time.perf_counter() - t0)
    prefill_s = statistics.mean(prefill)
    print(f"prefixes of one task's {args.steps} steps' prompts and valid prompts: {prefill_s:.1f} s "
          f"(mean of the first {len(prefill)} tasks)", flush=True)  # fmt: skip

    results = []
    for b in sizes:
        if b > len(tasks):
            print(f"B = {b}: only {len(tasks)} tasks", flush=True)
            continue
        k = min(args.single, b) or b
        one, many = [], []
        for r in range(args.rounds if b <= args.fit_max else 0):
            order = [False, True] if r % 2 == 0 else [True, False]
            for batched in order:
                if batched:
                    many.append(fit_seconds(model, ts[:b], trains[:b], valids[:b], cfg, 0, True))
                else:
                    one.append(fit_seconds(model, ts[:k], trains[:k], valids[:k], cfg, 0, False) * b / k)
            scaled = f" (scaled from {k} tasks)" if k < b else ""
            print(f"B = {b}, round {r + 1}: one at a time {one[-1]:.1f} s{scaled}, batched {many[-1]:.1f} s",
                  flush=True)  # fmt: skip
        one_s, many_s = (statistics.median(one), statistics.median(many)) if one else (math.nan, math.nan)
        one_ms, many_ms = step_ms(model, ts[:1], trains[:1], args.reps), step_ms(model, ts[:b], trains[:b], args.reps)
        step_s = many_ms / 1e3
        rates = machine_rates(b, model.cfg.d_model, model.cfg.d_mlp)
        flops = 4 * params * b
        bound = max(2 * weight_bytes / (rates["bandwidth_gb_s"] * 1e9), flops / (rates["matmul_gflop_s"] * 1e9))
        row = {
            "batch": b,
            "steps": args.steps,
            "one_at_a_time_s": one_s,
            "batched_s": many_s,
            "speedup": one_s / many_s,
            "stage2_fits_per_hour_one": 3600 * b / one_s,  # fits of --steps steps, t given
            "stage2_fits_per_hour_batched": 3600 * b / many_s,
            "prefill_s_per_task": prefill_s,
            "single_step_ms": one_ms,
            "batched_step_ms": many_ms,
            "step_speedup": b * one_ms / many_ms,
            **rates,
            "step_bytes": 2 * weight_bytes,
            "step_gflop": flops / 1e9,
            "bound_ms": 1e3 * bound,
            "step_over_bound": step_s / bound,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        }
        results.append(row)
        print(json.dumps(row), flush=True)
    out = {"model": args.model, "threads": threads, "command": " ".join(sys.argv), "stage1_s": stage1,
           "params": params, "results": results}  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
