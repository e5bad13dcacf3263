"""How fast stage 2's prompt prefixes are built, against this machine's arithmetic: are they bound by it?

For the first ``--tasks`` FV tasks, the two prompt caches a one-task fit builds (``PromptCache`` of the
training prompts its schedule draws and of its first ``max_valid`` valid prompts, ``SelectionConfig``'s defaults
but ``--steps``, seed 0) are timed once, with their prefix token count; the backend is chosen (packed, probed)
before the first task, as a fit finds it chosen after stage 1. Right after each task, on the same thread: a plain
forward of 32 rows x 17 tokens (stage 2's average prefix length; no logits: ``return_type=None`` stops after the
final norm), best of 3, and a float32 product of that many rows by an MLP matrix (``bench_multitask.machine_rates``,
the rate the many-task step is held to), the ceilings a prefix forward could approach, timed beside it so the
machine's drift between runs cancels in the ratios. Rates are
tokens/s and GFLOP/s counting 2 x the blocks' parameters per token (the embedding is a lookup, a prefix computes no
logits, and attention scores, small at these lengths, are not counted). A HookedTransformer (TransformerLens 3.x).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prefix_rate.py --data data/fv --tasks 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_multitask import machine_rates

import site_lens as sl
from site_lens.config import SelectionConfig
from site_lens.engine.backend import backend_for
from site_lens.engine.prompt_cache import PromptCache
from site_lens.stages.objectives import train_valid_examples
from site_lens.stages.training import schedule
from site_lens.tasks import available_tasks, load_task


def best_of(n: int, fn) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", required=True, help="the FV task folders")
    ap.add_argument("--tasks", type=int, default=8, help="the first N tasks, sorted by name (default: 8)")
    ap.add_argument("--steps", type=int, default=400, help="the fit's steps (default: 400)")
    args = ap.parse_args()
    model = sl.load_model(args.model, engine="hooked")
    blocks = sum(p.numel() for p in model.blocks.parameters())
    if not blocks:
        raise SystemExit("no block parameters found: a HookedTransformer is needed")
    cfg = SelectionConfig(steps=args.steps)
    backend_for(model)  # packed and probed once, before any timing
    x = torch.randint(100, 1000, (32, 17))
    with torch.no_grad():
        model(x, return_type=None)
    print(f"{args.model}: {blocks / 1e6:.1f} M block parameters, {torch.get_num_threads()} thread(s)")
    print("task: prompts, prefix tokens, seconds, tokens/s, GFLOP/s; beside it: plain forward and product GFLOP/s")
    seconds = tokens = 0
    fwd_rates, mm_rates = [], []
    for name in available_tasks(args.data)[: args.tasks]:
        train, valid = train_valid_examples(model, load_task(name, data_dir=args.data))
        used = sorted({i for batch in schedule(len(train), cfg.steps, cfg.batch_size, 0) for i in batch})
        caches = [[train[i] for i in used], list(valid[: cfg.max_valid])]
        n = sum(len(e.tokens) - 1 for c in caches for e in c)
        t0 = time.perf_counter()
        for examples in caches:
            PromptCache(model, examples)
        dt = time.perf_counter() - t0
        seconds, tokens = seconds + dt, tokens + n
        with torch.no_grad():
            fwd = 2 * blocks * x.numel() / best_of(3, lambda: model(x, return_type=None)) / 1e9
        mm = machine_rates(x.numel(), model.cfg.d_model, model.cfg.d_mlp)["matmul_gflop_s"]
        fwd_rates.append(fwd), mm_rates.append(mm)
        print(f"{name:26s} {sum(map(len, caches)):4d} prompts, {n:6d} tokens: {dt:6.1f} s, {n / dt:4.0f} tokens/s, "
              f"{2 * blocks * n / dt / 1e9:5.1f} GFLOP/s | forward {fwd:5.1f} | product {mm:5.1f}", flush=True)  # fmt: skip
    rate = 2 * blocks * tokens / seconds / 1e9
    fwd, mm = statistics.median(fwd_rates), statistics.median(mm_rates)
    print(f"all prefixes: {tokens} tokens in {seconds:.1f} s, {tokens / seconds:.0f} tokens/s, {rate:.1f} GFLOP/s")
    print(f"plain forward 32 x 17 tokens, no logits (median over tasks of best of 3): {fwd:.1f} GFLOP/s; "
          f"prefixes / forward {rate / fwd:.2f}")  # fmt: skip
    print(f"float32 product ({x.numel()} x {model.cfg.d_model}) @ ({model.cfg.d_model} x {model.cfg.d_mlp}) "
          f"(median over tasks of machine_rates): {mm:.1f} GFLOP/s; prefixes / product {rate / mm:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
