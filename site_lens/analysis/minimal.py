"""Minimal head sets: task accuracy against the number of heads t is written into.

A *head set* is a gate: t injected at the last prompt token with alpha = 1 on
the set's heads and 0 elsewhere (a binary set), or a sparse gate's own soft
alpha. Every set is scored the same way (``score_head_sets``): greedy
generation on a split, exact match (the paper's prefix match), first-token
accuracy and the answer's first-token probability.

    sets = ranking_sets(dense.alpha, ks, "dense_alpha") + ranking_sets(cie, ks, "cie")
    sets += random_sets(dense.alpha.shape, ks, draws=3, seed=0) + sparse_sets(fits)
    df = score_head_sets(model, task, dense.t, sets, "valid")
    df = add_recovery(df)        # 0 = zero-shot, 1 = dense SITE, per split and seed
    smallest_k(valid_df, test_df)

Recovery is normalised between zero-shot (0) and dense SITE (1), on exact
match and on the answer's probability. ``smallest_k`` picks, per selection
method, the smallest k whose *valid* recovery reaches the target and reports
the *test* score of that same set.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..metrics import exact_match, first_token_accuracy, settled_match
from ..stages.generation import generate_under_gates
from ..stats import top_k_mask, wilson_interval
from ..tasks import Task, zero_shot_prompts
from ..tokens import answer_ids, encode
from ..types import Model
from .overlap import jaccard

HeadMask = Bool[Tensor, "layer head_index"]
METRICS = ("exact_match", "first_token_acc", "prob")


@dataclass
class HeadSet:
    """One gate to score: ``alpha`` (binary for a set, soft for a sparse gate) and what it is.

    Example:
        >>> import torch
        >>> alpha = torch.zeros(2, 4)
        >>> alpha[1, 2] = alpha[0, 3] = 1.0              # patch t into two heads, leave the rest alone
        >>> two = HeadSet(method="by_hand", alpha=alpha, k=2)
        >>> two.mode, two.k
        ('binary', 2)
        >>> soft = HeadSet(method="site", alpha=torch.full((2, 4), 0.5), k=8, mode="soft")   # a dense gate as is
    """

    method: str  # dense_alpha, cie, random, sparse_l0, sparse_l1, site, zero_shot, shared ...
    alpha: Float[Tensor, "layer head_index"]
    k: int  # heads with alpha > 0
    draw: int = 0
    weight: float | None = None  # sparse SITE's penalty weight
    threshold: float | None = None  # the threshold that made a binary set from a sparse gate
    mode: str = "binary"  # binary (alpha in {0, 1}) or soft


def mask_alpha(mask: HeadMask) -> Float[Tensor, "layer head_index"]:
    """alpha = 1 on the mask's heads, 0 elsewhere."""
    return mask.float()


def ranking_sets(score: Float[Tensor, "layer head_index"], ks: Iterable[int], method: str) -> list[HeadSet]:
    """The top-k heads of a one-shot ranking (dense alpha, CIE ...) for each k."""
    return [HeadSet(method, mask_alpha(top_k_mask(score, k)), int(k)) for k in ks]


def random_sets(shape: Sequence[int], ks: Iterable[int], draws: int = 3, seed: int = 0) -> list[HeadSet]:
    """``draws`` uniformly random k-sets for each k (seeded, reproducible)."""
    rng = random.Random(seed)
    n = int(shape[0]) * int(shape[1])
    out = []
    for d in range(draws):
        for k in ks:
            m = torch.zeros(n, dtype=torch.bool)
            m[rng.sample(range(n), int(k))] = True
            out.append(HeadSet("random", mask_alpha(m.view(int(shape[0]), int(shape[1]))), int(k), draw=d))
    return out


def sparse_sets(fits, thresholds: Sequence[float] = (0.5,), soft: bool = True) -> list[HeadSet]:
    """Each sparse fit's binary mask at every threshold (and, with ``soft``, its own soft gate)."""
    out = []
    for f in fits:
        method = f"sparse_{f.sparsity.penalty}"
        w = f.sparsity.weight
        if soft:
            a = f.alpha.float()
            out.append(HeadSet(method, a, int((a > 0).sum()), weight=w, mode="soft"))
        for thr in thresholds:
            m = f.mask(thr)
            out.append(HeadSet(method, mask_alpha(m), int(m.sum()), weight=w, threshold=thr))
    return out


