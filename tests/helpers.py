"""Tiny models and a character tokenizer for fast, offline tests."""

from __future__ import annotations

import string

from transformers import PreTrainedTokenizerFast


def needs_hooked(reason: str):
    """A skip mark for tests of TransformerLens 3.x's HookedTransformer (TransformerLens 4 removed it)."""
    import pytest

    from site_lens.models.engines import HOOKED

    return pytest.mark.skipif(HOOKED is None, reason=f"needs HookedTransformer (TransformerLens 3.x): {reason}")


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
    """A tiny random Llama-like HookedTransformer with the character tokenizer (skips on TransformerLens 4)."""
    import pytest

    from site_lens.models.engines import HOOKED
    from site_lens.models.tiny import tiny_model

    if HOOKED is None:
        pytest.skip("needs HookedTransformer (TransformerLens 3.x); tests/test_bridge.py covers the bridge")
    tok = char_tokenizer()
    overrides.setdefault("d_vocab", len(tok.get_vocab()))
    gemma_like = overrides.get("use_qk_norm") or overrides.get("use_normalization_before_and_after")
    overrides.setdefault("original_architecture", "Gemma3ForCausalLM" if gemma_like else "LlamaForCausalLM")
    return tiny_model(tokenizer=tok, **overrides)
