"""Tasks: loading, splits, and prompt building (pure functions).

Prompt format (the SITE and FV papers' default):

    demonstration  "Q: {x}\\nA: {y}\\n\\n"
    zero-shot      "Q: {x}\\nA:"
    N-shot         N demonstrations followed by the zero-shot query

The prompt ends right after "A:", with no trailing space. The answer the model
should produce is therefore " {y}": the tokenizer's leading-space convention
puts the space inside the answer's first token (GPT-2/Llama-style BPE), which
is how the demonstrations tokenise too. ``tokens.answer_ids`` tokenises prompt
+ ``answer_sep(y)`` + answer and keeps the tokens after the prompt, so the
target is the very token the model is scored on.

Numeric answers (those starting with a digit) take no space: "A:5", as the
SITE paper's official code writes them. Llama-style tokenizers split digits
from a preceding space, so " 5" would make the first answer token a bare
space, the same for every item, and first-token training and scoring would
learn and measure nothing. Demonstrations, stage-1 prompts and targets all
use ``answer_sep``, so they agree.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .categories import ABSTRACTIVE, EXTRACTIVE, category, fv_hint  # noqa: F401 (tasks.category: the usual path)

Pair = tuple[str, str]  # (input, output); an item may also list "options" and "answers" (``Choice``)
SPLITS = ("train", "valid", "test")
SPLIT_FRACTIONS = (0.70, 0.09, 0.21)  # the published FV splits' proportions
SPLIT_SEED = 42  # fixed shuffle for tasks given as one JSON list


class TaskError(ValueError):
    """A task file or name is unusable; the message names the file and the problem."""


@dataclass
class Task:
    """A few-shot task: (input, output) string pairs in three splits.

    Example:
        >>> task = Task("opposites", train=[("hot", "cold")], valid=[], test=[("tall", "short")])
        >>> task.split("test"), task.case_sensitive
        ([('tall', 'short')], False)
    """

    name: str
    train: list[Pair]
    valid: list[Pair]
    test: list[Pair]
    case_sensitive: bool | None = None  # None: detect from the data (see detect_case_sensitive)
    source: str = ""  # where it was loaded from
    meta: dict[str, Any] = field(default_factory=dict)
    # split -> one Choice per item, for tasks whose items list options or several accepted answers
    choices: dict[str, list[Choice]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.case_sensitive is None:
            self.case_sensitive = detect_case_sensitive(self.train + self.valid + self.test)

    def split(self, name: str) -> list[Pair]:
        if name not in SPLITS:
            raise TaskError(f"unknown split '{name}'; use one of {SPLITS}")
        return getattr(self, name)

    def split_choices(self, name: str) -> list[Choice] | None:
        """The split's Choices (options and accepted answers per item), or None for a plain task."""
        self.split(name)
        return self.choices.get(name)


@dataclass(frozen=True)
class Choice:
    """An item's options (a multiple-choice task; empty otherwise) and every answer accepted as correct."""

    options: tuple[str, ...]
    answers: tuple[str, ...]


def detect_case_sensitive(pairs: Sequence[Pair]) -> bool:
    """A task is about case when most outputs are a case-changed copy of part of the input.

    (capitalize, uppercase, capitalize_first_letter ...). Scoring lower-cases
    both sides except for such tasks, as the paper's evaluation does.
    """
    if not pairs:
        return False
    hits = sum(1 for x, y in pairs if y.lower() in x.lower() and y not in x)
    return hits >= 0.5 * len(pairs)


# ---------------------------------------------------------------- loading


def _parse_pairs(raw: Any, where: str) -> list[Pair]:
    if not isinstance(raw, list):
        raise TaskError(f'{where}: expected a JSON list of {{"input", "output"}} objects, got {type(raw).__name__}')
    if not raw:
        raise TaskError(f"{where}: the list of examples is empty")
    pairs: list[Pair] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise TaskError(
                f"{where}: item {i} is a {type(item).__name__}, expected an object with keys 'input' and 'output'"
            )
        missing = [k for k in ("input", "output") if k not in item]
        if missing:
            raise TaskError(f"{where}: item {i} lacks key(s) {missing} (has {sorted(item)})")
        vals = []
        for k in ("input", "output"):
            v = item[k]
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise TaskError(f"{where}: item {i} '{k}' must be a string or number, got {type(v).__name__}")
            if isinstance(v, float) and not math.isfinite(v):
                raise TaskError(f"{where}: item {i} '{k}' is {v}, not a finite number")
            s = str(v).strip()
            if not s:
                raise TaskError(f"{where}: item {i} has an empty '{k}'")
            try:
                s.encode("utf-8")
            except UnicodeEncodeError as e:  # a lone surrogate ("\ud800"): no tokenizer can encode it
                raise TaskError(
                    f"{where}: item {i} '{k}' is not valid Unicode ({e.reason} at character {e.start})"
                ) from None
            vals.append(s)
        if "\n" in vals[1]:
            raise TaskError(f"{where}: item {i} 'output' contains a newline (answers are scored on one line)")
        pairs.append((vals[0], vals[1]))
    return pairs


