"""An atlas on disk: every task's SITE head map for one model, every seed, in one folder.

    ATLAS/atlas.json        manifest: schema version, the model's identity, versions, config,
                            tasks (category, family, source, licence), seeds, the command, each
                            file's SHA-256
    ATLAS/heads.parquet     one row per (task, seed, layer, head): theta, alpha, its rank in the
                            task's map (1 = highest), and any other ranking the atlas holds
    ATLAS/scores.parquet    one row per (task, seed, method): first-token, prefix, strict match
    ATLAS/t.safetensors     the task embeddings, one tensor "TASK/seedS" (layer, head, d_head)
    ATLAS/README.md         a model card with Hub metadata (library_name, base_model, tags)

Written through a temporary folder renamed into place, so a folder is whole or absent; read
back with every file's digest checked, so a truncated or edited file is a one-line error.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ..adapter import Adapter, AdapterError, replace_folder

SCHEMA_VERSION = 1
MANIFEST = "atlas.json"
HEADS = "heads.parquet"
SCORES = "scores.parquet"
TENSORS = "t.safetensors"
CARD = "README.md"
DATA_FILES = (HEADS, SCORES, TENSORS, CARD)  # digests in the manifest
HEAD_COLUMNS = ("task", "seed", "layer", "head", "theta", "alpha", "alpha_rank")
SCORE_COLUMNS = ("task", "seed", "method", "first_token_acc", "exact_match", "strict_match", "n_test")
TOP_SHARE = 0.1  # a task's selected heads: its top 10 % by alpha (the head claims' k)


class AtlasError(ValueError):
    """An atlas folder is missing, damaged, from a newer site-lens, or for another model.

    Example:
        >>> import tempfile
        >>> import site_lens as sl
        >>> sl.load_atlas(tempfile.mkdtemp())            # an empty folder is no atlas
        Traceback (most recent call last):
            ...
        site_lens.atlas.store.AtlasError: ...
    """


def key(task: str, seed: int) -> str:
    """The name of a (task, seed) tensor in t.safetensors."""
    return f"{task}/seed{seed}"


@dataclass
class Atlas:
    """Every task's SITE head map for one model: thetas and alphas, t, scores, in tidy tables.

    ``heads`` has one row per (task, seed, layer, head); ``scores`` one per (task, seed, method);
    ``t`` maps "TASK/seedS" to the task embedding; ``manifest`` records what they depend on.

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
        >>> atlas = sl.assemble_atlas(model, [bench])
        >>> atlas.map("uppercase", seed=0).shape          # alpha per (layer, head)
        torch.Size([2, 4])
        >>> atlas.top_heads("uppercase", k=3)[["layer", "head"]].shape   # its three most open heads
        (3, 2)
        >>> atlas.adapter("uppercase", seed=0).theta.shape   # SITE for that task, ready to inject
        torch.Size([2, 4])
    """

    manifest: dict[str, Any]
    heads: pd.DataFrame
    scores: pd.DataFrame
    t: dict[str, Tensor]

    # ---------------------------------------------------------------- what it holds

    @property
    def model(self) -> dict[str, Any]:
        """The model's identity as adapters record it (``models.model_identity``)."""
        return self.manifest["model"]

    @property
    def tasks(self) -> list[str]:
        return sorted(self.manifest["tasks"])

    @property
    def seeds(self) -> list[int]:
        return sorted(int(s) for s in self.heads.seed.unique())

    @property
    def n_heads(self) -> int:
        return int(self.model["n_layers"]) * int(self.model["n_heads"])

    def category(self, task: str) -> str:
        return self.manifest["tasks"][self._task(task)].get("category", "")

    def _task(self, task: str) -> str:
        if task not in self.manifest["tasks"]:
            raise AtlasError(f"task '{task}' is not in this atlas ({len(self.tasks)} tasks: {', '.join(self.tasks[:6])}, ...)")
        return task

    def _seeds(self, seed: int | None) -> list[int]:
        if seed is None:
            return self.seeds
        if seed not in self.seeds:
            raise AtlasError(f"seed {seed} is not in this atlas (seeds {self.seeds})")
        return [seed]

    def map(self, task: str, seed: int, value: str = "alpha") -> Float[Tensor, "layer head_index"]:
        """One task's map (alpha by default, or any column of ``heads``) as a (layer, head) tensor."""
        self._task(task), self._seeds(seed)
        if value not in self.heads.columns:
            raise AtlasError(f"'{value}' is not a column of this atlas's heads ({', '.join(self.heads.columns[4:])})")
        sub = self.heads[(self.heads.task == task) & (self.heads.seed == seed)].sort_values(["layer", "head"])
        if sub.empty:
            raise AtlasError(f"this atlas has no map of '{task}' at seed {seed}")
        return torch.tensor(sub[value].to_numpy(), dtype=torch.float32).reshape(self.model["n_layers"], self.model["n_heads"])

    def adapter(self, task: str, seed: int) -> Adapter:
        """The SITE adapter of a task and seed (t and theta), identity-checked when applied as any adapter is."""
        theta = self.map(task, seed, "theta")
        t = self.t.get(key(task, seed))
        if t is None:
            raise AtlasError(f"this atlas keeps no t for '{task}' at seed {seed}")
        meta = {"task": task, "seed": seed, "atlas_schema": self.manifest["schema_version"],
                **{k: v for k, v in self.manifest.get("config", {}).items() if k in ("embedding", "selection")}}  # fmt: skip
        return Adapter(t=t.clone(), theta=theta, model=dict(self.model), meta=meta)

    def check_model(self, identity: dict[str, Any]) -> None:
        """Refuse (AtlasError) a model whose identity differs from the atlas's."""
        n = (self.model["n_layers"], self.model["n_heads"])
        probe = Adapter(t=torch.zeros(*n, self.model["d_head"]), theta=torch.zeros(n), model=self.model)
        try:
            probe.check_model(identity)
        except AdapterError as e:
            raise AtlasError(str(e).replace("adapter was made", "atlas was made")) from None

    # ---------------------------------------------------------------- queries

    def default_k(self) -> int:
        return max(1, round(TOP_SHARE * self.n_heads))

    def top_heads(self, task: str, k: int = 10, seed: int | None = None, value: str = "alpha") -> pd.DataFrame:
        """A task's k highest heads by ``value``, averaged over the seeds (or at one), with how many seeds put each in their top k."""
        self._task(task)
        seeds = self._seeds(seed)
        sub = self.heads[(self.heads.task == task) & self.heads.seed.isin(seeds)]
        ranked = sub.assign(rank=sub.groupby("seed")[value].rank(ascending=False, method="first"))
        out = ranked.groupby(["layer", "head"]).agg(mean=(value, "mean"), in_top_k=("rank", lambda r: int((r <= k).sum())))
        out = out.rename(columns={"mean": value}).sort_values(value, ascending=False).head(k).reset_index()
        out.insert(0, "label", [f"L{la}H{h}" for la, h in zip(out["layer"], out["head"])])
        return out

    def tasks_selecting(self, layer: int, head: int, k: int | None = None, seed: int | None = None) -> pd.DataFrame:
        """The tasks that put head (layer, head) in their top k by alpha (default a tenth of the heads), most seeds first."""
        if not (0 <= layer < self.model["n_layers"] and 0 <= head < self.model["n_heads"]):
            raise AtlasError(f"no head L{layer}H{head} in a model of {self.model['n_layers']} layers x {self.model['n_heads']} heads")
        k = k or self.default_k()
        sub = self.heads[self.heads.seed.isin(self._seeds(seed))]
        one = sub[(sub["layer"] == layer) & (sub["head"] == head)]
        out = one.groupby("task").agg(seeds_in_top_k=("alpha_rank", lambda r: int((r <= k).sum())),
                                      alpha=("alpha", "mean"), rank=("alpha_rank", "mean")).reset_index()  # fmt: skip
        out = out[out.seeds_in_top_k > 0].sort_values(["seeds_in_top_k", "alpha"], ascending=False)
        out.insert(1, "category", [self.category(t) for t in out.task])
        return out.reset_index(drop=True)

    def overlap(self, seed: int, k: int | None = None) -> pd.DataFrame:
        """Task-by-task Jaccard of the top-k head sets at one seed (default k: a tenth of the heads)."""
        from ..analysis.overlap import jaccard_matrix

        self._seeds(seed)
        return jaccard_matrix({t: self.map(t, seed) for t in self.tasks if self._has(t, seed)}, k or self.default_k())

    def _has(self, task: str, seed: int) -> bool:
        return bool(((self.heads.task == task) & (self.heads.seed == seed)).any())

    def nearest(self, task: str, n: int = 5, k: int | None = None) -> pd.DataFrame:
        """The n tasks whose top-k head sets overlap ``task``'s most (Jaccard, mean over the seeds both have)."""
        self._task(task)
        mats = [self.overlap(s, k) for s in self.seeds if self._has(task, s)]
        both = pd.concat([m[task].drop(task, errors="ignore") for m in mats], axis=1)
        out = pd.DataFrame({"task": both.index, "jaccard": both.mean(axis=1).to_numpy()})
        out.insert(1, "category", [self.category(t) for t in out.task])
        return out.sort_values("jaccard", ascending=False).head(n).reset_index(drop=True)

    # ---------------------------------------------------------------- viewing

    def show(self, height: int = 900):
        """The atlas page inline in Jupyter (a sandboxed iframe: its script runs apart from the notebook's origin)."""
        import html

        from IPython.display import HTML

        from .page import render

        doc = html.escape(render(self), quote=True)
        return HTML(f'<iframe sandbox="allow-scripts" srcdoc="{doc}" style="width:100%;height:{height}px;border:0"></iframe>')

    def write_page(self, path: str | Path) -> Path:
        """The atlas page as one self-contained HTML file (opens offline)."""
        from .page import write_page

        return write_page(self, path)

    # ---------------------------------------------------------------- disk

    def save(self, path: str | Path) -> Path:
        """Write the folder whole: files into a temporary folder, digests into the manifest, renamed into place."""
        from safetensors.torch import save_file

        from .card import model_card

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp"))
        try:
            _write_table(self.heads, tmp / HEADS)
            _write_table(self.scores, tmp / SCORES)
            save_file({k: v.detach().float().contiguous() for k, v in sorted(self.t.items())}, str(tmp / TENSORS))
            manifest = {k: v for k, v in self.manifest.items() if k != "files"}
            (tmp / CARD).write_text(model_card(manifest, self))
            manifest["files"] = {f: _sha256(tmp / f) for f in DATA_FILES}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
            replace_folder(tmp, path)  # with the modes mkdir() and open() give
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.manifest = manifest
        return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_table(df: pd.DataFrame, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pandas(df.reset_index(drop=True), preserve_index=False), str(path))


