"""Model identity: name, shape, source and TransformerLens processing flags, what an adapter must match.

``load_model`` and ``tiny_model`` register each model they return (a weak
registry beside the model, nothing stored on it) with the flags it was loaded
with. For any other model, or one whose weights were processed since it was
registered, the flags are read from the model itself, as TransformerLens 3.9
leaves them:

- ``fold_ln``: the config's normalization_type becomes ``LNPre`` / ``RMSPre``.
- ``center_writing_weights``: W_E, W_pos, every W_O and W_out, b_O and b_out
  have zero mean over d_model. TL only centres LayerNorm models without
  ``final_rms``; elsewhere it skips the step silently, so the flag is False.
- ``center_unembed``: W_U (and b_U) have zero mean over d_vocab.
- ``fold_value_biases``: a non-zero b_V was not folded; no b_V or b_O at all
  (Llama-style) makes folding a no-op, reported False; every b_V zero but b_O
  not is ambiguous (folded, or a model without value biases).
- ``refactor_factored_attn_matrices``: every head's W_O has orthonormal rows
  (TL refuses it on rotary models).

A caller's ``processing`` overrides what is read; a step TL skips on this
model, or that changes nothing in it, is reported False whatever was asked, so
models with the same weights get the same identity.

"Zero mean" is zero to the dtype's rounding, not statistically small: a
centred row's mean is under ``16 * eps * rms(row)``, a random row's about
``rms / sqrt(d)``, and every row of every matrix must pass.
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import torch
from torch import Tensor

from ..types import Model
from .engines import PROCESSING_FLAGS, ModelError, architecture, is_bridge, weights_stamp

# model -> (identity, the flags its weights showed when registered); entries go with their model
_REGISTRY: weakref.WeakKeyDictionary[Model, tuple[dict[str, Any], dict[str, bool | None]]] = weakref.WeakKeyDictionary()
_WRITING = ("W_E", "W_pos", "W_O", "W_out", "b_O", "b_out")  # what center_writing_weights centres
_NOT_CENTRED_POS = ("rotary", "alibi", "none")  # positional embeddings TL leaves alone


def _eps(t: Tensor) -> float:
    # TL processes weights in float32, upcasting lower precisions and downcasting float64
    return max(torch.finfo(t.dtype).eps, torch.finfo(torch.float32).eps)


def _zero_mean(t: Tensor) -> bool:
    """Whether every slice of ``t`` along its last dim has mean zero to rounding (float64 sums, in chunks)."""
    rows = t.detach().reshape(-1, t.shape[-1])
    tol = 16 * _eps(t)
    for chunk in rows.split(max(1, (1 << 18) // rows.shape[-1])):  # ~2 MB of float64 at a time; stops at the first miss
        c = chunk.double()
        if (c.mean(-1).abs() > tol * c.square().mean(-1).sqrt()).any():
            return False
    return True


def _orthonormal_rows(w: Tensor) -> bool:
    """Whether each head's W_O (d_head, d_model) has orthonormal rows, as TL's refactoring leaves it."""
    w = w.detach().float()
    gram = w @ w.mT  # (head, d_head, d_head)
    eye = torch.eye(w.shape[-2], device=w.device)
    return bool(torch.allclose(gram, eye.expand_as(gram), atol=max(1e-3, 8 * _eps(w)), rtol=0))


def _params(model: Model, *leaves: str) -> list[tuple[str, Tensor]]:
    return [(n, p) for n, p in model.named_parameters() if n.rsplit(".", 1)[-1] in leaves]


def _centring_applies(model: Model) -> bool:
    c = model.cfg
    return c.normalization_type in ("LN", "LNPre") and not c.final_rms


def _no_attn_biases(model: Model) -> bool:
    return not any(bool((p != 0).any()) for _, p in _params(model, "b_V", "_b_V", "b_O"))


def detect_processing(model: Model) -> dict[str, bool | None]:
    """The processing flags the model's config and weights show; None where they cannot tell."""
    if is_bridge(model):
        return dict(bridge_processing(model))
    from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

    c = model.cfg
    writing = _params(model, *_WRITING)
    if c.original_architecture in POST_NORM_ARCHITECTURES or c.positional_embedding_type in _NOT_CENTRED_POS:
        skip = ("W_E", "W_pos") if c.original_architecture in POST_NORM_ARCHITECTURES else ("W_pos",)
        writing = [(n, p) for n, p in writing if n.rsplit(".", 1)[-1] not in skip]
    unembed = _params(model, "W_U", "b_U")
    b_v = _params(model, "b_V", "_b_V")
    w_o = _params(model, "W_O")
    if any(bool((p != 0).any()) for _, p in b_v):
        folded: bool | None = False
    else:
        folded = False if _no_attn_biases(model) else None
    return {
        "fold_ln": c.normalization_type in ("LNPre", "RMSPre"),
        "center_writing_weights": _centring_applies(model) and all(_zero_mean(p) for _, p in writing),
        "center_unembed": bool(unembed) and all(_zero_mean(p) for _, p in unembed),
        "fold_value_biases": folded,
        "refactor_factored_attn_matrices": c.positional_embedding_type != "rotary"
        and bool(w_o)
        and all(_orthonormal_rows(p) for _, p in w_o),
    }


