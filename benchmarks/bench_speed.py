"""Speed and memory benchmark for smollm2-135m on this machine.

Measures side by side, in one run:
  1. alpha-training step, batch 1, interleaved: naive (whole prompt, hooked), fast through the
     hooked backend (frozen TransformerLens KV cache), fast from packed weights with and
     without the C++ kernels (the packed backend, the default); the hooked step under
     torch.compile is benchmarks/bench_compile.py
  2. Stage 1 for M = 50, N = 10
  3. per-query latency (batch 1; up to 20 new tokens stopping at the newline, and exactly 20): zero-shot, SITE, ICL
  4. model load (cold: fresh cache dir; cached), adapter size; peak RSS of a full `site-lens run`
  5. achieved FLOP/s and bytes/s of the fast step against this machine's measured
     matmul throughput and gemv (memory) bandwidth
  6. FV's causal indirect effect (all 270 heads, 5 shuffled prompts): hooked vs packed

Usage: .venv/bin/python benchmarks/bench_speed.py [--data data/fv] [--task antonym]
           [--reps 30] [--full-run] [--out benchmarks/results/speed.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import site_lens as sl
from site_lens.analysis.cie import causal_indirect_effect
from site_lens.engine import kernels
from site_lens.engine.backend import HookedBackend, PackedBackend, use_backend
from site_lens.engine.prompt_cache import PromptCache
from site_lens.gate import injection_hooks
from site_lens.stages.embeddings import embedding_prompts
from site_lens.stages.generation import generate_greedy
from site_lens.stages.selection import AlphaTrainer
from site_lens.tasks import sample_icl_prompts, zero_shot_prompts
from site_lens.tokens import encode, make_examples


def med(xs):
    return statistics.median(xs)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def machine_limits(reps: int = 10) -> dict:
    """Large sgemm FLOP/s and single-row gemv bandwidth (the memory-bound limit of a 1-token step)."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for _ in range(3):
        a @ b
    ts = [timed(lambda: a @ b)[0] for _ in range(reps)]
    gemm = 2 * 1024**3 / med(ts)
    W = torch.randn(16384, 4096)  # 256 MB: far beyond cache
    x = torch.randn(1, 4096)
    torch.nn.functional.linear(x, W)
    ts = [timed(lambda: torch.nn.functional.linear(x, W))[0] for _ in range(reps)]
    gemv_bw = W.numel() * 4 / med(ts)
    Wt, xt = W.view(4096, 16384), torch.randn(1, 4096)  # input-major (d_in, d_out), as lasttoken packs
    ts = [timed(lambda: xt @ Wt)[0] for _ in range(reps)]
    kernel = {}
    if kernels.available():
        kernels.row_matmul(xt, Wt)
        ts_k = [timed(lambda: kernels.row_matmul(xt, Wt))[0] for _ in range(reps)]
        g = torch.randn(1, 16384)
        ts_kt = [timed(lambda: kernels.load().row_times_t(g, Wt, torch.get_num_threads()))[0] for _ in range(reps)]
        kernel = {"row_kernel_bytes_per_s": Wt.numel() * 4 / med(ts_k), "row_kernel_t_bytes_per_s": Wt.numel() * 4 / med(ts_kt)}
    big = torch.randn(64_000_000)
    ts_sum = [timed(lambda: big.sum())[0] for _ in range(reps)]
    return {
        "sgemm_flops": gemm,
        "gemv_bytes_per_s": gemv_bw,
        "gemv_input_major_bytes_per_s": W.numel() * 4 / med(ts),
        "stream_sum_bytes_per_s": big.numel() * 4 / med(ts_sum),
        "threads": torch.get_num_threads(),
        **kernel,
    }


