"""GGUF -> HF -> TransformerLens: config mapping by architecture, weights by TL's own converters.

transformers (+ ``gguf``) dequantises a GGUF file into an HF model; its config is
mapped to a ``HookedTransformerConfig`` by *architecture* (the HF model class),
and its weights go through TransformerLens's converter for that architecture.
Every model site-lens hands out ends in ``finalize``: on its device and dtype,
re-strided (``fast_layout``), in eval mode, frozen.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..locks import owner_tag, temp_is_orphan
from ..types import Model
from .engines import PROCESSING_FLAGS, ModelError, hooked_class


def fast_layout(model: Model) -> Model:
    """Re-stride weights so TransformerLens's forward stops copying them on every call.

    TransformerLens 3.9 computes ``F.linear(x, W.T.contiguous())`` in the MLP and
    unembedding and rearranges W_Q / W_O with a copy in attention, so each
    forward pass copies every weight matrix (for one token, the copies cost
    more than the matmuls). Storing each weight as a view of the contiguous
    matrix that F.linear wants makes those copies no-ops. Values are unchanged,
    so outputs are bit-identical.
    """

    def restride(module, name: str, make) -> None:
        p = getattr(module, name, None)
        if isinstance(p, torch.nn.Parameter):
            p.data = make(p.data)

    def mlp_in(w):  # (d_model, d_mlp) stored as the transpose of a contiguous (d_mlp, d_model)
        return w.T.contiguous().T

    def attn_in(w):  # (head, d_model, d_head) as a view of contiguous ((head d_head), d_model)
        h, m, d = w.shape
        return w.permute(0, 2, 1).contiguous().view(h, d, m).permute(0, 2, 1)

    def attn_out(w):  # (head, d_head, d_model) as a view of contiguous (d_model, (head d_head))
        h, d, m = w.shape
        return w.permute(2, 0, 1).reshape(m, h * d).contiguous().view(m, h, d).permute(1, 2, 0)

    for block in model.blocks:
        for n in ("W_Q", "W_K", "W_V", "_W_K", "_W_V"):
            restride(block.attn, n, attn_in)
        restride(block.attn, "W_O", attn_out)
        mlp = getattr(block, "mlp", None)
        if mlp is not None and type(mlp).__name__ == "GatedMLP":
            for n in ("W_gate", "W_in", "W_out"):
                restride(mlp, n, mlp_in)
    restride(model.unembed, "W_U", mlp_in)
    return model


def finalize(model: Model, device: str | None = None, dtype: torch.dtype | None = None) -> Model:
    """Move to ``dtype`` and ``device`` (None: leave as is), re-stride, eval mode, frozen."""
    if dtype is not None:
        model.to(dtype, print_details=False)  # also sets cfg.dtype
    if device is not None:
        model.to(device, print_details=False)  # also sets cfg.device
    fast_layout(model)
    model.eval()
    model.requires_grad_(False)  # SITE never trains model weights
    return model


def new_hooked(cfg: Any, tokenizer: Any = None, **kwargs: Any) -> Model:
    """``HookedTransformer(cfg, tokenizer)`` without TransformerLens's deprecation warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return hooked_class()(cfg, tokenizer=tokenizer, **kwargs)


# ---------------------------------------------------------------- HF -> TL config


def _shape_cfg(c: Any, head_dim: int) -> dict[str, Any]:
    """The size fields every decoder config maps the same way."""
    return dict(
        d_model=c.hidden_size,
        d_head=head_dim,
        n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=min(int(c.max_position_embeddings), 8192),  # a safe default; both models support more
        eps=float(c.rms_norm_eps),
        d_vocab=c.vocab_size,
    )


