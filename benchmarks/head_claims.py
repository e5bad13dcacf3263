"""The head-specificity claims across the FV tasks and seeds, from the alphas of benchmarks/run_seeds.sh.

(a) Patching contrast (``analysis.patching.head_patching_sweep``): t written into the top-k heads
    by alpha, the bottom-k, or k random heads (5 draws), at the last token of the first 50 zero-shot
    test prompts; recovery of first-token accuracy and of the answer's probability, 0 at zero-shot
    and 1 at SITE. Per (task, seed); t is stage 1 rerun with that seed (SITE's own t).
(b) Task dependence: top-k Jaccard between tasks, within vs across the abstractive / extractive
    categories and within vs across task families (``families``), with a permutation test
    (``analysis.overlap.category_permutation_test``), per seed.
(c) Stability: per task, the mean pairwise Spearman of alphas across seeds and the top-k Jaccard
    against its chance level (``analysis.overlap.seed_stability``).

k for (b) and (c) is 10 % of the heads (SmolLM2 27 of 270, Gemma 3 7 of 72); (a) is run at 10, 25
and 50 % of the heads (the seven-task study of docs/head_specificity.md found SmolLM2's top-alpha
heads carrying little below about 64 heads), and each k is reported.
A (task, seed) where SITE is less than 0.1 above zero-shot on a recovery's own metric (first-token
accuracy, answer probability) is left out of that recovery's averages: its denominator is near 0.

    .venv/bin/python benchmarks/head_claims.py --model smollm2-135m              # (b), (c): no model
    .venv/bin/python benchmarks/head_claims.py --model smollm2-135m --patching   # and (a), resumable
    .venv/bin/python benchmarks/head_claims.py --model smollm2-135m --atlas atlases/smollm2-135m --patching
        # every claim from the shipped atlas (its alphas, t and categories): the docs and the atlas agree
    .venv/bin/python benchmarks/head_claims.py --model smollm2-135m --patching --patch-seeds 1   # (a) on seed 1
    .venv/bin/python benchmarks/head_claims.py --model gemma-3-270m --patching --patch-seeds 1 --patch-tasks A,B,...
        # (a) on part of the tasks (e.g. half each in two processes): writes patching/TASK_seedS.csv only; then
        # --patching --patch-seeds 1 --committed-only summarises every task into claims.md and the figures
    .venv/bin/python benchmarks/head_claims.py --model smollm2-135m --patching --minimal
        # the same on the minimal-head-set study's dense fits (12 SmolLM2 / 6 Gemma 3 tasks, seeds 0-2,
        # their own t), into results/minimal/MODEL/claims/

Reads results/seeds/MODEL/rows/TASK/seedS/site.json (theta in the row's info) into
results/seeds/MODEL/theta.safetensors (kept: later runs read both); writes stability.csv,
categories.csv, patching/TASK_seedS.csv, patching.csv and claims.md next to it, and
figures/claims/MODEL_stability, MODEL_groups and MODEL_patching_kK.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file, save_file

from site_lens.analysis.overlap import (
    category_permutation_test,
    format_p,
    jaccard_matrix,
    permutation_null,
    seed_stability,
)
from site_lens.analysis.plots.claims import patching_contrast, permutation_null_figure, seed_stability_figure
from site_lens.analysis.plots.theme import save_figure
from site_lens.atlas import load_atlas
from site_lens.files import plain_modes
from site_lens.stats import bootstrap_interval

MIN_GAIN = 0.1  # SITE above zero-shot on a recovery's own metric, for (a)'s averages
MIN_TASKS = 5  # fewer tasks: no interval
DRAWS = 5  # random head sets per k
PAPER = (
    "Park et al. 2026 report 57.3 % accuracy with t patched into high-alpha heads and 6.2 % into low-alpha heads, "
    "on Llama-3.1-8B (1,024 heads); the plain first-token accuracies above are the comparable numbers here "
    "(other models, 4-bit, and k of this model's heads). The recoveries are this project's own measure "
    "(share of SITE's gain over zero-shot), not the paper's"
)


def collect_thetas(root: Path) -> dict[str, torch.Tensor]:
    """theta per "TASK/seedS": the file's entries, updated from the rows' info."""
    path = root / "theta.safetensors"
    thetas = dict(load_file(str(path))) if path.is_file() else {}
    for row in sorted(root.glob("rows/*/seed*/site.json")):
        r = json.loads(row.read_text())
        info = r.get("info") or {}  # none in a row restored from rows.csv: its theta is in the file already
        info = info if isinstance(info, dict) else ast.literal_eval(info)
        key = f"{r['task']}/seed{r['seed']}"
        if "theta" in info:
            thetas[key] = torch.tensor(info["theta"], dtype=torch.float32)
        elif key not in thetas:
            print(f"warning: {row} has no theta and {path.name} none for {key}: left out", flush=True)
    if thetas:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # processes started together each write their own
        save_file({k: v.contiguous() for k, v in sorted(thetas.items())}, str(tmp))
        plain_modes(tmp)  # safetensors writes 0600
        tmp.replace(path)
    return thetas


def minimal_adapters(folder: Path) -> dict[str, object]:
    """The dense SITE adapters of a sparsify folder, per "TASK/seedS" (each with its own t)."""
    import site_lens as sl

    return {
        f"{p.parent.parent.name}/{p.parent.name}": sl.load_adapter(p) for p in sorted(folder.glob("*/seed*/adapter"))
    }


def by_task(thetas: dict[str, torch.Tensor]) -> dict[str, dict[int, torch.Tensor]]:
    out: dict[str, dict[int, torch.Tensor]] = {}
    for key, theta in thetas.items():
        task, seed = key.rsplit("/seed", 1)
        out.setdefault(task, {})[int(seed)] = torch.sigmoid(theta)
    return out


def categories(model: str, results: Path) -> dict[str, str]:
    rows = pd.read_csv(results / model / "rows.csv")
    return dict(zip(rows.task, rows.category))


def stability(alphas: dict[str, dict[int, torch.Tensor]], k: int) -> pd.DataFrame:
    rows = []
    for task, seeds in sorted(alphas.items()):
        if len(seeds) >= 2:
            rows.append({"task": task, "seeds": ",".join(map(str, sorted(seeds))), **seed_stability(
                [seeds[s] for s in sorted(seeds)], k)})  # fmt: skip
    return pd.DataFrame(rows)


def families(tasks) -> dict[str, str]:
    """The finer groups the FV task names give: one family per name less its list length (animal_v_object_3
    and _5 are one family); a task alone in its family only adds pairs across families."""
    return {t: re.sub(r"_\d+$", "", t) for t in tasks}


def task_dependence(
    alphas: dict[str, dict[int, torch.Tensor]],
    groupings: dict[str, dict[str, str]],
    k: int,
    strata: dict[str, dict[str, str] | None] | None = None,
    blocks: dict[str, dict[str, str] | None] | None = None,
) -> tuple[pd.DataFrame, dict[str, tuple[float, np.ndarray]]]:
    """Per grouping and seed: the permutation test's row, and (observed gap, null gaps) for the figure.

    ``strata[grouping]`` keeps a coarser grouping fixed in the shuffles (families within categories);
    ``blocks[grouping]`` shuffles whole blocks (categories over whole families)."""
    rows, nulls = [], {}
    seeds = sorted({s for v in alphas.values() for s in v})
    for name, groups in groupings.items():
        for seed in seeds:
            one = {t: v[seed] for t, v in alphas.items() if seed in v and t in groups}
            if len({groups[t] for t in one}) < 2:
                continue
            matrix = jaccard_matrix(one, k)
            if len(one) == len({groups[t] for t in one}):  # every task alone in its group: nothing within
                continue
            within, whole = (strata or {}).get(name), (blocks or {}).get(name)
            test = category_permutation_test(matrix, groups, strata=within, blocks=whole)
            rows.append({"grouping": name, "seed": seed, "tasks": len(one), **test})
            observed, null = permutation_null(matrix, groups, strata=within, blocks=whole)  # the test's own shuffles
            if len(null):
                nulls[f"{name}, seed {seed}"] = (observed, null)
    return pd.DataFrame(rows), nulls


def patching(
    model_name: str, root: Path, data: str, alphas, thetas, ks: list[int], adapters=None, committed_only=False
) -> pd.DataFrame:
    import site_lens as sl
    from site_lens.analysis.patching import head_patching_sweep
    from site_lens.models import model_identity
    from site_lens.stages.embeddings import task_embedding

    model = None  # loaded when a (task, seed) is missing: committed files redraw without it
    out = root / "patching"
    out.mkdir(exist_ok=True)
    frames = []
    for task_name, seeds in sorted(alphas.items()):
        for seed in sorted(seeds):
            path = out / f"{task_name}_seed{seed}.csv"
            old = pd.read_csv(path) if path.is_file() else None
            made = old is not None and set(ks) <= set(old.k) and old.draw.max() + 1 == DRAWS
            if not made and committed_only:  # a redraw: only the (task, seed) pairs whose files exist
                continue
            if not made:  # absent, or made with other k or draws
                model = model or sl.load_model(model_name)
                task = sl.load_task(task_name, data_dir=data)
                adapter = (adapters or {}).get(f"{task_name}/seed{seed}")
                if adapter is None:  # the row's theta, and its t from stage 1 with the same seed
                    t = task_embedding(model, task, sl.EmbeddingConfig(), seed)
                    adapter = sl.Adapter(t=t, theta=thetas[f"{task_name}/seed{seed}"], model=model_identity(model))
                adapter.check_model(model_identity(model))
                df = head_patching_sweep(model, task, adapter, ks=ks, draws=DRAWS, max_items=50, seed=seed)
                df.insert(1, "seed", seed)
                tmp = path.with_suffix(".tmp")
                df.to_csv(tmp, index=False)
                tmp.replace(path)
                print(f"patching {task_name} seed {seed}: done", flush=True)
            frames.append(pd.read_csv(path))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def kept_pairs(df: pd.DataFrame) -> dict[str, set]:
    """Per recovery metric, the (task, seed) pairs whose SITE gain over zero-shot on its own denominator is >= MIN_GAIN."""
    out = {}
    for metric, value in (("recovery_acc", "acc"), ("recovery_prob", "prob")):
        ref = df[df.condition.isin(["zero_shot", "site"])].pivot_table(
            index=["task", "seed"], columns="condition", values=value
        )
        gain = ref["site"] - ref["zero_shot"]
        out[metric] = set(gain[gain >= MIN_GAIN].index)
    return out


def patching_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per k, condition and metric: mean recovery over the kept (task, seed) pairs, bootstrap interval over tasks.

    Fewer than MIN_TASKS tasks give no interval (NaN): a percentile bootstrap over so few says little.
    """
    keep = kept_pairs(df)
    rows = []
    heads = df[df.condition.isin(["top", "bottom", "random"])]
    for (k, cond), sub in heads.groupby(["k", "condition"]):
        for metric, pairs in keep.items():
            sel = sub[[pair in pairs for pair in zip(sub.task, sub.seed)]]
            m = sel.groupby(["task", "seed"])[metric].mean().unstack("seed")  # random: draws averaged
            if not len(m):
                continue
            est, low, high = bootstrap_interval(m.to_numpy())
            if len(m) < MIN_TASKS:
                low = high = float("nan")
            rows.append({"k": int(k), "condition": cond, "metric": metric, "tasks": len(m), "pairs": len(sel.groupby(
                ["task", "seed"])), "mean": est, "low": low, "high": high, "median": float(np.nanmedian(m.to_numpy()))})  # fmt: skip
    return pd.DataFrame(rows)


