"""Markdown tables for the README from `site-lens bench` output folders (rows.csv).

Only tasks that every listed method finished are compared, so a partial run
is never averaged over different task sets. Prints, per model folder:
the per-method means (exact, by category, first-token, strict, SITE minus
the method, trainable parameters, median fit seconds, median ms per query,
the paper's Llama-3.1-8B number where the issue gives one), where SITE loses
(per task and per category), and the per-task exact-match table.

Usage: .venv/bin/python benchmarks/bench_table.py results/smollm2-135m [results/gemma-3-270m ...]
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

METHODS = ["zero_shot", "icl", "site", "fv", "tv", "i2cl", "mtv", "lora", "ia3"]
# SITE paper (Park et al., 2026), FV benchmark, Llama-3.1-8B, mean exact match %
PAPER = {"icl": "76.76", "site": "90.02", "i2cl": "79.89", "lora": "86.76"}


def load(folder: Path) -> list[dict]:
    with open(folder / "rows.csv") as f:
        return list(csv.DictReader(f))


def table(folder: Path) -> str:
    rows = load(folder)
    by = defaultdict(dict)  # task -> method -> row (seed-averaged below when several)
    cats = {}
    for r in rows:
        by[r["task"]].setdefault(r["method"], []).append(r)
        cats[r["task"]] = r["category"]
    methods = [m for m in METHODS if any(m in d for d in by.values())]
    tasks = sorted(t for t, d in by.items() if all(m in d for m in methods))
    left = sorted(set(by) - set(tasks))

    def mean(task, method, key):
        return statistics.mean(float(r[key]) for r in by[task][method])

    def avg(method, key, ts=None):
        ts = tasks if ts is None else ts
        return statistics.mean(mean(t, method, key) for t in ts) if ts else float("nan")

    def pct(x: float) -> str:
        return "-" if math.isnan(x) else f"{100 * x:.1f}"

    out = [f"### {folder.name}: {len(tasks)} tasks complete for all {len(methods)} methods"]
    if left:
        out.append(f"(not counted, unfinished: {', '.join(left)})")
    abst = [t for t in tasks if cats[t] == "abstractive"]
    extr = [t for t in tasks if cats[t] == "extractive"]
    out.append(f"abstractive: {len(abst)}, extractive: {len(extr)}\n")
    out.append(
        "| method | prefix % | abstractive | extractive | first-token % | strict % | SITE - method | "
        "trainable params | fit s (median) | ms / query (median) | paper, Llama-3.1-8B |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    site = avg("site", "exact_match") if "site" in methods else None
    for m in methods:
        ex = avg(m, "exact_match")
        gap = f"{100 * (site - ex):+.1f}" if site is not None and m != "site" else "0"
        fit = statistics.median(mean(t, m, "fit_seconds") for t in tasks) if tasks else 0
        ms = statistics.median(mean(t, m, "ms_per_query") for t in tasks) if tasks else 0
        params = round(avg(m, "n_trainable"))
        out.append(
            f"| {m} | {pct(ex)} | {pct(avg(m, 'exact_match', abst))} | {pct(avg(m, 'exact_match', extr))} "
            f"| {pct(avg(m, 'first_token_acc'))} | {pct(avg(m, 'strict_match'))} | {gap} | {params:,} "
            f"| {fit:.0f} | {ms:.0f} | {PAPER.get(m, '-')} |"
        )
    if "site" in methods:
        out.append("\nWhere SITE loses (prefix match, per task, by more than 2 points):\n")
        for m in methods:
            if m == "site":
                continue
            lost = [t for t in tasks if mean(t, m, "exact_match") > mean(t, "site", "exact_match") + 0.02]
            cat_lost = [
                c
                for c, ts in (("abstractive", abst), ("extractive", extr))
                if ts and avg(m, "exact_match", ts) > avg("site", "exact_match", ts)
            ]
            out.append(
                f"- vs {m}: {len(lost)} of {len(tasks)} tasks"
                + (f" ({', '.join(lost)})" if lost else "")
                + (f"; category means lost: {', '.join(cat_lost)}" if cat_lost else "; no category mean lost")
            )
    out.append("\nPrefix match (%) per task:\n")
    out.append("| task | category | " + " | ".join(methods) + " |")
    out.append("|---|---|" + "---|" * len(methods))
    for t in sorted(tasks, key=lambda t: (cats[t], t)):
        out.append(f"| {t} | {cats[t]} | " + " | ".join(f"{100 * mean(t, m, 'exact_match'):.0f}" for m in methods) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    print("\n\n".join(table(Path(a)) for a in sys.argv[1:]))
