"""Stage 2 of many tasks in one loop (``BatchedAlphaTrainer``, ``fit_site_many``) against one fit per task."""

import math

import pytest
import torch

from site_lens.config import EmbeddingConfig, SelectionConfig, SiteConfig
from site_lens.stages.objectives import train_valid_examples
from site_lens.stages.selection import AlphaTrainer
from site_lens.stages.selection_batched import BatchedAlphaTrainer
from site_lens.tasks import builtin_tasks, load_task, load_task_folder

CFG = SelectionConfig(steps=7, eval_every=3, max_valid=4, batch_size=2)
ATOL = 1e-5


@pytest.fixture(scope="module")
def eight(model, tmp_path_factory):
    """Eight tasks (the built-in ones and a small folder task), their examples and a random t each."""
    from small import write_task_dir

    root = write_task_dir(tmp_path_factory.mktemp("tasks"), names=("upper",))
    tasks = [load_task(name) for name in builtin_tasks()] + [load_task_folder(root / "upper")]
    assert len(tasks) == 8
    gen = torch.Generator().manual_seed(1)
    c = model.cfg
    ts = [torch.randn(c.n_layers, c.n_heads, c.d_head, generator=gen) * 2 for _ in tasks]
    data = [train_valid_examples(model, task) for task in tasks]
    return tasks, ts, [d[0] for d in data], [d[1] for d in data]


def single_fits(model, ts, trains, valids, cfg=CFG, seed=3):
    """Each task's own AlphaTrainer fit: (theta after every step, history, final theta) per task."""
    out = []
    for t, train, valid in zip(ts, trains, valids):
        trainer = AlphaTrainer(model, t, cfg, seed=seed)
        steps = []
        trainer.fit(train, valid, progress=lambda step, loss, tr=trainer, s=steps: s.append(tr.gate.theta.detach().clone()))
        out.append((steps, trainer.history, trainer.gate.theta.detach().clone()))
    return out


def batched_fit(model, ts, trains, valids, cfg=CFG, seed=3, trainer_cls=BatchedAlphaTrainer):
    trainer = trainer_cls(model, ts, cfg, seed=seed)
    steps = []
    hists = trainer.fit(trains, valids, progress=lambda step, losses: steps.append(trainer.theta.detach().clone()))
    return steps, hists, trainer.theta.detach().clone()


def check_equal(single, batched, stopped=()):
    """Every task's theta at every step, its losses, valid losses, best step and final theta match its own fit."""
    steps, hists, final = batched
    for k, (s_steps, s_hist, s_final) in enumerate(single):
        h = hists[k]
        if k not in stopped:
            assert len(s_steps) == len(steps), k
        for step, theta in enumerate(s_steps):
            assert torch.allclose(steps[step][k], theta, atol=ATOL), (k, step, (steps[step][k] - theta).abs().max())
        assert h.step == s_hist.step and h.valid_step == s_hist.valid_step, k
        assert h.loss == pytest.approx(s_hist.loss, abs=ATOL), k
        assert h.valid_loss == pytest.approx(s_hist.valid_loss, abs=ATOL), k
        assert h.best_step == s_hist.best_step, k
        assert (h.stopped_early is None) == (s_hist.stopped_early is None), k
        assert torch.allclose(final[k], s_final, atol=ATOL), k


def test_stacked_adam_is_one_adam_per_task():
    """One Adam over a (task, layer, head) theta moves each task's slice exactly as its own Adam would."""
    gen = torch.Generator().manual_seed(0)
    stacked = torch.nn.Parameter(torch.randn(5, 3, 4, generator=gen))
    alone = [torch.nn.Parameter(stacked.detach()[k].clone()) for k in range(5)]
    opt = torch.optim.Adam([stacked], lr=0.2)
    opts = [torch.optim.Adam([p], lr=0.2) for p in alone]
    for _ in range(6):
        grad = torch.randn(5, 3, 4, generator=gen) * torch.logspace(-6, 2, 5)[:, None, None]
        stacked.grad = grad.clone()
        opt.step()
        for k, (p, o) in enumerate(zip(alone, opts)):
            p.grad = grad[k].clone()
            o.step()
    for k, p in enumerate(alone):
        assert torch.allclose(stacked.detach()[k], p.detach(), rtol=0, atol=1e-6), k


