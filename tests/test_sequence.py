"""The answer-sequence objective: targets, the cached path against whole prompts, training with it."""

from functools import partial

import pytest
import torch

from site_lens.config import ConfigError, EngineConfig, SelectionConfig
from site_lens.engine.backend import backend_for
from site_lens.gate import injection_hooks
from site_lens.models.engines import is_bridge
from site_lens.stages.objectives import SequenceCache, answer_sequence, sequence_examples, sequence_loss
from site_lens.stages.selection import AlphaTrainer
from site_lens.stages.training import first_token_loss
from site_lens.tokens import Example, generation_stop_ids, make_examples

WORDS = ["cat", "dog", "sun", "moon", "tree", "rock", "elephant", "ox"]


def _pairs(words):
    return [(f"Q: {w}\nA:", w[::-1]) for w in words]


def _name(model, backend: str) -> str:
    """The name of the backend asked for: "hooked" is the engine's reference, a bridge's own forward on a bridge."""
    return "bridge" if backend == "hooked" and is_bridge(model) else backend


def test_targets_are_the_answer_then_its_end_as_in_a_demonstration(model):
    tok = model.tokenizer
    ids = answer_sequence(model, "Q: cat\nA:", "tac")
    assert tok.decode(ids) == " tac\n"  # the char tokenizer splits "\n\n": the first newline ends the answer
    assert tok.decode(answer_sequence(model, "Q: 4\nA:", "5")) == "5\n"  # no space before a number
    ex = sequence_examples(model, _pairs(WORDS))
    assert [e.target for e in ex] == [e.target for e in make_examples(model, _pairs(WORDS))]
    assert all(e.continuation[-1] in generation_stop_ids(model) for e in ex)  # generation stops where training ends


@pytest.mark.parametrize("backend", ["packed", "hooked"])
def test_cached_loss_and_grad_equal_whole_prompts(model, backend):
    g = torch.Generator().manual_seed(0)
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head, generator=g)
    theta = torch.randn(model.cfg.n_layers, model.cfg.n_heads, generator=g).requires_grad_(True)
    ex = sequence_examples(model, _pairs(WORDS))
    cache = SequenceCache(model, ex, backend=backend_for(model, backend))
    assert cache.backend.name == _name(model, backend)
    cached = cache.loss(range(len(ex)), torch.sigmoid(theta), t)
    (gc,) = torch.autograd.grad(cached, theta)
    whole = sequence_loss(model, ex, prefill=lambda last: injection_hooks(model, t, torch.sigmoid(theta), last))
    (gw,) = torch.autograd.grad(whole, theta)
    assert abs(cached.item() - whole.item()) < 1e-5
    assert torch.allclose(gc, gw, atol=1e-5)
    assert gc.abs().sum() > 0


def test_cached_batches_of_one_prefix_length_equal_rows_one_by_one(model):
    """Rows sharing a prefix length run together, their answers right-padded; parts of batch_size rows."""
    g = torch.Generator().manual_seed(1)
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head, generator=g)
    alpha = torch.rand(model.cfg.n_layers, model.cfg.n_heads, generator=g)
    pairs = [("Q: ab\nA:", "x"), ("Q: cd\nA:", "xyzzy"), ("Q: ef\nA:", "xy"), ("Q: abc\nA:", "no")]
    ex = sequence_examples(model, pairs)
    cache = SequenceCache(model, ex, batch_size=2)
    assert len({len(e.continuation) for e in ex[:3]}) == 3  # one prefix length, three answer lengths
    one_by_one = torch.stack([cache.loss([i], alpha, t) for i in range(len(ex))]).mean()
    assert torch.allclose(cache.loss(range(len(ex)), alpha, t), one_by_one, atol=1e-5)
    assert torch.allclose(
        cache.loss([2, 0], alpha, t), (cache.loss([0], alpha, t) + cache.loss([2], alpha, t)) / 2, atol=1e-5
    )


def test_whole_prompt_batches_equal_rows_one_by_one(model, monkeypatch):
    """Whole prompts run in right-padded chunks (answers of several lengths); a one-row budget gives the same loss and grad."""
    from site_lens.stages import objectives

    g = torch.Generator().manual_seed(2)
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head, generator=g)
    theta = torch.randn(model.cfg.n_layers, model.cfg.n_heads, generator=g).requires_grad_(True)
    ex = sequence_examples(model, [("Q: ab\nA:", "x"), ("Q: elephant\nA:", "xyzzy"), ("Q: ox\nA:", "xy")])
    prefill = lambda last: injection_hooks(model, t, torch.sigmoid(theta), last)
    real, chunks = objectives.logits_at, []

    def spy(model, tokens, positions, **kw):
        chunks.append(tokens.shape[0])
        return real(model, tokens, positions, **kw)

    monkeypatch.setattr(objectives, "logits_at", spy)
    batched = sequence_loss(model, ex, prefill)
    (gb,) = torch.autograd.grad(batched, theta)
    monkeypatch.setattr(objectives, "GRAD_CELLS", 1)  # every chunk a single row
    rows = sequence_loss(model, ex, prefill)
    (gr,) = torch.autograd.grad(rows, theta)
    assert chunks == [3, 1, 1, 1]
    accumulated = sequence_loss(model, ex, prefill, backward=True)  # one chunk's graph at a time
    assert abs(accumulated.item() - batched.item()) < 1e-5 and torch.allclose(theta.grad, gb, atol=1e-5)
    assert abs(batched.item() - rows.item()) < 1e-5 and torch.allclose(gb, gr, atol=1e-5)
    cached = SequenceCache(model, ex).loss(range(len(ex)), torch.sigmoid(theta), t)
    assert abs(cached.item() - batched.item()) < 1e-5


