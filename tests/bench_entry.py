"""Test-only entry point: ``python tests/bench_entry.py bench --model tiny ...`` runs the real CLI
with ``--model tiny`` mapped to the tiny random model and every method given a small budget.
``SMALL_ROW_SECONDS=S`` makes each row take at least S seconds (inside its lock): a test that
must catch a process while it holds a row's lock then cannot miss it."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch

torch.set_num_threads(1)

from small import SMALL_EMBEDDING, small_methods

from site_lens import models
from site_lens.cli import main
from site_lens.experiments import bench
from site_lens.methods import METHODS

_load = models.load_model


def _load_model(name, **kw):
    """``tiny``: the tiny HookedTransformer, or on TransformerLens 4 a tiny Llama bridge."""
    from helpers import char_tokenizer, tiny

    from site_lens.models.engines import HOOKED
    from site_lens.models.tiny import tiny_bridge

    if name != "tiny":
        return _load(name, **kw)
    if HOOKED is None or kw.get("engine") == "bridge":
        return tiny_bridge("llama", char_tokenizer(), name="tiny", max_position_embeddings=256)
    return tiny(n_ctx=256)


models.load_model = _load_model
METHODS.update(small_methods())
_run_bench = bench.run_bench


def _small_run_bench(*args, cfg, **kw):
    """The CLI's bench with the small budgets: tiny few-shot prompts and the small methods."""
    return _run_bench(*args, cfg=replace(cfg, embedding=SMALL_EMBEDDING), factories=METHODS, **kw)


bench.run_bench = _small_run_bench
_fit_and_score = bench.fit_and_score


def _slow_fit_and_score(*args, **kw):
    time.sleep(float(os.environ.get("SMALL_ROW_SECONDS", "0")))
    return _fit_and_score(*args, **kw)


bench.fit_and_score = _slow_fit_and_score

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