def plain_accuracy_lines(df: pd.DataFrame) -> list[str]:
    """(a) in plain first-token accuracy, every (task, seed) pair: SITE's own, zero-shot's, and t in k heads."""
    per = df.groupby(["task", "seed", "condition", "k"]).acc.mean().reset_index()  # random: draws averaged
    n_pairs = per.groupby(["task", "seed"]).ngroups
    own = {c: 100 * per[per.condition == c].acc.mean() for c in ("site", "zero_shot")}
    lines = [
        (
            f"(a) in plain first-token accuracy, mean over all {n_pairs} (task, seed) pairs (none left out): "
            f"SITE itself {own['site']:.1f} %, zero-shot {own['zero_shot']:.1f} %; t written into k heads:"
        ),
        "",
        "| k | top-alpha heads % | random heads % | bottom-alpha heads % |",
        "|---|---|---|---|",
    ]
    heads = per[per.condition.isin(["top", "random", "bottom"])]
    for kk, sub in heads.groupby("k"):
        m = sub.groupby("condition").acc.mean() * 100
        lines.append(f"| {int(kk)} | {m.get('top', np.nan):.1f} | {m.get('random', np.nan):.1f} | {m.get('bottom', np.nan):.1f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--results", default="results")
    ap.add_argument("--data", default="data/fv")
    ap.add_argument("--patching", action="store_true", help="also run (a), which loads the model")
    ap.add_argument("--figures", default="figures/claims")
    ap.add_argument("--minimal", action="store_true", help="alphas and t of results/minimal/MODEL's dense fits")
    ap.add_argument(
        "--atlas", default=None,
        help="alphas, t and categories from this atlas (e.g. atlases/MODEL), so the claims and the atlas agree",
    )  # fmt: skip
    ap.add_argument("--committed-only", action="store_true", help="(a) from the patching files there, no model")
    ap.add_argument(
        "--patch-seeds", type=lambda v: [int(x) for x in v.split(",")], default=None,
        help="(a) on these seeds only, e.g. 1 (default: every seed with alphas)",
    )  # fmt: skip
    ap.add_argument(
        "--patch-tasks", type=lambda v: [x.strip() for x in v.split(",") if x.strip()], default=None,
        help="(a) on these tasks only, to split it between processes: writes their patching files, no summary",
    )  # fmt: skip
    args = ap.parse_args()
    if args.atlas and args.minimal:
        ap.error("--atlas and --minimal name two sources of alphas: give one of them")
    if (args.patch_tasks or args.patch_seeds) and not args.patching:
        ap.error("--patch-tasks and --patch-seeds choose what (a) runs on: add --patching")
    if args.patch_tasks and args.committed_only:
        ap.error("--patch-tasks runs (a) on some tasks, --committed-only summarises every task: give one of them")
    results = Path(args.results)
    adapters = None
    if args.minimal:  # the sparsify folders' dense SITE fits: three seeds, t included
        adapters = minimal_adapters(results / "minimal" / args.model)
        thetas = {key: a.theta for key, a in adapters.items()}
        root = results / "minimal" / args.model / "claims"
        root.mkdir(exist_ok=True)
        fig_stem = f"{args.model}_minimal"
    elif args.atlas:  # the shipped atlas: every (task, seed) map with its own t
        atlas = load_atlas(args.atlas)
        if atlas.model["name"] != args.model:
            ap.error(f"--atlas {args.atlas} is an atlas of {atlas.model['name']}, not {args.model}")
        import site_lens as sl

        if atlas.manifest.get("config", {}).get("embedding") != sl.EmbeddingConfig().to_dict():
            # (a)'s committed patching files were made with t from stage 1 at the default settings: the atlas's
            # t must be that t for them to stand for it (with a theta that equals the atlas's, checked below)
            ap.error(f"--atlas {args.atlas}: its t was made with other embedding settings than the patching files")
        adapters = {f"{t}/seed{s}": atlas.adapter(t, s) for t in atlas.tasks for s in atlas.seeds if f"{t}/seed{s}" in atlas.t}
        thetas = {key: a.theta for key, a in adapters.items()}
        root = results / "seeds" / args.model
        fig_stem = args.model
        fitted = collect_thetas(root)  # what the committed patching files were made with
        differ = sorted(k for k, v in thetas.items() if k in fitted and not torch.equal(fitted[k].flatten(), v.flatten()))
        if differ:
            ap.error(f"--atlas {args.atlas}: theta of {', '.join(differ[:3])} differs from {root}'s fits")
    else:
        root = results / "seeds" / args.model
        thetas = collect_thetas(root)
        fig_stem = args.model
    alphas = by_task(thetas)
    unknown = sorted(set(args.patch_tasks or []) - set(alphas))
    if unknown:
        ap.error(f"--patch-tasks: no SITE fits for {', '.join(unknown)}")
    n_heads = next(iter(thetas.values())).numel()
    ks = [round(f * n_heads) for f in (0.1, 0.25, 0.5)]
    chosen = {t: {s: a for s, a in v.items() if args.patch_seeds is None or s in args.patch_seeds}
              for t, v in alphas.items() if args.patch_tasks is None or t in args.patch_tasks}  # fmt: skip
    if args.patch_tasks:  # one process's share of (a): the files only; the summary reads them all afterwards
        df = patching(args.model, root, args.data, chosen, thetas, ks, adapters)
        n_pairs = df.groupby(["task", "seed"]).ngroups if len(df) else 0
        print(f"(a): {n_pairs} (task, seed) pairs in {root / 'patching'}; summarise with --patching --committed-only")
        return
    k = round(0.1 * n_heads)
    cats = {t: atlas.category(t) for t in atlas.tasks} if args.atlas else categories(args.model, results)
    source = (
        "the minimal-head-set study's dense SITE fits" if args.minimal
        else f"the atlas {Path(args.atlas).name} (SITE fits of seeds {', '.join(map(str, atlas.seeds))})" if args.atlas
        else "the seed runs' SITE fits"
    )  # fmt: skip
    lines = [f"# {args.model}: head-specificity claims (k = {k} of {n_heads} heads), from {source}", ""]
    stab = stability(alphas, k)
    if len(stab):
        stab.round(4).to_csv(root / "stability.csv", index=False)
        save_figure(seed_stability_figure(stab), Path(args.figures) / f"{fig_stem}_stability")
        above = int((stab.jaccard > stab.jaccard_chance).sum())
        lines += [
            (
                f"(c) stability over {len(stab)} tasks with two or more seeds: median Spearman of alphas across seeds "
                f"{stab.spearman.median():.2f} (range {stab.spearman.min():.2f} to {stab.spearman.max():.2f}); "
                f"median top-{k} Jaccard {stab.jaccard.median():.2f} against {stab.jaccard_chance.iloc[0]:.3f} by chance; "
                f"{above} of {len(stab)} tasks above chance."
            ),
            "",
        ]
    fams = families(cats)
    dep, nulls = task_dependence(alphas, {"category": cats, "family": fams}, k, {"family": cats}, {"category": fams})
    if len(dep):
        dep.round(4).to_csv(root / "categories.csv", index=False)
        save_figure(permutation_null_figure(nulls), Path(args.figures) / f"{fig_stem}_groups")
        lines += [
            (
                "(b) top-k Jaccard between tasks, within vs across groups: category (abstractive / extractive; "
                "categories shuffled over whole families, since a family's tasks always share a category) and "
                "family (one task at two list lengths, e.g. animal_v_object_3 and _5; families shuffled within "
                "categories, so the test asks what a family shares beyond its category). p: one-sided "
                f"(more sharing within), {int(dep.n_perm.iloc[0]):,} shuffles, the observed labelling counted, so "
                f"never below 1/{int(dep.n_perm.iloc[0]) + 1:,}. The category gap is also given with the pairs "
                "inside a family left out (p from the same shuffles). Values rounded once, from the raw means:"
            ),
            "",
            "| grouping | seed | tasks | pairs within | within | across | gap | p | gap without family pairs | p |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in dep.to_dict("records"):
            excl = r.get("gap_excl", float("nan"))
            ex = "- | -" if pd.isna(excl) else f"{excl:+.3f} | {format_p(r['p_excl'], r['n_perm'])}"
            lines.append(
                f"| {r['grouping']} | {r['seed']} | {r['tasks']} | {r['n_within']} | {r['within']:.3f} | "
                f"{r['across']:.3f} | {r['gap']:+.3f} | {format_p(r['p_value'], r['n_perm'])} | {ex} |"
            )
        lines.append("")
    if args.patching:
        df = patching(args.model, root, args.data, chosen, thetas, ks, adapters, args.committed_only)
    if args.patching and df.empty:  # a redraw with no patching files: (a) has not been run for these fits
        lines += ["(a) patching: no (task, seed) pair has been run yet (head_claims.py --patching runs it).", ""]
    elif args.patching:
        summ = patching_summary(df)
        summ.round(4).to_csv(root / "patching.csv", index=False)
        keep = kept_pairs(df)["recovery_acc"]
        shown = df[[pair in keep for pair in zip(df.task, df.seed)]]
        for kk in ks:
            fig = patching_contrast(shown[shown.k == kk], k=kk)
            save_figure(fig, Path(args.figures) / f"{fig_stem}_patching_k{kk}")
        n_pairs = df.groupby(["task", "seed"]).ngroups
        head = (
            f"(a) patching t into k heads: {n_pairs} (task, seed) pairs; each recovery over the pairs where SITE "
            f"gains >= {MIN_GAIN} over zero-shot on that metric (first-token accuracy: {len(keep)} pairs); "
            f"intervals: bootstrap over tasks, none below {MIN_TASKS} tasks. Figures: the accuracy pairs."
        )
        lines += [head, ""]
        lines += [
            "| k | heads | recovery of | tasks | mean | 95 % interval | median |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in summ.itertuples():
            what = "first-token accuracy" if r.metric == "recovery_acc" else "answer probability"
            lines.append(
                f"| {r.k} | {r.condition} | {what} | {r.tasks} | {r.mean:.3f} | [{r.low:.3f}, {r.high:.3f}] | "
                f"{r.median:.3f} |"
            )
        lines += ["", *plain_accuracy_lines(df), "", PAPER + ".", ""]
    (root / "claims.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
