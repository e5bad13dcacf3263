"""Head atlases: every task's SITE head map for one model, built once, shared, browsed.

    atlas = sl.load_atlas("atlases/smollm2-135m")          # a folder, or a Hub id ("user/repo")
    atlas.heads                                            # tidy: task, seed, layer, head, theta, alpha, ...
    atlas.top_heads("antonym"), atlas.tasks_selecting(12, 3), atlas.nearest("antonym")
    atlas.adapter("antonym", seed=0)                       # SITE for that task, identity-checked
    compare_atlases(atlas_a, atlas_b)                      # do two models' tasks share heads alike?

``store``: the folder and the Atlas object; ``build``: from finished bench folders;
``compare``: the Mantel test; ``hub``: push and pull; ``card``: the model card.
"""

from __future__ import annotations

import re
from pathlib import Path

from .build import assemble_atlas, family
from .compare import compare_atlases
from .hub import HUB_ID, push_to_hub
from .store import SCHEMA_VERSION, Atlas, AtlasError, load_folder


def load_atlas(source: str | Path, revision: str | None = None) -> Atlas:
    """An atlas from a folder, or from the Hub by id ("user/repo", ``revision`` pinned if given).

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
        >>> folder = sl.assemble_atlas(model, [bench]).save(f"{tempfile.mkdtemp()}/atlas")
        >>> atlas = load_atlas(folder)                    # or a Hub id, "user/repo"
        >>> atlas.tasks
        ['opposites', 'uppercase']
    """
    path = Path(source)
    if path.exists():
        if revision is not None:
            raise AtlasError(f"{path}: a revision is for an atlas on the Hub, not a local folder")
        return load_folder(path)
    if re.match(HUB_ID, str(source)):
        from .hub import pull

        try:
            return load_folder(pull(str(source), revision))
        except AtlasError as e:
            raise AtlasError(f"{source}: no such folder here; on the Hub: {e}") from None
    raise AtlasError(f"{source}: no such atlas folder, and not a Hub id of the form 'user/repo'")


__all__ = ["SCHEMA_VERSION", "Atlas", "AtlasError", "assemble_atlas", "compare_atlases", "family", "load_atlas",
           "push_to_hub"]  # fmt: skip
