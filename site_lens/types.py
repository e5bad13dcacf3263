"""The shared basics every layer annotates with: the model and the hooks (no loading, no TransformerLens import).

``Model`` is what site-lens functions take: a HookedTransformer or a TransformerBridge
(``models.engines`` says which); an annotation only. ``Hooks`` are TransformerLens
forward hooks as (hook name, function) pairs; a ``HookFactory`` makes the hooks of
one prefill from each row's last prompt position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from torch import Tensor, nn

Model: TypeAlias = nn.Module
Hooks = list[tuple[str, Callable]]
HookFactory = Callable[[Tensor], Hooks]  # last-token index per row -> hooks for the prefill
