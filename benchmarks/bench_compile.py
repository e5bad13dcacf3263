"""The hooked one-token training step under torch.compile, against the eager hooked and packed steps.

Could compiling TransformerLens's own forward replace the packed backend? This times, side
by side and interleaved, the batch-1 SITE step (last prompt token against a cached prefix,
gate on every head, backward to theta) three ways on smollm2-135m:

    hooked      the hooked backend, eager
    compiled    the same with every TransformerBlock's forward under torch.compile(dynamic=True)
    packed_mkl  the packed backend with torch's products (SITE_LENS_KERNELS=0)
    packed      the packed backend with the C++ kernels, the default

Compile time is reported apart (the first steps), and so is the number of graphs dynamo
compiled: prompts of many lengths must share them (``dynamic=True``). The gate is one forward
hook function shared by every layer's ``hook_z`` that reads alpha and t from tensors set on
the hook point, so one compiled block can serve all 30 layers and a new step's alpha does
not invalidate it. It runs on its own copy of the model.

    .venv/bin/python benchmarks/bench_compile.py --data data/fv --out benchmarks/results/compile.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._dynamo
import torch._dynamo.utils

import site_lens as sl
from site_lens.engine import kernels
from site_lens.engine.backend import HookedBackend, PackedBackend
from site_lens.engine.prompt_cache import PromptCache
from site_lens.tasks import sample_icl_prompts, zero_shot_prompts
from site_lens.tokens import make_examples


def shared_gate(module, args, z):
    """One forward hook for every layer's hook_z: mix the last (only) position toward the hook point's t."""
    alpha = module.site_alpha  # (head,) or an empty tensor for prefix passes
    if alpha.numel() == 0:
        return z
    rows = torch.arange(z.shape[0])
    mixed = torch.lerp(z[:, 0], module.site_t, alpha[:, None])
    return z.index_put((rows, torch.zeros_like(rows)), mixed)


def main() -> None:
    import random

    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/fv", help="FV task folders (default: data/fv, from site-lens data fv)")
    ap.add_argument("--task", default="antonym")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/compile.json")
    args = ap.parse_args()
    task = sl.load_task(args.task, data_dir=args.data)
    model = sl.load_model("smollm2-135m")
    c_model = sl.load_model("smollm2-135m")  # the compiled copy
    prompts = sample_icl_prompts(task.train, 5, 10, random.Random(0))
    t = sl.build_task_embedding(model, [p for p, _ in prompts])
    ex = make_examples(model, zero_shot_prompts(task.train[: args.reps + 8]))
    tr = sl.AlphaTrainer(model, t)
    caches = {"hooked": PromptCache(model, ex, backend=HookedBackend(model)), "packed": PromptCache(model, ex, backend=PackedBackend(model))}
    with kernels.disabled():  # packed with MKL's products: down projection kept output-major
        caches["packed_mkl"] = PromptCache(model, ex, backend=PackedBackend(model))
    empty = torch.zeros(0)
    blocks = list(c_model.blocks)
    for layer, block in enumerate(blocks):
        hp = block.attn.hook_z
        hp.site_alpha, hp.site_t = empty, tr.t[layer]
        hp.register_forward_hook(shared_gate)
    c_cache = PromptCache(c_model, ex, backend=HookedBackend(c_model))  # prefixes built eagerly
    torch._dynamo.reset()
    for block in blocks:
        block.forward = torch.compile(block.forward, dynamic=True)
    opt = torch.optim.Adam(tr.gate.parameters(), lr=0.2)

    def step(i: int, how: str) -> None:
        opt.zero_grad(set_to_none=True)
        if how == "compiled":
            alpha = tr.gate.alpha()
            for layer, block in enumerate(blocks):
                block.attn.hook_z.site_alpha = alpha[layer]
            ((idx, logits),) = c_cache.logits([i])
            for block in blocks:
                block.attn.hook_z.site_alpha = empty
            loss = torch.nn.functional.cross_entropy(logits.float(), torch.tensor([ex[idx[0]].target]))
        else:
            with kernels.disabled() if how == "packed_mkl" else contextlib.nullcontext():
                loss = tr.loss_fast(caches[how], [i])
                loss.backward()
            opt.step()
            return
        loss.backward()
        opt.step()

    res: dict = {"command": " ".join([Path(sys.executable).name] + sys.argv), "threads": torch.get_num_threads()}
    t0 = time.perf_counter()
    step(0, "compiled")
    res["compile_first_step_s"] = time.perf_counter() - t0
    firsts = []
    for i in range(1, 8):  # other prompt lengths: recompiles would show here
        t0 = time.perf_counter()
        step(i, "compiled")
        firsts.append(time.perf_counter() - t0)
    res["next_steps_s"] = firsts
    res["graphs_after_warmup"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    res["prompt_lengths"] = sorted({len(e.tokens) for e in ex})
    times: dict[str, list[float]] = {"hooked": [], "compiled": [], "packed_mkl": [], "packed": []}
    for i in range(8, 8 + args.reps):
        for how, spent in times.items():
            t0 = time.perf_counter()
            step(i, how)
            spent.append(time.perf_counter() - t0)
    res["graphs_after_timing"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    res["step_ms_median"] = med
    res["compiled_over_packed"] = med["compiled"] / med["packed"]
    res["hooked_over_compiled"] = med["hooked"] / med["compiled"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
