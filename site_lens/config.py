"""Dataclass configs for the three SITE stages: the single source of their defaults, checks and CLI flags.

Each field has the paper's default (Park et al., 2026, "SITE") and a comment
that is its ``--help`` text; ``site_lens.cli.args`` turns every field into a
flag of ``site-lens run`` / ``bench`` (``metadata={"flag": ...}`` names it
where the field name would collide or read badly) and reads it back.
``to_dict`` / ``from_dict`` round-trip through JSON and reject unknown keys;
``__post_init__`` raises ``ConfigError`` on a bad value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

T = TypeVar("T", bound="Config")


OBJECTIVES = ("first_token", "sequence", "option_token")  # training objectives (stages/objectives.py)
TEACHER_FORCED = ("sequence", "option_token")  # the objectives trained on Example.continuation


class ConfigError(ValueError):
    """A config field has a bad value or an unknown name."""


class Config:
    """The base of every config: ``to_dict`` / ``from_dict`` through JSON, unknown keys refused."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], d: Any) -> T:  # noqa: PYI019 (beartype rejects Self here)
        if not isinstance(d, dict):  # a saved config's part that is not an object
            raise ConfigError(f"{cls.__name__}.from_dict needs a dict, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"{cls.__name__}: unknown keys {unknown}; known keys are {sorted(known)}")
        # nested configs (SiteConfig's stages) from their dicts; a null one takes its defaults, except an optional
        # part's (SiteConfig.sparsity), which stays off
        parts = {f.name: f.default_factory for f in fields(cls) if is_config(f.default_factory)}  # type: ignore[arg-type]
        optional = {f.name: f.metadata["config"] for f in fields(cls) if "config" in f.metadata}  # type: ignore[arg-type]
        values = {}
        for k, v in d.items():
            if k in parts and not isinstance(v, Config):
                v = parts[k].from_dict(v or {})
            elif k in optional and isinstance(v, dict):
                v = optional[k].from_dict(v)
            values[k] = v
        return cls(**values)


def is_config(kind: Any) -> bool:
    """Whether a field's default factory is a config class (a nested stage config)."""
    return isinstance(kind, type) and issubclass(kind, Config)


@dataclass
class EmbeddingConfig(Config):
    """Stage 1: how the task embedding t[layer, head] is averaged.

    Example:
        >>> EmbeddingConfig(n_prompts=20).n_shots
        10
    """

    n_prompts: int = field(default=50, metadata={"flag": "prompts"})  # M: few-shot prompts averaged (paper: 50)
    n_shots: int = field(default=10, metadata={"flag": "shots"})  # N: demonstrations per prompt, also ICL's (paper: 10)
    batch_size: int = field(default=10, metadata={"flag": "embedding-batch-size"})  # prompts per forward pass of stage 1 (no effect on the result)

    def __post_init__(self) -> None:
        for name in ("n_prompts", "n_shots", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"EmbeddingConfig.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class TrainConfig(Config):
    """An optimiser loop over the frozen model: what SITE's stage 2 and every trained baseline share.

    Its defaults are the baselines' modest CPU budget (docs/benchmark.md); ``SelectionConfig``
    (SITE's stage 2) and ``MTVConfig`` are this loop with their own defaults and a few fields more.

    Example:
        >>> TrainConfig(steps=50).batch_size
        8
    """

    steps: int = 100  # optimiser steps
    lr: float = 1e-2  # Adam learning rate
    batch_size: int = 8  # zero-shot prompts per step
    eval_every: int = 25  # validate on the valid split every this many steps (and at the last); 0 = never
    max_valid: int = 50  # valid items used for model selection (the first ones)
    objective: str = "first_token"  # first_token: the answer's first token (paper); sequence: every answer token and its end; option_token: the first token where the options differ

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.steps < 0:
            raise ConfigError(f"{name}.steps must be >= 0, got {self.steps}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"{name}.lr must be a finite number > 0, got {self.lr}")
        if self.batch_size < 1:
            raise ConfigError(f"{name}.batch_size must be >= 1, got {self.batch_size}")
        if self.eval_every < 0 or self.max_valid < 0:
            raise ConfigError(f"{name}.eval_every and max_valid must be >= 0")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"{name}.objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")


@dataclass
class SelectionConfig(TrainConfig):
    """Stage 2: training theta, alpha = sigmoid(theta), on zero-shot prompts (``TrainConfig`` with the paper's
    defaults, theta's start, model selection and the engine that runs the steps).

    Example:
        >>> SelectionConfig(steps=100).lr
        0.2
        >>> SelectionConfig(lr=-1.0)
        Traceback (most recent call last):
        ...
        site_lens.config.ConfigError: SelectionConfig.lr must be a finite number > 0, got -1.0
    """

    steps: int = 400  # optimiser steps (paper: 400)
    lr: float = 0.2  # Adam learning rate (paper: 0.2)
    batch_size: int = 1  # zero-shot prompts per step (paper: 1)
    eval_every: int = 50  # validate on the valid split every this many steps; 0 = never
    max_valid: int = 100  # valid items used for model selection (the first ones)
    theta_init: float = 0.0  # alpha starts at sigmoid(0) = 0.5
    keep_best: bool = True  # restore the theta with the lowest valid loss

    def __post_init__(self) -> None:
        super().__post_init__()
        if not math.isfinite(self.theta_init):
            raise ConfigError(f"SelectionConfig.theta_init must be finite, got {self.theta_init}")


BACKENDS = ("auto", "hooked", "packed")


@dataclass
class EngineConfig(Config):
    """How the training steps run, not what they compute (the paths agree to float rounding; tests check it).

    Example:
        >>> EngineConfig().backend
        'auto'
        >>> EngineConfig(backend="gpu")
        Traceback (most recent call last):
        ...
        site_lens.config.ConfigError: EngineConfig.backend must be auto, hooked or packed, got 'gpu'
    """

    fast: bool = True  # cached prefixes: run only the last prompt token per step (--no-fast: whole prompts)
    backend: str = "auto"  # fast path's backend: auto (packed where the model allows), hooked or packed

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"EngineConfig.backend must be {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}, got {self.backend!r}")


@dataclass
class EvalConfig(Config):
    """Stage 3 and scoring.

    Example:
        >>> EvalConfig(max_test=20).max_new_tokens
        20
    """

    max_new_tokens: int = 20  # greedy tokens generated per query (paper: 20)
    stop_at_newline: bool = True  # stop a row once it emits a newline
    batch_size: int = field(default=64, metadata={"flag": "eval-batch-size"})  # queries per generation batch (no effect on the result)
    max_test: int | None = field(default=100, metadata={"aliases": ("limit",)})  # score only the first N test items; 'all' scores every one (default: 100)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"EvalConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_test is not None and self.max_test < 1:
            raise ConfigError(f"EvalConfig.max_test must be >= 1, got {self.max_test}")
        if self.batch_size < 1:
            raise ConfigError(f"EvalConfig.batch_size must be >= 1, got {self.batch_size}")


# sparse SITE's default sweep (nats per open head, per penalty) and the rankings' k grid (plus every head)
SPARSE_WEIGHTS = {"l0": (0.003, 0.01, 0.03, 0.1, 0.3), "l1": (0.003, 0.01, 0.03, 0.1, 0.3)}
K_GRID = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass
class SparsityConfig(Config):
    """Sparse SITE: a price on every head the gate opens (``sparse``).

    Example:
        >>> SparsityConfig(weight=0.03).penalty
        'l0'
    """

    penalty: str = field(default="l0", metadata={"flag": "sparse-penalty"})  # l0: hard-concrete gates with exact zeros (Louizos et al. 2018); l1: SITE's gates and the L1 norm of alpha
    weight: float = field(default=0.0, metadata={"flag": "sparse-weight"})  # nats added to the loss per open head (0 with l1 is SITE)
    threshold: float = field(default=0.5, metadata={"flag": "sparse-threshold"})  # binary mask: the heads whose alpha is above this
    beta: float = field(default=2 / 3, metadata={"flag": "sparse-beta"})  # hard-concrete temperature (Louizos et al. 2018)

    def __post_init__(self) -> None:
        if self.penalty not in ("l0", "l1"):
            raise ConfigError(f"SparsityConfig.penalty must be l0 or l1, got {self.penalty!r}")
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise ConfigError(f"SparsityConfig.weight must be a finite number >= 0, got {self.weight}")
        if not (0 <= self.threshold < 1):
            raise ConfigError(f"SparsityConfig.threshold must be in [0, 1), got {self.threshold}")
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ConfigError(f"SparsityConfig.beta must be a finite number > 0, got {self.beta}")


@dataclass
class MinimalConfig(Config):
    """``sparsify``'s study per (task, seed): sparse SITE along a path of penalty weights against top-k head sets.

    Example:
        >>> MinimalConfig(penalties=("l0",)).weights()
        {'l0': (0.003, 0.01, 0.03, 0.1, 0.3)}
        >>> MinimalConfig(weights_l1=(0.1, 0.01))
        Traceback (most recent call last):
        ...
        site_lens.config.ConfigError: MinimalConfig.weights_l1 must be numbers >= 0 in increasing order, got 0.1,0.01
    """

    penalties: Sequence[str] = ("l0", "l1")  # l0, l1 or both
    weights_l0: Sequence[float] = SPARSE_WEIGHTS["l0"]  # l0 weights along the warm-started path, nats per open head
    weights_l1: Sequence[float] = SPARSE_WEIGHTS["l1"]  # l1 weights along the warm-started path
    path_steps: int = 100  # steps per weight along the warm-started path
    ks: Sequence[int] = K_GRID  # k grid of the rankings, plus every head
    draws: int = 2  # random k-sets per k
    score_valid: int | None = 100  # valid items that score the head sets, to choose k, weight and threshold
    shared: bool = False  # also train one alpha over all the tasks (first seed's t per task)

    def __post_init__(self) -> None:
        for name in ("penalties", "weights_l0", "weights_l1", "ks"):  # kept as tuples, whatever sequence came
            setattr(self, name, tuple(getattr(self, name)))
        bad = [p for p in self.penalties if p not in ("l0", "l1")]
        if bad or not self.penalties:
            raise ConfigError(f"MinimalConfig.penalties must be l0, l1 or both, got {','.join(self.penalties) or 'none'}")
        for name in (f"weights_{p}" for p in self.penalties):
            ws = getattr(self, name)
            if not ws or list(ws) != sorted(ws) or min(ws) < 0 or not all(map(math.isfinite, ws)):
                raise ConfigError(f"MinimalConfig.{name} must be numbers >= 0 in increasing order, got {','.join(map(str, ws))}")
        if not self.ks or min(self.ks) < 1:
            raise ConfigError(f"MinimalConfig.ks must be positive integers, got {','.join(map(str, self.ks))}")
        if self.path_steps < 1 or self.draws < 0:
            raise ConfigError(f"MinimalConfig: path_steps must be >= 1 and draws >= 0, got {self.path_steps}, {self.draws}")
        if self.score_valid is not None and self.score_valid < 1:
            raise ConfigError(f"MinimalConfig.score_valid must be >= 1 or all, got {self.score_valid}")

    def weights(self) -> dict[str, Sequence[float]]:
        """Each chosen penalty's weights."""
        return {p: getattr(self, f"weights_{p}") for p in ("l0", "l1") if p in self.penalties}


@dataclass
class AnalyseConfig(Config):
    """``analyse``: patching, CIE and transfer over fitted runs.

    Example:
        >>> AnalyseConfig().draws
        5
    """

    max_test: int | None = field(default=100, metadata={"aliases": ("limit",)})  # test items for patching and transfer
    cie_prompts: int = 25  # shuffled-label prompts for the CIE
    draws: int = 5  # random head sets per k of the patching curves

    def __post_init__(self) -> None:
        if (self.max_test is not None and self.max_test < 1) or self.cie_prompts < 1 or self.draws < 0:
            raise ConfigError(
                f"AnalyseConfig: max_test and cie_prompts must be >= 1 and draws >= 0, got {self.max_test}, "
                f"{self.cie_prompts}, {self.draws}"
            )


@dataclass
class SiteConfig(Config):
    """Everything one SITE run depends on.

    Example:
        >>> cfg = SiteConfig(seed=1, selection=SelectionConfig(steps=100))
        >>> SiteConfig.from_dict(cfg.to_dict()) == cfg
        True
        >>> sparse = SiteConfig(sparsity=SparsityConfig(penalty="l0", weight=0.03))  # sparse SITE
        >>> SiteConfig.from_dict(sparse.to_dict()) == sparse, SiteConfig().sparsity is None
        (True, True)
    """

    seed: int = 0  # seeds every draw: stage-1 prompts, training order, ICL demonstrations
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    # sparse SITE: a price on every head the gate opens; None (the default) is SITE's dense gates
    sparsity: SparsityConfig | None = field(default=None, metadata={"config": SparsityConfig})

    @classmethod
    def from_dict(cls, d: Any) -> SiteConfig:
        """``to_dict``'s form; configs saved when ``fast`` and ``backend`` sat in ``selection`` read the same."""
        if isinstance(d, dict) and isinstance(d.get("selection"), dict):
            moved = {k: d["selection"][k] for k in ("fast", "backend") if k in d["selection"]}
            if moved:
                engine = d.get("engine") or {}
                if not isinstance(engine, dict) or set(moved) & set(engine):
                    raise ConfigError(f"SiteConfig: {sorted(moved)} given in both selection and engine")
                d = {**d, "selection": {k: v for k, v in d["selection"].items() if k not in moved}}
                d["engine"] = {**engine, **moved}
        return super().from_dict(d)

    def __post_init__(self) -> None:
        for f in fields(self):  # each stage's part must be its config (``from_dict`` builds them from dicts)
            kind = f.default_factory
            if is_config(kind) and not isinstance(getattr(self, f.name), kind):  # type: ignore[arg-type]
                got = type(getattr(self, f.name)).__name__
                raise ConfigError(f"SiteConfig.{f.name} must be an {kind.__name__}, got {got}")  # type: ignore[union-attr]
        if self.sparsity is not None:
            if not isinstance(self.sparsity, SparsityConfig):
                raise ConfigError(f"SiteConfig.sparsity must be a SparsityConfig or None, got {type(self.sparsity).__name__}")
            if self.selection.objective != "first_token":
                raise ConfigError(
                    f"sparse SITE trains on the first answer token only, got objective {self.selection.objective!r}"
                )
            if self.sparsity.penalty == "l0" and not self.engine.fast:
                raise ConfigError("the l0 penalty trains on the fast path only (its gate draws noise per step): drop --no-fast")

    def to_dict(self) -> dict[str, Any]:
        """Every part's fields; ``sparsity`` only where it is set (a dense config saves as it did before it existed)."""
        d = super().to_dict()
        if d["sparsity"] is None:
            del d["sparsity"]
        return d
