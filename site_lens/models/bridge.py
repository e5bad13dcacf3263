"""The TransformerBridge engine: any Hugging Face causal LM, raw weights, hooks by TransformerLens's names.

``bridge_from_hf`` wraps an in-memory transformers model (its config and
tokenizer saved in a folder, which the bridge's boot reads offline);
``load_model(..., engine="bridge")`` uses it for the embedded models (the float32
checkpoint ``hf.load_hf_model`` keeps in the weight cache) and for hub names,
with accelerate's ``device_map`` / ``max_memory`` for models split over devices.
``tiny.tiny_bridge`` builds tiny random ones of ten architectures for tests.

The bridge runs the native model: ``hook_z`` is the input of the attention
output projection, exactly where the HookedTransformer engine (loaded without
weight processing) and ``site_lens.models.hf`` put it, so one adapter serves
all three. ``identity.bridge_processing`` reports a bridge in compatibility mode
(processed weights) as processed, and adapters refuse the mismatch.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from transformer_lens.model_bridge import TransformerBridge


def bridge_from_hf(
    hf_model: Any, tokenizer: Any, folder: str | Path | None = None, *, dtype: torch.dtype | None = None
) -> TransformerBridge:
    """A frozen, eval-mode TransformerBridge around ``hf_model`` (its config and tokenizer read from ``folder``).

    ``folder`` is where the model's config (and tokenizer) were saved; None saves them to a
    temporary folder first. No network is used.
    """
    from .identity import hf_name, register

    dtype = dtype or next(hf_model.parameters()).dtype
    name, path = hf_name(hf_model), getattr(hf_model.config, "_name_or_path", "")
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as tmp:
        warnings.simplefilter("ignore")
        if folder is None:
            folder = tmp
            if not getattr(hf_model.config, "architectures", None):  # a config built in memory names none
                hf_model.config.architectures = [type(hf_model).__name__]
            hf_model.config.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        bridge = TransformerBridge.boot_transformers(str(folder), hf_model=hf_model, dtype=dtype)
    hf_model.config._name_or_path = path  # not the temporary folder the boot read
    if folder == tmp:  # nor in the bridge's config
        bridge.cfg.model_name = name
    bridge.eval()
    bridge.requires_grad_(False)  # SITE never trains model weights
    return register(bridge, name)


def load_bridge(
    name: str,
    *,
    device: str | None,
    dtype: torch.dtype,
    device_map: str | dict[str, Any] | None,
    max_memory: dict[Any, Any] | None,
    cache_dir: Path | None,
) -> tuple[TransformerBridge, str | None]:
    """(bridge, GGUF digest or None): an embedded model from its cached float32 checkpoint, or a hub name."""
    from .hf import load_hf_model
    from .identity import source_of

    kwargs: dict[str, Any] = {}
    if max_memory is not None:
        kwargs["max_memory"] = max_memory
    if device_map is None and device not in (None, "cpu"):
        device_map = {"": device}
    hf_model, tok = load_hf_model(name, dtype=dtype, device_map=device_map, cache_dir=cache_dir, **kwargs)
    bridge = bridge_from_hf(hf_model, tok, dtype=dtype)  # its config and tokenizer saved afresh: no hub lookups
    return bridge, source_of(hf_model).get("source_sha256")