def answer_budget(model: Model, pairs: Sequence[tuple[str, str]], extra: int = 3) -> int:
    """Tokens to generate so that every answer fits: the longest answer's tokens (in context) plus ``extra``."""
    return max(len(answer_ids(model, p, a)) for p, a in zero_shot_prompts(pairs)) + extra


@torch.inference_mode()
def score_head_sets(
    model: Model,
    task: Task,
    t: Float[Tensor, "layer head_index d_head"],
    sets: Sequence[HeadSet],
    split: str = "valid",
    max_items: int | None = 100,
    max_new_tokens: int | None = None,
    batch_size: int = 64,
) -> pd.DataFrame:
    """Exact match, first-token accuracy and answer probability of each gate on a split (one row per set).

    Generation stops at a newline, once a row's exact match is settled (``metrics.settled_match``),
    or after ``max_new_tokens`` (default ``answer_budget``: every answer fits, so prefix-match
    exact match equals a 20-token generation's unless the model spells an answer in more tokens
    than the reference). Zero-shot and the gates share the prompts.

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> task = sl.load_task("uppercase")
        >>> fit = sl.fit_site(model, task, cfg)
        >>> alpha = torch.zeros(2, 4)
        >>> alpha[1, 2] = 1.0
        >>> sets = [sl.HeadSet("zero_shot", torch.zeros(2, 4), 0), sl.HeadSet("one_head", alpha, 1),
        ...         sl.HeadSet("site", fit.adapter.alpha, 8, mode="soft")]
        >>> df = score_head_sets(model, task, fit.adapter.t, sets, split="valid", max_items=4)
        >>> df["method"].tolist(), df["n"].tolist()       # one row per set, scored on the same 4 items
        (['zero_shot', 'one_head', 'site'], [4, 4, 4])
        >>> sorted({"exact_match", "first_token_acc", "prob"} & set(df.columns))
        ['exact_match', 'first_token_acc', 'prob']
    """
    pairs = task.split(split)[:max_items]
    if not pairs:
        raise ValueError(f"task '{task.name}' has no {split} items to score head sets on")
    prompts = zero_shot_prompts(pairs)
    tokens = encode(model, [p for p, _ in prompts])
    targets = torch.tensor([answer_ids(model, p, a)[0] for p, a in prompts])
    budget = max_new_tokens or answer_budget(model, pairs)
    cs = bool(task.case_sensitive)
    answers = [a for _, a in prompts]

    def settled(i: int, toks: list[int]) -> bool:  # a row whose exact match is decided needs no more tokens
        return settled_match(model.tokenizer.decode(toks), answers[i], cs) is not None

    runs = generate_under_gates(
        model, tokens, t, [s.alpha for s in sets], max_new_tokens=budget, batch_size=batch_size, finished=settled
    )
    rows = []
    for s, (new, first) in zip(sets, runs):
        preds = [model.tokenizer.decode(n) for n in new]
        em = [exact_match(p, a, cs) for p, a in zip(preds, answers)]  # equal to settled_match where it is settled
        probs = first.float().softmax(-1)[torch.arange(len(targets)), targets]
        rows.append(
            {
                "task": task.name,
                "split": split,
                "method": s.method,
                "mode": s.mode,
                "k": s.k,
                "draw": s.draw,
                "weight": s.weight,
                "threshold": s.threshold,
                "exact_match": float(np.mean(em)),
                "first_token_acc": first_token_accuracy(first, targets),
                "prob": float(probs.mean()),
                "n": len(pairs),
                "heads": heads_string(s.alpha),
            }
        )
    return pd.DataFrame(rows)


def heads_string(alpha: Float[Tensor, "layer head_index"]) -> str:
    """'L.H' of every head with alpha > 0, space-separated (a CSV-friendly record of the set)."""
    idx = (alpha > 0).nonzero().tolist()
    return " ".join(f"{layer}.{head}" for layer, head in idx)


