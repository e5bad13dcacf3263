"""Small budgets and a tiny task folder for the baseline and bench tests."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

from site_lens.config import EmbeddingConfig, SelectionConfig, SiteConfig
from site_lens.methods import (
    I2CL,
    IA3,
    METHODS,
    FunctionVector,
    LoRA,
    MTVConfig,
    MultimodalTaskVector,
    Site,
    TrainConfig,
    with_objective,
)

SMALL_EMBEDDING = EmbeddingConfig(n_prompts=4, n_shots=3)
SMALL_SITE = SiteConfig(embedding=SMALL_EMBEDDING, selection=SelectionConfig(steps=6, eval_every=3, max_valid=4))
SMALL_TRAIN = TrainConfig(steps=6, lr=0.05, batch_size=4, eval_every=3, max_valid=4)


def small_methods() -> dict:
    """Every method, with budgets that run in well under a second on the tiny model."""
    return {
        **METHODS,
        "icl": _icl,
        "site": lambda: Site(SMALL_SITE),
        "fv": lambda: FunctionVector(k=3, n_cie_prompts=3, n_shots=3),
        "i2cl": lambda: I2CL(n_demos=3, train=SMALL_TRAIN),
        "mtv": lambda: MultimodalTaskVector(MTVConfig(steps=6, batch_size=4, eval_every=3)),
        "lora": lambda: LoRA(train=SMALL_TRAIN),
        "ia3": lambda: IA3(train=SMALL_TRAIN),
        **{
            f"{b}_seq": lambda b=b: with_objective(_SMALL[b](), "sequence", f"{b}_seq")
            for b in ("site", "i2cl", "lora", "ia3")
        },
    }


_SMALL = {
    "site": lambda: Site(SMALL_SITE),
    "i2cl": lambda: I2CL(n_demos=3, train=SMALL_TRAIN),
    "lora": lambda: LoRA(train=SMALL_TRAIN),
    "ia3": lambda: IA3(train=SMALL_TRAIN),
}


def _icl():
    from site_lens.methods import ICL

    return ICL(n_shots=3)


def write_task_dir(root: Path, names=("upper", "lower"), seed: int = 0) -> Path:
    """Task folders (train/valid/test.json) of one-letter case changes."""
    rng = random.Random(seed)
    for name in names:
        letters = list(string.ascii_lowercase)
        pairs = [(c, c.upper()) if name == "upper" else (c.upper(), c) for c in letters]
        rng.shuffle(pairs)
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for split, part in (("train", pairs[:16]), ("valid", pairs[16:21]), ("test", pairs[21:])):
            (d / f"{split}.json").write_text(json.dumps([{"input": x, "output": y} for x, y in part]))
    return root


def check_row(model, method, task, row: dict, n: int, max_new_tokens: int) -> list[str]:
    """Assert that ``score_method``'s row for a fitted method on the first ``n`` test items is what greedy
    generation under the method's own hooks and prompts gives: its predictions those outputs, its matches
    theirs, its first-token accuracy the first step's argmax against the answers' first token (with the char
    tokenizer, the space before the answer). Returns the outputs."""
    import pytest
    import torch

    from site_lens.metrics import exact_match, strict_match
    from site_lens.stages.generation import generate_greedy
    from site_lens.tokens import encode

    prompts = method.prompts(task, task.test[:n], 0)
    with model.hooks(fwd_hooks=method.persistent_hooks(model)), torch.inference_mode():
        ids, first = generate_greedy(
            model,
            encode(model, [p for p, _ in prompts]),
            max_new_tokens=max_new_tokens,
            prefill_hooks=method.prefill_hooks(model),
        )
    outputs, answers = [model.tokenizer.decode(g) for g in ids], [y for _, y in task.test[:n]]
    name, cs = method.name, bool(task.case_sensitive)
    assert row["n_test"] == n, name
    assert [p["output"] for p in row["predictions"]] == outputs, name
    assert [a for _, a in prompts] == answers, name
    space = model.tokenizer.convert_tokens_to_ids(" ")
    assert row["first_token_acc"] == pytest.approx(float((first.argmax(-1) == space).float().mean())), name
    exact = sum(exact_match(o, a, cs) for o, a in zip(outputs, answers)) / n
    strict = sum(strict_match(o, a, cs) for o, a in zip(outputs, answers)) / n
    assert (row["exact_match"], row["strict_match"]) == pytest.approx((exact, strict)), name
    return outputs


def bench_cmd(data: Path, out: Path) -> list[str]:
    """The CLI's bench on the tiny model (tests/bench_entry.py): four methods, one seed, two test items."""
    import sys

    entry = Path(__file__).parent / "bench_entry.py"
    return [
        sys.executable,
        str(entry),
        "bench",
        "--model",
        "tiny",
        "--data",
        str(data),
        "--tasks",
        "all",
        "--methods",
        "zero_shot,site,fv,ia3",
        "--seeds",
        "1",
        "--max-test",
        "2",
        "--out",
        str(out),
    ]
