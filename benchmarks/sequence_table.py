"""The answer-sequence objective against the first-token one: prefix and strict match per method.

    .venv/bin/python benchmarks/sequence_table.py results/smollm2-135m results/sequence/smollm2-135m

The first folder is a 45-task bench folder (its rows.csv gives SITE, ICL, LoRA and I2CL trained
on the first answer token); the second holds the ``*_seq`` rows from
``benchmarks/run_sequence.sh`` (it may hold first-token rows too: a row there replaces the first
folder's). Only tasks every listed method finished are averaged. Prints the means, the two
targets (SITE-sequence strict match at least ICL's; its prefix match at most 1 point below
first-token SITE's) and the per-task table.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

from site_lens.experiments import bench

METHODS = ["icl", "site", "site_seq", "lora", "lora_seq", "i2cl", "i2cl_seq"]


def load(folder: Path) -> dict[tuple[str, str], dict]:
    """(task, method) -> row, seed 0: from the rows/ files while a bench may still be running, else rows.csv."""
    if (folder / bench.ROWS_DIR).is_dir():
        rows = bench.collect_rows([folder])
    else:  # a committed folder: rows.csv alone
        with open(folder / "rows.csv") as f:
            rows = list(csv.DictReader(f))
    return {(r["task"], r["method"]): r for r in rows if str(r["seed"]) == "0"}


def spec(folder: Path) -> tuple[str, int]:
    """(model, max_test) from the folder's bench.json."""
    d = json.loads((folder / bench.SPEC_FILE).read_text())
    return d["model"], d["max_test"]


def verdict(ok: bool) -> str:
    return "met" if ok else "missed"


def table(first: Path, seq: Path) -> str:
    if spec(first) != spec(seq):
        raise SystemExit(f"{first} holds {spec(first)} (model, max_test), {seq} holds {spec(seq)}: not comparable")
    model, max_test = spec(seq)
    rows = load(first) | load(seq)
    tasks = sorted({t for t, _ in rows})
    done = [t for t in tasks if all((t, m) in rows for m in METHODS)]
    waiting = [t for t in tasks if t not in done and any((t, m) in rows for m in METHODS if m.endswith("_seq"))]

    def mean(m: str, key: str) -> float:
        return 100 * statistics.mean(float(rows[t, m][key]) for t in done)

    out = [f"### {model}: {len(done)} tasks with all {len(METHODS)} methods (first {max_test} test items, seed 0)", ""]
    if waiting:
        out += [f"(not counted, unfinished: {', '.join(waiting)})", ""]
    if not done:
        return "\n".join(out + ["no task finished yet"]) + "\n"
    out += ["| method | prefix % | strict % | first-token % | median fit s |", "|---|---|---|---|---|"]
    for m in METHODS:
        fit = statistics.median(float(rows[t, m]["fit_seconds"]) for t in done)
        cells = [f"{mean(m, k):.1f}" for k in ("exact_match", "strict_match", "first_token_acc")]
        out.append(f"| {m} | " + " | ".join(cells) + f" | {fit:.0f} |")
    strict_gap = mean("site_seq", "strict_match") - mean("icl", "strict_match")
    prefix_gap = mean("site_seq", "exact_match") - mean("site", "exact_match")
    out += [
        "",
        f"- SITE-sequence strict minus ICL strict: {strict_gap:+.1f} points (target >= 0: {verdict(strict_gap >= 0)})",
        f"- SITE-sequence prefix minus first-token SITE: {prefix_gap:+.1f} points (target >= -1: {verdict(prefix_gap >= -1)})",
        "",
        "Prefix / strict match (%) per task:",
        "",
        "| task | " + " | ".join(METHODS) + " |",
        "|" + "---|" * (len(METHODS) + 1),
    ]
    for t in done:
        cells = [
            f"{100 * float(rows[t, m]['exact_match']):.0f} / {100 * float(rows[t, m]['strict_match']):.0f}"
            for m in METHODS
        ]
        out.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: sequence_table.py FIRST_TOKEN_BENCH_DIR SEQUENCE_BENCH_DIR")
    print(table(Path(sys.argv[1]), Path(sys.argv[2])))
