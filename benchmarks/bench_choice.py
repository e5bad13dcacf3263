"""Option scoring: the cached path (``choice.option_logprobs``) against one full forward per option.

    .venv/bin/python benchmarks/bench_choice.py --data data/bbh --task date_understanding --n 2

The full-forward reference is written out here: each option appended to the whole prompt, all
options of an item as one right-padded batch, every position unembedded. Both score the first
``--n`` test items of the task under 10-shot ICL prompts (the method whose prompts are longest),
in one process, reference first; prints the seconds of each, their ratio, the largest difference
of a summed log-probability, and both option accuracies.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import site_lens as sl
from site_lens.config import SiteConfig
from site_lens.methods import configured
from site_lens.stages.options import option_accuracy, option_logprobs
from site_lens.tokens import answer_ids, encode, pad_id, pad_right


@torch.inference_mode()
def full_forward(model, prompts, options) -> list[list[float]]:
    out = []
    for prompt, opts in zip(prompts, options):
        p = encode(model, [prompt])[0]
        conts = [answer_ids(model, prompt, o) for o in opts]
        tokens, mask, _ = pad_right([p + c[:-1] for c in conts], pad_id(model), model.cfg.device)
        logp = model(tokens, attention_mask=mask).float().log_softmax(-1)
        out.append([float(sum(logp[j, len(p) - 1 + i, tok] for i, tok in enumerate(c))) for j, c in enumerate(conts)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default="data/bbh")
    ap.add_argument("--task", default="date_understanding")
    ap.add_argument("--n", type=int, default=2)
    args = ap.parse_args()
    model = sl.load_model(args.model)
    task = sl.load_task(args.task, args.data)
    pairs, choices = task.test[: args.n], task.split_choices("test")[: args.n]
    prompts = [p for p, _ in configured("icl", SiteConfig()).prompts(task, pairs, 0)]
    options = [c.options for c in choices]
    gold = [c.options.index(y) for (_, y), c in zip(pairs, choices)]
    t0 = time.perf_counter()
    ref = full_forward(model, prompts, options)
    t1 = time.perf_counter()
    got = option_logprobs(model, prompts, options)
    t2 = time.perf_counter()
    print(
        json.dumps(
            {
                "model": args.model,
                "task": args.task,
                "items": len(pairs),
                "options_per_item": sorted({len(o) for o in options}),
                "prompt_tokens": [len(x) for x in encode(model, prompts)],
                "full_forward_s": t1 - t0,
                "cached_s": t2 - t1,
                "speedup": (t1 - t0) / (t2 - t1),
                "max_abs_diff": max(abs(a - b) for u, v in zip(ref, got) for a, b in zip(u, v)),
                "option_acc": {"full_forward": option_accuracy(ref, gold), "cached": option_accuracy(got, gold)},
                "threads": torch.get_num_threads(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