def _strings(v: Any, what: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x.strip() and "\n" not in x for x in v):
        raise TaskError(f"{what} must be a non-empty list of one-line strings")
    return tuple(x.strip() for x in v)


def _parse_choices(raw: list, pairs: list[Pair], where: str) -> list[Choice] | None:
    """Each item's Choice when any item has "options" or "answers"; None for a plain task."""
    if not any(isinstance(it, dict) and ("options" in it or "answers" in it) for it in raw):
        return None
    out = []
    for i, (item, (_, y)) in enumerate(zip(raw, pairs)):
        opts = _strings(item["options"], f"{where}: item {i} 'options'") if "options" in item else ()
        answers = _strings(item["answers"], f"{where}: item {i} 'answers'") if "answers" in item else ()
        answers = tuple(dict.fromkeys((y, *answers)))
        if opts and y not in opts:
            raise TaskError(f"{where}: item {i} 'output' {y!r} is not one of its options {list(opts)}")
        out.append(Choice(options=opts, answers=answers))
    return out


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8-sig")  # tolerates a byte-order mark
    except FileNotFoundError:
        raise TaskError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: cannot read ({e.__class__.__name__}: {e})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TaskError(f"{path}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except (ValueError, RecursionError) as e:  # an integer of > 4300 digits; nesting deeper than the stack
        raise TaskError(f"{path}: invalid JSON ({e.__class__.__name__}: {str(e).splitlines()[0][:120]})") from None


def split_indices(n: int, seed: int = SPLIT_SEED) -> tuple[list[int], list[int], list[int]]:
    """Item indices shuffled with a fixed seed and split 70/9/21 (at least one item in each split)."""
    if n < 3:
        raise TaskError(f"a single-list task needs at least 3 examples to split 70/9/21, got {n}")
    items = list(range(n))
    random.Random(seed).shuffle(items)
    n_train = max(1, round(SPLIT_FRACTIONS[0] * n))
    n_valid = max(1, round(SPLIT_FRACTIONS[1] * n))
    n_train = min(n_train, n - n_valid - 1)
    return items[:n_train], items[n_train : n_train + n_valid], items[n_train + n_valid :]


META_FILE = "meta.json"  # optional in a task folder: {"category": "..."}


def _read_meta(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    meta = _read_json(path)
    if not isinstance(meta, dict):
        raise TaskError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    if "category" in meta and not (isinstance(meta["category"], str) and meta["category"].strip()):
        raise TaskError(f"{path}: 'category' must be a non-empty string")
    return meta


def load_task_folder(path: str | Path, name: str | None = None) -> Task:
    """A folder in the FV layout: train.json, valid.json, test.json (and optionally meta.json)."""
    path = Path(path)
    if not path.is_dir():
        raise TaskError(f"{path}: not a task folder")
    splits, choices = {}, {}
    for s in SPLITS:
        where = str(path / f"{s}.json")
        raw = _read_json(path / f"{s}.json")
        splits[s] = _parse_pairs(raw, where)
        found = _parse_choices(raw, splits[s], where)
        if found is not None:
            choices[s] = found
    return Task(name=name or path.name, source=str(path), meta=_read_meta(path / META_FILE), choices=choices, **splits)


def load_task_file(path: str | Path, name: str | None = None) -> Task:
    """One JSON list of pairs, split 70/9/21 with a fixed seed."""
    path = Path(path)
    raw = _read_json(path)
    pairs = _parse_pairs(raw, str(path))
    found = _parse_choices(raw, pairs, str(path))
    try:
        parts = split_indices(len(pairs))
    except TaskError as e:
        raise TaskError(f"{path}: {e}") from None
    splits = {s: [pairs[i] for i in idx] for s, idx in zip(SPLITS, parts)}
    choices = {s: [found[i] for i in idx] for s, idx in zip(SPLITS, parts)} if found is not None else {}
    return Task(name=name or path.stem, source=str(path), choices=choices, **splits)


def builtin_tasks() -> list[str]:
    """Names of the tasks shipped with site-lens (written by its authors).

    Example:
        >>> "uppercase" in builtin_tasks()
        True
    """
    root = resources.files("site_lens") / "data" / "tasks"
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


def available_tasks(data_dir: str | Path | None) -> list[str]:
    """Task names under ``data_dir`` (folders or .json lists), or the built-in ones."""
    if data_dir is None:
        return builtin_tasks()
    d = Path(data_dir)
    if not d.is_dir():
        raise TaskError(f"{d}: data folder not found")
    found = [p for p in d.iterdir() if not p.name.startswith(".") and (p.is_dir() or p.suffix == ".json")]
    return sorted(p.name if p.is_dir() else p.stem for p in found)


def load_task(name_or_path: str | Path, data_dir: str | Path | None = None) -> Task:
    """Load a task by built-in name, by name under ``data_dir``, or by path (folder or .json).

    Example:
        >>> task = load_task("uppercase")
        >>> task.train[0], len(task.test)
        (('capital', 'CAPITAL'), 101)
    """
    if not str(name_or_path).strip():
        raise TaskError("unknown task '': give a built-in task name, a task under --data, or a path")
    if data_dir is not None:
        data_dir = Path(data_dir)
        if not data_dir.is_dir():
            raise TaskError(f"{data_dir}: data folder not found")
        for cand in (data_dir / str(name_or_path), data_dir / f"{name_or_path}.json"):
            if cand.is_dir():
                return load_task_folder(cand)
            if cand.is_file():
                return load_task_file(cand)
        avail = sorted(p.name for p in data_dir.iterdir() if p.is_dir() or p.suffix == ".json")
        raise TaskError(f"unknown task '{name_or_path}' in {data_dir}; available: {', '.join(avail[:60])}")
    p = Path(name_or_path)
    if p.is_dir():
        return load_task_folder(p)
    if p.is_file():
        return load_task_file(p)
    if str(name_or_path) in builtin_tasks():
        ref = resources.files("site_lens") / "data" / "tasks" / f"{name_or_path}.json"
        with resources.as_file(ref) as f:
            task = load_task_file(f, name=str(name_or_path))
        task.source = f"builtin:{name_or_path}"
        return task
    if str(name_or_path) in ABSTRACTIVE | EXTRACTIVE:
        raise TaskError(fv_hint(str(name_or_path)))
    raise TaskError(
        f"unknown task '{name_or_path}': built-in tasks are {', '.join(builtin_tasks())}; or pass --data DIR or a path"
    )


# ---------------------------------------------------------------- prompts


def answer_sep(y: str) -> str:
    """What goes between 'A:' and the answer: nothing before a numeric answer (one starting with a digit), else a space."""
    return "" if y[:1].isdigit() else " "


def format_pair(x: str, y: str) -> str:
    """One question and its answer: 'Q: {x}\\nA: {y}' ('A:{y}' for a numeric answer)."""
    return f"Q: {x}\nA:{answer_sep(y)}{y}"


def format_demo(x: str, y: str) -> str:
    """One demonstration: 'Q: {x}\\nA: {y}\\n\\n' (see ``answer_sep``)."""
    return format_pair(x, y) + "\n\n"


def format_query(x: str) -> str:
    """The zero-shot query: 'Q: {x}\\nA:' (no trailing space; the answer starts with one).

    Example:
        >>> print(format_query("hot"))
        Q: hot
        A:
    """
    return f"Q: {x}\nA:"


def build_prompt(demos: Sequence[Pair], query: str) -> str:
    """Demonstrations followed by the query.

    Example:
        >>> print(build_prompt([("hot", "cold")], "tall"))
        Q: hot
        A: cold
        <BLANKLINE>
        Q: tall
        A:
    """
    return "".join(format_demo(x, y) for x, y in demos) + format_query(query)


def check_enough(pairs: Sequence[Pair], needed: int, what: str) -> None:
    if len(pairs) < needed:
        raise TaskError(f"{what} has {len(pairs)} examples; {needed} are needed")


def sample_icl_prompts(
    pool: Sequence[Pair], n_prompts: int, n_shots: int, rng: random.Random, queries: Sequence[Pair] | None = None
) -> list[tuple[str, str]]:
    """``n_prompts`` (prompt, answer) pairs of ``n_shots`` demonstrations + a query.

    Demonstrations come from ``pool``. Queries come from ``queries`` in order
    (one prompt each, ``n_prompts`` ignored) or, if None, from ``pool`` too,
    distinct from that prompt's demonstrations.
    """
    if n_shots < 0:
        raise TaskError(f"n_shots must be >= 0, got {n_shots}")
    if queries is None:
        check_enough(pool, n_shots + 1, f"the demonstration pool ({n_shots} shots + 1 query)")
        out = []
        for _ in range(n_prompts):
            items = rng.sample(list(pool), n_shots + 1)
            out.append((build_prompt(items[:-1], items[-1][0]), items[-1][1]))
        return out
    check_enough(pool, n_shots, f"the demonstration pool ({n_shots} shots)")
    out = []
    for x, y in queries:
        demos = rng.sample(list(pool), n_shots)
        out.append((build_prompt(demos, x), y))
    return out


def zero_shot_prompts(pairs: Sequence[Pair]) -> list[tuple[str, str]]:
    """(prompt, answer) for each pair, with no demonstrations."""
    return [(format_query(x), y) for x, y in pairs]
