"""Argument types of the command line: comma lists of names, seeds, numbers; a count or 'all'."""

from __future__ import annotations

import argparse


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


def float_list(text: str) -> list[float]:
    """A comma list of numbers, e.g. '0.001,0.01'."""
    try:
        values = [float(s) for s in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers, got '{text}'") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def int_list(text: str) -> list[int]:
    """A comma list of positive integers, e.g. '1,2,4'."""
    try:
        values = [int(s) for s in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got '{text}'")
    return values


def positive_int_or_all(text: str) -> int | None:
    """A positive integer, or 'all' (None)."""
    from ..config import int_or_all

    value = int_or_all(text)
    if value is not None and value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {value}")
    return value


def positive_int(text: str) -> int:
    """A positive integer, e.g. '8'."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value