def _applicable(model: Model, flags: dict[str, bool | None]) -> dict[str, bool | None]:
    """False for steps TL skips on this model or that change nothing in it, whatever was asked."""
    if is_bridge(model):
        return dict(flags)
    c = model.cfg
    out = dict(flags)
    if c.normalization_type not in ("LN", "LNPre", "RMS", "RMSPre"):
        out["fold_ln"] = False
    if not _centring_applies(model):
        out["center_writing_weights"] = False
    if _no_attn_biases(model):
        out["fold_value_biases"] = False
    if c.positional_embedding_type == "rotary":
        out["refactor_factored_attn_matrices"] = False
    return out


def _check_processing(processing: dict[str, Any]) -> None:
    unknown = sorted(set(processing) - set(PROCESSING_FLAGS))
    if unknown:
        raise ModelError(f"unknown processing flags {unknown}; known: {sorted(PROCESSING_FLAGS)}")
    bad = sorted(k for k, v in processing.items() if not isinstance(v, bool))
    if bad:
        raise ModelError(f"processing flags must be True or False: {bad}")


def _identity(
    model: Model, name: str, source: str | None, seen: dict[str, bool | None], processing: dict | None
) -> dict[str, Any]:
    flags = dict(seen)
    if processing:
        _check_processing(processing)
        flags.update(processing)
    flags = _applicable(model, flags)
    unknown = [k for k, v in flags.items() if v is None]
    if unknown:
        raise ModelError(
            f"cannot tell from the weights whether {', '.join(unknown)} was applied (every b_V is zero, b_O is "
            f"not): pass processing={{'{unknown[0]}': True or False}} to model_identity or identity.register"
        )
    c = model.cfg
    if is_bridge(model):
        shape = bridge_shape(model)
    else:
        shape = {
            "architecture": c.original_architecture,
            "n_layers": c.n_layers,
            "n_heads": c.n_heads,
            "d_head": c.d_head,
            "d_model": c.d_model,
            "d_vocab": c.d_vocab,
        }
    revision = getattr(model.original_model.config, "_commit_hash", None) if is_bridge(model) else None
    return {
        "name": name,
        "revision": revision,  # the hub commit a bridge's weights came from, where transformers knows it
        **shape,
        "source_sha256": source,
        "weights_sha256": weights_digest(model),
        "processing": flags,
    }


# ---------------------------------------------------------------- the weights digest

# model -> (parameter stamp, digest): computed once per model and weights
_DIGESTS: weakref.WeakKeyDictionary[Any, tuple[tuple, str]] = weakref.WeakKeyDictionary()


def forget_digest(model: Any) -> None:
    """Drop the remembered weights digest (after writing weights through ``.data``, which no stamp sees)."""
    _DIGESTS.pop(model, None)
    if hasattr(model, "original_model"):
        _DIGESTS.pop(model.original_model, None)


def _digest(matrices: list[Tensor]) -> str:
    """SHA-256 of the matrices' shapes and their values rounded to bfloat16 (the same for a float32 or bf16 load)."""
    h = hashlib.sha256()
    for w in matrices:
        w = w.detach()
        h.update(repr(tuple(w.shape)).encode())
        for chunk in w.reshape(-1).split(1 << 24):  # 32 MB of bfloat16 at a time
            h.update(chunk.to("cpu", torch.bfloat16).view(torch.int16).numpy().tobytes())
    return h.hexdigest()


def _memo(model: Any, matrices) -> str | None:
    known = _DIGESTS.get(model)
    stamp = weights_stamp(model)
    if known is not None and known[0] == stamp:
        return known[1]
    mats = matrices()
    if any(m.is_meta for m in mats):  # weights offloaded to disk by accelerate: not read here
        return None
    digest = _digest(mats)
    _DIGESTS[model] = (stamp, digest)
    return digest


def _out_weight(proj: Any) -> Tensor:
    """An output projection's weight as (d_model, head d_head): Linear's own, GPT-2's Conv1D transposed."""
    proj = getattr(proj, "_original_component", proj)  # the bridge wraps each linear
    return proj.weight if isinstance(proj, torch.nn.Linear) else proj.weight.T


def hf_weights_digest(hf_model: Any) -> str | None:
    """``weights_digest`` of a transformers model: its attention output projections and unembedding."""

    def matrices() -> list[Tensor]:
        outs = [_out_weight(p) for p in output_projections(hf_model)]
        return [*outs, _out_weight(hf_model.get_output_embeddings())]

    return _memo(hf_model, matrices)


