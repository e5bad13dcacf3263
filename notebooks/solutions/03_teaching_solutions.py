"""Solutions to the exercises of notebooks/03_teaching.ipynb, one function per exercise, same names.

Try the exercises first. Each function here can be pasted over its exercise
cell; ``tests/test_teaching.py`` does exactly that and runs the notebook with
``SITE_LENS_TEACHING_STRICT=1``. The notebook's import cell provides every
name used below.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.utilities import get_act_name
from transformers import DynamicCache

import site_lens as sl
from site_lens.models.engines import is_bridge


def attn_out_from_z(
    z: Float[Tensor, "batch pos head_index d_head"],
    W_O: Float[Tensor, "head_index d_head d_model"],
    b_O: Float[Tensor, " d_model"],
) -> Float[Tensor, "batch pos d_model"]:
    """The attention layer's output: each head's z through its own slice of W_O, summed over heads, plus b_O."""
    return torch.einsum("bphd,hdm->bpm", z, W_O) + b_O


def mean_hook_z(model, prompts: list[list[int]]) -> Float[Tensor, "layer head_index d_head"]:
    """Mean over prompts of hook_z at each prompt's last token, for every layer and head (one prompt at a time)."""
    names = [get_act_name("z", layer) for layer in range(model.cfg.n_layers)]
    per_prompt = []
    with torch.inference_mode():
        for ids in prompts:
            _, cache = model.run_with_cache(torch.tensor([ids]), names_filter=names)
            per_prompt.append(torch.stack([cache[n][0, -1] for n in names]))  # (layer, head, d_head)
    return torch.stack(per_prompt).mean(dim=0)


def gate_hook(
    z: Float[Tensor, "batch pos head_index d_head"],
    hook,
    t_layer: Float[Tensor, "head_index d_head"],
    alpha_layer: Float[Tensor, " head_index"],
) -> Float[Tensor, "batch pos head_index d_head"]:
    """z <- (1 - alpha) z + alpha t at the last position only, returned as a new tensor."""
    a = alpha_layer[:, None]  # (head, 1): one scalar per head, broadcast over d_head
    new = z.clone()
    new[:, -1] = (1 - a) * z[:, -1] + a * t_layer
    return new


def site_loss(
    model,
    theta: Float[Tensor, "layer head_index"],
    t: Float[Tensor, "layer head_index d_head"],
    tokens: Int[Tensor, "1 pos"],
    target: int,
) -> Float[Tensor, ""]:
    """Cross-entropy of the answer's first token with t mixed into every layer by alpha = sigmoid(theta)."""
    alpha = torch.sigmoid(theta)
    hooks = [
        (get_act_name("z", layer), partial(gate_hook, t_layer=t[layer], alpha_layer=alpha[layer]))
        for layer in range(model.cfg.n_layers)
    ]
    logits = model.run_with_hooks(tokens, fwd_hooks=hooks)[0, -1]  # (d_vocab,)
    return F.cross_entropy(logits[None], torch.tensor([target]))


def train_theta(model, t, examples, plan, lr=0.2):
    """Adam on theta alone (starting at 0), one step per batch of ``plan``; returns (theta, loss per step)."""
    theta = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=lr)
    losses = []
    for batch in plan:
        opt.zero_grad()
        loss = sum(site_loss(model, theta, t, torch.tensor([examples[i].tokens]), examples[i].target) for i in batch)
        loss = loss / len(batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return theta.detach(), losses


def generate_with_injection(model, tokens: list[int], t, alpha, max_new_tokens: int) -> list[int]:
    """Greedy tokens after ``tokens``: t injected at the last prompt token during prefill only, then the KV cache."""
    bridge = is_bridge(model)  # a TransformerBridge runs transformers' model: its cache is transformers' own
    cache = DynamicCache() if bridge else TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, 1)

    def forward(x: Tensor) -> Tensor:
        """x's logits; x's keys and values join the cache."""
        if not bridge:
            return model(x, past_kv_cache=cache)  # positions continue from where the cache ends
        n = cache.get_seq_length()
        return model(x, layer_past=cache, position_ids=torch.arange(n, n + x.shape[1], device=x.device)[None])

    out = []
    with torch.inference_mode():
        with model.hooks(fwd_hooks=sl.injection_hooks(model, t, alpha, pos=-1)):
            logits = forward(torch.tensor([tokens], device=model.cfg.device))  # prefill: the only injected pass
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        for _ in range(max_new_tokens - 1):
            logits = forward(torch.tensor([[nxt]], device=model.cfg.device))  # one new token against the cache
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
    return out


def patch_heads(model, prompts, targets, t, alpha) -> tuple[float, float]:
    """(accuracy, mean probability) of the answers' first tokens with t mixed in by alpha at the last token."""
    correct, prob = 0.0, 0.0
    hooks = sl.injection_hooks(model, t, alpha, pos=-1)
    with torch.inference_mode():
        for ids, y in zip(prompts, targets):
            logits = model.run_with_hooks(torch.tensor([ids]), fwd_hooks=hooks)[0, -1]
            correct += float(logits.argmax() == y)
            prob += logits.softmax(-1)[y].item()
    return correct / len(prompts), prob / len(prompts)