def step_flops_bytes(model) -> tuple[float, float]:
    """FLOPs and weight bytes of one 1-token forward+backward (input grads only)."""
    c = model.cfg
    kv = c.n_key_value_heads or c.n_heads
    per_layer = c.d_model * c.d_head * (c.n_heads + 2 * kv) + c.n_heads * c.d_head * c.d_model + 3 * c.d_model * c.d_mlp
    params = c.n_layers * per_layer + c.d_model * c.d_vocab  # matmul weights touched (incl. unembedding)
    # forward 2 FLOPs per weight; backward to the inputs only (no weight grads) another 2
    return 4.0 * params, 2.0 * 4 * params


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/fv", help="FV task folders (default: data/fv, from site-lens data fv)")
    ap.add_argument("--task", default="antonym")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--full-run", action="store_true", help="also time a full `site-lens run` (subprocess, peak RSS)")
    ap.add_argument("--step-only", action="store_true", help="stop after the SmolLM2 training-step comparison (1.)")
    ap.add_argument("--out", default="benchmarks/results/speed.json")
    args = ap.parse_args()
    res: dict = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__},
        "command": " ".join([Path(sys.executable).name] + sys.argv),
    }
    res["machine"].update(machine_limits())

    # 4a. model load: cold (fresh cache) vs cached
    with tempfile.TemporaryDirectory() as tmp:
        cold, _ = timed(lambda: sl.load_model("smollm2-135m", cache_dir=tmp))
        warm = [timed(lambda: sl.load_model("smollm2-135m", cache_dir=tmp))[0] for _ in range(3)]
    res["load_s"] = {"cold": cold, "cached_median": med(warm)}
    model = sl.load_model("smollm2-135m")
    task = sl.load_task(args.task, data_dir=args.data)

    # 2. Stage 1, M = 50, N = 10
    cfg = sl.SiteConfig()
    prompts = [p for p, _ in embedding_prompts(task, cfg.embedding, 0)]
    n_tok = sum(len(t) for t in encode(model, prompts))
    s1 = [timed(lambda: sl.build_task_embedding(model, prompts))[0] for _ in range(2)]
    t = sl.build_task_embedding(model, prompts)
    res["stage1"] = {"M": 50, "N": 10, "tokens": n_tok, "seconds_median": med(s1), "tokens_per_s": n_tok / med(s1)}

    # 1. training step, batch 1, interleaved: naive, fast (hooked), fast (packed)
    ex = make_examples(model, zero_shot_prompts(task.train[: args.reps + 5]))
    tr = AlphaTrainer(model, t)
    caches = {"hooked": PromptCache(model, ex, backend=HookedBackend(model)), "packed": PromptCache(model, ex, backend=PackedBackend(model))}
    with kernels.disabled():  # the packed path with MKL's products instead of the row kernel
        caches["packed_mkl"] = PromptCache(model, ex, backend=PackedBackend(model))
    opt = torch.optim.Adam(tr.gate.parameters(), lr=0.2)

    def step(i, how):
        opt.zero_grad(set_to_none=True)
        with kernels.disabled() if how == "packed_mkl" else contextlib.nullcontext():
            loss = tr.loss_naive([ex[i]]) if how == "naive" else tr.loss_fast(caches[how], [i])
            loss.backward()
        opt.step()

    hows = ("naive", "hooked", "packed_mkl", "packed")
    for i in range(3):
        for how in hows:
            step(i, how)
    times: dict[str, list[float]] = {h: [] for h in hows}
    for i in range(args.reps):
        for how in hows:
            times[how].append(timed(lambda: step(i, how))[0])
    flops, nbytes = step_flops_bytes(model)
    fm = med(times["packed"])
    res["train_step_ms"] = {
        "naive_median": 1e3 * med(times["naive"]),
        "fast_hooked_median": 1e3 * med(times["hooked"]),
        "fast_median": 1e3 * fm,
        "naive_over_fast": med(times["naive"]) / fm,
        "hooked_over_packed": med(times["hooked"]) / fm,
        "packed_mkl_median": 1e3 * med(times["packed_mkl"]),
        "packed_mkl_over_packed": med(times["packed_mkl"]) / fm,
        "row_kernel": kernels.available(),
        "prompt_tokens_median": med([len(e.tokens) for e in ex]),
        "fast_gflops": flops / fm / 1e9,
        "fast_weight_gb_per_s": nbytes / fm / 1e9,
        "share_of_sgemm_flops": flops / fm / res["machine"]["sgemm_flops"],
        "share_of_gemv_bandwidth": nbytes / fm / res["machine"]["gemv_input_major_bytes_per_s"],
    }
    with torch.profiler.profile() as prof:
        for i in range(5):
            step(i, "packed")
    ev = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ev)
    top = sorted(ev, key=lambda e: -e.self_cpu_time_total)[:6]
    res["train_step_profile"] = {e.key: round(e.self_cpu_time_total / total, 3) for e in top}
    if args.step_only:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
        print(json.dumps(res["train_step_ms"], indent=1))
        return

    # 1b. the same three steps on the second embedded family, gemma-3-270m (fewer reps)
    gemma = sl.load_model("gemma-3-270m")
    g_t = sl.build_task_embedding(gemma, prompts[:5])
    g_ex = make_examples(gemma, zero_shot_prompts(task.train[:12]))
    g_tr = AlphaTrainer(gemma, g_t)
    g_caches = {"hooked": PromptCache(gemma, g_ex, backend=HookedBackend(gemma)), "packed": PromptCache(gemma, g_ex, backend=PackedBackend(gemma))}
    with kernels.disabled():
        g_caches["packed_mkl"] = PromptCache(gemma, g_ex, backend=PackedBackend(gemma))

    def g_step(i, how):
        g_tr.gate.theta.grad = None
        with kernels.disabled() if how == "packed_mkl" else contextlib.nullcontext():
            loss = g_tr.loss_naive([g_ex[i]]) if how == "naive" else g_tr.loss_fast(g_caches[how], [i])
            loss.backward()

    hows = ("naive", "hooked", "packed_mkl", "packed")
    g_times: dict[str, list[float]] = {h: [] for h in hows}
    for i in range(12):
        for how in hows:
            g_times[how].append(timed(lambda: g_step(i, how))[0])
    res["gemma_train_step_ms"] = {f"{h}_median": 1e3 * med(v[2:]) for h, v in g_times.items()}
    gemma = g_caches = g_tr = None  # free the second model before the full run

    # 6. FV's CIE over all heads, 5 shuffled-label prompts: hooked vs packed
    def cie(kind):
        use_backend(model, kind)
        try:
            return causal_indirect_effect(model, task, t, n_prompts=5, n_shots=10, seed=0)
        finally:
            use_backend(model, "auto")

    hooked_s, c_h = timed(lambda: cie("hooked"))
    packed_s, c_p = timed(lambda: cie("packed"))
    res["cie_5_prompts_s"] = {
        "hooked": hooked_s,
        "packed": packed_s,
        "hooked_over_packed": hooked_s / packed_s,
        "max_abs_diff": float((c_h - c_p).abs().max()),
    }

    # 3. per-query latency, batch 1, interleaved: up to 20 new tokens stopping at the end of the
    #    line (as scored), and exactly 20 new tokens (the paper code's generation)
    alpha = torch.sigmoid(torch.zeros(model.cfg.n_layers, model.cfg.n_heads))
    queries = task.test[: args.queries]
    icl = sample_icl_prompts(task.train, 0, 10, random.Random(1), queries=queries)
    zs = zero_shot_prompts(queries)

    def site_hooks(last):
        return injection_hooks(model, t, alpha, last)

    for label, stop in (("stop_at_newline", None), ("fixed_20", set())):

        def gen(prompt, hooks=None):
            return generate_greedy(model, encode(model, [prompt]), max_new_tokens=20, prefill_hooks=hooks, stop_ids=stop)

        lat = {"zero_shot": [], "site": [], "icl": []}
        gen(zs[0][0]), gen(zs[0][0], site_hooks), gen(icl[0][0])
        for (zp, _), (ip, _) in zip(zs, icl):
            lat["zero_shot"].append(timed(lambda: gen(zp))[0])
            lat["site"].append(timed(lambda: gen(zp, site_hooks))[0])
            lat["icl"].append(timed(lambda: gen(ip))[0])
        m = {k: 1e3 * med(v) for k, v in lat.items()}
        res[f"latency_ms_per_query_{label}"] = {
            **m, "site_over_zero_shot": m["site"] / m["zero_shot"], "icl_over_site": m["icl"] / m["site"]
        }

    # 4b. adapter size
    with tempfile.TemporaryDirectory() as tmp:
        ad = sl.Adapter(t=t, theta=torch.zeros(model.cfg.n_layers, model.cfg.n_heads), model=sl.model_identity(model))
        sl.save_adapter(ad, Path(tmp) / "a")
        res["adapter_bytes"] = sum(p.stat().st_size for p in (Path(tmp) / "a").iterdir())

    # 4c. a full run (subprocess): wall time after load and peak RSS
    if args.full_run:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "site_lens", "run", "--model", "smollm2-135m", "--task", args.task, "--max-test", "100", "--out", tmp]
            if args.data:
                cmd += ["--data", args.data]
            # peak RSS via /usr/bin/time's own (small) fork: a child forked straight from this large
            # process would report this process's pages as its own peak (ru_maxrss survives exec)
            timer = ["/usr/bin/time", "-f", "PEAK_RSS_KB %M"] if Path("/usr/bin/time").exists() else []
            t0 = time.perf_counter()
            done = subprocess.run(timer + cmd, check=True, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            kb = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("PEAK_RSS_KB")]
            peak = kb[-1] * 1024 if kb else None
            r = json.loads((Path(tmp) / "results.json").read_text())
            secs = r["seconds"]
            res["full_run"] = {
                "command": " ".join(cmd[1:]).replace(tmp, "OUT"),
                "wall_s": wall,
                "seconds": secs,
                "after_load_s": sum(v for k, v in secs.items() if k != "model_load"),
                "peak_rss_mb": peak / 1e6 if peak else None,
                "exact_match": {k: r[k]["exact_match"] for k in ("zero_shot", "icl", "site")},
                "ms_per_query_batched": {k: r[k]["ms_per_query"] for k in ("zero_shot", "icl", "site")},
            }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
