"""Model identity: name, shape, source and TransformerLens processing flags, what an adapter must match.

``load_model`` and ``tiny_model`` register each model they return in a weak
registry beside the model (nothing is stored on it); an entry goes with its model.
"""

from __future__ import annotations

import weakref
from typing import Any

from transformer_lens import HookedTransformer

from .convert import PROCESSING_FLAGS

_REGISTRY: weakref.WeakKeyDictionary[HookedTransformer, dict[str, Any]] = weakref.WeakKeyDictionary()


def _identity(model: HookedTransformer, name: str, source: str | None, processing: dict[str, bool]) -> dict[str, Any]:
    c = model.cfg
    return {
        "name": name,
        "architecture": c.original_architecture,
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "d_head": c.d_head,
        "d_model": c.d_model,
        "d_vocab": c.d_vocab,
        "source_sha256": source,
        "processing": processing,
    }


def register(
    model: HookedTransformer,
    name: str | None = None,
    *,
    source: str | None = None,
    processing: dict[str, bool] | None = None,
) -> HookedTransformer:
    """Remember the model's name, source digest and the processing flags it was loaded with."""
    flags = {**PROCESSING_FLAGS, **(processing or {})}
    _REGISTRY[model] = _identity(model, name or model.cfg.model_name, source, flags)
    return model


def model_identity(model: HookedTransformer) -> dict[str, Any]:
    """Name, shape and loading flags of a model: what an adapter must match."""
    ident = _REGISTRY.get(model)
    if ident is None:
        ident = _identity(model, model.cfg.model_name, None, dict(PROCESSING_FLAGS))
    return {**ident, "processing": dict(ident["processing"])}
