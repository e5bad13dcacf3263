"""Making an atlas: from finished ``site-lens bench`` folders, nothing trained again.

    atlas = assemble_atlas(model, ["results/smollm2-135m", "results/seeds/smollm2-135m"], data_dir="data/fv")
    atlas.save("atlases/smollm2-135m")

A bench folder holds each SITE row's theta (the rows' ``info``, or ``theta.safetensors`` "TASK/seedS"
where the row files are not kept) and the scores in rows.csv. ``bench`` keeps each (task, seed)'s t
beside its row files (``rows/TASK/seedS/t.safetensors``, labelled with the model, its dtype, the
embedding settings and a digest of the task's train pairs); where none is kept under that label, t is
recomputed: stage 1 with the row's seed and the folder's recorded embedding settings, the same
prompts the fit used, and kept there in turn where the folder has row files, so a stopped assembly
resumes. What is missing is fitted by ``site-lens bench`` first (its rows, locks, shards and
resumption); assembling trains nothing.
"""

from __future__ import annotations

import ast
import csv
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..config import SiteConfig
from ..tasks import Task, category, load_task
from ..types import Model
from .store import SCHEMA_VERSION, Atlas, AtlasError, key

log = logging.getLogger(__name__)

SCORED = ("zero_shot", "icl", "site")  # the methods whose rows an atlas keeps beside its maps
FV_SOURCE = 'Function Vectors (Todd et al. 2024), with the splits of the SITE release (Park et al. 2026)'
FV_LICENCE = "MIT (the task data, Todd et al. 2024) and Apache-2.0 (the splits, SITE release)"


def family(task: str) -> str:
    """A task's family: its name less a trailing list length (animal_v_object_3 and _5 are one family)."""
    return re.sub(r"_\d+$", "", task)


def task_record(task: Task) -> dict[str, str]:
    """What the manifest records of a task: category, family, source and licence."""
    from ..sources.fv_release import RELEASE

    meta = task.meta or {}
    is_fv = task.name in RELEASE and (len(task.train), len(task.valid), len(task.test)) == RELEASE[task.name][:3]
    return {
        "category": category(task),
        "family": family(task.name),
        "source": str(meta.get("task_data") or (FV_SOURCE if is_fv else task.source)),
        "licence": str(meta.get("licence") or (FV_LICENCE if is_fv else "")),
    }


def read_rows(folder: Path) -> list[dict[str, Any]]:
    """A bench folder's rows: rows.csv, then the row files of the scored methods (which win), seeds as ints.

    A row file and the theta in its info come from one run, so the atlas never sets a theta beside the
    scores of another (rows.csv can hold an older run's row where a rerun was kept out of the table).
    """
    path = Path(folder) / "rows.csv"
    if not path.is_file():
        raise AtlasError(f"{path}: no rows.csv (not a finished bench folder)")
    with open(path, newline="") as f:
        rows = {(r["task"], r["method"], int(r["seed"])): r for r in csv.DictReader(f)}
    for method in SCORED:
        for row in sorted(Path(folder).glob(f"rows/*/seed*/{method}.json")):
            r = json.loads(row.read_text())
            rows[(r["task"], r["method"], int(r["seed"]))] = r
    for r in rows.values():
        r["seed"] = int(r["seed"])
    return list(rows.values())


