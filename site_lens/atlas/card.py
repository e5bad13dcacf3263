"""An atlas's model card: README.md with the Hugging Face Hub's YAML front matter, then what it holds."""

from __future__ import annotations

from typing import Any

# the Hub repositories the embedded models were quantised from (Hub metadata's base_model)
BASE_MODELS = {
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gemma-3-270m": "google/gemma-3-270m",
}
TAGS = ("site-lens", "interpretability", "attention-heads", "task-embeddings", "transformer-lens")


def base_model(identity: dict[str, Any]) -> str | None:
    """The Hub id of the model an atlas maps: the embedded models' sources, else a name that is a Hub id."""
    name = str(identity.get("name", ""))
    return BASE_MODELS.get(name) or (name if "/" in name else None)


def model_card(manifest: dict[str, Any], atlas) -> str:
    """The README.md of an atlas folder (and of its Hub repository)."""
    ident = manifest["model"]
    front = ["---", "library_name: site-lens"]
    base = manifest.get("base_model") or base_model(ident)
    if base:
        front.append(f"base_model: {base}")
    licences = sorted({t.get("licence") for t in manifest["tasks"].values() if t.get("licence")})
    front.append("tags:")
    front += [f"- {t}" for t in TAGS]
    front.append("---")
    tasks = manifest["tasks"]
    cats: dict[str, int] = {}
    for t in tasks.values():
        cats[t.get("category") or "uncategorised"] = cats.get(t.get("category") or "uncategorised", 0) + 1
    seeds = sorted({int(s) for s in atlas.heads.seed.unique()})
    methods = sorted(atlas.scores.method.unique()) if len(atlas.scores) else []
    body = [
        f"# SITE head atlas: {ident.get('name')}",
        "",
        (
            f"Every task's SITE head map for {ident.get('name')} ({ident.get('architecture')}, "
            f"{ident.get('n_layers')} layers x {ident.get('n_heads')} heads): {len(tasks)} tasks "
            f"({', '.join(f'{n} {c}' for c, n in sorted(cats.items()))}), seeds {', '.join(map(str, seeds))}. "
            "Per task and seed: the gate logits theta (alpha = sigmoid(theta), one per head), the task "
            "embedding t, and the scores"
            + (f" ({', '.join(methods)}; first-token accuracy, prefix match, strict match)." if methods else ".")
        ),
        "",
        "```python",
        "import site_lens as sl",
        'atlas = sl.load_atlas("PATH_OR_HUB_ID")',
        "atlas.heads                                # one row per (task, seed, layer, head)",
        'atlas.top_heads("antonym", k=10)          # a task\'s highest-alpha heads',
        "atlas.tasks_selecting(layer=12, head=3)    # the tasks that select a head",
        'adapter = atlas.adapter("antonym", seed=0) # SITE for that task, checked against the model',
        "```",
        "",
        (
            "Files: `atlas.json` (manifest: model identity, versions, config, tasks, seeds, command, digests), "
            "`heads.parquet`, `scores.parquet`, `t.safetensors`. Made by "
            f"site-lens {manifest.get('versions', {}).get('site_lens', '?')} "
            f"(TransformerLens {manifest.get('versions', {}).get('transformer_lens', '?')}):"
        ),
        "",
        "```bash",
        str(manifest.get("command", "")),
        "```",
    ]
    sources = sorted({t.get("source") for t in tasks.values() if t.get("source")})
    if sources or licences:
        body += ["", f"Task data: {', '.join(sources) or 'see atlas.json'}; licences: {', '.join(licences) or 'see atlas.json'}."]
    return "\n".join(front + [""] + body) + "\n"
