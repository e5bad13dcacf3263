"""The answer-sequence objective's validation pass: rows batched against rows one at a time.

One process, one model, one task's valid split (sequence targets). Each round times, in rotating
order, (a) ``SequenceCache.loss`` over every valid prompt with prompts of one prefix length run as
one batch (the default) and one prompt per forward (``batch_size=1``), and (b) the whole-prompt
``sequence_loss`` in right-padded chunks (the default) and one prompt per forward, under
``no_grad`` with a random gate, after one untimed warm-up call each. Medians over the rounds and
the ratios are printed and written as JSON. The losses of each pair are checked equal.

    .venv/bin/python benchmarks/bench_sequence.py --model gemma-3-270m --data ../shared/datasets/fv \\
        --task adjective_v_verb_3 --out benchmarks/results/sequence.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import site_lens as sl
from site_lens.gate import injection_hooks
from site_lens.sequence import SequenceCache, objective_examples, sequence_loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default=None)
    ap.add_argument("--task", default="antonym")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = sl.load_model(args.model)
    valid = objective_examples(model, sl.load_task(args.task, args.data), "valid", "sequence")[:100]
    c = model.cfg
    g = torch.Generator().manual_seed(0)
    t = 0.1 * torch.randn(c.n_layers, c.n_heads, c.d_head, generator=g)
    alpha = torch.rand(c.n_layers, c.n_heads, generator=g)
    prefill = lambda last: injection_hooks(model, t, alpha, last)
    t0 = time.perf_counter()
    caches = {
        "cached_batched": SequenceCache(model, valid),
        "cached_one_by_one": SequenceCache(model, valid, batch_size=1),
    }
    build_s = time.perf_counter() - t0
    runs = {
        "cached_batched": lambda: caches["cached_batched"].loss(range(len(valid)), alpha, t),
        "cached_one_by_one": lambda: caches["cached_one_by_one"].loss(range(len(valid)), alpha, t),
        "whole_batched": lambda: sequence_loss(model, valid, prefill),
        "whole_one_by_one": lambda: sequence_loss(model, valid, prefill, batch_size=1),
    }
    losses, times = {}, {k: [] for k in runs}
    with torch.no_grad():
        for name, run in runs.items():  # warm-up
            losses[name] = float(run())
        names = list(runs)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                t0 = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - t0)
                print(f"round {r} {name}: {times[name][-1]:.2f} s", flush=True)
    for a, b in [
        ("cached_batched", "cached_one_by_one"),
        ("whole_batched", "whole_one_by_one"),
        ("cached_batched", "whole_batched"),
    ]:
        assert abs(losses[a] - losses[b]) < 1e-4 * max(1.0, abs(losses[b])), (a, b, losses[a], losses[b])
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {
        "model": args.model,
        "task": args.task,
        "n_valid": len(valid),
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "cache_build_s_both": build_s,
        "loss": losses,
        "seconds": times,
        "median_s": med,
        "speedup": {
            "cached": med["cached_one_by_one"] / med["cached_batched"],
            "whole": med["whole_one_by_one"] / med["whole_batched"],
        },
    }
    print(json.dumps({"median_s": med, "speedup": res["speedup"]}, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