def load_folder(path: str | Path) -> Atlas:
    """Read an atlas folder, checking the schema version, every file's digest, the tables and the tensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_dir():
        raise AtlasError(f"{path}: atlas folder not found")
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise AtlasError(f"{mpath}: missing (not an atlas folder)")
    try:
        manifest = json.loads(mpath.read_text())
    except (ValueError, OSError) as e:
        raise AtlasError(f"{mpath}: not valid JSON ({e.__class__.__name__})") from None
    version = manifest.get("schema_version") if isinstance(manifest, dict) else None
    if not isinstance(version, int):
        raise AtlasError(f"{mpath}: no schema_version (not an atlas manifest)")
    if version > SCHEMA_VERSION:
        raise AtlasError(f"{mpath}: atlas schema {version} is newer than this site-lens reads ({SCHEMA_VERSION}); upgrade site-lens")
    for f in DATA_FILES:
        p = path / f
        if not p.is_file():
            raise AtlasError(f"{p}: missing from the atlas folder")
        if _sha256(p) != manifest.get("files", {}).get(f):
            raise AtlasError(f"{p}: contents do not match the SHA-256 in {MANIFEST} (truncated or edited)")
    heads, scores = pd.read_parquet(path / HEADS), pd.read_parquet(path / SCORES)
    for name, df, cols in ((HEADS, heads, HEAD_COLUMNS), (SCORES, scores, SCORE_COLUMNS)):
        missing = [c for c in cols if c not in df.columns]
        if missing:
            raise AtlasError(f"{path / name}: columns {missing} missing")
    try:
        t = dict(load_file(str(path / TENSORS)))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise AtlasError(f"{path / TENSORS}: unreadable safetensors ({e})") from None
    m = manifest["model"]
    shape = (m["n_layers"], m["n_heads"], m["d_head"])
    bad = [k for k, v in t.items() if tuple(v.shape) != shape]
    if bad:
        raise AtlasError(f"{path / TENSORS}: {bad[0]} has shape {tuple(t[bad[0]].shape)}, the model's t is {shape}")
    per_map = heads.groupby(["task", "seed"]).size()
    if (per_map != m["n_layers"] * m["n_heads"]).any():
        raise AtlasError(f"{path / HEADS}: a (task, seed) map does not have one row per head")
    return Atlas(manifest=manifest, heads=heads, scores=scores, t=t)
