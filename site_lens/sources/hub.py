"""Hugging Face datasets (ANLI, MMLU-Pro, ...) into task folders, with a field mapping.

For users with the hub: ``datasets.load_dataset(name, config)`` gives splits of rows;
``convert_dataset`` maps each row to an item. ``input`` is a field name or a template
over fields (``"Premise: {premise}\\nHypothesis: {hypothesis}"``); ``output`` is a field
holding the answer string, a label index (read through the field's ``ClassLabel`` names
or ``label_names``), or, with ``options``, an index or letter into that row's list of
options, which are then lettered after the input as in BBH::

    # ANLI round 1: a three-way choice between label names
    convert_dataset(load_dataset("facebook/anli"), out, "anli_r1",
                    input="Premise: {premise}\\nHypothesis: {hypothesis}", output="label",
                    splits={"train": "train_r1", "valid": "dev_r1", "test": "test_r1"})
    # MMLU-Pro: ten lettered options, one task per subject
    convert_dataset(load_dataset("TIGER-Lab/MMLU-Pro"), out, "mmlu_pro", input="question",
                    output="answer_index", options="options", group_by="category",
                    splits={"test": "test"})

Map all three of train, valid and test, or one split, which is then divided (seeded)
into the three (``sources.split_items``).
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..tasks import SPLITS
from . import Item, SourceError, lettered, split_items, write_task

_FIELD = re.compile(r"{([^{}]+)}")


def _render(template: str, row: Mapping[str, Any], where: str) -> str:
    if "{" not in template:
        if template not in row:
            raise SourceError(f"{where}: no field {template!r} (fields: {', '.join(row)})")
        return str(row[template]).strip()
    missing = [f for f in _FIELD.findall(template) if f not in row]
    if missing:
        raise SourceError(f"{where}: the input template names missing field(s) {missing} (fields: {', '.join(row)})")
    return _FIELD.sub(lambda m: str(row[m.group(1)]).strip(), template).strip()


def _label_names(ds: Any, field: str) -> list[str] | None:
    feature = getattr(ds, "features", {}).get(field) if hasattr(ds, "features") else None
    return list(feature.names) if feature is not None and hasattr(feature, "names") else None


def row_item(
    row: Mapping[str, Any],
    input: str,
    output: str,
    options: str | None,
    names: Sequence[str] | None,
    where: str,
) -> Item | None:
    """One row as an item; None for a row without a usable answer (ANLI's label -1, an empty answer)."""
    text = _render(input, row, where)
    if output not in row:
        raise SourceError(f"{where}: no output field {output!r} (fields: {', '.join(row)})")
    value = row[output]
    if options:
        if options not in row or not isinstance(row[options], (list, tuple)):
            raise SourceError(f"{where}: options field {options!r} is missing or not a list")
        opts = [str(o).strip() for o in row[options]]
        if isinstance(value, str) and len(value.strip()) == 1 and value.strip().upper() in string.ascii_uppercase:
            index = string.ascii_uppercase.index(value.strip().upper())
        elif isinstance(value, int) and not isinstance(value, bool):
            index = value
        else:
            raise SourceError(f"{where}: with --options, {output!r} must be an index or a letter, got {value!r}")
        if not 0 <= index < len(opts):
            return None
        text, letters = lettered(text, opts)
        return {"input": text, "output": letters[index], "options": letters}
    if names is not None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SourceError(f"{where}: {output!r} should be a label index for its names, got {value!r}")
        if not 0 <= value < len(names):
            return None
        return {"input": text, "output": names[value], "options": list(names)}
    answer = str(value).strip()
    if not answer or "\n" in answer or not text:
        return None
    return {"input": text, "output": answer}


def convert_dataset(
    dataset: Mapping[str, Any],
    out: Path,
    name: str,
    input: str,
    output: str,
    splits: Mapping[str, str],
    options: str | None = None,
    label_names: Sequence[str] | None = None,
    group_by: str | None = None,
    max_items: int | None = None,
    seed: int = 0,
    category: str = "hub",
    source: str = "",
    overwrite: bool = False,
) -> list[Path]:
    """Write one task folder (or one per ``group_by`` value) from ``dataset``'s splits; their paths."""
    bad = [s for s in splits if s not in SPLITS]
    if bad or len(splits) not in (1, 3):
        raise SourceError(
            f"splits map all of train/valid/test to dataset splits, or one of them (then divided), got {dict(splits)}"
        )
    if max_items is not None and max_items < 1:
        raise SourceError(f"max_items must be at least 1, got {max_items}")
    absent = [v for v in splits.values() if v not in dataset]
    if absent:
        raise SourceError(f"dataset has no split(s) {absent} (has {', '.join(dataset)})")
    groups: dict[str, dict[str, list[Item]]] = {}
    dropped = 0
    for ours, theirs in splits.items():
        ds = dataset[theirs]
        names = list(label_names) if label_names else (None if options else _label_names(ds, output))
        for i, row in enumerate(ds):
            item = row_item(row, input, output, options, names, f"split {theirs!r} row {i}")
            if item is None:
                dropped += 1
                continue
            if group_by is not None and group_by not in row:
                raise SourceError(f"split {theirs!r}: no group-by field {group_by!r} (fields: {', '.join(row)})")
            key = name if group_by is None else f"{name}_{_slug(str(row[group_by]))}"
            groups.setdefault(key, {}).setdefault(ours, []).append(item)
    if not groups:
        raise SourceError("no row had a usable answer")
    written = []
    for key, parts in sorted(groups.items()):
        rng = random.Random(f"{key}:{seed}")
        if max_items:
            parts = {s: rng.sample(v, min(max_items, len(v))) for s, v in parts.items()}
        if len(splits) == 1:
            parts = split_items(parts[next(iter(splits))], seed)
        elif set(parts) != set(SPLITS):
            missing = sorted(set(SPLITS) - set(parts))
            raise SourceError(f"task {key}: no rows in its {', '.join(missing)} split; map one split to divide it instead")
        meta = {"category": category, "source": source, "seed": seed, "rows_dropped": dropped, "splits": dict(splits)}
        written.append(write_task(out, key, parts, meta, overwrite=overwrite))
    return written


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "none"
