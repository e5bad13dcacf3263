"""site-lens: SITE (soft head-selection for ICL-derived task embeddings) on TransformerLens.

Stages, each in the module of its name:
  embeddings.build_task_embedding   stage 1: mean hook_z at the last prompt token
  selection.AlphaGate / AlphaTrainer stage 2: alpha = sigmoid(theta), trained on zero-shot prompts
  inject.generate_greedy           stage 3: inject once at prefill (gate.injection_hooks), greedy with the KV cache
  methods.fit_site                 stages 1 and 2 on a task; every scored method behind one interface
"""

from ._version import __version__
from .config import EmbeddingConfig, EvalConfig, SelectionConfig, SiteConfig
from .embeddings import build_task_embedding
from .gate import AlphaGate, gate_hook, injection_hooks
from .inject import generate_greedy
from .io import Adapter, load_adapter, save_adapter
from .methods import SiteFit, fit_site
from .metrics import exact_match, normalize, strict_match
from .models import load_model, model_identity
from .pipeline import evaluate, predict, run_task
from .selection import AlphaTrainer
from .tasks import Task, build_prompt, builtin_tasks, load_task
from .tiny import tiny_model

__all__ = [
    "Adapter",
    "AlphaGate",
    "AlphaTrainer",
    "EmbeddingConfig",
    "EvalConfig",
    "SelectionConfig",
    "SiteConfig",
    "SiteFit",
    "Task",
    "__version__",
    "build_prompt",
    "build_task_embedding",
    "builtin_tasks",
    "evaluate",
    "exact_match",
    "fit_site",
    "gate_hook",
    "generate_greedy",
    "injection_hooks",
    "load_adapter",
    "load_model",
    "load_task",
    "model_identity",
    "normalize",
    "predict",
    "run_task",
    "save_adapter",
    "strict_match",
    "tiny_model",
]