def test_eight_tasks_match_their_own_fits_at_every_step(model, eight):
    _, ts, trains, valids = eight
    single = single_fits(model, ts, trains, valids)
    batched = batched_fit(model, ts, trains, valids)
    check_equal(single, batched)
    moved = [not torch.equal(batched[2][k], torch.zeros_like(batched[2][k])) for k in range(8)]
    assert all(moved)


def test_batch_of_one_prompt_per_task_matches(model, eight):
    """The paper's batch size (one prompt per task per step)."""
    _, ts, trains, valids = eight
    cfg = SelectionConfig(steps=5, eval_every=2, max_valid=3)
    check_equal(single_fits(model, ts[:4], trains[:4], valids[:4], cfg), batched_fit(model, ts[:4], trains[:4], valids[:4], cfg))


class SmallWindows(BatchedAlphaTrainer):
    """Prefixes cached three steps ahead, at most two prompts per forward (validation in several)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.cache_steps, self.max_rows = 3, 2


def test_cache_windows_and_row_chunks_change_nothing(model, eight):
    _, ts, trains, valids = eight
    check_equal(single_fits(model, ts, trains, valids), batched_fit(model, ts, trains, valids, trainer_cls=SmallWindows))


class PoisonedTrainer(BatchedAlphaTrainer):
    """Task 2's training loss is NaN from step 3 on (the other tasks' rows untouched)."""

    calls = 0

    def task_losses(self, cache, rows):
        losses = super().task_losses(cache, rows)
        if torch.is_grad_enabled():
            self.calls += 1
            if self.calls >= 3:
                bad = torch.zeros_like(losses)
                bad[2] = math.nan
                losses = losses + bad
        return losses


def test_a_non_finite_loss_stops_its_task_alone(model, eight):
    _, ts, trains, valids = eight
    single = single_fits(model, ts, trains, valids)
    batched = batched_fit(model, ts, trains, valids, trainer_cls=PoisonedTrainer)
    steps, hists, final = batched
    assert hists[2].stopped_early is not None and "step 3" in hists[2].stopped_early
    assert hists[2].step == [1, 2] and hists[2].valid_step == []
    for later in steps[2:]:  # task 2 keeps its step-2 theta
        assert torch.equal(later[2], steps[1][2])
    assert torch.allclose(final[2], single[2][0][1], atol=ATOL)
    others = [k for k in range(8) if k != 2]
    check_equal([single[k] for k in others], (steps_of(steps, others), [hists[k] for k in others], final[others]))
    assert all(hists[k].stopped_early is None for k in others)


def steps_of(steps, tasks):
    return [s[tasks] for s in steps]


def test_a_nan_t_stops_its_task_at_once_and_leaks_nowhere(model, eight):
    """A NaN in one task's t runs through the shared batch: that task stops at step 1, the rest match their fits."""
    _, ts, trains, valids = eight
    ts = list(ts)
    ts[5] = torch.full_like(ts[5], math.nan)
    single = single_fits(model, ts[4:], trains[4:], valids[4:])
    batched = batched_fit(model, ts[4:], trains[4:], valids[4:])
    assert single[1][1].stopped_early is not None and batched[1][1].stopped_early is not None
    check_equal(single, batched, stopped=(1,))
    assert torch.equal(batched[2][1], torch.zeros_like(batched[2][1]))  # the initial theta


def test_fit_site_many_matches_fit_site(model, eight):
    """Stages 1 and 2: each task's adapter (t, theta), history and best step are fit_site's."""
    from site_lens.methods.site import fit_site, fit_site_many

    tasks = eight[0][:3]
    cfg = SiteConfig(embedding=EmbeddingConfig(n_prompts=3, n_shots=2), selection=CFG, seed=4)
    fits = fit_site_many(model, tasks, cfg)
    for task, fit in zip(tasks, fits):
        one = fit_site(model, task, cfg)
        assert fit.adapter.meta["task"] == task.name
        assert torch.allclose(fit.adapter.t, one.adapter.t, atol=1e-6)
        assert torch.allclose(fit.adapter.theta, one.adapter.theta, atol=ATOL)
        assert fit.history.best_step == one.history.best_step
        assert fit.history.loss == pytest.approx(one.history.loss, abs=ATOL)


