"""Many prompts against their cached prefixes: ``PromptCache``.

Every prompt's prefix (all tokens but the last) runs once through a backend
(``backend.backend_for``), grouped by length; each training step, MTV reward, FV/TV layer
choice, patching or transfer run then costs one token per prompt. ``objectives.SequenceCache``
extends it to answer spans.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from ..tokens import Example, by_length, fit_batches
from ..types import Model
from .backend import Backend, ResidEdits, backend_for
from .prefix import Prefix


class PromptCache:
    """Every prompt's prefix (all tokens but the last) run once, grouped by length, for repeated last-token runs.

    ``logits(indices, alpha, t)`` and ``loss(indices, alpha, t)`` then cost one token per
    prompt. ``alpha`` and ``t`` are one for all prompts or one per prompt (a leading dim of
    ``len(cache)``, indexed by prompt). With ``owners`` (one int per prompt: which task, say,
    it belongs to) a leading dim is one per owner instead, indexed by each prompt's owner, so
    prompts of many tasks run in one call, each under its own task's gate. With ``ragged`` (on a
    backend that takes it: the packed one) prompts of different lengths share one forward, their
    prefixes right-padded (``Prefix.pad``); otherwise one forward per prefix length.
    """

    def __init__(
        self,
        model: Model,
        examples: Sequence[Example],
        batch_size: int = 32,
        backend: Backend | None = None,
        owners: Sequence[int] | None = None,
        ragged: bool = False,
    ):
        if any(len(e.tokens) < 2 for e in examples):
            raise ValueError("every prompt needs at least two tokens (a prefix and a last token)")
        if owners is not None and len(owners) != len(examples):
            raise ValueError(f"{len(owners)} owners for {len(examples)} prompts")
        self.owners = None if owners is None else torch.tensor(list(owners), dtype=torch.long)
        self.model = model
        self.backend = backend or backend_for(model)
        # prompts of every length in one forward (their prefixes right-padded), where the backend takes that
        self.ragged = ragged and getattr(self.backend, "ragged", False)
        self.examples = list(examples)
        self.where: dict[int, tuple[int, int]] = {}  # prompt index -> (prefix length, row in group)
        self.prefixes: dict[int, Prefix] = {}  # prefix length -> the group's prefix
        lengths = [len(ex.tokens) - 1 for ex in self.examples]
        device = model.cfg.device
        for length, idx in by_length(lengths).items():
            for row, i in enumerate(idx):
                self.where[i] = (length, row)
            parts = fit_batches(idx, lengths, batch_size, model.cfg.n_heads)
            self.prefixes[length] = Prefix.cat(
                [
                    self.backend.prefix(torch.tensor([self.examples[i].tokens[:-1] for i in part], device=device))
                    for part in parts
                ]
            )

    def __len__(self) -> int:
        return len(self.examples)

    def groups(self, indices: Sequence[int]) -> dict[int, list[int]]:
        """``indices`` grouped by prefix length (each group's rows share one cached prefix)."""
        return {n: [indices[p] for p in part] for n, part in self._positions(indices).items()}

    def _positions(self, indices: Sequence[int]) -> dict[int, list[int]]:
        """Positions in ``indices`` grouped by their prompts' prefix length."""
        by_len: dict[int, list[int]] = {}
        for p, i in enumerate(indices):
            by_len.setdefault(self.where[i][0], []).append(p)
        return by_len

    def _per(self, x: Tensor | None, dims: int, idx: list[int], owners: list[int] | None) -> Tensor | None:
        if x is None or x.dim() == dims:
            return x
        if owners is not None:  # the caller's owner per row
            rows = torch.tensor(owners)
        else:
            rows = torch.tensor(idx) if self.owners is None else self.owners[idx]
        return x[rows.to(x.device)]

    def logits(
        self,
        indices: Sequence[int],
        alpha: Tensor | None = None,
        t: Tensor | None = None,
        resid_edits: ResidEdits | None = None,
    ) -> list[tuple[list[int], Float[Tensor, "rows d_vocab"]]]:
        """(prompt indices, their last-token logits) per prefix length among ``indices``."""
        indices = list(indices)
        return [([indices[p] for p in pos], out) for pos, out in self._logits(indices, None, alpha, t, resid_edits)]

    def logits_as(
        self,
        indices: Sequence[int],
        owners: Sequence[int],
        alpha: Tensor | None = None,
        t: Tensor | None = None,
    ) -> list[tuple[list[int], Float[Tensor, "rows d_vocab"]]]:
        """``logits`` with each row's owner given by the caller (one per entry of ``indices``, which may
        repeat a prompt: one cached prefix serving several owners, e.g. the seeds of one task): (positions
        in ``indices``, their logits) per forward."""
        if len(owners) != len(indices):
            raise ValueError(f"{len(owners)} owners for {len(indices)} rows")
        return self._logits(list(indices), list(owners), alpha, t, None)

    def _logits(
        self,
        indices: list[int],
        owners: list[int] | None,
        alpha: Tensor | None,
        t: Tensor | None,
        resid_edits: ResidEdits | None,
    ) -> list[tuple[list[int], Tensor]]:
        device = self.model.cfg.device
        groups = self._positions(indices)

        def per(pos: list[int]) -> tuple[Tensor | None, Tensor | None]:
            idx, own = [indices[p] for p in pos], None if owners is None else [owners[p] for p in pos]
            return self._per(alpha, 2, idx, own), self._per(t, 3, idx, own)

        if self.ragged and len(groups) > 1 and all(self.prefixes[n].tokens is None for n in groups):
            pos = [p for part in groups.values() for p in part]
            prefix = Prefix.pad(
                [
                    self.prefixes[n].select(torch.tensor([self.where[indices[p]][1] for p in part], device=device))
                    for n, part in groups.items()
                ]
            )
            last = torch.tensor([self.examples[indices[p]].tokens[-1] for p in pos], device=device)
            return [(pos, self.backend.logits(last, prefix, *per(pos), resid_edits=resid_edits))]
        out = []
        for length, pos in groups.items():
            rows = torch.tensor([self.where[indices[p]][1] for p in pos], device=device)
            last = torch.tensor([self.examples[indices[p]].tokens[-1] for p in pos], device=device)
            prefix = self.prefixes[length].select(rows)
            out.append((pos, self.backend.logits(last, prefix, *per(pos), resid_edits=resid_edits)))
        return out

    def loss(
        self,
        indices: Sequence[int],
        alpha: Tensor | None = None,
        t: Tensor | None = None,
        resid_edits: ResidEdits | None = None,
    ) -> Tensor:
        """Mean first-token cross-entropy of ``indices`` with the gate (and residual edits) at the last token."""
        total = torch.zeros((), device=self.model.cfg.device)
        for idx, logits in self.logits(indices, alpha, t, resid_edits):
            target = torch.tensor([self.examples[i].target for i in idx], device=logits.device)
            total = total + F.cross_entropy(logits.float(), target, reduction="sum")
        return total / len(indices)
