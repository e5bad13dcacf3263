"""Attribution patching against measured single-head patching, and its cost against CIE, per FV task.

For each task: t from stage 1 (the project's M and N unless ``--prompts`` / ``--shots`` say
otherwise), or with ``--adapters`` the dense SITE t of a ``site-lens sparsify`` folder, then on the first ``--items`` zero-shot test items every head's effect on the
log-probability of the answer's first token of writing t into it, estimated
(``analysis.attribution.attribution_scores``) and measured (``exact_head_effects``), with the
Spearman and Pearson correlations between the two over all heads. FV's causal indirect effect
(``analysis.cie.causal_indirect_effect``) on as many shuffled-label prompts (``--items``, FV's
N shots) is run too, and its Spearman correlation with both.

Times, side by side in one process (one untimed warm-up of each, then ``--repeats`` rounds,
the order rotating between rounds): the attribution, the measured effects on the same
zero-shot prompts, and CIE; medians are reported with their ratios to the attribution.
CIE's prompts are N-shot (longer than the zero-shot ones): their mean lengths are recorded.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_attribution.py --data data/fv \\
        --tasks antonym,capitalize,country-capital,english-french,present-past,singular-plural \\
        --out benchmarks/results/attribution.json
    # the tasks and t of the minimal-head-set study (results/minimal; TASKS: its 12 tasks, BENCHMARKS.md):
    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_attribution.py --data data/fv \
        --adapters results/minimal/smollm2-135m --tasks "$TASKS" --items 25 --repeats 1 \
        --out benchmarks/results/attribution_smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import site_lens as sl
from site_lens.analysis.attribution import attribution_scores, exact_head_effects, zero_shot_examples
from site_lens.analysis.cie import causal_indirect_effect, shuffled_label_prompts
from site_lens.stages.embeddings import task_embedding
from site_lens.stats import pearson, spearman, top_k_mask
from site_lens.tokens import encode


def top_overlap(a: torch.Tensor, b: torch.Tensor, k: int) -> float:
    """Share of the k largest heads of ``a`` that are among the k largest of ``b``."""
    return int((top_k_mask(a, k) & top_k_mask(b, k)).sum()) / k


def one_task(model, name: str, args) -> dict:
    """Scores, correlations and median times on one task."""
    task = sl.load_task(name, data_dir=args.data)
    cfg = sl.EmbeddingConfig(**{k: v for k, v in (("n_prompts", args.prompts), ("n_shots", args.shots)) if v})
    if args.adapters:  # the dense SITE t of a sparsify folder: the t its matched-k comparison used
        adapter = sl.load_adapter(Path(args.adapters) / name / f"seed{args.seed}" / "adapter")
        adapter.check_model(sl.model_identity(model))
        t = adapter.t
    else:
        t = task_embedding(model, task, cfg, args.seed)
    examples = zero_shot_examples(model, task, "test", args.items)
    n = len(examples)
    cie_prompts = shuffled_label_prompts(task, n, cfg.n_shots, args.seed)
    runs = {
        "attribution": lambda: attribution_scores(model, examples, t, batch_size=args.batch_size),
        "exact": lambda: exact_head_effects(model, examples, t),
        "cie": lambda: causal_indirect_effect(model, cie_prompts, t),
    }
    scores = {k: run() for k, run in runs.items()}  # also the warm-up
    seconds: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for r in range(args.repeats):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            runs[k]()
            seconds[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    attr, exact, cie = (scores[k] for k in names)
    k = min(args.top_k, attr.numel())
    res = {
        "task": name,
        "items": n,
        "n_prompts": cfg.n_prompts,
        "n_shots": cfg.n_shots,
        "mean_tokens": {
            "zero_shot": statistics.mean(len(e.tokens) for e in examples),
            "cie": statistics.mean(len(x) for x in encode(model, [p for p, _ in cie_prompts])),
        },
        "spearman": spearman(attr, exact),
        "pearson": pearson(attr, exact),
        f"top{k}_overlap": top_overlap(attr, exact, k),
        "spearman_cie": {"attribution": spearman(attr, cie), "exact": spearman(exact, cie)},
        "seconds": seconds,
        "median_s": med,
        "ratio_to_attribution": {key: med[key] / med["attribution"] for key in med},
        "scores": {key: v.tolist() for key, v in scores.items()},
    }
    print(
        f"{name}: spearman {res['spearman']:.3f}, pearson {res['pearson']:.3f}, top-{k} overlap "
        f"{res[f'top{k}_overlap']:.2f}; median s: " + ", ".join(f"{key} {v:.2f}" for key, v in med.items()),
        flush=True,
    )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default="data/fv", help="FV task folders (default: data/fv, from site-lens data fv)")
    ap.add_argument("--tasks", default="antonym", help="comma-separated task names under --data")
    ap.add_argument("--items", type=int, default=50, help="zero-shot test items (and CIE prompts) per task")
    ap.add_argument("--prompts", type=int, default=None, help="stage 1's M (default: the project's)")
    ap.add_argument("--shots", type=int, default=None, help="stage 1's and CIE's N (default: the project's)")
    ap.add_argument("--batch-size", type=int, default=16, help="prompts per attribution forward and backward pass")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--adapters", default=None, help="a sparsify folder: t from its TASK/seedS/adapter (default: stage 1)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = sl.load_model(args.model)
    results = [one_task(model, name.strip(), args) for name in args.tasks.split(",") if name.strip()]
    out = {
        "model": args.model,
        "identity": sl.model_identity(model),
        "threads": torch.get_num_threads(),
        "device": str(model.cfg.device),
        "args": vars(args),
        "tasks": results,
        "median_spearman": statistics.median(r["spearman"] for r in results),
    }
    print(json.dumps({r["task"]: {"spearman": r["spearman"], "median_s": r["median_s"]} for r in results}, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
