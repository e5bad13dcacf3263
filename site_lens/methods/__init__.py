"""Benchmarked methods, one file each, behind one interface (``base.Method``).

method = make_method("fv")
method.fit(model, task, seed)
score = score_method(model, method, task, seed, EvalConfig(max_test=100))
row = fit_and_score(model, configured("site", cfg), task, seed, None, cfg.eval)   # both at once

``site-lens run`` and ``site-lens bench`` both go through this registry and
``fit_and_score``; ``configured(name, cfg)`` builds a method from a ``SiteConfig``
(ICL takes its shots from ``cfg.embedding``, SITE the whole config).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..config import ConfigError, SiteConfig
from .base import Method, Row, Score, TaskContext, TrainConfig, fit_and_score, score_method, scored_row
from .fv import FunctionVector
from .i2cl import I2CL
from .mtv import MTVConfig, MultimodalTaskVector
from .peft import IA3, LoRA
from .prompting import ICL, ZeroShot
from .site import Site, SiteFit, fit_site, fit_site_many, sparse_refusal
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


def with_objective(method: Method, objective: str, name: str) -> Method:
    """``method`` trained with ``objective`` (config.OBJECTIVES), under its own name."""
    method.name = name
    if isinstance(method, Site):
        method.cfg = dataclasses.replace(
            method.cfg, selection=dataclasses.replace(method.cfg.selection, objective=objective)
        )
    else:
        method.train_cfg = dataclasses.replace(method.train_cfg, objective=objective)
    return method


# the trained methods with the answer-sequence objective (_seq) or, for multiple-choice tasks, the
# option-token objective (_opt: the first token where the options differ), instead of the first token
SUFFIXES = {"seq": "sequence", "opt": "option_token"}
for _suffix, _objective in SUFFIXES.items():
    for _base in ("site", "i2cl", "lora", "ia3"):
        METHODS[f"{_base}_{_suffix}"] = lambda b=_base, s=_suffix, o=_objective: with_objective(
            METHODS[b](), o, f"{b}_{s}"
        )
SEQUENCE_METHODS = ("site_seq", "i2cl_seq", "lora_seq", "ia3_seq")
OPTION_METHODS = ("site_opt", "i2cl_opt", "lora_opt", "ia3_opt")


OBJECTIVE_NOTES = {
    "seq": "trained on every answer token and its end (the answer-sequence objective)",
    "opt": "trained on the first token where the options differ (multiple-choice tasks)",
}


def describe_method(name: str) -> str:
    """One line about a method: its class's docstring, or for a _seq / _opt variant its base and objective."""
    base, _, suffix = name.rpartition("_")
    if suffix in SUFFIXES and base in METHODS:
        return f"{base}, {OBJECTIVE_NOTES[suffix]}"
    if name not in METHODS:
        raise ConfigError(f"unknown method '{name}'; valid: {', '.join(METHODS)}")
    doc = (getattr(METHODS[name], "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else name


def make_method(name: str) -> Method:
    """A fresh, unfitted method by name."""
    if name not in METHODS:
        raise ConfigError(f"unknown method '{name}'; valid: {', '.join(METHODS)}")
    return METHODS[name]()


def configured(name: str, cfg: SiteConfig, progress: Callable[[int, float], None] | None = None) -> Method:
    """A fresh method by name, with the shots and SITE stages of ``cfg`` (the others keep their defaults)."""
    if name == "icl":
        return ICL(n_shots=cfg.embedding.n_shots)
    if name == "site":
        return Site(cfg, progress)
    if name.startswith("site_") and name[len("site_") :] in SUFFIXES:
        return with_objective(Site(cfg, progress), SUFFIXES[name[len("site_") :]], name)
    return make_method(name)


__all__ = [
    "I2CL",
    "IA3",
    "ICL",
    "METHODS",
    "OPTION_METHODS",
    "SEQUENCE_METHODS",
    "FunctionVector",
    "LoRA",
    "MTVConfig",
    "Method",
    "MultimodalTaskVector",
    "Row",
    "Score",
    "Site",
    "SiteFit",
    "TaskContext",
    "TaskVector",
    "TrainConfig",
    "ZeroShot",
    "configured",
    "describe_method",
    "fit_and_score",
    "fit_site",
    "fit_site_many",
    "make_method",
    "score_method",
    "scored_row",
    "sparse_refusal",
    "with_objective",
]
