"""Two checkouts side by side: the batch-1 training step and a full `site-lens run`, interleaved.

Each round runs, for the old checkout and then the new one (the order alternates between
rounds), one subprocess that times ``--reps`` training steps after a warm-up, and one
full ``site-lens run`` of the task; medians over the rounds are compared. Both sides use
this machine's venv, with ``PYTHONPATH`` pointing at each checkout.

    git worktree add --detach runs/wt-old OLD_COMMIT
    .venv/bin/python benchmarks/bench_compare.py --old runs/wt-old --new . --data data/fv \\
        --out benchmarks/results/compare.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Times the packed step in the checkout it runs in (the training step's API moved between them).
STEP = r"""
import json, statistics, sys, time
import torch
import site_lens as sl
task = sl.load_task(sys.argv[1], data_dir=sys.argv[2] or None)
reps = int(sys.argv[3])
model = sl.load_model("smollm2-135m")
from site_lens.tasks import zero_shot_prompts
prompts = sl.tasks.sample_icl_prompts(task.train, 5, 10, __import__("random").Random(0))
t = sl.build_task_embedding(model, [p for p, _ in prompts])
try:  # the backend seam
    from site_lens.engine.prompt_cache import PromptCache
    from site_lens.tokens import make_examples
    ex = make_examples(model, zero_shot_prompts(task.train[: reps + 5]))
    tr = sl.AlphaTrainer(model, t)
    cache = PromptCache(model, ex)
    loss_of = lambda i: tr.loss_fast(cache, [i])
except ImportError:  # before it
    from site_lens.stages.selection import _PrefixCache, make_examples
    ex = make_examples(model, zero_shot_prompts(task.train[: reps + 5]))
    tr = sl.AlphaTrainer(model, t)
    cache = _PrefixCache(model, ex, runner=tr.runner())
    loss_of = lambda i: tr.loss_fast(ex, cache, [i])
opt = torch.optim.Adam(tr.gate.parameters(), lr=0.2)
def step(i):
    opt.zero_grad(set_to_none=True)
    loss_of(i).backward()
    opt.step()
for i in range(5):
    step(i)
ts = []
for i in range(reps):
    t0 = time.perf_counter(); step(i); ts.append(time.perf_counter() - t0)
print(json.dumps({"step_ms": 1e3 * statistics.median(ts), "file": sl.__file__}))
"""


def run_side(path: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(path.resolve()), "HF_HUB_OFFLINE": "1"}
    cwd = str(path.resolve())  # `python -c` and `-m` put the working folder first on sys.path
    out = subprocess.run(
        [sys.executable, "-c", STEP, args.task, args.data or "", str(args.reps)],
        env=env,
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    step = json.loads(out.stdout.strip().splitlines()[-1])
    assert step["file"].startswith(str(path.resolve())), step["file"]  # the checkout asked for ran
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "site_lens",
            "run",
            "--model",
            "smollm2-135m",
            "--task",
            args.task,
            "--max-test",
            str(args.max_test),
            "--out",
            tmp,
        ]
        if args.data:
            cmd += ["--data", args.data]
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        r = json.loads((Path(tmp) / "results.json").read_text())
    secs = r["seconds"]
    return {
        "step_ms": step["step_ms"],
        "run_wall_s": wall,
        "run_after_load_s": sum(v for k, v in secs.items() if k != "model_load"),
        "exact_match": {m: r[m]["exact_match"] for m in ("zero_shot", "icl", "site")},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="checkout of the earlier commit (a git worktree)")
    ap.add_argument("--new", default=".", help="checkout of the later commit")
    ap.add_argument("--data", default="data/fv", help="FV task folders (default: data/fv, from site-lens data fv)")
    ap.add_argument("--task", default="antonym")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--max-test", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/compare.json")
    args = ap.parse_args()
    args.data = str(Path(args.data).resolve()) if args.data else None
    sides = {"old": Path(args.old), "new": Path(args.new)}
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
            runs[name].append(run_side(sides[name], args))
            print(name, runs[name][-1], flush=True)

    def med(name, key):
        return statistics.median(x[key] for x in runs[name])

    res = {
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "commits": {
            n: subprocess.run(
                ["git", "-C", str(p), "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True
            ).stdout.strip()
            for n, p in sides.items()
        },
        "runs": runs,
        **{f"{k}_median": {n: med(n, k) for n in sides} for k in ("step_ms", "run_wall_s", "run_after_load_s")},
    }
    for k in ("step_ms", "run_wall_s", "run_after_load_s"):
        res[f"{k}_new_over_old"] = res[f"{k}_median"]["new"] / res[f"{k}_median"]["old"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