def _llama_cfg(c: Any) -> dict[str, Any]:
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rope = getattr(c, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    kv = c.num_key_value_heads
    return dict(
        **_shape_cfg(c, head_dim),
        act_fn=c.hidden_act,
        n_key_value_heads=kv if kv != c.num_attention_heads else None,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=head_dim,
        rotary_base=float(theta),
        final_rms=True,
        gated_mlp=True,
    )


def _gemma3_cfg(c: Any) -> dict[str, Any]:
    rope = getattr(c, "rope_parameters", None) or {}
    # transformers 5 nests rope settings per attention type
    full = rope.get("full_attention", rope) if isinstance(rope, dict) else {}
    local = rope.get("sliding_attention", {}) if isinstance(rope, dict) else {}
    theta = full.get("rope_theta", getattr(c, "rope_theta", 1_000_000.0))
    theta_local = local.get("rope_theta", getattr(c, "rope_local_base_freq", 10_000.0))
    types = list(getattr(c, "layer_types", None) or [])
    attn_types = ["global" if t == "full_attention" else "local" for t in types]
    return dict(
        **_shape_cfg(c, c.head_dim),
        act_fn=getattr(c, "hidden_activation", None) or "gelu_pytorch_tanh",
        initializer_range=0.02,
        normalization_type="RMS",
        rotary_base=float(theta),
        rotary_base_local=float(theta_local),
        positional_embedding_type="rotary",
        use_attn_scale=True,
        n_key_value_heads=c.num_key_value_heads,
        gated_mlp=True,
        final_rms=True,
        use_normalization_before_and_after=True,
        use_qk_norm=True,
        window_size=c.sliding_window,
        use_local_attn=True,
        attn_types=attn_types,
    )


# architecture (HF model class name) -> config mapper; the weights go through
# TransformerLens's converter for the same architecture.
ARCHITECTURES = {"LlamaForCausalLM": _llama_cfg, "Gemma3ForCausalLM": _gemma3_cfg}


def hf_architecture(hf_model: Any) -> str:
    """The HF model's architecture name (its config's, else its class name): what TL's config records."""
    archs = getattr(hf_model.config, "architectures", None) or [type(hf_model).__name__]
    return archs[0]


def _tokenizer_prepends_bos(tokenizer: Any) -> bool:
    ids = tokenizer("a")["input_ids"]
    return bool(tokenizer.bos_token_id is not None and ids and ids[0] == tokenizer.bos_token_id)


def hooked_from_hf(hf_model: Any, tokenizer: Any, *, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Model:
    """Build a HookedTransformer from an in-memory HF model, with no hub access and no weight processing."""
    hooked_class()  # ModelError on TransformerLens 4, before anything else
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.loading_from_pretrained import get_pretrained_state_dict

    arch = hf_architecture(hf_model)
    if arch not in ARCHITECTURES:
        raise ModelError(f"architecture {arch} is not supported; supported: {sorted(ARCHITECTURES)}")
    cfg_dict = ARCHITECTURES[arch](hf_model.config)
    prepends_bos = _tokenizer_prepends_bos(tokenizer)
    cfg = HookedTransformerConfig(
        **cfg_dict,
        original_architecture=arch,
        init_weights=False,
        device=device,
        dtype=dtype,
        default_prepend_bos=prepends_bos,
        tokenizer_prepends_bos=prepends_bos,
    )
    with tempfile.TemporaryDirectory() as tmp:  # an existing path: TL skips its name lookup
        state_dict = get_pretrained_state_dict(tmp, cfg, hf_model=hf_model, dtype=dtype)
    model = new_hooked(cfg, tokenizer, move_to_device=False)
    model.load_and_process_state_dict(state_dict, **PROCESSING_FLAGS)
    from .identity import hf_name, register

    return register(finalize(model, cfg.device), hf_name(hf_model), processing=PROCESSING_FLAGS)


# ---------------------------------------------------------------- GGUF -> HF


def join_gguf(parts: list[Path], joined: Path) -> Path:
    """The GGUF file itself, or its parts concatenated once into ``joined``."""
    if len(parts) == 1:
        return parts[0]
    if not joined.exists():  # processes starting together each write their own temp; the last rename wins
        joined.parent.mkdir(parents=True, exist_ok=True)
        for old in joined.parent.glob(f".{joined.name}.*.tmp"):  # left by a killed writer (hundreds of MB)
            if temp_is_orphan(old):
                old.unlink(missing_ok=True)
        tmp = joined.parent / f".{joined.name}.{owner_tag()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)  # the umask's permissions
        try:
            with os.fdopen(fd, "wb") as out:
                for p in parts:
                    with open(p, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 22)
            os.replace(tmp, joined)
        finally:
            tmp.unlink(missing_ok=True)
    return joined


def tokenizer_with_bos(tokenizer: Any) -> Any:
    """The tokenizer, made to prepend its BOS token where it has one and does not already.

    TransformerLens and the bridge give every model with a BOS token a tokenizer that
    prepends it; a GGUF file may say not to (SmolLM2's does), and TransformerLens cannot
    reload a GGUF tokenizer to change that. So the tokenizer goes through a folder, as the
    weight cache stores it: a converted model and a cached one then tokenise alike.
    """
    from transformers import AutoTokenizer

    if tokenizer.bos_token_id is None or _tokenizer_prepends_bos(tokenizer):
        return tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        with_bos = AutoTokenizer.from_pretrained(tmp, add_bos_token=True)
    if not _tokenizer_prepends_bos(with_bos):
        raise ModelError(f"cannot make the tokenizer {type(tokenizer).__name__} prepend its BOS token")
    with_bos.padding_side = tokenizer.padding_side
    return with_bos


_GGUF_READ_ONCE = threading.RLock()


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """Within the block, one ``gguf.GGUFReader`` per file serves every load.

    transformers builds a reader, which parses every field of the header (one numpy view per
    vocabulary entry), for the config, again for the tokenizer and again for the weights: 13 s each
    for Gemma 3's 262k-token vocabulary on one core. The reader is read-only (a memory map), so one
    per file serves all three. ``gguf.GGUFReader`` is replaced while the block runs, so the blocks
    take turns (a lock); a reader built by another thread meanwhile is shared the same way.
    """
    import gguf as gguf_lib

    with _GGUF_READ_ONCE:
        make = gguf_lib.GGUFReader
        readers: dict[tuple[str, str], Any] = {}

        def reader(path, mode: str = "r"):
            key = (os.fspath(path), mode)
            if key not in readers:
                readers[key] = make(path, mode)
            return readers[key]

        gguf_lib.GGUFReader = reader
        try:
            yield
        finally:
            gguf_lib.GGUFReader = make


def hf_from_gguf(gguf: Path, dtype: torch.dtype = torch.float32, **kwargs: Any) -> tuple[Any, Any]:
    """(model, tokenizer) from ``transformers``, dequantised from a GGUF file with one header reader per file.

    ``kwargs`` go to ``AutoModelForCausalLM.from_pretrained`` (``device_map``, ...).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _gguf_read_once():
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype, **kwargs)
    return model, tokenizer


def hooked_from_gguf(gguf: Path) -> Model:
    """Dequantise a GGUF file (transformers + gguf) and convert it: CPU, float32, finalized."""
    hf_model, tokenizer = hf_from_gguf(gguf)
    model = hooked_from_hf(hf_model, tokenizer_with_bos(tokenizer), device="cpu", dtype=torch.float32)
    del hf_model
    return model