def test_bench_with_a_task_batch_writes_the_rows_one_task_at_a_time_would(model, tmp_path, monkeypatch):
    """``run_bench(task_batch=3)`` over four tasks (a batch of three, then one): every SITE row's theta is the
    one-at-a-time bench's, its scores equal, its t kept; the other methods' rows untouched by it."""
    from small import write_task_dir

    from site_lens.config import EvalConfig
    from site_lens.experiments import bench
    from site_lens.experiments.kept_t import t_path

    data = write_task_dir(tmp_path / "data", names=("upper", "lower", "upper2", "lower2"))
    cfg = SiteConfig(
        embedding=EmbeddingConfig(n_prompts=2, n_shots=2),
        selection=SelectionConfig(steps=4, eval_every=2, max_valid=3),
        eval=EvalConfig(max_test=3, max_new_tokens=3),
    )
    names = ["lower", "lower2", "upper", "upper2"]
    rows = {}
    for batch in (1, 3):
        if batch == 3:  # every SITE row from fit_site_many: fitting one task alone is an error here
            monkeypatch.setattr("site_lens.methods.site.fit_site", lambda *a, **k: pytest.fail("fit one at a time"))
        out = tmp_path / f"b{batch}"
        got = bench.run_bench(model, names, ["zero_shot", "site"], [1], out, data_dir=data, cfg=cfg, task_batch=batch)
        rows[batch] = {(r["task"], r["method"]): r for r in got}
        assert all(t_path(out, n, 1).is_file() for n in names)
    assert rows[1].keys() == rows[3].keys() and len(rows[3]) == 8
    for key, one in rows[1].items():
        many = rows[3][key]
        for field in ("first_token_acc", "exact_match", "strict_match", "n_test", "n_trainable"):
            assert many[field] == one[field], (key, field)
        if key[1] == "site":
            info = [bench._read_json(bench.row_path(tmp_path / f"b{b}", key[0], 1, "site"))["info"] for b in (1, 3)]
            assert torch.allclose(torch.tensor(info[1]["theta"]), torch.tensor(info[0]["theta"]), atol=ATOL), key
            assert info[1]["best_step"] == info[0]["best_step"]
            assert not torch.equal(torch.tensor(info[1]["theta"]), torch.zeros(len(info[1]["theta"]), len(info[1]["theta"][0])))


def test_seeds_of_one_task_share_its_prefixes_and_match_their_own_fits(model, eight, monkeypatch):
    """Three seeds of one task in one loop (the same example lists): each seed's theta at every step is its own
    fit's, and each prompt's prefix is cached once however many seeds draw it."""
    from site_lens.stages import selection_batched

    _, ts, trains, valids = eight
    train, valid = trains[0], valids[0]
    seeds = [0, 1, 2]
    cached = []
    real = selection_batched.PromptCache

    def counting(model, examples, *a, **k):
        cached.append(len(examples))
        return real(model, examples, *a, **k)

    monkeypatch.setattr(selection_batched, "PromptCache", counting)
    cfg = SelectionConfig(steps=9, eval_every=3, max_valid=4, batch_size=2)
    trainer = BatchedAlphaTrainer(model, ts[:3], cfg, seed=7, seeds=seeds)
    steps = []
    hists = trainer.fit([train] * 3, [valid] * 3, progress=lambda step, losses: steps.append(trainer.theta.detach().clone()))
    single = []
    for t, seed in zip(ts[:3], seeds):
        one = single_fits(model, [t], [train], [valid], cfg=cfg, seed=seed)
        single += one
    check_equal(single, (steps, hists, trainer.theta.detach().clone()))
    # one training window (9 steps < cache_steps) holding the union of the three schedules' draws, and the
    # valid prompts once: not three copies
    from site_lens.stages.training import schedule

    drawn = [{i for b in schedule(len(train), 9, 2, s) for i in b} for s in seeds]
    assert sorted(cached) == sorted([len(set().union(*drawn)), min(4, len(valid))])
    assert len(set().union(*drawn)) < sum(len(d) for d in drawn)
    with pytest.raises(ValueError, match="2 seeds for 3"):
        BatchedAlphaTrainer(model, ts[:3], cfg, seeds=[0, 1])


