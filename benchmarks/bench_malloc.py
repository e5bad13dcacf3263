"""Freed memory kept for reuse (``site_lens.malloc``) against malloc as it is, side by side.

Each round runs every workload twice, in a subprocess with ``SITE_LENS_KEEP_FREED=1`` and one
with ``=0`` (the order alternates between rounds), and reads each child's own wall time, user
and system CPU seconds, minor page faults and peak resident memory (``os.wait4``). Medians over
the rounds are compared.

Workloads (SmolLM2-135M):
- ``long``: forwards of one 2,000-token prompt (logits at every position), as stage 1 and
  scoring run squad_val's ten-shot prompts;
- ``run``: a whole ``site-lens run`` of a task (stage 1, 400 training steps, scoring zero-shot,
  ICL and SITE).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_malloc.py --data data/fv --rounds 2 \\
        --out benchmarks/results/malloc.json
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

LONG = r"""
import sys, torch
import site_lens as sl
from site_lens.malloc import keep_freed
keep_freed()  # as site-lens's own long calls do (a no-op under SITE_LENS_KEEP_FREED=0)
model = sl.load_model("smollm2-135m")
tokens = torch.randint(0, model.cfg.d_vocab, (1, int(sys.argv[1])), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    for _ in range(int(sys.argv[2])):
        model(tokens)
"""


def child(cmd: list[str], keep: bool) -> dict:
    env = {**os.environ, "SITE_LENS_KEEP_FREED": "1" if keep else "0", "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: a chatty child cannot block on a full pipe
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)  # this child's own rusage (reaped here)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        err.seek(0)
        if status != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{err.read().decode()[-2000:]}")
    return {
        "wall_s": wall,
        "user_s": ru.ru_utime,
        "sys_s": ru.ru_stime,
        "minor_faults": ru.ru_minflt,
        "peak_rss_gb": ru.ru_maxrss / 2**20,  # KiB -> GiB
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="data/fv")
    ap.add_argument("--task", default="antonym")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--forwards", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workloads", default="long,run")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_malloc_"))

    def command(name: str, n: int) -> list[str]:
        if name == "long":
            return [sys.executable, "-c", LONG, str(args.tokens), str(args.forwards)]
        return [sys.executable, "-m", "site_lens", "run", "--model", "smollm2-135m", "--data", args.data, "--task",
                args.task, "--max-test", "100", "--out", str(tmp / f"run{n}")]  # a fresh folder each time

    names = args.workloads.split(",")
    got: dict[str, dict[str, list[dict]]] = {n: {"kept": [], "malloc": []} for n in names}
    for r in range(args.rounds):
        for name in names:
            for keep in (True, False) if r % 2 == 0 else (False, True):
                m = child(command(name, len(got[name]["kept"]) + len(got[name]["malloc"])), keep)
                got[name]["kept" if keep else "malloc"].append(m)
                print(f"round {r} {name} {'kept' if keep else 'malloc'}: " + json.dumps({k: round(v, 3) for k, v in m.items()}), flush=True)  # fmt: skip
    summary = {}
    for name in names:
        med = {side: {k: statistics.median(m[k] for m in runs) for k in runs[0]} for side, runs in got[name].items()}
        med["wall_ratio_malloc_over_kept"] = med["malloc"]["wall_s"] / med["kept"]["wall_s"]
        med["cpu_ratio_malloc_over_kept"] = (med["malloc"]["user_s"] + med["malloc"]["sys_s"]) / (
            med["kept"]["user_s"] + med["kept"]["sys_s"]
        )
        summary[name] = med
        print(name, json.dumps(med, indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": got, "median": summary}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
