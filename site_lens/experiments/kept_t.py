"""Stage 1's t kept beside a bench folder's row files, labelled with what it depends on, so an atlas
built from the folder need not recompute it."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from ..config import EmbeddingConfig
from ..files import write_bytes_atomic

log = logging.getLogger(__name__)
ROWS_DIR = "rows"  # a bench folder's row files (bench.ROWS_DIR)


T_FILE = "t.safetensors"  # beside a (task, seed)'s row files: stage 1's t, kept so an atlas need not recompute it


def t_path(out: Path, task: str, seed: int) -> Path:
    return out / ROWS_DIR / task / f"seed{seed}" / T_FILE


def t_label(model_name: str, dtype: str, embedding: EmbeddingConfig, task: Any) -> dict[str, str]:
    """What a kept t depends on: the model, its dtype, stage 1's settings and the task's train pairs (its prompts)."""
    pairs = json.dumps([list(p) for p in task.train], ensure_ascii=False)
    return {
        "model": model_name,
        "dtype": str(dtype).removeprefix("torch."),
        "embedding": json.dumps(embedding.to_dict(), sort_keys=True),
        "train_sha256": hashlib.sha256(pairs.encode()).hexdigest(),
    }


def keep_t(out: Path, task: str, seed: int, t: Any, label: dict[str, str]) -> bool:
    """Keep a (task, seed)'s t beside its rows, labelled (``t_label``); False (and a log line) where it cannot be
    written: keeping t saves later work, its absence costs only a recomputation."""
    from safetensors.torch import save

    try:
        write_bytes_atomic(t_path(out, task, seed), save({"t": t.detach().float().cpu().contiguous()}, metadata=label))
    except OSError as e:
        log.warning("t of %s seed %d not kept under %s (%s)", task, seed, out, e.strerror or e)
        return False
    return True


def kept_t(out: Path, task: str, seed: int, label: dict[str, str]) -> Any:
    """The t ``keep_t`` kept under this label, or None (absent, unreadable or made otherwise)."""
    from safetensors import safe_open

    path = t_path(out, task, seed)
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor("t") if (f.metadata() or {}) == label else None
    except Exception:  # a truncated or foreign file: recomputed, never trusted
        return None
