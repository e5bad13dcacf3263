"""site_lens.models.hf against the TransformerLens path: how many of 50 greedy generations agree, batched and one by one.

    .venv/bin/python benchmarks/hf_agreement.py smollm2-135m   # or gemma-3-270m

The adapter is the task embedding of uppercase (10 five-shot prompts) with a seeded random gate, as in
tests/test_hf.py; the 50 prompts are test queries of four built-in tasks. Prints agreement and seconds.
"""

import random
import sys
import time

import torch

from site_lens.adapter import Adapter
from site_lens.gate import injection_hooks
from site_lens.models import hf, load_model, model_identity
from site_lens.stages.embeddings import build_task_embedding
from site_lens.stages.generation import generate_greedy
from site_lens.tasks import format_query, load_task
from site_lens.tokens import encode


def main(name: str, n: int = 50, new: int = 8) -> None:
    tl = load_model(name)
    model, tok = hf.load_hf_model(name)
    task = load_task("uppercase")
    shots = "".join(f"{format_query(x)} {y}\n\n" for x, y in task.train[:5])
    t = build_task_embedding(tl, encode(tl, [shots + format_query(x) for x, _ in task.train[5:15]]))
    theta = torch.randn(tl.cfg.n_layers, tl.cfg.n_heads, generator=torch.Generator().manual_seed(0))
    adapter = Adapter(t=t, theta=theta, model=model_identity(tl))
    items = [x for k in ("uppercase", "first-letter", "opposites", "next-number") for x, _ in load_task(k).test]
    prompts = [format_query(x) for x in random.Random(0).sample(items, n)]
    t0 = time.perf_counter()
    want, _ = generate_greedy(
        tl,
        encode(tl, prompts),
        max_new_tokens=new,
        prefill_hooks=lambda last: injection_hooks(tl, t, adapter.alpha, last),
    )
    print(f"{name}: TransformerLens {time.perf_counter() - t0:.1f} s")
    for bs in (16, 1):
        t0 = time.perf_counter()
        got = hf.generate(model, tok, prompts, adapter, max_new_tokens=new, batch_size=bs, return_tokens=True)
        same = sum(a == b for a, b in zip(got, want))
        print(f"{name}: hf batch {bs}: {same} of {n} identical, {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m")
