"""Dataclass configs for the three SITE stages.

Each field has the paper's default (Park et al., 2026, "SITE"); ``to_dict`` /
``from_dict`` round-trip through JSON and reject unknown keys.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

T = TypeVar("T", bound="_Config")


class ConfigError(ValueError):
    """A config field has a bad value or an unknown name."""


class _Config:
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], d: dict[str, Any]) -> T:  # noqa: PYI019 (beartype rejects Self here)
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"{cls.__name__}: unknown keys {unknown}; known keys are {sorted(known)}")
        return cls(**d)


@dataclass
class EmbeddingConfig(_Config):
    """Stage 1: how the task embedding t[layer, head] is averaged."""

    n_prompts: int = 50  # M: few-shot prompts averaged (paper: 50)
    n_shots: int = 10  # N: demonstrations per prompt (paper: 10)
    batch_size: int = 10  # prompts per forward pass (no effect on the result)

    def __post_init__(self) -> None:
        for name in ("n_prompts", "n_shots", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"EmbeddingConfig.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class SelectionConfig(_Config):
    """Stage 2: training theta, alpha = sigmoid(theta), on zero-shot prompts."""

    steps: int = 400  # optimiser steps (paper: 400)
    lr: float = 0.2  # Adam learning rate (paper: 0.2)
    batch_size: int = 1  # zero-shot prompts per step (paper: 1)
    theta_init: float = 0.0  # alpha starts at sigmoid(0) = 0.5
    eval_every: int = 50  # validate on the valid split every this many steps; 0 = never
    max_valid: int = 100  # valid items used for model selection
    keep_best: bool = True  # restore the theta with the lowest valid loss
    fast: bool = True  # prefix KV cache: run only the last prompt token per step
    backend: str = "auto"  # fast path's backend: auto (packed where the model allows), hooked or packed

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ConfigError(f"SelectionConfig.steps must be >= 0, got {self.steps}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"SelectionConfig.lr must be a finite number > 0, got {self.lr}")
        if not math.isfinite(self.theta_init):
            raise ConfigError(f"SelectionConfig.theta_init must be finite, got {self.theta_init}")
        if self.batch_size < 1:
            raise ConfigError(f"SelectionConfig.batch_size must be >= 1, got {self.batch_size}")
        if self.eval_every < 0 or self.max_valid < 0:
            raise ConfigError("SelectionConfig.eval_every and max_valid must be >= 0")
        if self.backend not in ("auto", "hooked", "packed"):
            raise ConfigError(f"SelectionConfig.backend must be auto, hooked or packed, got {self.backend!r}")


@dataclass
class EvalConfig(_Config):
    """Stage 3 and scoring."""

    max_new_tokens: int = 20  # greedy tokens generated per query (paper: 20)
    stop_at_newline: bool = True  # stop a row once it emits a newline
    batch_size: int = 64  # queries per generation batch (sorted by length, right-padded)
    max_test: int | None = None  # cap on test items (the first ones), None = all

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"EvalConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_test is not None and self.max_test < 1:
            raise ConfigError(f"EvalConfig.max_test must be >= 1, got {self.max_test}")


@dataclass
class SiteConfig(_Config):
    """Everything one SITE run depends on."""

    seed: int = 0
    embedding: EmbeddingConfig | None = None
    selection: SelectionConfig | None = None
    eval: EvalConfig | None = None

    def __post_init__(self) -> None:
        if isinstance(self.embedding, dict):
            self.embedding = EmbeddingConfig.from_dict(self.embedding)
        if isinstance(self.selection, dict):
            self.selection = SelectionConfig.from_dict(self.selection)
        if isinstance(self.eval, dict):
            self.eval = EvalConfig.from_dict(self.eval)
        self.embedding = self.embedding or EmbeddingConfig()
        self.selection = self.selection or SelectionConfig()
        self.eval = self.eval or EvalConfig()
