"""Batch-1 alpha-training step per engine and backend, side by side in one run: HookedTransformer and
TransformerBridge, each with its reference (every hook fires) and its packed backend, on an embedded model.

One step is the first-token loss of one zero-shot prompt with SITE's gate at its last token, and its
backward pass into theta (``AlphaTrainer.loss_fast``). Rounds alternate the engines; medians are printed.

    .venv/bin/python benchmarks/bench_engines.py --model smollm2-135m --rounds 5 --steps 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from site_lens.config import EngineConfig, SelectionConfig
from site_lens.engine.backend import backend_for
from site_lens.engine.prompt_cache import PromptCache
from site_lens.models import load_model
from site_lens.stages.selection import AlphaTrainer
from site_lens.tokens import make_examples

WORDS = ["hot", "big", "up", "yes", "fast", "old", "dark", "soft", "loud", "early", "happy", "strong"]


def step_times(model, backend: str, steps: int) -> list[float]:
    c = model.cfg
    ex = make_examples(model, [(f"Q: {w}\nA:", " x") for w in WORDS])
    t = torch.randn(c.n_layers, c.n_heads, c.d_head) * 0.1
    tr = AlphaTrainer(model, t, SelectionConfig(), engine=EngineConfig(backend=backend))
    cache = PromptCache(model, ex, backend=backend_for(model, backend))
    out = []
    for i in range(steps):
        start = time.perf_counter()
        loss = tr.loss_fast(cache, [i % len(ex)], train=True)
        loss.backward()
        out.append(time.perf_counter() - start)
        tr.gate.theta.grad = None
    return out[2:]  # the first steps warm caches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    hooked = load_model(args.model)
    bridge = load_model(args.model, engine="bridge")
    runs = {
        "HookedTransformer, hooked backend": (hooked, "hooked"),
        "HookedTransformer, packed backend": (hooked, "packed"),
        "TransformerBridge, bridge backend (KV cache)": (bridge, "hooked"),
        "TransformerBridge, packed backend": (bridge, "packed"),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for name, (model, backend) in runs.items():
            times[name] += step_times(model, backend, args.steps)
    base = statistics.median(times["HookedTransformer, hooked backend"])
    print(f"{args.model}, batch-1 alpha step (forward + backward), torch threads {torch.get_num_threads()}")
    print("| engine, backend | median ms | vs HookedTransformer, hooked backend |")
    print("|---|---|---|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| {name} | {1000 * m:.1f} | {m / base:.2f}x |")


if __name__ == "__main__":
    main()