def test_a_one_token_continuation_is_the_first_token_loss(model):
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    alpha = torch.rand(model.cfg.n_layers, model.cfg.n_heads)
    ex = make_examples(model, _pairs(WORDS))
    one = [Example(e.tokens, e.target, continuation=(e.target,)) for e in ex]
    first = first_token_loss(model, ex, prefill=lambda last: injection_hooks(model, t, alpha, last))
    assert torch.allclose(SequenceCache(model, one).loss(range(len(one)), alpha, t), first, atol=1e-5)
    assert torch.allclose(
        sequence_loss(model, one, lambda last: injection_hooks(model, t, alpha, last)), first, atol=1e-5
    )


def test_only_the_last_prompt_token_is_injected(model):
    """Answer positions see the injection through attention only: their own hook_z is left as it was."""
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    alpha = torch.ones(model.cfg.n_layers, model.cfg.n_heads)
    (e,) = sequence_examples(model, _pairs(["moon"]))
    seen = {}

    def spy(z, hook, name):  # name: the z hook's own (a bridge's hook reports the point hook_z aliases)
        seen[name] = z.detach().clone()
        return z

    names = [f"blocks.{layer}.attn.hook_z" for layer in range(model.cfg.n_layers)]
    spies = [(n, partial(spy, name=n)) for n in names]  # after the injection on each hook point: they see what it wrote
    sequence_loss(model, [e], prefill=lambda last: injection_hooks(model, t, alpha, last) + spies)
    last = len(e.tokens) - 1
    z0 = seen[names[0]][0]
    assert torch.allclose(z0[last], t[0])  # alpha = 1: the last prompt token is t
    assert not torch.allclose(z0[last + 1], t[0])


def test_training_with_the_sequence_objective_fast_equals_naive(model):
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    ex = sequence_examples(model, _pairs(WORDS))
    thetas = []
    for fast, backend, used in [(True, "auto", "packed"), (True, "hooked", "hooked"), (False, "auto", "hooked")]:
        cfg = SelectionConfig(steps=6, eval_every=3, objective="sequence")
        tr = AlphaTrainer(model, t, cfg, seed=1, engine=EngineConfig(fast=fast, backend=backend))
        thetas.append(tr.fit(ex[:6], ex[6:]).theta.detach())
        assert tr.backend_used.name == _name(model, used)  # cached prefixes on packed weights where the model allows
    assert torch.allclose(thetas[0], thetas[2], atol=1e-4) and torch.allclose(thetas[1], thetas[2], atol=1e-4)
    assert not torch.allclose(thetas[0], torch.zeros_like(thetas[0]))


def test_bad_objective_and_missing_continuations_are_refused(model):
    with pytest.raises(ConfigError, match="objective"):
        SelectionConfig(objective="tokens")
    with pytest.raises(ValueError, match="continuation"):
        SequenceCache(model, make_examples(model, _pairs(WORDS[:2])))


@pytest.mark.parametrize("kind", ["i2cl", "lora"])
def test_whole_prompt_baselines_train_on_sequences(model, tmp_path, kind):
    from small import SMALL_TRAIN, write_task_dir

    from site_lens.methods import I2CL, METHODS, LoRA, with_objective
    from site_lens.stages.objectives import train_valid_examples
    from site_lens.tasks import load_task

    task = load_task("upper", data_dir=write_task_dir(tmp_path))
    base = I2CL(n_demos=3, train=SMALL_TRAIN) if kind == "i2cl" else LoRA(train=SMALL_TRAIN)
    method = with_objective(base, "sequence", f"{kind}_seq")
    assert (method.name, method.train_cfg.objective) == (f"{kind}_seq", "sequence")
    method.fit(model, task, 0)
    _, valid = train_valid_examples(model, task, "sequence")
    with torch.no_grad():
        kept = sequence_loss(model, valid[: SMALL_TRAIN.max_valid], hooks=method.persistent_hooks(model))
    assert abs(float(kept) - method.info["best_valid_loss"]) < 1e-4  # selected on the sequence loss
    registered = METHODS[f"{kind}_seq"]()
    assert (registered.name, registered.train_cfg.objective) == (f"{kind}_seq", "sequence")
    assert METHODS[kind]().train_cfg.objective == "first_token"


