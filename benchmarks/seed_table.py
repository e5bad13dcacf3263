"""The seed tables of both embedded models: per method the mean over tasks and seeds with its 95 % interval,
SITE minus ICL and minus I2CL paired by task (each task's mean over the seeds both ran), and each
task's seed spread.

    .venv/bin/python benchmarks/seed_table.py                  # after benchmarks/run_seeds.sh

Reads seed 0 from results/MODEL/rows.csv (all nine methods) and the further seeds from
results/seeds/MODEL/rows.csv (rewritten first from the rows on disk); writes
results/seeds/MODEL/{intervals,differences,spread}.csv and intervals.md, and
figures/claims/methods_intervals.{html,png}. Only tasks every listed method finished are used,
and a difference pairs each task's mean over the seeds both methods ran.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from site_lens.analysis.plots.claims import method_intervals_figure
from site_lens.analysis.plots.theme import save_figure
from site_lens.experiments.bench import restore_rows, write_summary
from site_lens.experiments.seed_report import markdown, method_intervals, paired_differences, read_rows, seed_spread
from site_lens.files import write_text_atomic

METHODS = ["zero_shot", "icl", "site", "i2cl"]
NAMES = {"smollm2-135m": "SmolLM2-135M", "gemma-3-270m": "Gemma 3 270M"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2-135m,gemma-3-270m")
    p.add_argument("--results", default="results")
    p.add_argument("--n-boot", type=int, default=10_000)
    p.add_argument("--figures", default="figures/claims")
    args = p.parse_args()
    tables = {}
    for model in args.models.split(","):
        root = Path(args.results)
        seeds = root / "seeds" / model
        if (seeds / "rows").is_dir():  # the rows finished so far, also while runs go on
            if (seeds / "rows.csv").is_file():  # the committed rows whose files this machine lacks, first
                restore_rows(seeds, json.loads((seeds / "bench.json").read_text()))
            write_summary(seeds)
        paths = [root / model / "rows.csv", root / "seeds" / model / "rows.csv"]
        rows = read_rows([q for q in paths if q.is_file()])
        rows = rows[rows.method.isin(METHODS)]
        iv = method_intervals(rows, METHODS, n_boot=args.n_boot)
        diff = paired_differences(rows, "site", ["icl", "i2cl"], n_boot=args.n_boot)
        spread = seed_spread(rows, ["icl", "site"])
        out = root / "seeds" / model
        out.mkdir(parents=True, exist_ok=True)
        for name, df in (("intervals", iv), ("differences", diff), ("spread", spread)):
            write_text_atomic(out / f"{name}.csv", df.round(4).to_csv(index=False))
        text = markdown(iv, diff, spread, f"{model}: seeds and 95 % intervals (bootstrap over tasks)")
        write_text_atomic(out / "intervals.md", text)
        print(text)
        tables[NAMES.get(model, model)] = iv
    print(*save_figure(method_intervals_figure(tables), Path(args.figures) / "methods_intervals"))


if __name__ == "__main__":
    main()
