"""Do the tasks that share heads in SmolLM2 share them in Gemma 3? The Mantel test of two models' head maps.

    .venv/bin/python benchmarks/compare_models.py [--atlases atlases] [--out results/atlas/compare.md]

With ``--atlases`` each model's atlas folder is read; without it, the maps come straight from the
committed seed runs' thetas (``results/seeds/MODEL/theta.safetensors``), which are the maps an
atlas built from those runs holds (its ``heads`` table; t plays no part in the test). Per model:
the task-by-task Jaccard of the top-10 % head sets, averaged over its seeds; then
``site_lens.atlas.compare_atlases`` (Spearman over the task pairs, 10,000 task shuffles, and the
same without the pairs of one task family), for the models' seeds averaged and seed by seed.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import sys
from pathlib import Path

import pandas as pd

from site_lens.analysis.overlap import format_p
from site_lens.atlas import Atlas, compare_atlases, load_atlas
from site_lens.atlas.build import _head_rows
from site_lens.atlas.store import SCHEMA_VERSION

MODELS = ("smollm2-135m", "gemma-3-270m")
SHAPES = {"smollm2-135m": (30, 9, 64), "gemma-3-270m": (18, 4, 256)}


def maps_from_seed_runs(model: str, results: Path) -> Atlas:
    """An atlas holding only the head maps of the committed seed runs (no t, no scores)."""
    from safetensors.torch import load_file

    thetas = load_file(str(results / "seeds" / model / "theta.safetensors"))
    with open(results / "seeds" / model / "rows.csv", newline="") as f:
        cats = {r["task"]: r["category"] for r in csv.DictReader(f)}
    n_l, n_h, d = SHAPES[model]
    frames = [_head_rows(k.split("/seed")[0], int(k.split("/seed")[1]), v.reshape(n_l, n_h)) for k, v in sorted(thetas.items())]
    manifest = {"schema_version": SCHEMA_VERSION, "model": {"name": model, "n_layers": n_l, "n_heads": n_h, "d_head": d},
                "tasks": {t: {"category": cats.get(t, "")} for t in {k.split("/seed")[0] for k in thetas}}}  # fmt: skip
    return Atlas(manifest=manifest, heads=pd.concat(frames, ignore_index=True), scores=pd.DataFrame(), t={})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--atlases", type=Path, default=None, help="folder with one atlas per model (default: the seed runs' maps)")
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--perms", type=int, default=10_000)
    ap.add_argument("--out", type=Path, default=Path("results/atlas/compare.md"))
    args = ap.parse_args()
    a, b = (load_atlas(args.atlases / m) if args.atlases else maps_from_seed_runs(m, args.results) for m in MODELS)
    source = f"the atlases in {args.atlases}/" if args.atlases else "the committed seed runs' head maps (results/seeds/MODEL/theta.safetensors)"
    lines = [
        "# SmolLM2-135M against Gemma 3 270M: do the same tasks share heads?",
        "",
        (
            f"`{' '.join(['benchmarks/compare_models.py', *sys.argv[1:]])}`, from {source}. Per model, the "
            "task-by-task Jaccard of the top-10 % head sets (27 of 270 heads; 7 of 72); the statistic is the "
            "Spearman correlation of the two models' matrices over the pairs of shared tasks; its null shuffles "
            f"one model's tasks {args.perms:,} times, whole families at a time (one task at two list lengths "
            "moves with its pair, onto another family of the same size): a Mantel test, one-sided (more "
            f"agreement than chance); p counts the observed labelling, so it cannot fall below "
            f"1/{args.perms + 1:,}. Family pairs share heads strongly in both models, so the statistic is also "
            "given without them."
        ),
        "",
        "| maps | tasks | pairs | Spearman | p | null mean | without family pairs (pairs) | Spearman | p |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    averaged = f"seeds averaged ({', '.join(map(str, a.seeds))} / {', '.join(map(str, b.seeds))})"
    rows = [(averaged, (None, None))] + [(f"seed {s} with seed {s}", (s, s)) for s in sorted(set(a.seeds) & set(b.seeds))]
    for label, seeds in rows:
        r = compare_atlases(a, b, seeds=seeds, n_perm=args.perms)
        lines.append(
            f"| {label} | {r['tasks']} | {r['pairs']} | {r['spearman']:+.3f} | {format_p(r['p_value'], r['n_perm'])} | "
            f"{r['null_mean']:+.3f} | {r['pairs_excl']} | {r['spearman_excl']:+.3f} | {format_p(r['p_excl'], r['n_perm'])} |"
        )
        print(lines[-1], flush=True)
    for atlas in (a, b):  # the same test between each two seeds of one model, for scale
        for s0, s1 in itertools.combinations(atlas.seeds, 2):
            r = compare_atlases(atlas, atlas, seeds=(s0, s1), n_perm=args.perms)
            lines.append(
                f"| {atlas.model['name']}: seed {s0} with seed {s1} (for scale) | {r['tasks']} | {r['pairs']} | "
                f"{r['spearman']:+.3f} | {format_p(r['p_value'], r['n_perm'])} | {r['null_mean']:+.3f} | {r['pairs_excl']} | "
                f"{r['spearman_excl']:+.3f} | {format_p(r['p_excl'], r['n_perm'])} |"
            )
            print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