def test_fit_site_many_over_seeds_matches_fit_site_per_seed(model, eight):
    from site_lens.methods.site import fit_site, fit_site_many

    task = eight[0][1]
    cfg = SiteConfig(embedding=EmbeddingConfig(n_prompts=3, n_shots=2), selection=CFG)
    fits = fit_site_many(model, [task, task], cfg, seeds=[5, 6])
    for seed, fit in zip((5, 6), fits):
        one = fit_site(model, task, SiteConfig(embedding=cfg.embedding, selection=CFG, seed=seed))
        assert fit.adapter.meta["seed"] == seed and fit.adapter.meta["trained_with"] == [f"{task.name}/seed5", f"{task.name}/seed6"]
        assert torch.allclose(fit.adapter.t, one.adapter.t, atol=1e-6)
        assert torch.allclose(fit.adapter.theta, one.adapter.theta, atol=ATOL)
        assert fit.history.best_step == one.history.best_step
    assert not torch.allclose(fits[0].adapter.theta, fits[1].adapter.theta, atol=1e-3)


def test_bench_fits_the_seeds_of_a_task_in_one_loop(model, tmp_path):
    """``task_batch=4`` over two tasks and two seeds: one loop holds both tasks' both seeds; every row's theta and
    scores are those of the one-at-a-time bench."""
    from small import write_task_dir

    from site_lens.config import EvalConfig
    from site_lens.experiments import bench
    from site_lens.experiments.sharding import together

    assert together(["a", "b", "c"], [0, 1], 4) == [[("a", 0), ("a", 1), ("b", 0), ("b", 1)], [("c", 0), ("c", 1)]]
    assert together(["a", "b"], [0, 1, 2], 2) == [[("a", 0), ("a", 1)], [("a", 2), ("b", 0)], [("b", 1), ("b", 2)]]
    data = write_task_dir(tmp_path / "data", names=("upper", "lower"))
    cfg = SiteConfig(
        embedding=EmbeddingConfig(n_prompts=2, n_shots=2),
        selection=SelectionConfig(steps=4, eval_every=2, max_valid=3),
        eval=EvalConfig(max_test=3, max_new_tokens=3),
    )
    rows = {}
    for batch in (1, 4):
        got = bench.run_bench(model, ["lower", "upper"], ["site"], [1, 2], tmp_path / f"b{batch}", data_dir=data, cfg=cfg, task_batch=batch)
        rows[batch] = {(r["task"], r["seed"]): r for r in got}
    assert rows[1].keys() == rows[4].keys() and len(rows[4]) == 4
    for key, one in rows[1].items():
        assert {f: rows[4][key][f] for f in ("first_token_acc", "exact_match", "strict_match")} == {
            f: one[f] for f in ("first_token_acc", "exact_match", "strict_match")
        }, key
        info = [bench._read_json(bench.row_path(tmp_path / f"b{b}", key[0], key[1], "site"))["info"] for b in (1, 4)]
        assert torch.allclose(torch.tensor(info[1]["theta"]), torch.tensor(info[0]["theta"]), atol=ATOL), key


def test_the_cache_window_is_the_whole_schedule_where_its_prefixes_fit(model, eight):
    from site_lens.stages.training import schedule

    _, ts, trains, _ = eight
    trainer = BatchedAlphaTrainer(model, ts[:2], SelectionConfig(steps=400), seeds=[0, 1])
    plans = [schedule(len(trains[0]), 400, 1, s) for s in (0, 1)]
    assert trainer._window(plans, [0, 0], [trains[0]] * 2) == 400  # a tiny model's prefixes: far under 3 GiB
    c = model.cfg
    per_token = c.n_layers * 2 * (getattr(c, "n_key_value_heads", None) or c.n_heads) * c.d_head * 4
    union = {i for p in plans for b in p for i in b}
    whole = sum(len(trains[0][i].tokens) - 1 for i in union) * per_token
    trainer.cache_bytes = whole  # exactly the whole schedule's union: still one window
    assert trainer._window(plans, [0, 0], [trains[0]] * 2) == 400
    trainer.cache_bytes = whole - 1
    assert trainer._window(plans, [0, 0], [trains[0]] * 2) in (200, 100, 50)
    trainer.cache_bytes = 0
    assert trainer._window(plans, [0, 0], [trains[0]] * 2) == 50


def test_zero_steps_and_no_seeds_are_empty_not_errors(model, eight):
    from site_lens.experiments.sharding import together

    _, ts, trains, valids = eight
    hists = BatchedAlphaTrainer(model, ts[:2], SelectionConfig(steps=0)).fit(trains[:2], valids[:2])
    assert [h.step for h in hists] == [[], []]
    assert together(["a"], [], 4) == [] and together(["a"], [0, 0], 4) == [[("a", 0)]]
