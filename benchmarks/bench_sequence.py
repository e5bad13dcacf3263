"""The answer-sequence objective's cost: training steps and validation passes, engine against engine.

One process, one model, one task (sequence targets). Each round times, in rotating order:
(a) a SITE training step (one prompt, the paper's batch size: ``SequenceCache.loss`` and its
backward to theta) on the packed engine (``LastToken.span_logits``, the default where the model
allows) and on the hooked model, and a first-token step on the packed engine for scale, each the
median of ``--steps`` steps over the first training prompts; (b) one validation pass over every
valid prompt, no gradient, cached prefixes with prompts of one prefix length as one batch on each
engine and one prompt per forward (hooked), and the whole-prompt ``sequence_loss`` (LoRA, I2CL)
in right-padded chunks and one prompt per forward. One untimed warm-up call each; a random gate.
Medians over the rounds and the ratios are printed and written as JSON; the losses of engines
and of batchings are checked equal.

    .venv/bin/python benchmarks/bench_sequence.py --model gemma-3-270m --data data/fv \\
        --task adjective_v_verb_3 --out benchmarks/results/sequence_steps.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import site_lens as sl
from site_lens.engine.backend import backend_for
from site_lens.engine.prompt_cache import PromptCache
from site_lens.gate import injection_hooks
from site_lens.stages.objectives import SequenceCache, objective_examples, sequence_loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default="data/fv", help="FV task folders (default: data/fv, from site-lens data fv)")
    ap.add_argument("--task", default="antonym")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="training steps timed per round and engine")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = sl.load_model(args.model)
    task = sl.load_task(args.task, args.data)
    valid = objective_examples(model, task, "valid", "sequence")[:100]
    train = objective_examples(model, task, "train", "sequence")[: args.steps]
    first = objective_examples(model, task, "train", "first_token")[: args.steps]
    c = model.cfg
    g = torch.Generator().manual_seed(0)
    t = 0.1 * torch.randn(c.n_layers, c.n_heads, c.d_head, generator=g)
    theta = torch.randn(c.n_layers, c.n_heads, generator=g).requires_grad_(True)
    alpha = torch.sigmoid(theta.detach())
    prefill = lambda last: injection_hooks(model, t, alpha, last)
    for p in model.parameters():
        p.requires_grad_(False)
    packed, hooked = backend_for(model, "packed"), backend_for(model, "hooked")
    t0 = time.perf_counter()
    caches = {
        "cached_batched_packed": SequenceCache(model, valid, backend=packed),
        "cached_batched_hooked": SequenceCache(model, valid, backend=hooked),
        "cached_one_by_one_hooked": SequenceCache(model, valid, batch_size=1, backend=hooked),
    }
    build_s = time.perf_counter() - t0
    steppers = {
        "step_sequence_packed": SequenceCache(model, train, backend=packed),
        "step_sequence_hooked": SequenceCache(model, train, backend=hooked),
        "step_first_token_packed": PromptCache(model, first, backend=packed),
    }

    def steps(cache):  # the median of batch-1 training steps, forward and backward to theta
        took, losses = [], []
        for i in range(len(cache)):
            t0 = time.perf_counter()
            loss = cache.loss([i], torch.sigmoid(theta), t)
            loss.backward()
            took.append(time.perf_counter() - t0)
            losses.append(loss.item())
        theta.grad = None
        return statistics.median(took), sum(losses) / len(losses)

    runs = {k: (lambda cache=cache: cache.loss(range(len(valid)), alpha, t)) for k, cache in caches.items()}
    runs["whole_batched"] = lambda: sequence_loss(model, valid, prefill)
    runs["whole_one_by_one"] = lambda: sequence_loss(model, valid, prefill, batch_size=1)
    losses, times = {}, {k: [] for k in [*steppers, *runs]}
    for name, cache in steppers.items():  # warm-up
        losses[name] = steps(cache)[1]
    with torch.no_grad():
        for name, run in runs.items():
            losses[name] = float(run())
    names = list(times)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if name in steppers:
                times[name].append(steps(steppers[name])[0])
            else:
                with torch.no_grad():
                    t0 = time.perf_counter()
                    runs[name]()
                    times[name].append(time.perf_counter() - t0)
            print(f"round {r} {name}: {times[name][-1]:.4f} s", flush=True)
    for a, b in [
        ("step_sequence_packed", "step_sequence_hooked"),
        ("cached_batched_packed", "cached_batched_hooked"),
        ("cached_batched_hooked", "cached_one_by_one_hooked"),
        ("whole_batched", "whole_one_by_one"),
        ("cached_batched_hooked", "whole_batched"),
    ]:
        assert abs(losses[a] - losses[b]) < 1e-4 * max(1.0, abs(losses[b])), (a, b, losses[a], losses[b])
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {
        "model": args.model,
        "task": args.task,
        "n_valid": len(valid),
        "n_steps": len(train),
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "cache_build_s_valid": build_s,
        "loss": losses,
        "seconds": times,
        "median_s": med,
        "speedup": {
            "step_packed_vs_hooked": med["step_sequence_hooked"] / med["step_sequence_packed"],
            "step_cost_sequence_packed_over_first_token": med["step_sequence_packed"] / med["step_first_token_packed"],
            "valid_packed_vs_hooked": med["cached_batched_hooked"] / med["cached_batched_packed"],
            "cached": med["cached_one_by_one_hooked"] / med["cached_batched_hooked"],
            "whole": med["whole_one_by_one"] / med["whole_batched"],
        },
    }
    print(json.dumps({"median_s": med, "speedup": res["speedup"]}, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
