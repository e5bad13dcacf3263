"""The on-disk cache of converted weights, so later loads skip the GGUF dequantisation.

An entry is a folder named after the model, its source's SHA-256 and
``CACHE_VERSION``: ``weights.safetensors`` (the TransformerLens state dict),
``tokenizer/`` and ``meta.json`` (version, source digest, the weights file's
size and header hash, the JSON-able config). An entry that does not match its
source or whose weights file is damaged is rebuilt, never used; a cache that
cannot be written only logs a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import torch

from ..files import write_dir
from ..types import Model
from .convert import finalize, new_hooked

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # 2: the converted tokenizer prepends BOS, as a cached one did
WEIGHTS_FILE = "weights.safetensors"
META_FILE = "meta.json"


def source_digest(paths: list[Path]) -> str:
    """SHA-256 of the files concatenated (the GGUF parts): the cache key."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def entry_path(cache_dir: Path, name: str, digest: str) -> Path:
    """The entry folder for model ``name`` converted from the source with this digest."""
    return cache_dir / f"{name}-{digest[:16]}-v{CACHE_VERSION}"


def fingerprint(path: Path) -> dict[str, Any]:
    """Size and header hash of a safetensors file: catches truncation, swaps and header damage.

    Hashing the whole file would also catch flipped bytes in the tensor data,
    but reads every weight on every load; the header (names, dtypes, shapes,
    offsets) is small and read anyway.
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


def save(entry: Path, model: Model, digest: str, since: float | None = None) -> None:
    """Write ``model`` as the entry for the source ``digest``, atomically; a failure only warns.

    ``since``: when the caller found no usable entry (``time.time()``). An entry for ``digest`` whose
    metadata was written after that, by another process building the same model, is kept; anything
    else there (stale, damaged) is replaced.
    """
    from safetensors.torch import save_file

    def fill(tmp: Path) -> None:
        save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(tmp / WEIGHTS_FILE))
        model.tokenizer.save_pretrained(str(tmp / "tokenizer"))
        cfg = {k: v for k, v in model.cfg.to_dict().items() if _jsonable(v)}
        meta = {
            "cache_version": CACHE_VERSION,
            "source_sha256": digest,
            "weights": fingerprint(tmp / WEIGHTS_FILE),
            "cfg": cfg,
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))

    try:
        write_dir(entry, fill, keep=lambda e: since is not None and _written_since(e, digest, since))
    except OSError as e:  # a read-only cache must not stop the user
        log.warning("could not write the weight cache at %s: %s", entry, e)


def _written_since(entry: Path, digest: str, since: float) -> bool:
    """Whether ``entry`` is a whole entry for ``digest`` whose metadata was written at or after ``since``."""
    try:
        meta_path = entry / META_FILE
        meta = json.loads(meta_path.read_text())
        return (
            meta_path.stat().st_mtime >= since
            and meta.get("source_sha256") == digest
            and meta.get("cache_version") == CACHE_VERSION
            and meta.get("weights") == fingerprint(entry / WEIGHTS_FILE)
        )
    except (OSError, ValueError):
        return False


def load(entry: Path, digest: str, device: str, dtype: torch.dtype) -> Model | None:
    """The cached model (finalized on ``device`` in ``dtype``), or None if absent, stale or damaged."""
    if not (entry / META_FILE).exists():
        return None
    try:
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        meta = json.loads((entry / META_FILE).read_text())
        if meta.get("source_sha256") != digest or meta.get("cache_version") != CACHE_VERSION:
            log.warning("weight cache %s does not match its source; rebuilding", entry)
            return None
        if meta.get("weights") != fingerprint(entry / WEIGHTS_FILE):
            log.warning("weight cache %s: %s is damaged or replaced; rebuilding", entry, WEIGHTS_FILE)
            return None
        from transformer_lens import HookedTransformerConfig

        known = set(HookedTransformerConfig.__dataclass_fields__)
        cfg_d = {k: v for k, v in meta["cfg"].items() if k in known and k not in ("n_params", "device", "dtype")}
        cfg = HookedTransformerConfig(**cfg_d, device=device, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(entry / "tokenizer"))
        state = load_file(str(entry / WEIGHTS_FILE), device=str(device))
        state = {k: v.to(dtype) for k, v in state.items()}
        model = new_hooked(cfg, tokenizer, move_to_device=False)
        model.load_state_dict(state, strict=True)
        return finalize(model, device)
    except Exception as e:  # corrupt cache: rebuild from the GGUF rather than fail
        log.warning("weight cache %s unreadable (%s); rebuilding", entry, e)
        return None
