"""Replace some tasks' rows of a committed results folder by a rerun's, and rewrite its summary.

    .venv/bin/python benchmarks/update_rows.py results/smollm2-135m runs/numeric/smollm2-135m \\
        [--note "squad_val: made before ..."]

The rerun folder's rows.csv (``site-lens bench`` output) gives the new rows; every
(task, method, seed) it holds replaces the old one. ``rows.csv``, ``summary.csv`` and
``summary.md`` of the results folder are rewritten with ``site_lens.experiments.bench_report``'s summary
(``--note`` lines are appended to summary.md).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from site_lens.experiments import bench_report
from site_lens.files import write_text_atomic

NUMERIC = ("first_token_acc", "exact_match", "strict_match", "fit_seconds", "ms_per_query")


def read_rows(folder: Path) -> list[dict]:
    with open(folder / "rows.csv") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in NUMERIC:
            r[k] = float(r[k])
        r["seed"], r["n_trainable"], r["n_test"] = int(r["seed"]), int(r["n_trainable"]), int(r["n_test"])
        opt = r.get("option_acc")  # absent from folders written before options existed; "-" where a task has none
        r["option_acc"] = None if opt in (None, "", "-") else float(opt)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path)
    ap.add_argument("rerun", type=Path)
    ap.add_argument("--note", action="append", default=[])
    args = ap.parse_args()
    new = read_rows(args.rerun)
    keys = {(r["task"], r["method"], r["seed"]) for r in new}
    rows = [r for r in read_rows(args.results) if (r["task"], r["method"], r["seed"]) not in keys] + new
    rows.sort(key=lambda r: (r["task"], r["method"], r["seed"]))
    summary = bench_report.summarise(rows)
    title = (args.results / "summary.md").read_text().splitlines()[0].lstrip("# ")
    md = bench_report.markdown(rows, summary, title)
    if args.note:
        md += "\n" + "\n".join(f"Note: {n}" for n in args.note) + "\n"
    write_text_atomic(
        args.results / "rows.csv",
        bench_report.csv_text([{k: bench_report.fmt(r[k]) for k in bench_report.ROW_FIELDS} for r in rows]),
    )
    write_text_atomic(
        args.results / "summary.csv",
        bench_report.csv_text([{k: bench_report.fmt(v) for k, v in s.items()} for s in summary]),
    )
    write_text_atomic(args.results / "summary.md", md)
    print(f"{len(new)} rows replaced; {len(rows)} rows in {args.results}")


if __name__ == "__main__":
    main()