def test_site_seq_is_site_with_the_sequence_objective():
    from dataclasses import replace

    from site_lens.config import SiteConfig
    from site_lens.experiments import bench
    from site_lens.methods import configured

    cfg = SiteConfig()
    m = configured("site_seq", replace(cfg, selection=replace(cfg.selection, steps=7)))
    assert (m.name, m.cfg.selection.objective, m.cfg.selection.steps) == ("site_seq", "sequence", 7)
    assert configured("site", cfg).cfg.selection.objective == "first_token"
    short = replace(cfg, selection=replace(cfg.selection, steps=7))
    assert bench.row_spec("m", short, "site_seq")["settings"] == {"selection.steps": 7}
    assert bench.row_spec("m", short, "site_opt")["settings"] == {
        "selection.steps": 7
    }  # a rerun with other steps refits


# ---------------------------------------------------------------- the option-token objective

LETTERS = ["(A)", "(B)", "(C)"]


def test_option_token_scores_the_first_token_where_options_differ(model):
    """Lettered answers share " (": the target is the letter, after " (" teacher-forced and unscored."""
    from site_lens.stages.objectives import option_token_examples

    prompts = [(f"Q: pick {w}\nA:", LETTERS[i % 3]) for i, w in enumerate(WORDS)]
    ex = option_token_examples(model, prompts, [LETTERS] * len(prompts))
    tok = model.tokenizer
    for e, (_, y) in zip(ex, prompts):
        assert tok.decode(e.continuation[e.scored_from]) == y[1]  # the letter
        assert tok.decode(e.continuation[: e.scored_from]) == " ("  # shared, fed in, not scored
    # no injection: the loss is the first-token loss of the prompt extended by the shared tokens
    from site_lens.tokens import encode

    extended = [Example(ids, e.continuation[-1]) for ids, e in zip(encode(model, [p + " (" for p, _ in prompts]), ex)]
    assert all(x.tokens == [*e.tokens, *e.continuation[:-1]] for x, e in zip(extended, ex))
    ref = first_token_loss(model, extended)
    assert torch.allclose(sequence_loss(model, ex), ref, atol=1e-5)
    alpha = torch.rand(model.cfg.n_layers, model.cfg.n_heads)
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    cached = SequenceCache(model, ex).loss(range(len(ex)), alpha, t)
    whole = sequence_loss(model, ex, prefill=lambda last: injection_hooks(model, t, alpha, last))
    assert torch.allclose(cached, whole, atol=1e-5)
    # options that differ at once (digits take no space): the first answer token, as first_token's
    digits = [(f"Q: {w}\nA:", str(len(w))) for w in WORDS[:4]]
    at_once = option_token_examples(model, digits, [[y, "9"] for _, y in digits])
    assert [e.scored_from for e in at_once] == [0] * 4
    assert [e.target for e in at_once] == [e.target for e in make_examples(model, digits)]


def test_site_opt_trains_on_the_letter(model, tmp_path):
    import json

    from site_lens.config import SiteConfig
    from site_lens.methods import METHODS, configured
    from site_lens.stages.objectives import objective_examples
    from site_lens.tasks import load_task

    d = tmp_path / "mc"
    d.mkdir()
    for s, n in [("train", 12), ("valid", 4), ("test", 4)]:
        items = [{"input": f"{i}", "output": LETTERS[i % 3], "options": LETTERS} for i in range(n)]
        (d / f"{s}.json").write_text(json.dumps(items))
    task = load_task(d)
    ex = objective_examples(model, task, "train", "option_token")
    assert all(e.scored_from == 2 for e in ex)  # " ", "(" then the letter on the character tokenizer
    assert METHODS["lora_opt"]().train_cfg.objective == "option_token"
    from dataclasses import replace

    from small import SMALL_EMBEDDING

    from site_lens.config import SelectionConfig

    cfg = SiteConfig(
        embedding=replace(SMALL_EMBEDDING, n_shots=2), selection=SelectionConfig(steps=4, eval_every=2, max_valid=4)
    )
    m = configured("site_opt", cfg)
    assert (m.name, m.cfg.selection.objective) == ("site_opt", "option_token")
    m.fit(model, task, 0)
    theta = m.adapter.theta
    assert not torch.allclose(theta, torch.zeros_like(theta))  # a gradient reached the gate through the letter
    with pytest.raises(ValueError, match="unknown objective"):
        objective_examples(model, task, "train", "letters")


def test_cached_loss_refuses_a_gate_per_prompt(model):
    ex = sequence_examples(model, _pairs(WORDS[:2]))
    c = model.cfg
    with pytest.raises((ValueError, TypeError), match="one gate|alpha"):  # the jaxtyping annotation, or the check
        SequenceCache(model, ex).loss(
            [0, 1], torch.rand(2, c.n_layers, c.n_heads), torch.randn(c.n_layers, c.n_heads, c.d_head)
        )
