"""Start-up time of the site-lens command against importing torch, medians of --reps runs each.

    .venv/bin/python benchmarks/bench_cli.py [--reps 5] [--before /tmp/cli_before]

Each run is a fresh interpreter (this one, so the same venv). ``--before DIR`` also times
``python -m site_lens --help`` run from DIR, another checkout of site-lens (say an older commit,
``git archive OLD site_lens | tar -x -C DIR``), interleaved with the others.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(args: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5, help="runs per command (default: 5)")
    ap.add_argument("--before", default=None, help="another site-lens checkout to time beside this one")
    args = ap.parse_args()
    cases = {
        "python -m site_lens --help": (["-m", "site_lens", "--help"], ROOT),
        "python -m site_lens --version": (["-m", "site_lens", "--version"], ROOT),
        "python -m site_lens tasks": (["-m", "site_lens", "tasks"], ROOT),
        'python -c "import torch"': (["-c", "import torch"], ROOT),
    }
    if args.before:
        cases["python -m site_lens --help (--before)"] = (["-m", "site_lens", "--help"], Path(args.before))
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.reps):  # interleaved, so a change in the machine's load touches every command alike
        for name, (argv, cwd) in cases.items():
            times[name].append(timed(argv, cwd))
    print(f"{sys.executable}, medians of {args.reps} runs (min-max):")
    for name, ts in times.items():
        print(f"  {name:<42} {statistics.median(ts):6.2f} s  ({min(ts):.2f}-{max(ts):.2f})")


if __name__ == "__main__":
    main()
