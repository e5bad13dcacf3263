"""Tiny random models (rotary, RMS, GQA, Llama-like) for tests and teaching: no download, milliseconds."""

from __future__ import annotations

from typing import Any

import torch

from ..types import Model
from .convert import PROCESSING_FLAGS, finalize, new_hooked
from .engines import ModelError, hooked_class
from .identity import register

# the architectures tiny_hf builds (transformers model types); Arcee's is RMSNorm with a plain (not gated) MLP
TINY_ARCHITECTURES = ("llama", "gemma3", "qwen2", "qwen3", "mistral", "gpt2", "gpt_neox", "glm", "phi3", "arcee")


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


# HookedTransformerConfig fields the tiny TransformerBridge maps onto its transformers config
HF_FIELDS = {
    "n_layers": "num_hidden_layers",
    "d_model": "hidden_size",
    "n_heads": "num_attention_heads",
    "d_head": "head_dim",
    "d_mlp": "intermediate_size",
    "n_ctx": "max_position_embeddings",
    "n_key_value_heads": "num_key_value_heads",
}


def vocab_tokenizer(size: int) -> Any:
    """A character-level tokenizer of exactly ``size`` ids (``<pad>``, then printable characters; others map to
    ``<pad>``), built offline: the tokenizer a tokenizer-less tiny TransformerBridge boots with."""
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = (["<pad>"] + list(string.printable))[:size]
    if len(chars) < size:
        raise ModelError(f"a tiny TransformerBridge without a tokenizer has at most {len(chars)} ids, not {size}: pass one")
    tok = Tokenizer(models.WordLevel(vocab={c: i for i, c in enumerate(chars)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")


def _tiny_bridge(tokenizer: Any, overrides: dict[str, Any]) -> Model:
    """``tiny_model``'s TransformerBridge: a tiny random Llama of the shape ``build_cfg`` gives, with its defaults."""
    from .bridge import bridge_from_hf

    o = dict(overrides)
    seed = o.pop("seed", 0)
    vocab = o.pop("d_vocab", None if tokenizer is not None else 50)
    hf = {HF_FIELDS[k]: o.pop(k) for k in list(o) if k in HF_FIELDS}
    if o:
        raise ModelError(f"tiny_model on TransformerLens 4 (a TransformerBridge) cannot set {', '.join(sorted(o))}")
    if tokenizer is None:
        tokenizer = vocab_tokenizer(vocab)
    elif vocab is not None and vocab != len(tokenizer.get_vocab()):
        raise ModelError(f"tiny_model: d_vocab={vocab} but the tokenizer has {len(tokenizer.get_vocab())} ids")
    d_model = hf.setdefault("hidden_size", 32)
    hf.setdefault("max_position_embeddings", 64)
    hf.setdefault("attention_bias", True)  # zero biases, as HookedTransformer's b_Q, b_K, b_V, b_O
    hf.setdefault("initializer_range", 0.8 / d_model**0.5)  # HookedTransformer's init scale, not transformers' 0.02
    model = tiny_hf("llama", tokenizer, seed, **hf)
    bridge = bridge_from_hf(model, tokenizer)
    bridge.cfg.default_prepend_bos = False  # strings encoded as they are, as the HookedTransformer's are
    return register(bridge, f"tiny-{model.config.num_hidden_layers}x{model.config.num_attention_heads}")


def tiny_model(tokenizer: Any = None, **overrides: Any) -> Model:
    """A tiny random model (frozen, unprocessed), optionally with a tokenizer (``"bytes"``: a byte-level one,
    ``byte_tokenizer``, with the vocabulary and context it needs): a HookedTransformer on TransformerLens 3.x, a
    TransformerBridge around a tiny Llama of the same shape on 4.x (which removed HookedTransformer), where only
    the shape (layers, widths, heads, vocabulary, context) and the seed can be overridden. Where they differ: the
    bridge rotates whole heads (the HookedTransformer's rotary_dim stays 8 when d_head changes), and given a
    tokenizer without d_vocab, the bridge takes the tokenizer's size (the HookedTransformer 50).

    Example:
        >>> model = tiny_model()
        >>> model.cfg.n_layers, model.cfg.n_heads
        (2, 4)
    """
    from .engines import HOOKED

    if isinstance(tokenizer, str) and tokenizer == "bytes":  # text tasks on a tiny model, no download
        tokenizer = byte_tokenizer()
        overrides = {"d_vocab": len(tokenizer), "n_ctx": 256, **overrides}
    if HOOKED is None:
        return _tiny_bridge(tokenizer, overrides)
    cfg = build_cfg(**overrides)
    model = finalize(new_hooked(cfg, tokenizer))
    return register(model, f"tiny-{cfg.n_layers}x{cfg.n_heads}", processing=PROCESSING_FLAGS)


# ---------------------------------------------------------------- tiny random transformers models and bridges


def tiny_hf_config(arch: str, vocab: int, **overrides: Any) -> Any:
    """A tiny random transformers config: 2 layers (3 for Gemma 3: two sliding, one full), d_model 32, 4 heads."""
    import transformers as tf

    base = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    base.update(max_position_embeddings=128, tie_word_embeddings=False)
    if arch in ("llama", "mistral", "qwen2", "qwen3", "arcee"):
        cls = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config, "qwen3": tf.Qwen3Config}
        cls["arcee"] = tf.ArceeConfig  # Llama's block with an up-projection, relu squared, no gate
        d = dict(base, num_key_value_heads=2, head_dim=8)
        if arch == "mistral":
            d["sliding_window"] = None
        return cls[arch](**{**d, **overrides})
    if arch == "gemma3":
        d = dict(
            base, num_hidden_layers=3, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=4
        )
        d["layer_types"] = ["sliding_attention", "sliding_attention", "full_attention"]
        return tf.Gemma3TextConfig(**{**d, **overrides})
    if arch == "gpt2":
        d = dict(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=128)
        return tf.GPT2Config(**{**d, **overrides})
    if arch == "gpt_neox":
        d = dict(base, rotary_pct=0.5, use_parallel_residual=True)
        return tf.GPTNeoXConfig(**{**d, **overrides})
    if arch in ("glm", "phi3"):  # partial rotary (half of each head); GLM's pairs adjacent, Phi-3's the halves
        d = dict(base, num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5)
        return (tf.GlmConfig if arch == "glm" else tf.Phi3Config)(**{**d, **overrides})
    raise ModelError(f"unknown tiny architecture '{arch}'; use one of {', '.join(TINY_ARCHITECTURES)}")


def tiny_hf(arch: str, tokenizer: Any, seed: int = 0, **overrides: Any) -> Any:
    """A tiny random transformers causal LM of ``arch`` (eval mode, frozen), seeded."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_hf_config(arch, len(tokenizer.get_vocab()), **overrides)
    cfg.pad_token_id = tokenizer.pad_token_id
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model.eval().requires_grad_(False)


def tiny_bridge(arch: str = "llama", tokenizer: Any = None, seed: int = 0, name: str | None = None, **overrides: Any):
    """A tiny random TransformerBridge of ``arch`` (``TINY_ARCHITECTURES``), registered as ``name``."""
    from .bridge import bridge_from_hf

    if tokenizer is None:
        raise ModelError("tiny_bridge needs a tokenizer (the bridge's boot encodes a probe string)")
    model = bridge_from_hf(tiny_hf(arch, tokenizer, seed, **overrides), tokenizer)
    return register(model, name or f"tiny-{arch}")