def parse_heads(text: str | float) -> set[tuple[int, int]]:
    """The heads of a ``heads_string`` (an empty set, read back from CSV, is NaN)."""
    if not isinstance(text, str) or not text.strip():
        return set()
    return {tuple(int(x) for x in h.split(".")) for h in text.split()}  # type: ignore[misc]


def reference_sets(alpha: Float[Tensor, "layer head_index"]) -> list[HeadSet]:
    """Zero-shot (no head) and dense SITE (its soft alpha): recovery's 0 and 1."""
    return [
        HeadSet("zero_shot", torch.zeros_like(alpha.float()), 0),
        HeadSet("site", alpha.float(), int((alpha > 0).sum()), mode="soft"),
    ]


def add_recovery(df: pd.DataFrame, by: Sequence[str] = ("task", "split", "seed")) -> pd.DataFrame:
    """recovery_em and recovery_prob: (x - zero_shot) / (site - zero_shot) within each group; gain columns too."""
    keys = [c for c in by if c in df.columns]
    out = []
    for _, g in df.groupby(keys, dropna=False, sort=False):
        g = g.copy()
        zs = g[g.method == "zero_shot"].iloc[0]
        ref = g[g.method == "site"].iloc[0]
        for metric, col in (("exact_match", "recovery_em"), ("prob", "recovery_prob")):
            den = ref[metric] - zs[metric]
            g[col] = (g[metric] - zs[metric]) / den if den != 0 else np.nan
        g["site_gain_em"] = ref["exact_match"] - zs["exact_match"]
        out.append(g)
    return pd.concat(out, ignore_index=True)


def _curve(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One value per (method, k, weight, threshold, mode): random draws averaged."""
    keys = ["method", "k", "mode"]
    extra = ["weight", "threshold"]
    g = df.fillna({c: -1.0 for c in extra}).groupby(keys + extra, as_index=False)
    return g.agg(value=(metric, "mean"), exact_match=("exact_match", "mean"), n=("n", "first"))


SMALLEST_FIELDS = (
    "k", "weight", "threshold", "valid_value", "test_value", "test_exact_match", "test_em_low", "test_em_high", "n_test",
)  # fmt: skip


def smallest_k(
    valid: pd.DataFrame,
    test: pd.DataFrame,
    target: float = 0.9,
    metric: str = "recovery_em",
    methods: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Per method: the smallest binary set whose valid ``metric`` reaches ``target``, and that set's test scores.

    ``valid`` and ``test`` are one task and seed, with recovery (``add_recovery``). Sparse
    methods choose among their (weight, threshold) masks; rankings and random among k.
    Every field is None where no set reaches the target on valid. For random sets the test
    numbers are the mean over the draws of that k.
    """
    rows = []
    vb, tb = valid[valid["mode"] == "binary"], test[test["mode"] == "binary"]
    methods = methods or [m for m in vb.method.unique() if m not in ("zero_shot", "site")]
    for m in methods:
        cv, ct = _curve(vb[vb.method == m], metric), _curve(tb[tb.method == m], metric)
        hit = cv[cv.value >= target].sort_values(["k", "weight", "threshold"])
        row: dict = {"method": m, "target": target, "metric": metric, **dict.fromkeys(SMALLEST_FIELDS)}
        if len(hit):
            best = hit.iloc[0]
            sel = (ct.k == best.k) & (ct.weight == best.weight) & (ct.threshold == best.threshold)
            if sel.any():
                tr = ct[sel].iloc[0]
                lo, hi = wilson_interval(tr.exact_match * tr.n, int(tr.n))
                row.update(
                    k=int(best.k),
                    weight=None if best.weight < 0 else float(best.weight),
                    threshold=None if best.threshold < 0 else float(best.threshold),
                    valid_value=float(best.value),
                    test_value=float(tr.value),
                    test_exact_match=float(tr.exact_match),
                    test_em_low=lo,
                    test_em_high=hi,
                    n_test=int(tr.n),
                )
        rows.append(row)
    return pd.DataFrame(rows)


def seed_overlap(sets: Sequence[set]) -> float:
    """Mean pairwise Jaccard overlap of the head sets of several seeds (nan for fewer than two)."""
    pairs = list(itertools.combinations(sets, 2))
    return float(np.mean([jaccard(a, b) for a, b in pairs])) if pairs else float("nan")
