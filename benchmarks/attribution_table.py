"""Attribution patching as a head ranking: recovery at matched k beside dense alpha, CIE and random sets, its rank
correlation with measured single-head patching, and its cost against CIE's, per model.

    .venv/bin/python benchmarks/attribution_table.py > results/minimal/attribution.md

Reads the sparsify folders (results/minimal/MODEL/TASK/seed0/scores.csv: test split, binary sets,
recovery of prefix match, 0 zero-shot and 1 dense SITE; tasks where SITE gains at least 0.1 over
zero-shot, as the study's summary does) and benchmarks/results/attribution_MODEL.json
(benchmarks/bench_attribution.py with the same folders' t).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pandas as pd

METHODS = ["attribution", "cie", "dense_alpha", "random"]
LABELS = {"attribution": "attribution", "cie": "CIE", "dense_alpha": "dense alpha", "random": "random (mean of draws)"}


def matched_k(root: Path, min_gain: float = 0.1) -> tuple[pd.DataFrame, int]:
    frames = [pd.read_csv(f) for f in sorted(root.glob("*/seed0/scores.csv"))]
    d = pd.concat(frames, ignore_index=True)
    d = d[(d.split == "test") & (d["mode"] == "binary") & d.method.isin(METHODS) & (d.site_gain_em >= min_gain)]
    per_task = d.groupby(["method", "k", "task"]).recovery_em.mean()  # random: draws averaged
    table = per_task.groupby(["method", "k"]).mean().unstack("method")
    counts = per_task.groupby(["method", "k"]).size().unstack("method")
    full = counts.eq(counts.max(axis=None)).all(axis=1)  # ks every method was scored at on every task
    return table[full].reindex(columns=METHODS), int(d.task.nunique())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,gemma-3-270m")
    args = ap.parse_args()
    print("# Attribution patching as a head ranking\n")
    for model in args.models.split(","):
        table, n = matched_k(Path("results/minimal") / model)
        print(f"## {model}\n\nTest recovery of prefix match at matched k, mean over {n} tasks (SITE gains >= 0.1):\n")
        print("| k | " + " | ".join(LABELS[m] for m in METHODS) + " |")
        print("|---|" + "---|" * len(METHODS))
        for k, row in table.iterrows():
            print(f"| {k} | " + " | ".join(f"{row[m]:.2f}" for m in METHODS) + " |")
        path = Path("benchmarks/results") / f"attribution_{model}.json"
        if path.is_file():
            res = json.loads(path.read_text())
            tasks = res["tasks"]
            print(f"\nAgainst measured single-head patching ({res['args']['items']} zero-shot test items per task):\n")
            print(
                "| task | Spearman | Pearson | top-10 overlap | attribution s | measured s | CIE s | CIE / attribution |"
            )
            print("|---|---|---|---|---|---|---|---|")
            for r in tasks:
                top = next(v for key, v in r.items() if key.startswith("top") and key.endswith("_overlap"))
                s = r["median_s"]
                print(
                    f"| {r['task']} | {r['spearman']:.3f} | {r['pearson']:.3f} | {top:.2f} | {s['attribution']:.2f} | "
                    f"{s['exact']:.1f} | {s['cie']:.1f} | {s['cie'] / s['attribution']:.0f}x |"
                )
            med = statistics.median
            print(
                f"\nMedian over {len(tasks)} tasks: Spearman {med(r['spearman'] for r in tasks):.3f}; CIE takes "
                f"{med(r['median_s']['cie'] / r['median_s']['attribution'] for r in tasks):.0f}x the attribution's "
                f"time ({res['threads']} thread(s), {res['device']}, one timed round after a warm-up, while other "
                "benchmark processes shared the machine's two cores: compare the ratios, not the seconds; CIE's "
                "prompts are 10-shot, the attribution's zero-shot).\n"
            )


if __name__ == "__main__":
    main()