def read_thetas(folder: Path) -> dict[str, torch.Tensor]:
    """Each SITE row's theta, "TASK/seedS": from theta.safetensors, then the row files' info (which win)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    path = folder / "theta.safetensors"
    thetas = dict(load_file(str(path))) if path.is_file() else {}
    for row in sorted(folder.glob("rows/*/seed*/site.json")):
        r = json.loads(row.read_text())
        info = r.get("info") or {}
        info = info if isinstance(info, dict) else ast.literal_eval(info)
        if "theta" in info:
            thetas[key(r["task"], int(r["seed"]))] = torch.tensor(info["theta"], dtype=torch.float32)
    return thetas


def _config(folder: Path) -> SiteConfig:
    spec = json.loads((Path(folder) / "bench.json").read_text())
    return SiteConfig.from_dict(spec["config"]) if "config" in spec else SiteConfig()


def assemble_atlas(
    model: Model,
    folders: Sequence[str | Path],
    data_dir: str | Path | None = None,
    tasks: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    command: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Atlas:
    """An atlas from finished bench folders: every (task, seed) with a SITE theta, t as bench kept it or from stage 1.

    A later folder's row or theta replaces an earlier one's. Each folder's bench.json must name
    this model; every folder must record the same embedding settings (t depends on them).

    Example:
        A tiny random model with a byte-level tokenizer stands in for a real one: its answers are
        noise, but the calls and what they return are those of a real run.

        >>> import site_lens as sl
        >>> model = sl.tiny_model("bytes")  # a byte-level tokenizer, built offline; or sl.load_model("smollm2-135m")
        >>> cfg = sl.SiteConfig(embedding=sl.EmbeddingConfig(n_prompts=2, n_shots=2),   # a few seconds' budget
        ...                     selection=sl.SelectionConfig(steps=2, eval_every=2, max_valid=2),
        ...                     eval=sl.EvalConfig(max_new_tokens=3, max_test=2))
        >>> import tempfile
        >>> from pathlib import Path
        >>> TASKS = ["uppercase", "opposites"]
        >>> from site_lens.experiments.bench import run_bench
        >>> bench = Path(tempfile.mkdtemp())              # what `site-lens bench` writes
        >>> rows = run_bench(model, TASKS, ["site"], [0], bench, cfg=cfg)
        >>> atlas = assemble_atlas(model, [bench])
        >>> atlas.tasks, atlas.seeds, len(atlas.heads)    # one row per (task, seed, layer, head)
        (['opposites', 'uppercase'], [0], 16)
    """
    from ..experiments.bench import keep_t, kept_t, t_label
    from ..models import model_identity
    from ..stages.embeddings import task_embedding

    ident = model_identity(model)
    folders = [Path(f) for f in folders]
    rows: dict[tuple, dict[str, Any]] = {}
    thetas: dict[str, torch.Tensor] = {}
    cfg = None
    home: dict[str, Path] = {}  # where each theta came from: its t is kept there (resuming a stopped assembly)
    for folder in folders:
        spec = json.loads((folder / "bench.json").read_text()) if (folder / "bench.json").is_file() else {}
        if spec.get("model") != ident["name"]:
            raise AtlasError(f"{folder}: bench rows of model '{spec.get('model')}', not '{ident['name']}'")
        here = _config(folder)
        if here.sparsity is not None:
            raise AtlasError(f"{folder}: sparse SITE rows (--sparse-*): an atlas holds SITE's dense gates")
        if cfg is not None and here.embedding != cfg.embedding:
            raise AtlasError(f"{folder}: its embedding settings differ from the other folders' (t depends on them)")
        cfg = here
        for r in read_rows(folder):
            rows[(r["task"], r["method"], r["seed"])] = r
        here_thetas = read_thetas(folder)
        thetas.update(here_thetas)
        home.update(dict.fromkeys(here_thetas, folder))
    if cfg is None:
        raise AtlasError("assemble_atlas needs at least one bench folder")
    pairs = sorted({(k.split("/seed")[0], int(k.split("/seed")[1])) for k in thetas})
    pairs = [(t, s) for t, s in pairs if (tasks is None or t in tasks) and (seeds is None or s in seeds)]
    if not pairs:
        raise AtlasError("no SITE theta for the tasks and seeds asked for in these folders")
    heads, t_store, records = [], {}, {}
    n_l, n_h = model.cfg.n_layers, model.cfg.n_heads
    t0 = time.perf_counter()
    for i, (name, seed) in enumerate(pairs, 1):
        task = load_task(name, data_dir=data_dir)
        records[name] = task_record(task)
        theta = thetas[key(name, seed)].float()
        if theta.numel() != n_l * n_h:
            raise AtlasError(f"theta of {key(name, seed)} has {theta.numel()} values; {ident['name']} has {n_l * n_h} heads")
        theta = theta.reshape(n_l, n_h)
        k = key(name, seed)
        label = t_label(ident["name"], str(model.cfg.dtype), cfg.embedding, task)
        t, how = kept_t(home[k], name, seed, label), "t as kept beside the rows"  # by bench, or an earlier build
        if t is None:
            t, how = task_embedding(model, task, cfg.embedding, seed).float(), "t recomputed"
            if (home[k] / "rows").is_dir():  # a folder of row files (never one restored from rows.csv alone)
                keep_t(home[k], name, seed, t, label)
        t_store[k] = t.float()
        heads.append(_head_rows(name, seed, theta))
        if progress is not None:
            progress(f"[{i}/{len(pairs)}] {name} seed {seed}: {how} ({time.perf_counter() - t0:.0f} s so far)")
    scores = [
        {"task": t, "seed": s, "method": m, **{c: float(r[c]) for c in ("first_token_acc", "exact_match", "strict_match")},
         "n_test": int(r["n_test"])}
        for (t, m, s), r in sorted(rows.items())
        if m in SCORED and t in records and (seeds is None or s in seeds or m == "zero_shot")
    ]  # fmt: skip  (zero-shot draws nothing with its seed: its one row stands for every seed)
    manifest = _manifest(model, ident, cfg, records, sorted({s for _, s in pairs}), command)
    return Atlas(manifest=manifest, heads=pd.concat(heads, ignore_index=True), scores=pd.DataFrame(scores), t=t_store)


def _head_rows(task: str, seed: int, theta: torch.Tensor) -> pd.DataFrame:
    """One (task, seed) map as tidy rows: theta, alpha and alpha's rank (1 = highest; ties by position)."""
    n_l, n_h = theta.shape
    alpha = torch.sigmoid(theta).flatten()
    order = torch.argsort(-alpha, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(1, len(order) + 1)
    return pd.DataFrame({
        "task": task, "seed": seed,
        "layer": torch.arange(n_l).repeat_interleave(n_h).numpy(), "head": torch.arange(n_h).repeat(n_l).numpy(),
        "theta": theta.flatten().numpy(), "alpha": alpha.numpy(), "alpha_rank": rank.numpy(),
    })  # fmt: skip


def _manifest(model, ident, cfg: SiteConfig, records, seeds, command) -> dict[str, Any]:
    import transformer_lens

    from .._version import __version__
    from .card import base_model

    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "site-lens head atlas",
        "model": ident,
        "base_model": base_model(ident),
        "versions": {
            "site_lens": __version__,
            "transformer_lens": getattr(transformer_lens, "__version__", "?"),
            "torch": torch.__version__,
        },
        "config": cfg.to_dict(),
        "tasks": dict(sorted(records.items())),
        "seeds": seeds,
        "command": command or " ".join(["site-lens", *sys.argv[1:]]),
    }
