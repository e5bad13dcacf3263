"""What the last-token backends keep between calls: prompt prefixes' keys and values, and decode caches."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor


@dataclass
class Prefix:
    """Frozen keys (rotated) and values of a batch of prompt prefixes, one pair per layer.

    A bridge whose KV-cache path disagrees with its full forward keeps the prefix tokens instead
    (``tokens``; ``keys`` and ``values`` empty) and runs them again with the last token(s).
    Prefixes of different lengths padded into one (``Prefix.pad``) carry each row's length
    (``lengths``): the slots past it are padding, never attended to.
    """

    keys: list[Tensor]  # per layer (batch, kv_head, pos, d_head)
    values: list[Tensor]  # per layer (batch, kv_head, pos, d_head)
    tokens: Tensor | None = None  # (batch, pos): the bridge's prefix
    lengths: Tensor | None = None  # (batch,) each row's prefix length, where rows are right-padded to ``length``

    @property
    def length(self) -> int:
        return self.keys[0].shape[2] if self.keys else self.tokens.shape[1]

    @property
    def rows(self) -> int:
        return self.keys[0].shape[0] if self.keys else self.tokens.shape[0]

    def select(self, rows: Int[Tensor, " rows"]) -> Prefix:
        toks = None if self.tokens is None else self.tokens.index_select(0, rows.to(self.tokens.device))
        lengths = None if self.lengths is None else self.lengths.index_select(0, rows.to(self.lengths.device))
        if rows.numel() == 1:  # a view, no copy (batch-1 training steps)
            r = int(rows)
            return Prefix([k[r : r + 1] for k in self.keys], [v[r : r + 1] for v in self.values], toks, lengths)
        return Prefix(
            [k.index_select(0, rows) for k in self.keys], [v.index_select(0, rows) for v in self.values], toks, lengths
        )

    @staticmethod
    def pad(parts: list[Prefix]) -> Prefix:
        """Prefixes of any lengths as one, each part's rows right-padded to the longest (``lengths`` says where
        each row ends). Keys and values only (not a bridge's token prefix)."""
        if any(p.tokens is not None or p.lengths is not None for p in parts):
            raise ValueError("Prefix.pad takes key/value prefixes of one length each")
        longest = max(p.length for p in parts)
        device = parts[0].keys[0].device
        lengths = torch.cat([torch.full((p.rows,), p.length, dtype=torch.long, device=device) for p in parts])

        def padded(x: Tensor) -> Tensor:
            return F.pad(x, (0, 0, 0, longest - x.shape[2]))

        n = len(parts[0].keys)
        return Prefix(
            [torch.cat([padded(p.keys[i]) for p in parts]) for i in range(n)],
            [torch.cat([padded(p.values[i]) for p in parts]) for i in range(n)],
            None,
            lengths,
        )

    def seen_by_next(self, window: int | None) -> Tensor:
        """Right-padded rows (``pad``): which of the ``length`` + 1 slots each row's next token sees, (batch, 1, 1,
        length + 1): its own prefix's slots (within ``window`` of its position, the row's length) and itself."""
        if self.lengths is None:
            raise ValueError("seen_by_next is for padded prefixes (Prefix.pad), this one has no row lengths")
        P = self.length
        slot = torch.arange(P + 1, device=self.lengths.device)
        ends = self.lengths[:, None]  # (batch, 1): each row's next token's position
        own = (slot < ends) if window is None else (slot < ends) & (slot > ends - window)
        return (own | (slot == P))[:, None, None]

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


def seen(first: int, n: int, window: int | None, device: torch.device) -> Tensor | None:
    """Which keys the queries at positions first .. first + n - 1 see, (n, first + n) bool: those at or before
    their own position and, in a local layer, after position - window. None where one query sees every key."""
    if n == 1 and (window is None or first < window):
        return None
    k = torch.arange(first + n, device=device)
    q = torch.arange(first, first + n, device=device)[:, None]  # (n, 1)
    seen = k <= q
    return seen if window is None else seen & (k > q - window)
