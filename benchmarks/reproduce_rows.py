"""Rerun committed benchmark rows with today's code and print every cell that differs.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/reproduce_rows.py --n 18 --draw-seed 0 \\
        --data ../shared/datasets/fv --report results/checks/reproduce_rows.md
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/reproduce_rows.py --every --models gemma-3-270m \\
        --methods icl --tasks ag_news --out runs/rerun --report results/checks/rerun.md

Draws ``--n`` rows (seeded) from the committed rows.csv files of both models (seed 0 in
``results/MODEL``, seeds 1-2 in ``results/seeds/MODEL``): the (model, method) pairs are taken in
a shuffled order, round robin, and for each a random task and seed, so the draw covers every
method on both models before it repeats one. Each row is recomputed by ``site_lens bench`` with
the settings its folder's bench.json records, into a scratch folder, and its scores
(first-token accuracy, prefix match, strict match, option accuracy, trainable parameters, test
items) compared with the committed cells; timings are not compared. Exits 1 if any cell differs.
``--every`` reruns every row that ``--models``, ``--methods`` and ``--tasks`` match instead of
drawing; ``--out`` keeps each rerun (for ``update_rows.py``); a row already in that folder is
read back, not run again, so a stopped rerun resumes (use an empty folder for fresh numbers).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {
    "smollm2-135m": [ROOT / "results/smollm2-135m", ROOT / "results/seeds/smollm2-135m"],
    "gemma-3-270m": [ROOT / "results/gemma-3-270m", ROOT / "results/seeds/gemma-3-270m"],
}
COMPARED = ("first_token_acc", "exact_match", "strict_match", "option_acc", "n_trainable", "n_test")


def committed_rows(models: list[str]) -> list[dict]:
    """Every committed row of ``models``, each with the folder that holds it."""
    rows = []
    for m in models:
        for folder in FOLDERS[m]:
            with open(folder / "rows.csv", newline="") as f:
                rows += [{**r, "model": m, "folder": folder} for r in csv.DictReader(f)]
    return rows


def draw(rows: list[dict], n: int, seed: int) -> list[dict]:
    """``n`` rows: (model, method) pairs in a shuffled order, round robin, a random row of each."""
    rng = random.Random(seed)
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["method"]), []).append(r)
    order = sorted(groups)
    rng.shuffle(order)
    picked: list[dict] = []
    seen: set[tuple] = set()
    distinct = len({(r["model"], r["task"], r["method"], r["seed"]) for r in rows})
    while len(picked) < min(n, distinct):
        for key in order:
            if len(picked) == n:
                break
            left = [r for r in groups[key] if (r["model"], r["task"], r["method"], r["seed"]) not in seen]
            if left:
                r = rng.choice(left)
                seen.add((r["model"], r["task"], r["method"], r["seed"]))
                picked.append(r)
    return picked


def cell(text: str | None) -> str:
    return "-" if text in (None, "") else text


def rerun(rows: list[dict], data: Path, after=None, out: Path | None = None) -> list[dict]:
    """Each row recomputed; returns one result per row (new cells, differences, seconds). With ``out``, each
    rerun is kept under ``out``/its folder's path below results/ (for ``update_rows.py``)."""
    import site_lens as sl
    from site_lens.config import EvalConfig, SiteConfig
    from site_lens.experiments.bench import run_bench
    from site_lens.experiments.bench_report import fmt

    results = []
    models: dict[str, object] = {}
    for i, r in enumerate(rows, 1):
        spec = json.loads((r["folder"] / "bench.json").read_text())
        if "config" in spec:
            cfg = SiteConfig.from_dict(spec["config"])
        else:  # a folder from before bench.json recorded the config: the defaults and its caps
            cfg = SiteConfig(eval=EvalConfig(max_test=spec["max_test"], max_new_tokens=spec["max_new_tokens"]))
        if r["model"] not in models:
            models.clear()  # one model in memory at a time
            models[r["model"]] = sl.load_model(r["model"])
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="reproduce-") as tmp:
            where = out / r["folder"].relative_to(ROOT / "results") if out is not None else Path(tmp)
            new = run_bench(models[r["model"]], [r["task"]], [r["method"]], [int(r["seed"])], where, data, cfg)
        seconds = time.perf_counter() - t0
        (row,) = [n for n in new if (n["task"], n["method"], int(n["seed"])) == (r["task"], r["method"], int(r["seed"]))]
        cells = {k: fmt(row.get(k)) for k in COMPARED}
        diffs = {k: (cell(r.get(k)), cells[k]) for k in COMPARED if cell(r.get(k)) != cell(cells[k])}
        results.append({**r, "new": cells, "diffs": diffs, "seconds": seconds})
        status = "same" if not diffs else "; ".join(f"{k} {a} -> {b}" for k, (a, b) in diffs.items())
        print(f"[{i}/{len(rows)}] {r['model']} {r['task']} {r['method']} seed {r['seed']}: {status} ({seconds:.0f} s)",
              flush=True)
        if after is not None:
            after(results)
    return results


