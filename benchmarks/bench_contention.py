"""Speed on a machine that is not idle: the same steps with the machine idle and with busy processes beside them.

    .venv/bin/python benchmarks/bench_contention.py [--data ../shared/datasets/fv] [--reps 10]
        [--variants adaptive,fixed,...] [--full-run adaptive,fixed] [--out benchmarks/results/contention.json]

Each variant runs in its own process (OpenMP reads its settings when torch is first imported):

  adaptive      site-lens as it ships: the thread count follows the free cores (``site_lens.threads``)
  fixed         SITE_LENS_ADAPTIVE_THREADS=0: torch's thread count left alone (all cores)
  passive       fixed, with OMP_WAIT_POLICY=PASSIVE (OpenMP threads sleep instead of spinning)
  one_thread    fixed, with OMP_NUM_THREADS=1

In each process the conditions alternate round by round, idle and busy: a busy process
(``yes > /dev/null``, one per ``--busy``) is resumed for the busy rounds and stopped (SIGSTOP)
for the idle ones, so both are measured side by side under the same load of everything else;
after each switch, untimed steps run for ``--settle`` seconds (the thread count looks at the
load every 0.5 s). Measured: one alpha-training step, batch 1, as ``training.train_loop`` runs
it (``threads.adapt()``, loss, backward, Adam; naive, hooked fast, packed with MKL, packed with
the C++ kernels), Stage 1 (M = 50, N = 10). ``--full-run adaptive,fixed`` also times a whole ``site-lens run`` of the
task (100 test items) idle and with one busy process beside it. Stop background work before
running it: the idle numbers assume an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {
    "adaptive": {},
    "fixed": {"SITE_LENS_ADAPTIVE_THREADS": "0"},
    "passive": {"SITE_LENS_ADAPTIVE_THREADS": "0", "OMP_WAIT_POLICY": "PASSIVE"},
    "one_thread": {"SITE_LENS_ADAPTIVE_THREADS": "0", "OMP_NUM_THREADS": "1"},
}
OMP_KEYS = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT", "OMP_DYNAMIC", "SITE_LENS_ADAPTIVE_THREADS")


@contextlib.contextmanager
def busy_processes(n: int):
    """``n`` busy processes (``yes > /dev/null``), started stopped; yields a switch(on: bool)."""
    procs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(n)]
    state = {"on": True}

    def switch(on: bool) -> None:
        if on != state["on"]:
            for p in procs:
                p.send_signal(signal.SIGCONT if on else signal.SIGSTOP)
            state["on"] = on
            time.sleep(0.05)

    try:
        switch(False)
        yield switch
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()


def worker(args: argparse.Namespace) -> dict:
    """Runs inside the variant's process: the timings for both conditions."""
    import torch

    import site_lens as sl
    from site_lens.engine import kernels
    from site_lens.engine.backend import HookedBackend, PackedBackend
    from site_lens.engine.prompt_cache import PromptCache
    from site_lens.stages.embeddings import embedding_prompts
    from site_lens.stages.selection import AlphaTrainer
    from site_lens.tasks import zero_shot_prompts
    from site_lens.threads import adapt, adaptive_threads
    from site_lens.tokens import make_examples

    model = sl.load_model("smollm2-135m")
    task = sl.load_task(args.task, data_dir=args.data)
    prompts = [p for p, _ in embedding_prompts(task, sl.SiteConfig().embedding, 0)]
    t = sl.build_task_embedding(model, prompts)
    ex = make_examples(model, zero_shot_prompts(task.train[:8]))
    tr = AlphaTrainer(model, t)
    caches = {"hooked": PromptCache(model, ex, backend=HookedBackend(model)),
              "packed": PromptCache(model, ex, backend=PackedBackend(model))}
    with kernels.disabled():
        caches["packed_mkl"] = PromptCache(model, ex, backend=PackedBackend(model))
    opt = torch.optim.Adam(tr.gate.parameters(), lr=0.2)

    def step(i: int, how: str) -> float:
        t0 = time.perf_counter()
        adapt()
        opt.zero_grad(set_to_none=True)
        with kernels.disabled() if how == "packed_mkl" else contextlib.nullcontext():
            loss = tr.loss_naive([ex[i % len(ex)]]) if how == "naive" else tr.loss_fast(caches[how], [i % len(ex)])
            loss.backward()
        opt.step()
        return time.perf_counter() - t0

    hows = ("naive", "hooked", "packed_mkl", "packed")
    conds = ("idle", "busy")
    steps = {c: {h: [] for h in hows} for c in conds}
    stage1 = {c: [] for c in conds}
    def settle(busy: bool) -> None:
        switch(busy)
        t_end = time.perf_counter() + args.settle
        while time.perf_counter() < t_end:
            step(0, "packed")

    threads = {c: [] for c in conds}
    with busy_processes(args.busy) as switch, adaptive_threads():  # the block train_loop runs its steps in
        for c in conds:  # warm-up in both conditions
            settle(c == "busy")
            for h in hows:
                step(0, h)
        for r in range(args.reps):
            for c in conds if r % 2 == 0 else conds[::-1]:
                settle(c == "busy")
                for h in hows:
                    steps[c][h].append(step(r, h))
                threads[c].append(torch.get_num_threads())
        for r in range(args.stage1_reps):
            for c in conds if r % 2 == 0 else conds[::-1]:
                settle(c == "busy")
                t0 = time.perf_counter()
                sl.build_task_embedding(model, prompts)
                stage1[c].append(time.perf_counter() - t0)
    med = statistics.median
    out: dict = {"threads_in_step_rounds": threads,
                 "omp_env": {k: os.environ[k] for k in OMP_KEYS if k in os.environ},
                 "row_kernel": kernels.available()}
    for c in conds:
        out[c] = {**{f"step_{h}_ms": 1e3 * med(steps[c][h]) for h in hows}, "stage1_s": med(stage1[c])}
    out["busy_over_idle"] = {k: out["busy"][k] / out["idle"][k] for k in out["idle"]}
    return out


