"""What a finished bench row must share with a rerun to be skipped: the model, the scoring caps, and the
settings its method's numbers depend on."""

from __future__ import annotations

from typing import Any

from ..config import SiteConfig

# Which settings each method's numbers depend on, beyond the model and the scoring caps
# (batch sizes and the backend change no result and are left out).
_EMBEDDING_USERS = {
    "site": ("n_prompts", "n_shots"),
    "site_seq": ("n_prompts", "n_shots"),
    "site_opt": ("n_prompts", "n_shots"),
    "fv": ("n_prompts", "n_shots"),
    "tv": ("n_prompts", "n_shots"),
    "mtv": ("n_prompts", "n_shots"),
    "icl": ("n_shots",),
}
_SELECTION = ("steps", "lr", "batch_size", "theta_init", "eval_every", "max_valid", "keep_best", "objective")


def row_spec(model_name: str, cfg: SiteConfig, method: str, dtype: str = "float32") -> dict[str, Any]:
    """What a finished row of ``method`` must share with a rerun to be skipped.

    Settings at their defaults are left out, so folders from before settings were recorded resume.
    """
    spec: dict[str, Any] = {
        "model": model_name,
        "max_test": cfg.eval.max_test,
        "max_new_tokens": cfg.eval.max_new_tokens,
    }
    default = SiteConfig()
    changed: dict[str, Any] = {}
    if not cfg.eval.stop_at_newline:
        changed["stop_at_newline"] = False
    if dtype != "float32":
        changed["dtype"] = dtype
    for k in _EMBEDDING_USERS.get(method, ()):
        if getattr(cfg.embedding, k) != getattr(default.embedding, k):
            changed[f"embedding.{k}"] = getattr(cfg.embedding, k)
    if method in ("site", "site_seq", "site_opt"):
        for k in _SELECTION:
            if getattr(cfg.selection, k) != getattr(default.selection, k):
                changed[f"selection.{k}"] = getattr(cfg.selection, k)
        if method == "site" and cfg.sparsity is not None:  # sparse SITE (site_seq and site_opt refuse it)
            s = cfg.sparsity  # what training reads: the threshold only draws masks, beta only shapes l0's gate
            changed["sparsity"] = {"penalty": s.penalty, "weight": s.weight, **({"beta": s.beta} if s.penalty == "l0" else {})}
        if not cfg.engine.fast:  # whole prompts: the same numbers up to float rounding, kept apart all the same
            changed["selection.fast"] = False  # the key rows recorded when the flag sat in SelectionConfig
    if changed:
        spec["settings"] = changed
    return spec
