"""The two model engines: TransformerLens 3.x's HookedTransformer and the TransformerBridge (3.9 and 4.x).

Both expose the same hook names (``blocks.{l}.attn.hook_z`` is an alias of the
bridge's ``attn.o.hook_in``), ``cfg`` with the shape fields site-lens reads,
``hooks(...)``, ``run_with_hooks`` and a tokenizer. Where they differ (weight
layout, KV cache, weight processing) the backend seam (``site_lens.engine.backend``)
decides; code above it annotates with ``site_lens.types.Model`` and never asks which engine
it has.

TransformerLens 4 removed HookedTransformer: there ``HOOKED`` is None, the
bridge is the only engine and the default. On 3.9 both exist and
HookedTransformer stays the default (the committed results are on it).
"""

from __future__ import annotations

from typing import Any

try:  # TransformerLens 4 raises ImportError for the removed name
    from transformer_lens import HookedTransformer as _Hooked
except ImportError:
    _Hooked = None
from transformer_lens.model_bridge import TransformerBridge

HOOKED: type | None = _Hooked  # None on TransformerLens 4

# TransformerLens processing flags used for every model site-lens loads (they change hook_z).
PROCESSING_FLAGS: dict[str, bool] = {
    "fold_ln": False,
    "center_writing_weights": False,
    "center_unembed": False,
    "fold_value_biases": False,
    "refactor_factored_attn_matrices": False,
}


class ModelError(ValueError):
    """An unknown model name or engine, a missing embedded package, or a corrupt cache."""


ENGINES = ("hooked", "bridge")



def default_engine() -> str:
    """'hooked' where TransformerLens has HookedTransformer (3.x), else 'bridge'."""
    return "hooked" if HOOKED is not None else "bridge"


def check_engine(engine: str | None) -> str:
    """The engine to use: ``engine`` itself, or the default for None; ModelError for an unknown or missing one."""
    engine = engine or default_engine()
    if engine not in ENGINES:
        raise ModelError(f"unknown engine '{engine}'; use one of {', '.join(ENGINES)}")
    if engine == "hooked" and HOOKED is None:
        raise ModelError(
            "engine 'hooked' needs TransformerLens 3.x (HookedTransformer was removed in 4.0); use engine='bridge'"
        )
    return engine


def hooked_class() -> Any:
    """HookedTransformer, or ModelError on TransformerLens 4."""
    if HOOKED is None:
        raise ModelError("HookedTransformer needs TransformerLens 3.x (removed in 4.0); use the bridge engine")
    return HOOKED


def is_bridge(model: Any) -> bool:
    """Whether ``model`` is a TransformerBridge."""
    return isinstance(model, TransformerBridge)


def is_hooked(model: Any) -> bool:
    """Whether ``model`` is a HookedTransformer (always False on TransformerLens 4)."""
    return HOOKED is not None and isinstance(model, HOOKED)


def engine_of(model: Any) -> str:
    """'hooked' or 'bridge'; ModelError for anything else."""
    if is_bridge(model):
        return "bridge"
    if is_hooked(model):
        return "hooked"
    raise ModelError(f"expected a HookedTransformer or a TransformerBridge, got {type(model).__name__}")


def hf_model(model: Any) -> Any:
    """The Hugging Face model a bridge wraps."""
    return model.original_model


def architecture(model: Any) -> str:
    """The Hugging Face architecture name (``LlamaForCausalLM``, ...) on either engine."""
    c = model.cfg
    return getattr(c, "original_architecture", None) or getattr(c, "architecture", None) or type(model).__name__


def norm_gain(model: Any, norm: Any) -> Any:
    """What a norm multiplies its normalized input by: ``w``, plus one where the bridge keeps Gemma's raw
    weight (its RMSNorm computes ``(1 + w) x / rms``; HookedTransformer folds the one into ``w``)."""
    w = norm.w
    if is_bridge(model) and getattr(model.cfg, "rmsnorm_uses_offset", False):
        w = w + 1
    return w


def weights_stamp(model: Any) -> tuple:
    """Which parameter tensors the model holds, and their versions: changes when any is replaced, moved or written
    in place (not through ``.data``). What packed snapshots, probe verdicts and weights digests are keyed by.

    Read straight from the module tree (a bridge's native model's, whose parameters ``parameters()`` gives):
    a fraction of the cost of ``parameters()``, which names every module on the way."""
    stack, stamp, seen = [model.original_model if is_bridge(model) else model], [], set()
    while stack:
        module = stack.pop()
        if id(module) in seen:  # a module reachable twice (a bridge's wrappers) counts once
            continue
        seen.add(id(module))
        stamp += [(id(p), p._version, p.data_ptr(), p.dtype) for p in module._parameters.values() if p is not None]
        stack += [m for m in module._modules.values() if m is not None]
    return tuple(stamp)
