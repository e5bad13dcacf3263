"""Prompting baselines: zero-shot and N-shot in-context learning (no parameters)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from ..tasks import Task, sample_icl_prompts
from .base import Method


class ZeroShot(Method):
    """The bare query 'Q: {x}\\nA:'."""

    name = "zero_shot"


class ICL(Method):
    """N demonstrations from train before each query (default 10, the papers' setting)."""

    name = "icl"

    def __init__(self, n_shots: int = 10):
        super().__init__()
        self.n_shots = n_shots

    def prompts(self, task: Task, pairs: Sequence[tuple[str, str]], seed: int) -> list[tuple[str, str]]:
        """The same demonstrations ``experiments.run.evaluate`` draws (``random.Random(seed + 1)``)."""
        return sample_icl_prompts(task.train, 0, self.n_shots, random.Random(seed + 1), queries=pairs)
