"""How fast stage 2's prompt prefixes are built, against this machine's arithmetic: are they bound by it?

For the first ``--tasks`` FV tasks, the prefixes a one-task fit builds (the prompts its ``--steps``-step
schedule draws and up to 100 valid prompts, ``PromptCache``) are timed, with their token count. Their rate is
given as tokens/s and as GFLOP/s counting 2 x the blocks' parameters per token (the embedding is a lookup and a
prefix computes no logits; attention scores, small at these lengths, are not counted). Beside it, on the same
thread: one plain forward of 32 rows x 17 tokens (stage 2's average prefix length) and one float32 product of
that many rows by an MLP matrix, the ceilings a prefix forward could approach.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prefix_rate.py --data data/fv --tasks 8
"""

from __future__ import annotations

import argparse
import time

import torch

import site_lens as sl
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
    model = sl.load_model(args.model)
    blocks = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks."))
    print(f"{args.model}: {blocks / 1e6:.1f} M block parameters, {torch.get_num_threads()} thread(s)")
    seconds = tokens = 0
    for name in available_tasks(args.data)[: args.tasks]:
        train, valid = train_valid_examples(model, load_task(name, data_dir=args.data))
        used = sorted({i for batch in schedule(len(train), args.steps, 1, 0) for i in batch})
        examples = [train[i] for i in used] + list(valid[:100])
        n = sum(len(e.tokens) - 1 for e in examples)
        t0 = time.perf_counter()
        PromptCache(model, examples)
        dt = time.perf_counter() - t0
        seconds, tokens = seconds + dt, tokens + n
        print(f"{name:26s} {len(examples):4d} prompts, {n:6d} prefix tokens, {len({len(e.tokens) for e in examples}):3d} "
              f"lengths: {dt:6.1f} s, {n / dt:5.0f} tokens/s, {2 * blocks * n / dt / 1e9:5.1f} GFLOP/s", flush=True)  # fmt: skip
    print(f"all: {seconds:.1f} s, {tokens / seconds:.0f} tokens/s, {2 * blocks * tokens / seconds / 1e9:.1f} GFLOP/s")
    x = torch.randint(100, 1000, (32, 17))
    with torch.no_grad():
        model(x, return_type=None)
        dt = best_of(3, lambda: model(x, return_type=None))
    print(f"plain forward, 32 x 17 tokens, no logits: {x.numel() / dt:.0f} tokens/s, {2 * blocks * x.numel() / dt / 1e9:.1f} GFLOP/s")  # fmt: skip
    a, b = torch.randn(x.numel(), model.cfg.d_model), torch.randn(model.cfg.d_model, model.cfg.d_mlp)
    dt = best_of(5, lambda: a @ b)
    print(f"float32 product ({x.numel()} x {model.cfg.d_model}) @ ({model.cfg.d_model} x {model.cfg.d_mlp}): "
          f"{2 * a.shape[0] * a.shape[1] * b.shape[1] / dt / 1e9:.1f} GFLOP/s")  # fmt: skip


if __name__ == "__main__":
    main()
