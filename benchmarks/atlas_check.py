"""An adapter taken from a shipped atlas gives its task's committed scores exactly.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/atlas_check.py --data data/fv \\
        [--atlas atlases/smollm2-135m] [--n 2] [--draw-seed 0] [--report results/checks/atlas_adapters.md]

Draws ``--n`` (task, seed) pairs of the atlas (seeded), takes each one's adapter (t and theta),
scores SITE on the first 50 test items as the bench did (the atlas's recorded scoring settings),
and compares first-token accuracy, prefix match, strict match and test items with the atlas's
scores (copied from the committed bench rows). Exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

COMPARED = ("first_token_acc", "exact_match", "strict_match", "n_test")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--atlas", default="atlases/smollm2-135m")
    ap.add_argument("--data", type=Path, default=Path("data/fv"))
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--draw-seed", type=int, default=0)
    ap.add_argument("--report", type=Path, default=None)
    args = ap.parse_args()

    import site_lens as sl
    from site_lens.config import SiteConfig
    from site_lens.models import model_identity

    atlas = sl.load_atlas(args.atlas)
    pairs = sorted({(r.task, int(r.seed)) for r in atlas.scores.itertuples() if r.method == "site"})
    pairs = [p for p in pairs if ((atlas.heads.task == p[0]) & (atlas.heads.seed == p[1])).any()]
    if not 1 <= args.n <= len(pairs):
        ap.error(f"--n must be between 1 and the {len(pairs)} (task, seed) pairs with a map and a SITE score")
    picked = random.Random(args.draw_seed).sample(pairs, args.n)
    model = sl.load_model(atlas.model["name"])
    atlas.check_model(model_identity(model))
    cfg = SiteConfig.from_dict(atlas.manifest["config"]).eval
    lines = [
        f"# Adapters from {args.atlas} against the committed scores",
        "",
        (
            f"`benchmarks/atlas_check.py --atlas {args.atlas} --n {args.n} --draw-seed {args.draw_seed}` "
            f"(OMP_NUM_THREADS=1), {time.strftime('%Y-%m-%d')}; scoring: first {cfg.max_test} test items, "
            f"{cfg.max_new_tokens} new tokens."
        ),
        "",
        "| task | seed | committed (first-token / prefix / strict / n) | from the atlas | same |",
        "|---|---|---|---|---|",
    ]
    bad = 0
    for task_name, seed in picked:
        row = atlas.scores[(atlas.scores.task == task_name) & (atlas.scores.seed == seed) & (atlas.scores.method == "site")].iloc[0]
        task = sl.load_task(task_name, data_dir=args.data)
        got = sl.evaluate(model, task, "site", atlas.adapter(task_name, seed), cfg, seed=seed)
        old = " / ".join(f"{row[k]:.3f}" if k != "n_test" else str(int(row[k])) for k in COMPARED)
        new = " / ".join(f"{got[k]:.3f}" if k != "n_test" else str(int(got[k])) for k in COMPARED)
        same = all(abs(float(got[k]) - float(row[k])) < 5e-4 for k in COMPARED)  # rows.csv keeps 3 decimals
        bad += not same
        lines.append(f"| {task_name} | {seed} | {old} | {new} | {'yes' if same else 'NO'} |")
        print(lines[-1], flush=True)
    lines += ["", f"{len(picked) - bad} of {len(picked)} reproduce exactly."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        args.report.write_text(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
