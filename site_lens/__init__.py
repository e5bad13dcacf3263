"""site-lens: SITE (soft head-selection for ICL-derived task embeddings) on TransformerLens.

Stages, by folder (engine/, stages/, methods/, analysis/, experiments/, cli/):
  stages.embeddings.build_task_embedding  stage 1: mean hook_z at the last prompt token
  stages.selection.AlphaTrainer           stage 2: alpha = sigmoid(theta) (gate.AlphaGate), trained on zero-shot prompts
  stages.generation.generate_greedy         stage 3: inject once at prefill (gate.injection_hooks), greedy with KV cache
  methods.fit_site                        stages 1 and 2 on a task; every scored method behind one interface
  methods.fit_site_many                   stages 1 and 2 on many tasks, their stage 2 in one loop (one theta each)
Atlases:
  atlas.load_atlas, assemble_atlas        every task's head map of a model: a folder or a Hub id; built from bench folders
  atlas.compare_atlases                   do the tasks that share heads in one model share them in another (Mantel)
Head sets:
  stages.sparse.fit_sparse, sparse_path sparse SITE: an L0 (hard-concrete) or L1 price on every open head
  analysis.minimal.score_head_sets        t written into given head sets, scored (exact match, answer probability)
  experiments.sweep.minimal_sets          the minimal-set study of one task: sparse SITE against top-k rankings
  stages.shared.fit_shared           one alpha trained over several tasks, each with its own t
"""

from typing import TYPE_CHECKING

from ._version import __version__

# The public API is imported on first use (``site_lens.fit_site``, ``from site_lens import load_model``), so that
# ``import site_lens`` and the site-lens command's --help, --version and listings load neither torch nor
# TransformerLens. Each name's module:
_API = {
    "adapter": ("Adapter", "load_adapter", "save_adapter"),
    "analysis.attribution": ("attribution_scores",),
    "analysis.minimal": ("HeadSet", "score_head_sets"),
    "stages.shared": ("fit_shared",),
    "stages.sparse": ("fit_sparse", "sparse_path"),
    "atlas": ("Atlas", "AtlasError", "assemble_atlas", "compare_atlases", "load_atlas"),
    "config": ("EmbeddingConfig", "EngineConfig", "EvalConfig", "SelectionConfig", "SiteConfig", "SparsityConfig"),
    "stages.generation": ("generate_greedy",),
    "experiments.run": ("evaluate", "predict", "predict_with_logits", "run_task"),
    "experiments.sweep": ("minimal_sets",),
    "gate": ("AlphaGate", "Injection", "gate_hook", "injection_hooks"),
    "methods": ("SiteFit", "fit_site", "fit_site_many"),
    "metrics": ("exact_match", "normalize", "strict_match"),
    "models": ("load_model", "model_identity"),
    "models.tiny": ("tiny_model",),
    "stages.embeddings": ("build_task_embedding",),
    "stages.selection": ("AlphaTrainer",),
    "tasks": ("Task", "build_prompt", "builtin_tasks", "format_query", "load_task"),
}
_HOME = {name: module for module, names in _API.items() for name in names}

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from .adapter import Adapter, load_adapter, save_adapter
    from .analysis.attribution import attribution_scores
    from .analysis.minimal import HeadSet, score_head_sets
    from .atlas import Atlas, AtlasError, assemble_atlas, compare_atlases, load_atlas
    from .config import EmbeddingConfig, EngineConfig, EvalConfig, SelectionConfig, SiteConfig, SparsityConfig
    from .experiments.run import evaluate, predict, predict_with_logits, run_task
    from .experiments.sweep import minimal_sets
    from .gate import AlphaGate, Injection, gate_hook, injection_hooks
    from .methods import SiteFit, fit_site, fit_site_many
    from .metrics import exact_match, normalize, strict_match
    from .models import load_model, model_identity
    from .models.tiny import tiny_model
    from .stages.embeddings import build_task_embedding
    from .stages.generation import generate_greedy
    from .stages.selection import AlphaTrainer
    from .stages.shared import fit_shared
    from .stages.sparse import fit_sparse, sparse_path
    from .tasks import Task, build_prompt, builtin_tasks, format_query, load_task

__all__ = [
    "Adapter",
    "AlphaGate",
    "AlphaTrainer",
    "Atlas",
    "AtlasError",
    "EmbeddingConfig",
    "EngineConfig",
    "EvalConfig",
    "HeadSet",
    "Injection",
    "SelectionConfig",
    "SiteConfig",
    "SiteFit",
    "SparsityConfig",
    "Task",
    "__version__",
    "assemble_atlas",
    "attribution_scores",
    "build_prompt",
    "build_task_embedding",
    "builtin_tasks",
    "compare_atlases",
    "evaluate",
    "exact_match",
    "fit_shared",
    "fit_site",
    "fit_site_many",
    "fit_sparse",
    "format_query",
    "gate_hook",
    "generate_greedy",
    "injection_hooks",
    "load_adapter",
    "load_atlas",
    "load_model",
    "load_task",
    "minimal_sets",
    "model_identity",
    "normalize",
    "predict",
    "predict_with_logits",
    "run_task",
    "save_adapter",
    "score_head_sets",
    "sparse_path",
    "strict_match",
    "tiny_model",
]

# analysis modules by their short names (``from site_lens import overlap, patching, plots``), imported on first use
_MODULES = {"overlap": "analysis.overlap", "patching": "analysis.patching", "plots": "analysis.plots"}


def __getattr__(name: str):
    import importlib
    import importlib.util

    if name in _HOME:
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
        globals()[name] = value  # looked up once
        return value
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{_MODULES[name]}")
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # a submodule, as ``site_lens.engine``
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_MODULES))
