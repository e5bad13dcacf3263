"""Checks for the exercises of notebook 03 (teaching): each compares a learner's function with site-lens's own.

    passed = teaching.check_mean_hook_z(mean_hook_z, model, prompts[:3])   # prints one PASS / FAIL / TODO line
    t = teaching.fallback(mean_hook_z, passed)(model, prompts)             # the learner's function, or the reference

A check calls the learner's function on a small input, runs the package's
implementation on the same input, prints one line saying whether they agree
(and if not, what differed), and returns True or False. It does not raise, so
the notebook runs end to end with the exercises unfilled, unless the
environment variable ``SITE_LENS_TEACHING_STRICT=1`` is set: then a check that
does not pass raises ``ExerciseFailed`` (the tests run the notebook with the
solutions filled in that way). ``reference(name)`` is the package's
implementation of exercise ``name`` with the exercise's signature
(``teaching.references``); ``fallback`` hands it out in place of a function
whose check did not pass.

Only torch and jaxtyping are imported here; the stages are imported when a
check runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from . import references as ref
from .references import EXERCISES, fallback, reference

__all__ = [
    "EXERCISES",
    "STRICT_ENV",
    "ExerciseFailed",
    "check_attn_out_from_z",
    "check_gate_hook",
    "check_generate_with_injection",
    "check_mean_hook_z",
    "check_patch_heads",
    "check_site_loss",
    "check_train_theta",
    "fallback",
    "reference",
]

STRICT_ENV = "SITE_LENS_TEACHING_STRICT"  # "1": a check that does not pass raises ExerciseFailed


class ExerciseFailed(AssertionError):
    """A check did not pass while ``SITE_LENS_TEACHING_STRICT=1``."""


class _NotDone(Exception):
    """The learner's function still raises NotImplementedError."""


class _Differs(Exception):
    """The learner's function gave something other than the reference; the message says what."""


# ---------------------------------------------------------------- the machinery every check shares


def _run(name: str, body: Callable[[], str]) -> bool:
    """Run one check's ``body`` (it returns the PASS detail), print its line, and return whether it passed."""
    try:
        line, ok = f"PASS {name}: {body()}", True
    except _NotDone:
        line, ok = f"TODO {name}: not done yet (it raises NotImplementedError); later cells use the reference", False
    except _Differs as e:
        line, ok = f"FAIL {name}: {e}; later cells use the reference", False
    print(line)
    if not ok and os.environ.get(STRICT_ENV) == "1":
        raise ExerciseFailed(line)
    return ok


def _hooks_left(model) -> bool:
    return any(hp._forward_hooks or hp._backward_hooks for hp in model.hook_dict.values())


def _mine(fn: Callable, *args: Any, model=None, **kwargs: Any) -> Any:
    """The learner's ``fn(*args, **kwargs)``; its exceptions become the check's TODO or FAIL line."""
    try:
        out = fn(*args, **kwargs)
    except NotImplementedError:
        raise _NotDone from None
    except Exception as e:
        raise _Differs(f"your function raised {type(e).__name__}: {e}") from e
    finally:
        if model is not None and _hooks_left(model):
            model.reset_hooks()
            raise _Differs(
                "your function left hooks on the model (removed now); attach them with "
                "run_with_hooks or `with model.hooks(...)`, which remove them afterwards"
            )
    return out


def _same_gradient(
    got: Tensor, want: Tensor, mine: Tensor, ref: Tensor, what: str, wrt: str, atol: float, rtol: float
) -> None:
    """Back-propagate the sums of ``got`` and ``want``; raises _Differs unless ``mine.grad`` matches ``ref.grad``."""
    if not got.requires_grad:
        raise _Differs(f"{what} has no gradient with respect to {wrt} (a .detach(), .item() or torch.no_grad?)")
    got.sum().backward()
    want.sum().backward()
    if mine.grad is None:
        raise _Differs(f"no gradient reached {wrt}")
    _close(f"the gradient with respect to {wrt}", mine.grad, ref.grad, atol=atol, rtol=rtol)


def _close(what: str, got: Any, want: Tensor, atol: float, rtol: float = 0.0) -> float:
    """Max |got - want|; raises _Differs naming ``what`` on a type, shape or value mismatch."""
    if isinstance(got, (int, float)) and want.dim() == 0:
        got = torch.tensor(float(got))
    if not isinstance(got, Tensor):
        raise _Differs(f"{what} should be a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(want.shape):
        raise _Differs(f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    g, w = got.detach().float().cpu(), want.detach().float().cpu()
    if not bool(torch.isfinite(g).all()):
        raise _Differs(f"{what} has non-finite values")
    diff = (g - w).abs()
    bad = diff > atol + rtol * w.abs()
    if bool(bad.any()):
        flat = int(torch.argmax(diff).item())
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)) if diff.dim() else ()
        raise _Differs(
            f"{what} differs from the reference by up to {float(diff.max()):.3g} (at index {idx}: "
            f"yours {float(g.flatten()[flat]):.5g}, reference {float(w.flatten()[flat]):.5g}; tolerance {atol:g})"
        )
    return float(diff.max()) if diff.numel() else 0.0


