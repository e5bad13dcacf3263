"""The command line's flags: one per field of a config dataclass (default and help taken from the class),
and the argument types no config field gives (comma lists of names and seeds, a count)."""

from __future__ import annotations

import argparse
import inspect
import re
from dataclasses import MISSING, fields
from typing import Any, TypeVar

from ..config import (
    Config,
    ConfigError,
    EmbeddingConfig,
    EngineConfig,
    EvalConfig,
    SelectionConfig,
    SiteConfig,
    SparsityConfig,
    is_config,
)

T = TypeVar("T", bound=Config)


def comma_list(text: str) -> list[str]:
    """'a,b, c' -> ['a', 'b', 'c'] (empty items dropped)."""
    return [s.strip() for s in text.split(",") if s.strip()]


def seed_list(text: str) -> list[int]:
    """A comma list of integer seeds, e.g. '0,1,2'."""
    try:
        seeds = [int(s) for s in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got '{text}'") from None
    if not seeds:
        raise argparse.ArgumentTypeError("expected at least one seed")
    return list(dict.fromkeys(seeds))


def positive_int(text: str) -> int:
    """A positive integer, e.g. '8'."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def field_help(cls: type) -> dict[str, str]:
    """Each field's trailing comment in the class source (a subclass's over its base's): its help text."""
    out: dict[str, str] = {}
    for kind in reversed([k for k in cls.__mro__ if k is not Config and is_config(k)]):
        for line in inspect.getsource(kind).splitlines():
            m = re.match(r"\s+(\w+): [^#]+#\s*(.+)$", line)
            if m:
                out[m.group(1)] = m.group(2).strip()
    return out


def int_or_all(text: str) -> int | None:
    """An integer, or 'all' (None): the value of an optional count such as ``--max-test``."""
    if text.strip().lower() == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'all', got '{text}'") from None


def _parse(kind: str):
    items = re.fullmatch(r"Sequence\[(\w+)\]", kind)  # a comma list, e.g. --ks 1,2,4

    def parse(text: str):
        if items:
            one = {"int": int, "float": float, "str": str}[items.group(1)]
            try:
                return tuple(one(s.strip()) for s in text.split(",") if s.strip())
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected a comma list of {items.group(1)}s, got '{text}'") from None
        if kind == "int | None":  # an optional count (max_test): 'all' for None
            return int_or_all(text)
        return {"int": int, "float": float, "str": str}[kind.split("|")[0].strip()](text)

    parse.__name__ = f"comma list of {items.group(1)}" if items else kind.split("|")[0].strip()  # in argparse's errors
    return parse


def _shown(default: Any) -> str:
    """A default as the flag takes it: 'all' for None, a comma list for a tuple."""
    if default is None:
        return "all"
    return ",".join(map(str, default)) if isinstance(default, tuple) else str(default)


def add_arguments(parser: argparse.ArgumentParser, cls: type, title: str | None = None, optional: bool = False) -> None:
    """One flag per field of a config dataclass, default and help taken from the class.

    ``optional``: the config is off unless one of its flags is given (the flags' defaults are None; the help
    shows the class's defaults, which a flag left out takes once another is given)."""
    group = parser.add_argument_group(title or cls.__name__)
    helps = field_help(cls)
    for f in fields(cls):
        if is_config(f.default_factory) or "config" in f.metadata:  # SiteConfig's parts: their own groups
            continue
        flag = "--" + f.metadata.get("flag", f.name.replace("_", "-"))
        # other names of the flag, e.g. --limit for --max-test (lm-evaluation-harness's name)
        aliases = [f"--{a}" for a in f.metadata.get("aliases", ())]
        shown_default = f.default if f.default is not MISSING else None
        default = None if optional else shown_default
        dest = f"{cls.__name__}.{f.name}"
        text = helps.get(f.name, "")
        if f.type == "bool":
            shown = f" (default: {flag if shown_default else '--no-' + flag[2:]})"
            group.add_argument(
                flag, *aliases, dest=dest, action=argparse.BooleanOptionalAction, default=default, help=text + shown
            )
        else:
            shown = "" if "default" in text else f" (default: {_shown(shown_default)})"
            metavar = "N|all" if "None" in str(f.type) else flag[2:].upper().replace("-", "_")
            metavar = "A,B,..." if str(f.type).startswith("Sequence[") else metavar
            group.add_argument(
                flag, *aliases, dest=dest, type=_parse(str(f.type)), default=default, metavar=metavar, help=text + shown
            )


def from_args(cls: type[T], args: argparse.Namespace, **extra: Any) -> T:
    """The config built from the flags ``add_arguments`` made (and ``extra`` fields)."""
    values = {
        f.name: getattr(args, f"{cls.__name__}.{f.name}")
        for f in fields(cls)
        if hasattr(args, f"{cls.__name__}.{f.name}")
    }
    return cls(**values, **extra)


def add_site_arguments(parser: argparse.ArgumentParser) -> None:
    """Every field of SiteConfig and of its parts (three stages, the engine and sparse SITE) as flags."""
    add_arguments(parser, SiteConfig, "run")
    add_arguments(parser, EmbeddingConfig, "stage 1: task embedding")
    add_arguments(parser, SelectionConfig, "stage 2: alpha training")
    add_arguments(parser, EvalConfig, "stage 3: generation and scoring")
    add_arguments(parser, EngineConfig, "engine: how the training steps run")
    add_arguments(parser, SparsityConfig, "sparse SITE (off unless a --sparse-* flag is given)", optional=True)


def site_config_from_args(args: argparse.Namespace) -> SiteConfig:
    """The SiteConfig the flags of ``add_site_arguments`` describe (ConfigError on a bad value)."""
    return from_args(
        SiteConfig,
        args,
        embedding=from_args(EmbeddingConfig, args),
        selection=from_args(SelectionConfig, args),
        eval=from_args(EvalConfig, args),
        engine=from_args(EngineConfig, args),
        sparsity=_sparsity(args),
    )


def _sparsity(args: argparse.Namespace) -> SparsityConfig | None:
    """Sparse SITE where --sparse-penalty or --sparse-weight is given; the other two flags only qualify it."""
    sparsity = _optional(SparsityConfig, args)
    if sparsity is not None and not any(
        getattr(args, f"SparsityConfig.{k}", None) is not None for k in ("penalty", "weight")
    ):
        raise ConfigError("--sparse-threshold and --sparse-beta qualify sparse SITE: give --sparse-weight (or --sparse-penalty) too")
    return sparsity


def _optional(cls: type[T], args: argparse.Namespace) -> T | None:
    """An optional config from its flags: None where none of them was given."""
    given = {f.name: v for f in fields(cls) if (v := getattr(args, f"{cls.__name__}.{f.name}", None)) is not None}
    return cls(**given) if given else None
