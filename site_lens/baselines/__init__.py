"""Benchmarked methods, one file each, behind one interface (``base.Method``).

method = make_method("fv")
method.fit(model, task, seed)
row = score_method(model, method, task, seed, EvalConfig(max_test=100))
"""

from __future__ import annotations

from collections.abc import Callable

from .base import Method, TaskContext, TrainConfig, score_method
from .fv import FunctionVector
from .i2cl import I2CL
from .mtv import MTVConfig, MultimodalTaskVector
from .peft import IA3, LoRA
from .prompting import ICL, ZeroShot
from .site import Site
from .tv import TaskVector

METHODS: dict[str, Callable[[], Method]] = {
    "zero_shot": ZeroShot,
    "icl": ICL,
    "site": Site,
    "fv": FunctionVector,
    "tv": TaskVector,
    "i2cl": I2CL,
    "mtv": MultimodalTaskVector,
    "lora": LoRA,
    "ia3": IA3,
}


def make_method(name: str) -> Method:
    """A fresh, unfitted method by name."""
    if name not in METHODS:
        raise ValueError(f"unknown method '{name}'; valid: {', '.join(METHODS)}")
    return METHODS[name]()


__all__ = [
    "I2CL",
    "IA3",
    "ICL",
    "METHODS",
    "FunctionVector",
    "LoRA",
    "MTVConfig",
    "Method",
    "MultimodalTaskVector",
    "Site",
    "TaskContext",
    "TaskVector",
    "TrainConfig",
    "ZeroShot",
    "make_method",
    "score_method",
]
