"""The one probe of the seam: a faster path held to its reference on a seeded prompt before it is used.

``backend.backend_for`` holds packed weights to the model's reference backend, and
``bridge_backend.cache_agrees`` holds a bridge's KV-cache path to its full forward;
both compare logits on the same seeded inputs (``probe_inputs``) with the same
measure (``relative_error``) against the same tolerance (``PROBE_TOL``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

PROBE_TOL = 1e-4  # max |candidate - reference| logit over max(1, max |logit|); at least 8 eps of the dtype


def tolerance(dtype: torch.dtype) -> float:
    """``PROBE_TOL``, or 8 machine epsilons of ``dtype`` where that is larger (half precision)."""
    return max(PROBE_TOL, 8 * torch.finfo(dtype).eps)


def relative_error(got: Tensor, want: Tensor) -> float:
    """Max |got - want| over the largest |want| (at least 1)."""
    return float((got - want).abs().max() / want.abs().max().clamp(min=1.0))


def probe_inputs(model: Any, n: int = 8, rows: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded tokens (rows, n), a random gate alpha (layer, head) and t (layer, head, d_head) of unit scale."""
    c = model.cfg
    dev = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, c.d_vocab, (rows, min(n, c.n_ctx)), generator=gen).to(dev)
    alpha = torch.rand(c.n_layers, c.n_heads, generator=gen).to(device=dev, dtype=c.dtype)
    t = torch.randn(c.n_layers, c.n_heads, c.d_head, generator=gen).to(device=dev, dtype=c.dtype)
    return tokens, alpha, t


@torch.no_grad()
def agreement(candidate: Any, reference: Any, tokens: Tensor, alpha: Tensor, t: Tensor) -> float:
    """The largest relative error of ``candidate``'s logits against ``reference``'s: the gated last token after
    its prefix, and (four tokens or more) a span of three after a shorter prefix (the sequence objective)."""
    err = relative_error(
        candidate.logits(tokens[:, -1], candidate.prefix(tokens[:, :-1]), alpha, t),
        reference.logits(tokens[:, -1], reference.prefix(tokens[:, :-1]), alpha, t),
    )
    if tokens.shape[1] >= 4:
        err = max(
            err,
            relative_error(
                candidate.span_logits(tokens[:, -3:], candidate.prefix(tokens[:, :-3]), alpha, t),
                reference.span_logits(tokens[:, -3:], reference.prefix(tokens[:, :-3]), alpha, t),
            ),
        )
    return err
