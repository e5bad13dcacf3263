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


def byte_tokenizer() -> Any:
    """A byte-level tokenizer (257 ids, ``<pad>`` among them), built offline: text for a tiny model."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([], vocab_size=257, special_tokens=["<pad>"], show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>")


def tiny_model(tokenizer: Any = None, **overrides: Any) -> Model:
    """A tiny random HookedTransformer (frozen, unprocessed), optionally with a tokenizer (``"bytes"``: a
    byte-level one, ``byte_tokenizer``, with the vocabulary and context it needs); TransformerLens 3.x only
    (4.0 removed HookedTransformer).

    Example:
        >>> model = tiny_model()
        >>> model.cfg.n_layers, model.cfg.n_heads
        (2, 4)
    """
    if isinstance(tokenizer, str) and tokenizer == "bytes":  # text tasks on a tiny model, no download
        tokenizer = byte_tokenizer()
        overrides = {"d_vocab": len(tokenizer), "n_ctx": 256, **overrides}
    cfg = build_cfg(**overrides)
    model = finalize(new_hooked(cfg, tokenizer))
    return register(model, f"tiny-{cfg.n_layers}x{cfg.n_heads}", processing=PROCESSING_FLAGS)
