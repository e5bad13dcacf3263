"""What the last-token backends keep between calls: prompt prefixes' keys and values, and decode caches."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor


@dataclass
class Prefix:
    """Frozen keys (rotated) and values of a batch of prompt prefixes, one pair per layer.

    A bridge whose KV-cache path disagrees with its full forward keeps the prefix tokens instead
    (``tokens``; ``keys`` and ``values`` empty) and runs them again with the last token(s).
    """

    keys: list[Tensor]  # per layer (batch, kv_head, pos, d_head)
    values: list[Tensor]  # per layer (batch, kv_head, pos, d_head)
    tokens: Tensor | None = None  # (batch, pos): the bridge's prefix

    @property
    def length(self) -> int:
        return self.keys[0].shape[2] if self.keys else self.tokens.shape[1]

    @property
    def rows(self) -> int:
        return self.keys[0].shape[0] if self.keys else self.tokens.shape[0]

    def select(self, rows: Int[Tensor, " rows"]) -> Prefix:
        toks = None if self.tokens is None else self.tokens.index_select(0, rows.to(self.tokens.device))
        if rows.numel() == 1:  # a view, no copy (batch-1 training steps)
            r = int(rows)
            return Prefix([k[r : r + 1] for k in self.keys], [v[r : r + 1] for v in self.values], toks)
        return Prefix(
            [k.index_select(0, rows) for k in self.keys], [v.index_select(0, rows) for v in self.values], toks
        )

    @staticmethod
    def cat(parts: list[Prefix]) -> Prefix:
        n = len(parts[0].keys)
        toks = None if parts[0].tokens is None else torch.cat([p.tokens for p in parts])
        return Prefix(
            [torch.cat([p.keys[i] for p in parts]) for i in range(n)],
            [torch.cat([p.values[i] for p in parts]) for i in range(n)],
            toks,
        )


def check_rows(batch: int, prefix: Prefix, alpha: Tensor | None, what: str = "tokens") -> None:
    """ValueError unless ``alpha`` and ``prefix`` have one row or ``batch`` rows (one per token, or span: ``what``)."""
    if alpha is not None and alpha.dim() == 3 and alpha.shape[0] != batch:
        raise ValueError(f"alpha has {alpha.shape[0]} rows for {batch} {what}")
    if prefix.rows not in (1, batch):
        raise ValueError(f"prefix has {prefix.rows} rows for {batch} {what}")


@dataclass
class DecodeCache:
    """Keys (rotated) and values of a batch being decoded, in preallocated slots, with a validity mask."""

    keys: list[Tensor]  # per layer (batch, kv_head, capacity, d_head)
    values: list[Tensor]  # per layer (batch, kv_head, capacity, d_head)
    valid: Tensor  # (batch, capacity) bool: slot holds a real token (pads and unused slots are False)
    used: int  # slots filled so far
    pos: Tensor  # (batch,) rotary position of each row's next token

    def select(self, rows: Int[Tensor, " rows"]) -> DecodeCache:
        """The cache of only these rows (finished rows dropped from a generating batch); copies them once."""
        return DecodeCache(
            [k.index_select(0, rows) for k in self.keys],
            [v.index_select(0, rows) for v in self.values],
            self.valid.index_select(0, rows),
            self.used,
            self.pos.index_select(0, rows),
        )
