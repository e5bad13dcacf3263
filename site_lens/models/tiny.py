"""Tiny random models (rotary, RMS, GQA, Llama-like) for tests and teaching: no download, milliseconds."""

from __future__ import annotations

from typing import Any

from .convert import PROCESSING_FLAGS, finalize, new_hooked
from .engines import Model, hooked_class
from .identity import register


def build_cfg(**overrides: Any) -> Any:
    """A tiny random Llama-like config (rotary, RMS, GQA) for tests and teaching."""
    d: dict[str, Any] = dict(
        n_layers=2,
        d_model=32,
        n_ctx=64,
        d_head=8,
        n_heads=4,
        d_mlp=64,
        d_vocab=50,
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=8,
        gated_mlp=True,
        final_rms=True,
        n_key_value_heads=2,
        seed=0,
        device="cpu",
        default_prepend_bos=False,
        original_architecture="LlamaForCausalLM",  # a Llama-style block: the packed backend's allow-list covers it
    )
    d.update(overrides)
    hooked_class()  # ModelError on TransformerLens 4
    from transformer_lens import HookedTransformerConfig

    return HookedTransformerConfig(**d)


def tiny_model(tokenizer: Any = None, **overrides: Any) -> Model:
    """A tiny random HookedTransformer (frozen, unprocessed), optionally with a tokenizer; TransformerLens 3.x
    only (4.0 removed HookedTransformer).

    Example:
        >>> model = tiny_model()
        >>> model.cfg.n_layers, model.cfg.n_heads
        (2, 4)
    """
    cfg = build_cfg(**overrides)
    model = finalize(new_hooked(cfg, tokenizer))
    return register(model, f"tiny-{cfg.n_layers}x{cfg.n_heads}", processing=PROCESSING_FLAGS)
