"""One-row products over SmolLM2-135M's matrices: the C++ kernels (site_lens/engine/kernels.py) vs torch (MKL).

A batch-1 SITE step multiplies one row by each of these 121 matrices forward
(x @ W) and backward (g @ W^T). Both only stream the weights, so the figure
that matters is bytes per second. Interleaved, medians of --reps passes:

    .venv/bin/python benchmarks/bench_kernels.py --out benchmarks/results/kernels.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from site_lens.engine import kernels


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default="benchmarks/results/kernels.json")
    args = ap.parse_args()
    ext = kernels.load()
    if ext is None:
        raise SystemExit("the C++ kernels could not be built here (see the log); nothing to compare")
    torch.manual_seed(0)
    # SmolLM2-135M: d_model 576, 9 query + 3 key/value heads of 64, d_mlp 1536, vocab 49152; input-major (K, N)
    layer = [(576, 960), (576, 576), (576, 3072), (1536, 576)]
    mats = [torch.randn(k, n) for _ in range(30) for k, n in layer] + [torch.randn(576, 49152)]
    nbytes = sum(m.numel() * 4 for m in mats)
    xs = {m.shape[0]: torch.randn(1, m.shape[0]) for m in mats}
    gs = {m.shape[1]: torch.randn(1, m.shape[1]) for m in mats}
    res: dict = {"weight_mb": nbytes / 1e6, "matrices": len(mats), "threads": {}}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        fns = {
            "forward_torch": lambda m: xs[m.shape[0]] @ m,
            "forward_kernel": lambda m: ext.row_times(xs[m.shape[0]], m, threads),
            "backward_torch": lambda m: gs[m.shape[1]] @ m.T,
            "backward_kernel": lambda m: ext.row_times_t(gs[m.shape[1]], m, threads),
        }
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.reps):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                for m in mats:
                    fn(m)
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        res["threads"][threads] = {
            **{f"{k}_ms": 1e3 * v for k, v in med.items()},
            **{f"{k}_gb_per_s": nbytes / v / 1e9 for k, v in med.items()},
            "forward_torch_over_kernel": med["forward_torch"] / med["forward_kernel"],
            "backward_torch_over_kernel": med["backward_torch"] / med["backward_kernel"],
        }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
