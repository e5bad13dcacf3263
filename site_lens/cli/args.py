"""Argument types of the command line that no config field gives: comma lists of names and seeds, a count."""

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





def positive_int(text: str) -> int:
    """A positive integer, e.g. '8'."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value
