"""The bench's tables: per-method means over the tasks every method finished, and their CSV and markdown.

Pure functions of the rows (dicts with ``ROW_FIELDS``), so a notebook or a
script can summarise rows gathered from anywhere without a model.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

from ..methods import METHODS

METRICS = ("first_token_acc", "exact_match", "strict_match")
OPTIONAL = ("option_acc",)  # multiple-choice tasks only (methods.score_method); None elsewhere
COSTS = ("n_trainable", "fit_seconds", "ms_per_query")
ROW_FIELDS = ("task", "category", "method", "seed", *METRICS, *OPTIONAL, *COSTS, "n_test")  # rows.csv's columns


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per method: means over the (task, seed) pairs every method finished, overall and per category.

    A partial run thus compares methods on the same tasks; ``n_tasks_run`` counts each method's own.
    """
    out = []
    methods = list(dict.fromkeys(m for m in METHODS if any(r["method"] == m for r in rows)))
    methods += sorted({r["method"] for r in rows} - set(methods))
    done = [{(r["task"], r["seed"]) for r in rows if r["method"] == m} for m in methods]
    common = set.intersection(*done) if done else set()
    cats = sorted({r["category"] for r in rows})
    for m in methods:
        rs = [r for r in rows if r["method"] == m and (r["task"], r["seed"]) in common]
        s: dict[str, Any] = {
            "method": m,
            "n_tasks": len({r["task"] for r in rs}),
            "n_tasks_run": len({r["task"] for r in rows if r["method"] == m}),
            "n_rows": len(rs),
        }
        for k in (*METRICS, *COSTS):
            s[k] = sum(r[k] for r in rs) / len(rs) if rs else None
        for k in OPTIONAL:  # over the rows that have it (multiple-choice tasks)
            vs = [r[k] for r in rs if r.get(k) is not None]
            s[k] = sum(vs) / len(vs) if vs else None
        for c in cats:
            cr = [r["exact_match"] for r in rs if r["category"] == c]
            s[f"exact_match_{c}"] = sum(cr) / len(cr) if cr else None
        out.append(s)
    return out


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def markdown(rows: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]], title: str = "") -> str:
    """The summary table (exact match in %, over the tasks every method finished), then exact match per task."""
    lines = [f"# {title}".rstrip(), ""] if title else []
    cats = [k[len("exact_match_") :] for k in (summary[0] if summary else {}) if k.startswith("exact_match_")]
    has_options = any(s.get("option_acc") is not None for s in summary)
    head = [
        "method",
        "tasks",
        "tasks run",
        "first-token %",
        "prefix %",
        "strict %",
        *(["option %"] if has_options else []),
        *[f"prefix % {c}" for c in cats],
        "trainable params",
        "fit s",
        "ms/query",
    ]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        pct = lambda v: "-" if v is None else f"{100 * v:.1f}"
        num = lambda v, f: "-" if v is None else format(v, f)
        cells = [
            s["method"],
            str(s["n_tasks"]),
            str(s["n_tasks_run"]),
            pct(s["first_token_acc"]),
            pct(s["exact_match"]),
            pct(s["strict_match"]),
            *([pct(s.get("option_acc"))] if has_options else []),
            *[pct(s[f"exact_match_{c}"]) for c in cats],
            num(s["n_trainable"], ",.0f"),
            num(s["fit_seconds"], ".1f"),
            num(s["ms_per_query"], ".1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    done = [{r["task"] for r in rows if r["method"] == s["method"]} for s in summary]
    common = set.intersection(*done) if done else set()  # the tasks the means are over
    with_options = sorted({r["task"] for r in rows if r["task"] in common and r.get("option_acc") is not None})
    if has_options and len(with_options) < len(common):
        lines += ["", f"option % is the mean over the tasks with options only ({', '.join(with_options)})."]
    methods = [s["method"] for s in summary]
    tasks = sorted({(r["category"], r["task"]) for r in rows})
    lines += [
        "",
        "Prefix match (%) per task (mean over seeds):",
        "",
        "| task | category | " + " | ".join(methods) + " |",
        "|" + "---|" * (len(methods) + 2),
    ]
    for c, t in tasks:
        cells = []
        for m in methods:
            v = [r["exact_match"] for r in rows if r["task"] == t and r["method"] == m]
            cells.append(f"{100 * sum(v) / len(v):.0f}" if v else "-")
        lines.append(f"| {t} | {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