def report(results: list[dict], args: argparse.Namespace) -> str:
    lines = [
        "# Committed benchmark rows recomputed with today's code",
        "",
        (
            f"`{' '.join(['benchmarks/reproduce_rows.py', *sys.argv[1:]]).replace(str(args.data), 'DATA')}` "
            "(OMP_NUM_THREADS=1; DATA: the 45 FV task folders, as `site-lens data fv` writes them), "
            f"{len(results)} rows "
            + ("(every matching row)" if args.every else f"drawn with draw seed {args.draw_seed}")
            + f"; {time.strftime('%Y-%m-%d')}."
        ),
        (
            "Compared: first-token accuracy, prefix match, strict match, option accuracy, trainable parameters, "
            "test items (timings are not)."
        ),
        "",
        "| model | task | method | seed | committed (first-token / prefix / strict) | today | differs |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        old = " / ".join(cell(r.get(k)) for k in ("first_token_acc", "exact_match", "strict_match"))
        new = " / ".join(cell(r["new"][k]) for k in ("first_token_acc", "exact_match", "strict_match"))
        differs = ", ".join(r["diffs"]) or "no"
        lines.append(f"| {r['model']} | {r['task']} | {r['method']} | {r['seed']} | {old} | {new} | {differs} |")
    bad = [r for r in results if r["diffs"]]
    lines += ["", f"{len(results) - len(bad)} of {len(results)} rows reproduce every compared cell."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=12, help="rows to draw (default 12)")
    ap.add_argument("--draw-seed", type=int, default=0, help="seed of the draw (default 0)")
    ap.add_argument("--models", default=",".join(FOLDERS), help="comma list (default both embedded models)")
    ap.add_argument("--methods", default=None, help="comma list: draw only these methods' rows")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared/datasets/fv", help="the FV task folder")
    ap.add_argument("--report", type=Path, default=None, help="also write the table here (Markdown)")
    ap.add_argument("--tasks", default=None, help="comma list: draw only these tasks' rows")
    ap.add_argument("--every", action="store_true", help="rerun every matching row instead of drawing --n")
    ap.add_argument("--out", type=Path, default=None, help="keep the reruns here, for update_rows.py (rows already there are reused: resume)")
    ap.add_argument("--dry-run", action="store_true", help="print the draw and stop")
    args = ap.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in FOLDERS]
    if unknown or args.n < 1:
        ap.error(f"unknown model(s) {unknown}; valid: {list(FOLDERS)}" if unknown else "--n must be >= 1")
    if not args.data.is_dir():
        ap.error(f"--data {args.data}: not a folder")
    rows = committed_rows(models)
    if args.methods:
        keep = {m.strip() for m in args.methods.split(",")}
        rows = [r for r in rows if r["method"] in keep]
    if args.tasks:
        keep = {t.strip() for t in args.tasks.split(",")}
        rows = [r for r in rows if r["task"] in keep]
    if not rows:
        ap.error("no committed row matches --models, --methods and --tasks")
    picked = rows if args.every else draw(rows, args.n, args.draw_seed)
    if args.dry_run:
        for r in picked:
            print(r["model"], r["task"], r["method"], r["seed"])
        return 0

    def write(results: list[dict]) -> None:  # after every row, so a stopped check keeps what it found
        if args.report:
            args.report.parent.mkdir(parents=True, exist_ok=True)
            args.report.write_text(report(results, args))

    picked.sort(key=lambda r: models.index(r["model"]))  # one model load each
    results = rerun(picked, args.data, write, args.out)
    print(report(results, args))
    return 1 if any(r["diffs"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
