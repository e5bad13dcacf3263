"""Task categories: the FV suite's abstractive and extractive lists (Todd et al., 2024), and the message for an
FV task asked for without its data folder."""

from __future__ import annotations

from typing import Any

# The FV suite's categories (Todd et al., 2024): abstractive tasks generate, extractive ones pick from the input.
# A task's own meta.json ("category") overrides them.
ABSTRACTIVE = frozenset(
    [
        "antonym",
        "capitalize",
        "capitalize_first_letter",
        "capitalize_second_letter",
        "commonsense_qa",
        "country-capital",
        "english-french",
        "english-spanish",
        "lowercase_first_letter",
        "national_parks",
        "next_capital_letter",
        "park-country",
        "person-occupation",
        "person-sport",
        "present-past",
        "prev_item",
        "sentiment",
        "singular-plural",
        "word_length",
        "ag_news",
    ]
)
EXTRACTIVE = frozenset(
    [
        f"{s}_{n}"
        for s in (
            "adjective_v_verb",
            "alphabetically_first",
            "alphabetically_last",
            "animal_v_object",
            "choose_first_of",
            "choose_last_of",
            "color_v_animal",
            "concept_v_object",
            "object_v_concept",
            "verb_v_adjective",
        )
        for n in (3, 5)
    ]
    + ["choose_middle_of_3", "fruit_v_animal_3", "conll2003_location", "conll2003_person", "squad_val"]
)


def fv_hint(name: str) -> str:
    """The one-line message for an FV task name asked for without a data folder: where to get the tasks."""
    return (
        f"'{name}' is a function-vector task, not built in: get the {len(ABSTRACTIVE | EXTRACTIVE)} FV tasks with "
        f"`site-lens data fv --out data/fv`, then load_task('{name}', data_dir='data/fv') (CLI: --data data/fv)"
    )


def category(task: Any) -> str:
    """A task's (a ``Task`` or a name) category: its metadata's, else 'abstractive' / 'extractive' from the FV suite's lists, else 'other'.

    Example:
        >>> category("antonym"), category("choose_first_of_3"), category("uppercase")
        ('abstractive', 'extractive', 'other')
    """
    meta = getattr(task, "meta", None)
    if isinstance(meta, dict):  # a Task: its meta.json's category first
        own = meta.get("category")
        if own:
            return str(own)
        task = task.name
    return "abstractive" if task in ABSTRACTIVE else "extractive" if task in EXTRACTIVE else "other"
