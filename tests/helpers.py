"""Tiny models and a character tokenizer for fast, offline tests."""

from __future__ import annotations

import string

from transformers import PreTrainedTokenizerFast

from site_lens.models.tiny import HF_FIELDS as TINY_HF_FIELDS


def needs_hooked(reason: str):
    """A skip mark for tests of TransformerLens 3.x's HookedTransformer (TransformerLens 4 removed it)."""
    import pytest

    from site_lens.models.engines import HOOKED

    return pytest.mark.skipif(HOOKED is None, reason=f"needs HookedTransformer (TransformerLens 3.x): {reason}")


def engines_here() -> list[str]:
    """The model engines this TransformerLens has, for tests whose subject is each engine's behaviour: both on
    3.x, the bridge alone on 4.x (which removed HookedTransformer)."""
    from site_lens.models.engines import HOOKED

    return ["hooked", "bridge"] if HOOKED is not None else ["bridge"]


def tiny_on(engine: str, **overrides):
    """``tiny(**overrides)`` on the named engine: HookedTransformer's tiny model, or its bridge counterpart."""
    return tiny_bridge_like(**overrides) if engine == "bridge" else tiny(**overrides)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (printable ASCII + a pad), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = ["<pad>"] + list(string.printable)
    vocab = {c: i for i, c in enumerate(chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")
    fast.padding_side = "right"
    return fast


def tiny(**overrides):
    """A tiny random Llama-like model with the character tokenizer: a HookedTransformer where TransformerLens has
    one (3.x), else a TransformerBridge of the same shape (``tiny_bridge_like``)."""
    from site_lens.models.engines import HOOKED
    from site_lens.models.tiny import tiny_model

    if HOOKED is None:
        return tiny_bridge_like(**overrides)
    tok = char_tokenizer()
    overrides.setdefault("d_vocab", len(tok.get_vocab()))
    gemma_like = overrides.get("use_qk_norm") or overrides.get("use_normalization_before_and_after")
    overrides.setdefault("original_architecture", "Gemma3ForCausalLM" if gemma_like else "LlamaForCausalLM")
    return tiny_model(tokenizer=tok, **overrides)


# HookedTransformerConfig fields -> the tiny transformers config's: tiny_model's, plus vocabulary and init scale
HF_FIELDS = {**TINY_HF_FIELDS, "d_vocab": "vocab_size", "initializer_range": "initializer_range"}
ARCHITECTURES = {"LlamaForCausalLM": "llama", "Gemma3ForCausalLM": "gemma3", "Qwen2ForCausalLM": "qwen2"}
ARCHITECTURES |= {"MistralForCausalLM": "mistral", "Qwen3ForCausalLM": "qwen3", "GPTNeoXForCausalLM": "gpt_neox"}
ARCHITECTURES |= {"Phi3ForCausalLM": "phi3", "GlmForCausalLM": "glm", "GPT2LMHeadModel": "gpt2"}
ARCHITECTURES |= {"ArceeForCausalLM": "arcee"}
# partial or adjacent-pair rotary: a Llama-like block whose transformers model has it (GLM: adjacent pairs)
ROTARY = {False: "Phi3ForCausalLM", True: "GlmForCausalLM"}
# values that are what the bridge's Llama-like and Gemma-3-like blocks are anyway
IMPLIED = {
    "normalization_type": "RMS",
    "final_rms": True,
    "positional_embedding_type": "rotary",
    "gated_mlp": True,
    "attn_only": False,
    "device": "cpu",
    "default_prepend_bos": False,
}


def tiny_bridge_like(**overrides):
    """The TransformerBridge counterpart of ``tiny(**overrides)``: a tiny random Llama (Gemma 3 where Q/K norms or
    post-sublayer norms are asked for, Phi-3 or GLM for partial or adjacent-pair rotary, Arcee for a plain MLP; the named
    ``original_architecture`` otherwise) of the same shape, with the same defaults (2 layers, d_model 32, 4 heads
    of 8, 2 key/value heads, d_mlp 64, n_ctx 64).

    Partial rotary gives Phi-3 (the halves of the rotated part), adjacent-pair rotary GLM (partial or whole);
    a HookedTransformer setting no such transformers model has (attention-only blocks, no final norm ...) skips the
    test, naming it.
    """
    import pytest
    import torch

    from site_lens.models.bridge import bridge_from_hf
    from site_lens.models.identity import register
    from site_lens.models.tiny import tiny_hf

    o = dict(overrides)
    dtype, seed = o.pop("dtype", torch.float32), o.pop("seed", 0)
    if o.get("positional_embedding_type") == "standard":  # learned positions: GPT-2's (LayerNorm, a plain MLP)
        o.pop("positional_embedding_type"), o.pop("final_rms", None)
        if o.pop("gated_mlp", False) or o.setdefault("normalization_type", "LN") != "LN":
            pytest.skip("the tiny TransformerBridge with learned positions is GPT-2 (LayerNorm, a plain MLP)")
        o.setdefault("original_architecture", "GPT2LMHeadModel")
    if o.get("normalization_type") == "LN":  # a LayerNorm model: GPT-NeoX's (off the packed engine's list)
        o.pop("normalization_type"), o.pop("final_rms", None)
        o.setdefault("original_architecture", "GPTNeoXForCausalLM")
    if o.get("gated_mlp") is False:  # a plain MLP: GPT-NeoX's under LayerNorm, Arcee's (relu squared) under RMSNorm
        o.setdefault("original_architecture", "ArceeForCausalLM")
        if o["original_architecture"] in ("GPTNeoXForCausalLM", "ArceeForCausalLM"):
            o.pop("gated_mlp")  # another named architecture's MLP is gated: skipped below
    for key, value in IMPLIED.items():
        given = o.pop(key, value)
        if given != value:
            pytest.skip(f"the tiny TransformerBridge has no {key}={given!r} (its blocks are Llama's or Gemma 3's)")
    gemma = bool(o.pop("use_qk_norm", False)) | bool(o.pop("use_normalization_before_and_after", False))
    adjacent = bool(o.pop("rotary_adjacent_pairs", False))
    d_head = o.get("d_head", 8)
    rotary_dim = o.pop("rotary_dim", None) or d_head
    rotary = adjacent or rotary_dim != d_head
    default = ROTARY[adjacent] if rotary else "Gemma3ForCausalLM" if gemma else "LlamaForCausalLM"
    named = o.pop("original_architecture", default)
    arch = ARCHITECTURES.get(named)
    if arch is None or gemma != (arch == "gemma3"):
        pytest.skip(f"no tiny TransformerBridge of {named} with these norms")
    hf = {HF_FIELDS[k]: o.pop(k) for k in list(o) if k in HF_FIELDS}
    hf.setdefault("max_position_embeddings", 64)
    # HookedTransformer's weight scale (its gpt2 init: 0.8 / sqrt(d_model)), not transformers' 0.02, under which a
    # tiny model's layers barely differ
    hf.setdefault("initializer_range", 0.8 / hf.get("hidden_size", 32) ** 0.5)
    n_layers = hf.setdefault("num_hidden_layers", 2)
    if hf.get("num_key_value_heads", 0) is None:  # multi-head attention
        hf["num_key_value_heads"] = hf.get("num_attention_heads", 4)
    if rotary and named != ROTARY[adjacent]:
        pytest.skip(f"no tiny TransformerBridge of {named} with this rotary (partial: Phi-3, adjacent pairs: GLM)")
    if named in ROTARY.values():
        hf["partial_rotary_factor"] = rotary_dim / d_head
    act = o.pop("act_fn", None)
    if act is not None:  # gelu_new is the tanh approximation, transformers' gelu_pytorch_tanh
        hf["hidden_activation" if arch == "gemma3" else "hidden_act"] = {"gelu_new": "gelu_pytorch_tanh"}.get(act, act)
    if arch == "gemma3":
        local, kinds = o.pop("use_local_attn", False), o.pop("attn_types", None)
        kinds = kinds if local and kinds else ["global"] * n_layers
        hf["layer_types"] = [{"local": "sliding_attention", "global": "full_attention"}[k] for k in kinds]
        hf["query_pre_attn_scalar"] = d_head
        if "window_size" in o:
            hf["sliding_window"] = o.pop("window_size")
        if "rotary_base_local" in o:
            hf["rope_local_base_freq"] = o.pop("rotary_base_local")
    if "output_logits_soft_cap" in o and arch == "gemma3":
        hf["final_logit_softcapping"] = o.pop("output_logits_soft_cap")
    if o:
        pytest.skip(f"the tiny TransformerBridge does not map {', '.join(sorted(o))}")
    if arch in ("gpt_neox", "gpt2"):  # one key/value head per head, d_model / n_heads wide
        hf.pop("num_key_value_heads", None), hf.pop("head_dim", None)
        if arch == "gpt2":  # GPT-2's MLP is n_inner wide and its blocks always carry biases
            hf["n_inner"] = hf.pop("intermediate_size", 64)
    elif arch != "phi3":  # zero attention biases, as HookedTransformer has (b_Q, b_K, b_V, b_O); Phi-3 has none
        hf.setdefault("attention_bias", True)
    tok = char_tokenizer()
    model = tiny_hf(arch, tok, seed, **hf).to(dtype)
    bridge = bridge_from_hf(model, tok, dtype=dtype)
    # the boot gave the char tokenizer a BOS beyond the vocabulary; strings are encoded as they are, as tiny()'s are
    bridge.cfg.default_prepend_bos = False
    return register(bridge, f"tiny-{n_layers}x{hf.get('num_attention_heads', 4)}")