def weights_digest(model: Model) -> str | None:
    """A digest of the weights that tells two models apart on either engine or in transformers.

    It covers every layer's attention output projection, as (d_model, head d_head), and the
    unembedding, as (d_vocab, d_model): the weights SITE's injection passes through, and those
    no engine rescales when it loads a model without processing (HookedTransformer scales
    Gemma's embedding). A base model and its fine-tune, or two random inits, differ here.
    None where accelerate has offloaded weights to disk (they are not read for a digest).
    """
    if is_bridge(model):

        def matrices() -> list[Tensor]:
            outs = [_out_weight(b.attn.o) for b in model.blocks]
            return [*outs, _out_weight(model.original_model.get_output_embeddings())]

    else:

        def matrices() -> list[Tensor]:
            outs = [
                b.attn.W_O.reshape(-1, b.attn.W_O.shape[-1]).T for b in model.blocks
            ]  # W_O: (head, d_head, d_model)
            return [*outs, model.unembed.W_U.T]

    return _memo(model, matrices)


def register(
    model: Model,
    name: str | None = None,
    *,
    source: str | None = None,
    processing: dict[str, bool] | None = None,
) -> Model:
    """Remember the model's name, source digest and processing flags (those given, the rest read off it)."""
    seen = detect_processing(model)
    _REGISTRY[model] = (_identity(model, name or model.cfg.model_name, source, seen, processing), seen)
    return model


def model_identity(model: Model, processing: dict[str, bool] | None = None) -> dict[str, Any]:
    """Name, shape, source and processing flags of a model: what an adapter must match.

    The flags are those registered by ``load_model`` / ``tiny_model`` while the
    weights still show what they showed then, else what the config and weights
    show (module docstring); ``processing`` overrides or completes either.
    ModelError where a flag cannot be told and ``processing`` does not say.

    Example:
        >>> import site_lens as sl
        >>> ident = model_identity(sl.tiny_model())
        >>> ident["name"], ident["n_layers"], ident["n_heads"], ident["d_head"]
        ('tiny-2x4', 2, 4, 8)
        >>> sorted(ident["processing"])                  # weight processing an adapter must match
        ['center_unembed', 'center_writing_weights', 'fold_ln', 'fold_value_biases', 'refactor_factored_attn_matrices']
    """
    seen = detect_processing(model)
    known, known_seen = _REGISTRY.get(model, (None, None))
    if known is not None and known_seen == seen:  # not processed since it was registered
        flags: dict[str, bool | None] = dict(known["processing"])
    else:
        flags = seen
    name = known["name"] if known is not None else model.cfg.model_name
    source = known["source_sha256"] if known is not None else None
    return _identity(model, name, source, flags, processing)


# ---------------------------------------------------------------- transformers models and bridges

_SOURCES: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()


def source_of(model: Any) -> dict[str, Any]:
    """{'name', 'source_sha256'} recorded by ``load_hf_model`` for this model ({} for any other)."""
    return dict(_SOURCES.get(model, {}))


def record_source(model: Any, name: str, digest: str | None) -> None:
    """Remember the name and GGUF digest ``hf.load_hf_model`` loaded a transformers model by."""
    _SOURCES[model] = {"name": name, "source_sha256": digest}


def hf_name(model: Any) -> str:
    """The name an identity gives a transformers model: ``load_hf_model``'s, else the config's path or hub id,
    else the class name (an in-memory model); ``convert.hooked_from_hf`` and the bridge give their models the same."""
    known = _SOURCES.get(model, {})
    return known.get("name") or getattr(model.config, "_name_or_path", "") or type(model).__name__


def output_projections(model: Any) -> list[torch.nn.Module]:
    """Each layer's attention output projection, whose input is hook_z with the heads concatenated."""
    found: dict[int, torch.nn.Module] = {}
    for name, module in model.named_modules():
        parts = name.split(".")
        if (
            len(parts) >= 4
            and parts[-3].isdigit()
            and parts[-4] in ("layers", "h")
            and (parts[-2:] == ["self_attn", "o_proj"] or parts[-2:] == ["attn", "c_proj"])
        ):
            found[int(parts[-3])] = module
    if not found or sorted(found) != list(range(len(found))):
        raise ModelError(
            f"cannot find the attention output projections of {type(model).__name__} "
            "(looked for layers.N.self_attn.o_proj and h.N.attn.c_proj)"
        )
    return [found[i] for i in range(len(found))]


def bridge_processing(bridge: Any) -> dict[str, bool]:
    """The processing flags of a bridge: all False for raw weights; TransformerLens's defaults once processed."""
    processed = bool(getattr(bridge, "_weights_processed", False) or getattr(bridge, "compatibility_mode", False))
    if not processed:
        return dict(PROCESSING_FLAGS)
    fold = getattr(bridge.cfg, "layer_norm_folding", None)
    return {
        "fold_ln": True if fold is None else bool(fold),
        "center_writing_weights": True,
        "center_unembed": True,
        "fold_value_biases": True,
        "refactor_factored_attn_matrices": False,
    }


def bridge_shape(bridge: Any) -> dict[str, Any]:
    """Architecture and shape, as ``identity`` records them for either engine."""
    c = bridge.cfg
    return {
        "architecture": architecture(bridge),
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "d_head": c.d_head,
        "d_model": c.d_model,
        "d_vocab": c.d_vocab,
    }