# ---------------------------------------------------------------- one check per exercise


def check_attn_out_from_z(fn: Callable, model, tokens: Tensor, layer: int = 0) -> bool:
    """Does ``fn(z, W_O, b_O)`` rebuild the layer's ``hook_attn_out`` from its ``hook_z``?"""
    from transformer_lens.utilities import get_act_name

    def body() -> str:
        names = [get_act_name("z", layer), get_act_name("attn_out", layer)]
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=names)
            attn = model.blocks[layer].attn
            W_O = attn.W_O.detach()
            # a bridge over a model without an output bias (Llama's, SmolLM2's) has b_O None: a zero bias
            b_O = attn.b_O.detach() if attn.b_O is not None else W_O.new_zeros(W_O.shape[-1])
            # a bias of the learner's own, so an answer that drops b_O fails on models whose b_O is zero
            b_new = torch.randn(b_O.shape, generator=torch.Generator().manual_seed(0)).to(b_O)
            got = _mine(fn, cache[names[0]].clone(), W_O, b_new)
        err = _close("attn_out", got, cache[names[1]] - b_O + b_new, atol=1e-4, rtol=1e-4)
        return f"matches blocks.{layer}.hook_attn_out (max |diff| {err:.1e})"

    return _run("attn_out_from_z", body)


def check_mean_hook_z(fn: Callable, model, prompts: Sequence[Sequence[int]]) -> bool:
    """Does ``fn(model, prompts)`` equal ``embeddings.build_task_embedding`` (batched, right-padded)?"""

    def body() -> str:
        got = _mine(fn, model, prompts, model=model)
        err = _close("the task embedding", got, ref.mean_hook_z(model, prompts), atol=1e-4, rtol=1e-4)
        return f"matches site_lens.build_task_embedding on {len(prompts)} prompts (max |diff| {err:.1e})"

    return _run("mean_hook_z", body)


def check_gate_hook(fn: Callable, n_heads: int = 4, d_head: int = 8) -> bool:
    """Does ``fn(z, hook, t_layer, alpha_layer)`` mix the last position only, out of place, with the reference's gradient?"""
    from transformer_lens.hook_points import HookPoint

    def body() -> str:
        g = torch.Generator().manual_seed(0)
        z = torch.randn(2, 5, n_heads, d_head, generator=g)  # (batch, pos, head, d_head)
        t_layer = torch.randn(n_heads, d_head, generator=g)
        alpha = torch.rand(n_heads, generator=g)
        hook = HookPoint()
        hook.name = "blocks.0.attn.hook_z"
        a_mine, a_ref = alpha.clone().requires_grad_(), alpha.clone().requires_grad_()
        z_in = z.clone()
        got = _mine(fn, z_in, hook, t_layer=t_layer, alpha_layer=a_mine)
        if not torch.equal(z_in, z):
            raise _Differs("it changed z in place; build a new tensor (autograd needs the old z for alpha's gradient)")
        want = ref.gate_hook(z, hook, t_layer, a_ref)
        if isinstance(got, Tensor) and got.shape == want.shape and not torch.allclose(got[:, :-1], z[:, :-1]):
            raise _Differs("it changed positions before the last one; SITE edits the last prompt token only")
        err = _close("the gated z", got, want, atol=1e-6, rtol=1e-5)
        w = torch.randn(want.shape, generator=g)  # a random direction, so every element's gradient counts
        _same_gradient(got * w, want * w, a_mine, a_ref, "the output", "alpha", atol=1e-5, rtol=1e-4)
        return f"matches site_lens.gate_hook at the last position, value and gradient (max |diff| {err:.1e})"

    return _run("gate_hook", body)


def check_site_loss(
    fn: Callable, model, t: Float[Tensor, "layer head_index d_head"], tokens: Tensor, target: int
) -> bool:
    """Does ``fn(model, theta, t, tokens, target)`` give the package's first-token loss, and its gradient in theta?"""
    from ..stages.training import frozen

    def body() -> str:
        theta = torch.randn(model.cfg.n_layers, model.cfg.n_heads, generator=torch.Generator().manual_seed(1))
        th_mine, th_ref = theta.clone().requires_grad_(), theta.clone().requires_grad_()
        with frozen(model):
            got = _mine(fn, model, th_mine, t, tokens, target, model=model)
            want = ref.site_loss(model, th_ref, t, tokens, target)
            if isinstance(got, Tensor) and got.numel() == 1:
                got = got.reshape(())
            err = _close("the loss", got, want, atol=1e-4, rtol=1e-4)
            _same_gradient(got, want, th_mine, th_ref, "the loss", "theta", atol=1e-5, rtol=1e-3)
        return f"loss {float(want.detach()):.4f} and its gradient in theta match the package's (max |diff| {err:.1e})"

    return _run("site_loss", body)


