"""Seeds and intervals from ``site-lens bench`` rows (no model): how sure each headline number is.

    rows = read_rows(["results/smollm2-135m/rows.csv", "results/seeds/smollm2-135m/rows.csv"])
    method_intervals(rows, ["zero_shot", "icl", "site", "i2cl"])   # mean over tasks and seeds, 95 % interval
    paired_differences(rows, "site", ["icl", "i2cl"])              # SITE minus each, paired by task
    seed_spread(rows, ["icl", "site"])                            # per task: the seeds' mean, sd and range

``method_intervals`` is over the tasks every named method finished with at least one seed, so
methods are compared on the same tasks; a paired difference over the tasks both of its methods
finished. A method's estimate is the mean over tasks of the
task's mean over its seeds; the interval is ``stats.bootstrap_interval``'s (tasks resampled,
each with its seeds). A difference is paired by task: per task, the mean over the seeds both
methods ran of their rows' difference. Rows with one seed number share no random draw across
methods (ICL draws its demonstrations from ``Random(seed + 1)``, SITE its stage-1 prompts and
training order from ``Random(seed)``), so the seeds are repeats, not matched pairs.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..stats import bootstrap_interval

METRICS = {"exact_match": "prefix match", "strict_match": "strict match"}
NUMERIC = ("first_token_acc", "exact_match", "strict_match")


def read_rows(paths: Iterable[str | Path]) -> pd.DataFrame:
    """The rows.csv files together; a (task, method, seed) given twice must agree, else ValueError."""
    frames = []
    for p in paths:
        with open(p) as f:
            frames.append(pd.DataFrame(list(csv.DictReader(f))))
    rows = pd.concat(frames, ignore_index=True)
    missing = {"task", "method", "seed", *NUMERIC} - set(rows.columns)
    if missing:
        raise ValueError(f"rows lack the columns {sorted(missing)}")
    rows["seed"] = rows["seed"].astype(int)
    for k in NUMERIC:
        rows[k] = rows[k].astype(float)
    key = ["task", "method", "seed"]
    twice = rows[rows.duplicated(key, keep=False)]
    if len(twice) and (twice.groupby(key)[list(NUMERIC)].nunique() > 1).any(axis=None):
        raise ValueError("a (task, method, seed) appears twice with different scores")
    return rows.drop_duplicates(key).reset_index(drop=True)


def common_tasks(rows: pd.DataFrame, methods: Sequence[str]) -> list[str]:
    """The tasks every method in ``methods`` has a row for."""
    have = [set(rows.task[rows.method == m]) for m in methods]
    return sorted(set.intersection(*have)) if have else []


def score_matrix(rows: pd.DataFrame, method: str, metric: str, tasks: Sequence[str]) -> pd.DataFrame:
    """(task, seed) scores of one method, NaN where a seed did not run."""
    sub = rows[(rows.method == method) & rows.task.isin(tasks)]
    return sub.pivot(index="task", columns="seed", values=metric).reindex(index=list(tasks))


def _interval_row(values: np.ndarray, n_boot: int) -> dict:
    est, low, high = bootstrap_interval(values, n_boot=n_boot)
    counts = (~np.isnan(values)).sum(1)
    return {"n_tasks": int((counts > 0).sum()), "n_rows": int(counts.sum()), "mean": est, "low": low, "high": high}


def method_intervals(
    rows: pd.DataFrame, methods: Sequence[str], metrics: Sequence[str] = tuple(METRICS), n_boot: int = 10_000
) -> pd.DataFrame:
    """Per method and metric: tasks, rows, mean over tasks and seeds, and the 95 % interval."""
    tasks = common_tasks(rows, methods)
    out = []
    for method in methods:
        for metric in metrics:
            m = score_matrix(rows, method, metric, tasks)
            seeds = ",".join(str(s) for s in m.columns)
            out.append({"method": method, "metric": metric, "seeds": seeds, **_interval_row(m.to_numpy(), n_boot)})
    return pd.DataFrame(out)


def paired_differences(
    rows: pd.DataFrame,
    method: str,
    others: Sequence[str],
    metrics: Sequence[str] = tuple(METRICS),
    n_boot: int = 10_000,
) -> pd.DataFrame:
    """``method`` minus each other, over the (task, seed) rows both ran, paired by task: mean, interval, tasks won and lost."""
    out = []
    for other in others:
        tasks = common_tasks(rows, [method, other])
        for metric in metrics:
            a, b = score_matrix(rows, method, metric, tasks), score_matrix(rows, other, metric, tasks)
            shared = sorted(set(a.columns) & set(b.columns))
            diff = (a[shared] - b[shared]).to_numpy()  # NaN where either lacks the seed
            has = ~np.isnan(diff).all(1)
            if not has.any():
                continue  # no shared seed
            per_task = np.nanmean(diff[has], axis=1)
            out.append(
                {
                    "difference": f"{method} - {other}",
                    "metric": metric,
                    **_interval_row(diff, n_boot),
                    "tasks_ahead": int((per_task > 0).sum()),
                    "tasks_behind": int((per_task < 0).sum()),
                }
            )
    return pd.DataFrame(out)


def seed_spread(rows: pd.DataFrame, methods: Sequence[str], metric: str = "exact_match") -> pd.DataFrame:
    """Per task and method with two or more seeds: the seeds, their mean, sd (n - 1) and range of ``metric``."""
    sub = rows[rows.method.isin(methods)]
    g = sub.groupby(["task", "method"])[metric]
    table = g.agg(n_seeds="count", mean="mean", sd="std", low="min", high="max").reset_index()
    table["range"] = table["high"] - table["low"]
    return table[table.n_seeds >= 2].reset_index(drop=True)


def markdown(intervals: pd.DataFrame, differences: pd.DataFrame, spread: pd.DataFrame, title: str = "") -> str:
    """The three tables in %, intervals in brackets."""

    def pct(x: float) -> str:
        return f"{100 * x:.1f}"

    lines = [f"# {title}", ""] if title else []
    lines += ["| method | metric | seeds | tasks | rows | mean % | 95 % interval |", "|---|---|---|---|---|---|---|"]
    for r in intervals.itertuples():
        lines.append(
            f"| {r.method} | {METRICS.get(r.metric, r.metric)} | {r.seeds} | {r.n_tasks} | {r.n_rows} | "
            f"{pct(r.mean)} | [{pct(r.low)}, {pct(r.high)}] |"
        )
    if len(differences):
        lines += [
            "",
            "| paired difference | metric | tasks | pairs | mean (points) | 95 % interval | tasks ahead / behind |",
        ]
        lines += ["|---|---|---|---|---|---|---|"]
        for r in differences.itertuples():
            lines.append(
                f"| {r.difference} | {METRICS.get(r.metric, r.metric)} | {r.n_tasks} | {r.n_rows} | {pct(r.mean)} | "
                f"[{pct(r.low)}, {pct(r.high)}] | {r.tasks_ahead} / {r.tasks_behind} |"
            )
    if len(spread):
        s = spread.groupby("method")
        lines += ["", "Seed spread of prefix match per task (tasks with two or more seeds):", ""]
        lines += [
            "| method | tasks | median sd (points) | median range | largest range (task) |",
            "|---|---|---|---|---|",
        ]
        for method, g in s:
            worst = g.loc[g["range"].idxmax()]
            lines.append(
                f"| {method} | {len(g)} | {pct(g.sd.median())} | {pct(g['range'].median())} | "
                f"{pct(worst['range'])} ({worst.task}) |"
            )
    return "\n".join(lines) + "\n"
