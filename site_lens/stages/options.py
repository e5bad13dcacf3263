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

from ..engine.backend import backend_for, logits_at
from ..gate import HookFactory, Hooks
from ..tokens import answer_ids, check_context, encode, pad_id, pad_right
from ..types import Model


@torch.inference_mode()
def option_logprobs(
    model: Model,
    prompts: Sequence[str],
    options: Sequence[Sequence[str]],
    prefill: HookFactory | None = None,
    hooks: Hooks = (),
) -> list[list[float]]:
    """Summed log-probability of each option's tokens after its prompt (one list per prompt).

    The prompt up to its last token runs once, into a KV cache (with ``hooks`` and any hooks
    attached to the model); then every option runs as one row against it: the last prompt token
    (where ``prefill`` injects) followed by the option's tokens, unembedding only those positions.
    """
    if len(prompts) != len(options):
        raise ValueError(f"{len(prompts)} prompts but {len(options)} option lists")
    device = model.cfg.device
    reference = backend_for(model, "hooked")  # every hook fires (the bridge's backend on a TransformerBridge)
    out: list[list[float]] = []
    for prompt, opts in zip(prompts, options):
        p = encode(model, [prompt])[0]
        conts = [answer_ids(model, prompt, o) for o in opts]
        check_context(model, [len(p) + max(len(c) for c in conts) - 1])
        spans = [[p[-1], *c[:-1]] for c in conts]  # the last option token is predicted, never input
        tokens, _, _ = pad_right(spans, pad_id(model), device)  # pads come after every position read
        rows = len(spans)
        at_last = prefill(torch.zeros(rows, dtype=torch.long, device=device)) if prefill else []
        if len(p) > 1:
            with model.hooks(fwd_hooks=list(hooks)):
                prefix = reference.prefix(torch.tensor([p[:-1]], device=device))
            logits = reference.run(tokens, prefix, [*hooks, *at_last])
        else:
            positions = torch.arange(tokens.shape[1], device=device).expand(rows, -1)
            logits = logits_at(
                model, tokens, positions, hooks=[*hooks, *at_last], attention_mask=torch.ones_like(tokens)
            )
        logp = logits.float().log_softmax(-1)  # (option, span, d_vocab)
        out.append(
            [
                float(logp[j, torch.arange(len(c), device=device), torch.tensor(c, device=device)].sum())
                for j, c in enumerate(conts)
            ]
        )
    return out


def option_accuracy(scores: Sequence[Sequence[float]], gold: Sequence[int]) -> float:
    """Share of items whose gold option has the highest summed log-probability (ties count as wrong)."""
    hits = 0
    for s, g in zip(scores, gold):
        best = max(s)
        hits += int(s[g] == best and sum(x == best for x in s) == 1)
    return hits / max(1, len(gold))
