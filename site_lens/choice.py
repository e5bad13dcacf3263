"""Multiple-choice scoring: the option whose full string is most likely after the prompt.

Option accuracy is lm-eval-harness's ``acc``: for each option, the summed
log-probability of its tokens (``answer_sep(option) + option`` as it follows the
prompt, ``tokens.answer_ids``) given the prompt, teacher-forced; the item counts
as correct when the gold option has the highest sum. An intervention is applied
as at generation: prefill hooks (SITE's injection) at the last prompt token only,
persistent hooks (I2CL, LoRA) at every position, option tokens included.

    scores = option_logprobs(model, ["Q: 2+2\\nA:"], [["3", "4"]], prefill=factory)
    acc = option_accuracy(scores, [1])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformer_lens import HookedTransformer

from .gate import HookFactory, Hooks
from .tokens import answer_ids, encode, pad_id, pad_right


@torch.inference_mode()
def option_logprobs(
    model: HookedTransformer,
    prompts: Sequence[str],
    options: Sequence[Sequence[str]],
    prefill: HookFactory | None = None,
    hooks: Hooks = (),
) -> list[list[float]]:
    """Summed log-probability of each option's tokens after its prompt (one list per prompt)."""
    if len(prompts) != len(options):
        raise ValueError(f"{len(prompts)} prompts but {len(options)} option lists")
    out: list[list[float]] = []
    for prompt, opts in zip(prompts, options):
        p = encode(model, [prompt])[0]
        conts = [answer_ids(model, prompt, o) for o in opts]
        seqs = [p + c[:-1] for c in conts]  # the last option token is predicted, never input
        tokens, mask, _ = pad_right(seqs, pad_id(model), model.cfg.device)
        last = torch.full((len(seqs),), len(p) - 1, device=model.cfg.device)
        at_last = prefill(last) if prefill else []
        logits = model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=[*hooks, *at_last])
        logp = logits.float().log_softmax(-1)  # (option, pos, d_vocab)
        sums = []
        for j, c in enumerate(conts):
            pos = torch.arange(len(p) - 1, len(p) - 1 + len(c), device=logp.device)
            sums.append(float(logp[j, pos, torch.tensor(c, device=logp.device)].sum()))
        out.append(sums)
    return out


def option_accuracy(scores: Sequence[Sequence[float]], gold: Sequence[int]) -> float:
    """Share of items whose gold option has the highest summed log-probability (ties count as wrong)."""
    hits = 0
    for s, g in zip(scores, gold):
        best = max(s)
        hits += int(s[g] == best and sum(x == best for x in s) == 1)
    return hits / max(1, len(gold))