def full_run(args: argparse.Namespace, variant: str) -> dict:
    """A whole ``site-lens run`` of the task, idle and with busy processes beside it (wall seconds)."""
    res = {}
    for cond in ("idle", "busy"):
        with tempfile.TemporaryDirectory() as tmp, busy_processes(args.busy) as switch:
            switch(cond == "busy")
            cmd = [sys.executable, "-m", "site_lens", "run", "--model", "smollm2-135m", "--task", args.task,
                   "--max-test", "100", "--data", str(args.data), "--out", tmp]
            env = {k: v for k, v in os.environ.items() if k not in OMP_KEYS} | VARIANTS[variant]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, env=env)
            res[f"{cond}_wall_s"] = time.perf_counter() - t0
            r = json.loads((Path(tmp) / "results.json").read_text())
            res[f"{cond}_exact_match"] = {k: r[k]["exact_match"] for k in ("zero_shot", "icl", "site")}
    res["busy_over_idle"] = res["busy_wall_s"] / res["idle_wall_s"]
    res["command"] = f"site-lens run --model smollm2-135m --task {args.task} --max-test 100 --data DATA --out OUT"
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("data/fv"))
    ap.add_argument("--task", default="antonym")
    ap.add_argument("--reps", type=int, default=10, help="rounds of each condition for the steps")
    ap.add_argument("--stage1-reps", type=int, default=3)
    ap.add_argument("--busy", type=int, default=1, help="busy processes in the busy condition")
    ap.add_argument("--settle", type=float, default=1.5, help="untimed seconds after each switch")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--full-run", default="", help="variants whose whole `site-lens run` is timed too (comma list)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/contention.json"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args)))
        return
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in names + args.full_run.split(",") if v and v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {bad}; valid: {list(VARIANTS)}")
    if not args.data.is_dir():
        ap.error(f"--data {args.data}: not a folder")
    res: dict = {"cores": os.cpu_count(), "busy_processes": args.busy, "reps": args.reps,
                 "command": " ".join(["bench_contention.py", *sys.argv[1:]]), "variants": {}}
    for name in names:
        env = {k: v for k, v in os.environ.items() if k not in OMP_KEYS} | VARIANTS[name]
        cmd = [sys.executable, __file__, "--worker", "--data", str(args.data), "--task", args.task, "--reps",
               str(args.reps), "--stage1-reps", str(args.stage1_reps), "--busy", str(args.busy), "--settle", str(args.settle)]
        done = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"variant {name} failed:\n{done.stderr[-2000:]}")
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        res["variants"][name] = json.loads(line.removeprefix("RESULT "))
        print(name, json.dumps(res["variants"][name]), flush=True)
    for name in [v.strip() for v in args.full_run.split(",") if v.strip()]:
        res.setdefault("full_run", {})[name] = full_run(args, name)
        print("full_run", name, json.dumps(res["full_run"][name]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