def check_train_theta(
    fn: Callable,
    model,
    t: Float[Tensor, "layer head_index d_head"],
    examples: Sequence,
    steps: int = 4,
    lr: float = 0.2,
) -> bool:
    """Does ``fn(model, t, examples, plan, lr)`` follow ``AlphaTrainer.fit`` (batch 1, no validation) step for step?"""
    from ..config import SelectionConfig
    from ..stages.selection import AlphaTrainer
    from ..stages.training import schedule

    def body() -> str:
        plan = schedule(len(examples), steps, 1, seed=0)  # AlphaTrainer's own plan for seed 0
        out = _mine(fn, model, t, examples, plan, lr, model=model)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise _Differs(f"it should return (theta, losses), got {type(out).__name__}")
        theta, losses = out
        cfg = SelectionConfig(steps=steps, lr=lr, batch_size=1, eval_every=0, keep_best=False)
        trainer = AlphaTrainer(model, t, cfg, seed=0)
        gate = trainer.fit(list(examples))
        want_losses = torch.tensor(trainer.history.loss)
        try:
            got_losses = torch.tensor([float(x) for x in losses])
        except (TypeError, ValueError) as e:
            raise _Differs(f"losses should be a list of floats ({e})") from None
        _close("the losses per step", got_losses, want_losses, atol=1e-3, rtol=1e-3)
        err = _close("the trained theta", theta, gate.theta, atol=1e-2)
        return (
            f"{steps} steps match AlphaTrainer.fit (loss {want_losses[0]:.3f} -> {want_losses[-1]:.3f}; "
            f"max |theta diff| {err:.1e})"
        )

    return _run("train_theta", body)


def check_generate_with_injection(
    fn: Callable,
    model,
    prompts: Sequence[Sequence[int]],
    t: Float[Tensor, "layer head_index d_head"],
    alpha: Float[Tensor, "layer head_index"],
    max_new_tokens: int = 6,
) -> bool:
    """Does ``fn(model, tokens, t, alpha, n)`` give ``generation.generate_greedy``'s tokens (injected once, at prefill)?"""

    def decode(ids: Sequence[int]) -> str:
        return repr(model.tokenizer.decode(list(ids))) if model.tokenizer is not None else str(list(ids))

    def body() -> str:
        for j, p in enumerate(prompts):
            got = _mine(fn, model, list(p), t, alpha, max_new_tokens, model=model)
            try:
                got = [int(x) for x in (got.flatten().tolist() if isinstance(got, Tensor) else got)]
            except (TypeError, ValueError) as e:
                raise _Differs(f"it should return a list of token ids ({e})") from None
            want = ref.generate_with_injection(model, p, t, alpha, max_new_tokens)
            if got != want:
                i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                raise _Differs(
                    f"prompt {j}: yours {decode(got)}, reference {decode(want)} (first difference at new token {i}; "
                    "inject at prefill only, then decode with the KV cache and no hooks)"
                )
        return f"{len(prompts)} prompts x {max_new_tokens} tokens equal site_lens.generate_greedy with injection at prefill"

    return _run("generate_with_injection", body)


def check_patch_heads(
    fn: Callable,
    model,
    prompts: Sequence[Sequence[int]],
    targets: Sequence[int],
    t: Float[Tensor, "layer head_index d_head"],
    alpha: Float[Tensor, "layer head_index"],
    k: int = 4,
) -> bool:
    """Does ``fn(model, prompts, targets, t, alpha)`` give ``patching``'s (accuracy, P(answer)), hard and soft alpha?"""
    from ..analysis.patching import top_k_heads

    def body() -> str:
        hard = top_k_heads(alpha, k).float()
        for what, a in ((f"top-{k} heads replaced", hard), ("the soft alpha", alpha)):
            got = _mine(fn, model, prompts, targets, t, a, model=model)
            if not (isinstance(got, tuple) and len(got) == 2):
                raise _Differs(f"it should return (accuracy, mean probability), got {type(got).__name__}")
            want = ref.patch_heads(model, prompts, targets, t, a)
            for name, g, w in zip(("accuracy", "mean probability"), got, want):
                try:
                    g = float(g)
                except (TypeError, ValueError):
                    raise _Differs(f"{name} should be a number, got {type(g).__name__}") from None
                if abs(g - w) > 1e-4:
                    raise _Differs(f"with {what}: {name} {g:.4f}, reference {w:.4f}")
        return f"accuracy and P(answer) match site_lens.patching on {len(prompts)} prompts (top-{k} and soft alpha)"

    return _run("patch_heads", body)
