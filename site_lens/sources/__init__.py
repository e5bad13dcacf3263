"""Task folders built from other sources: BIG-Bench Hard-style tasks, Hugging Face datasets.

Every builder writes the layout ``tasks.load_task_folder`` reads: ``train.json``,
``valid.json``, ``test.json`` (lists of ``{"input", "output"}`` items, with ``"options"``
for a multiple-choice item and ``"answers"`` where several answers are accepted) and
``meta.json`` (where the items came from, the split seed and sizes, the chance level).

    items = [{"input": "2 + 2 =", "output": "4"}, ...]
    splits = split_items(items, seed=0)                 # seeded, recorded in meta.json
    write_task(Path("data/bbh"), "sums", splits, {"source": "..."})

A folder is written beside its final place and renamed into it, so a stopped build
leaves either the whole task or none of it.
"""

from __future__ import annotations

import json
import random
import shutil
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..locks import owner_tag
from ..tasks import SPLITS, TaskError, load_task_folder

Item = dict[str, Any]  # {"input": str, "output": str, "options"?: [str], "answers"?: [str]}
LETTERS = string.ascii_uppercase


class SourceError(ValueError):
    """A source cannot be read or converted; the message names the source and the problem."""


def lettered(question: str, options: Sequence[str]) -> tuple[str, list[str]]:
    """The question followed by ``Options:`` and one ``(A) option`` line each, and the letters."""
    if len(options) > len(LETTERS):
        raise SourceError(f"{len(options)} options is more than the {len(LETTERS)} letters A-Z")
    letters = [f"({LETTERS[i]})" for i in range(len(options))]
    lines = [question.rstrip(), "Options:", *(f"{k} {o}" for k, o in zip(letters, options))]
    return "\n".join(lines), letters


GROUP = "group"  # an item key that keeps items of one source question in one split; not written


def split_items(items: Sequence[Item], seed: int, n_test: int = 250, n_valid: int = 50) -> dict[str, list[Item]]:
    """Shuffle with ``seed``; test takes up to ``n_test`` items (at most 40 %), valid up to ``n_valid``
    (at most 10 %, at least one), train the rest. Items sharing a ``"group"`` stay in one split."""
    if len(items) < 12:
        raise SourceError(f"{len(items)} items are too few for train, valid and test splits (need 12)")
    groups: dict[Any, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault(it.get(GROUP, i), []).append(i)
    order = list(groups.values())
    random.Random(seed).shuffle(order)
    want = {"test": min(n_test, int(0.4 * len(items))), "valid": max(1, min(n_valid, int(0.1 * len(items))))}
    parts: dict[str, list[int]] = {s: [] for s in SPLITS}
    for members in order:
        # the first split with room for the whole group; never an empty split
        split = next((s for s in ("test", "valid") if not parts[s] or len(parts[s]) + len(members) <= want[s]), "train")
        parts[split] += members
    if not parts["train"]:
        raise SourceError(f"{len(groups)} distinct questions are too few for train, valid and test splits")
    return {s: [{k: v for k, v in items[i].items() if k != GROUP} for i in parts[s]] for s in SPLITS}


def chance_level(items: Sequence[Item]) -> float | None:
    """Mean of 1 / (number of options) over items with options; None for a generation task."""
    sizes = [len(it["options"]) for it in items if it.get("options")]
    return sum(1 / n for n in sizes) / len(sizes) if sizes and len(sizes) == len(items) else None


def write_task(
    out: Path, name: str, splits: dict[str, list[Item]], meta: dict[str, Any], overwrite: bool = False
) -> Path:
    """Write one task folder atomically (a temp folder renamed into place) and check that it loads."""
    final = out / name
    if final.exists() and not overwrite:
        raise SourceError(f"{final} exists; pass overwrite (--overwrite) to replace it")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{name}.{owner_tag()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for s in SPLITS:
            (tmp / f"{s}.json").write_text(json.dumps(splits[s], indent=1, ensure_ascii=False), encoding="utf-8")
        meta = {**meta, "sizes": {s: len(splits[s]) for s in SPLITS}, "chance": chance_level(splits["test"])}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False), encoding="utf-8")
        try:
            load_task_folder(tmp, name)
        except TaskError as e:
            raise SourceError(f"task {name}: the converted items do not load ({e})") from None
        if final.exists():
            old = out / f".{name}.{owner_tag()}.old"
            final.rename(old)
            try:
                tmp.rename(final)
            except OSError:
                old.rename(final)  # the old folder stays in place
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
