"""The BBH-style study's table: exact match and option accuracy per task and method, chance beside them.

    .venv/bin/python benchmarks/bbh_table.py results/smollm2-135m/bbh [results/gemma-3-270m/bbh] --data data/bbh

Reads each folder's rows (its rows/ files while a bench may still run, else rows.csv), seed 0.
Chance is the task's ``meta.json`` "chance" under ``--data`` (the share of items a uniform
guess among the options gets right; "-" for generation tasks). Means are over the tasks every
listed method finished, beside the paper's BBH column (Llama-3.1-8B, exact match %).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from sequence_table import load  # this folder's script: the rows of a bench folder, seed 0

from site_lens.experiments import bench

METHODS = ["zero_shot", "icl", "site_opt", "i2cl_opt", "lora_opt"]
NAMES = {"zero_shot": "zero-shot", "icl": "ICL", "site_opt": "SITE", "i2cl_opt": "I2CL", "lora_opt": "LoRA"}
PAPER = {"icl": 47.17, "site_opt": 58.04, "i2cl_opt": 50.60, "lora_opt": 60.39}  # Llama-3.1-8B, BBH exact %


def pct(x) -> str:
    return "-" if x in (None, "", "None") else f"{100 * float(x):.0f}"


def chance(data: Path | None, task: str) -> str:
    meta = data / task / "meta.json" if data else None
    if meta is None or not meta.is_file():
        return "?"
    c = json.loads(meta.read_text()).get("chance")
    return "gen." if c is None else f"{100 * c:.0f}"


def table(folder: Path, data: Path | None) -> str:
    rows = load(folder)
    spec = json.loads((folder / bench.SPEC_FILE).read_text())
    model, shots = spec["model"], spec["config"]["embedding"]["n_shots"]
    tasks = sorted({t for t, _ in rows})
    done = [t for t in tasks if all((t, m) in rows for m in METHODS)]
    head = "| task | chance % | " + " | ".join(NAMES[m] for m in METHODS) + " |"
    n_done = f"{len(done)} task{'' if len(done) == 1 else 's'}"
    lines = [f"#### {model}: {n_done} with all {len(METHODS)} methods", ""]
    lines += [
        f"Exact match % / option accuracy % (first {spec['max_test']} test items, seed 0; ICL {shots}-shot):",
        "",
        head,
    ]
    lines.append("|" + "---|" * (len(METHODS) + 2))
    for t in tasks:
        cells = []
        for m in METHODS:
            r = rows.get((t, m))
            cells.append("" if r is None else f"{pct(r['exact_match'])} / {pct(r.get('option_acc'))}")
        mark = "" if t in done else " (unfinished)"
        lines.append(f"| {t}{mark} | {chance(data, t)} | " + " | ".join(cells) + " |")
    if done:
        means = []
        for m in METHODS:
            ex = statistics.mean(float(rows[(t, m)]["exact_match"]) for t in done)
            means.append(f"{100 * ex:.1f}")
        lines.append(f"| mean prefix match, {n_done} | | " + " | ".join(means) + " |")
        lines.append("| paper (Llama-3.1-8B, BBH) | | - | " + " | ".join(f"{PAPER[m]:.1f}" for m in METHODS[1:]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--data", type=Path, default=None, help="the built BBH-style tasks, for chance levels")
    args = ap.parse_args()
    print("\n".join(table(f, args.data) for f in args.folders))


if __name__ == "__main__":
    main()
