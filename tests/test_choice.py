"""Multiple-choice tasks: options and accepted answers in the task layout, option accuracy, scoring."""

import json

import pytest
import torch

from site_lens.gate import injection_hooks
from site_lens.metrics import score
from site_lens.stages.options import option_accuracy, option_logprobs
from site_lens.tasks import Choice, TaskError, load_task
from site_lens.tokens import answer_ids, encode


def _items(n, with_options=True):
    out = []
    for i in range(n):
        y = "(A)" if i % 2 else "(B)"
        item = {"input": f"pick {i}", "output": y}
        if with_options:
            item["options"] = ["(A)", "(B)"]
        if i == 0:
            item["answers"] = ["B"]
        out.append(item)
    return out


def _folder(tmp_path, items_by_split):
    d = tmp_path / "mc"
    d.mkdir()
    for s, items in items_by_split.items():
        (d / f"{s}.json").write_text(json.dumps(items))
    return d


def test_options_and_accepted_answers_load_with_their_items(tmp_path):
    task = load_task(_folder(tmp_path, {"train": _items(6), "valid": _items(3), "test": _items(4)}))
    (c0, c1) = task.split_choices("test")[:2]
    assert c0 == Choice(options=("(A)", "(B)"), answers=("(B)", "B"))
    assert c1.answers == ("(A)",)
    assert load_task("opposites").split_choices("test") is None
    # a single list keeps each item's choice with it through the 70/9/21 split
    f = tmp_path / "one.json"
    items = [{"input": f"x{i}", "output": str(i % 3), "options": ["0", "1", "2"]} for i in range(30)]
    f.write_text(json.dumps(items))
    t = load_task(f)
    for split in ("train", "valid", "test"):
        for (x, y), c in zip(t.split(split), t.split_choices(split)):
            assert c.options == ("0", "1", "2") and y in c.options and c.answers == (y,)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"options": ["(C)", "(D)"]}, "not one of its options"),
        ({"options": "(A)"}, "non-empty list"),
        ({"answers": [""]}, "non-empty list"),
        ({"options": ["(A)", "two\nlines"]}, "one-line strings"),
    ],
)
def test_bad_options_are_one_line_errors(tmp_path, patch, message):
    bad = _items(3)
    bad[1] = {**bad[1], **patch}
    d = _folder(tmp_path, {"train": _items(3), "valid": _items(3), "test": bad})
    with pytest.raises(TaskError, match=message) as e:
        load_task(d)
    assert "test.json: item 1" in str(e.value)


def test_exact_match_accepts_any_listed_answer():
    got = score(["three apples", "4", "(B)"], ["3", "four", "(A)"], accepted=[["3", "three"], ["four"], ["(A)"]])
    assert got["exact_match"] == pytest.approx(1 / 3) and got["strict_match"] == 0.0


def _manual(model, prompt, option, hooks=()):
    p = encode(model, [prompt])[0]
    c = answer_ids(model, prompt, option)
    logits = model.run_with_hooks(torch.tensor([p + c]), fwd_hooks=list(hooks))[0].log_softmax(-1)
    return float(sum(logits[len(p) - 1 + j, tok] for j, tok in enumerate(c)))


def test_option_logprobs_are_summed_teacher_forced_logprobs(model):
    prompts = ["Q: ab\nA:", "Q: c\nA:"]
    options = [["(A)", "(B)", "ba"], ["7", "c c"]]
    got = option_logprobs(model, prompts, options)
    want = [[_manual(model, p, o) for o in opts] for p, opts in zip(prompts, options)]
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=1e-4)
    # SITE's injection lands on the last prompt token only, not on the option tokens
    t = torch.randn(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
    alpha = torch.rand(model.cfg.n_layers, model.cfg.n_heads)
    got = option_logprobs(model, prompts, options, prefill=lambda last: injection_hooks(model, t, alpha, last))
    for p, opts, g in zip(prompts, options, got):
        pos = len(encode(model, [p])[0]) - 1
        assert g == pytest.approx([_manual(model, p, o, injection_hooks(model, t, alpha, pos)) for o in opts], abs=1e-4)


def test_option_logprobs_with_hooks_at_every_position(model):
    """Persistent hooks (LoRA, I2CL, (IA)3 act at every position) shape the cached prompt and the options alike."""
    prompts = ["Q: ab\nA:", "Q: c\nA:"]
    options = [["(A)", "(B)", "ba"], ["7", "c c"]]
    g = torch.Generator().manual_seed(1)
    scale = 1 + 0.5 * torch.rand(model.cfg.d_head, generator=g)
    shift = 0.5 * torch.randn(model.cfg.d_model, generator=g)
    hooks = [
        ("blocks.0.attn.hook_v", lambda v, hook: v * scale),  # cached with the prompt's keys and values
        ("blocks.1.hook_resid_pre", lambda r, hook: r + shift),
    ]
    want = [[_manual(model, p, o, hooks) for o in opts] for p, opts in zip(prompts, options)]
    got = option_logprobs(model, prompts, options, hooks=hooks)
    with model.hooks(fwd_hooks=hooks):  # attached to the model, as score_method attaches a method's
        attached = option_logprobs(model, prompts, options)
    for g_, a, w, plain in zip(got, attached, want, option_logprobs(model, prompts, options)):
        assert g_ == pytest.approx(w, abs=1e-4) and a == pytest.approx(w, abs=1e-4)
        assert g_ != pytest.approx(plain, abs=1e-2)  # the hooks change the scores


def test_option_accuracy_counts_ties_as_wrong():
    assert option_accuracy([[-1.0, -2.0], [-3.0, -1.0], [-1.0, -1.0]], [0, 0, 0]) == pytest.approx(1 / 3)


def test_score_method_reports_option_accuracy_on_multiple_choice_tasks(model, tmp_path):
    from site_lens.config import EvalConfig
    from site_lens.methods import ZeroShot, score_method

    task = load_task(_folder(tmp_path, {"train": _items(6), "valid": _items(3), "test": _items(4)}))
    res = score_method(model, ZeroShot(), task, 0, EvalConfig(max_new_tokens=3))
    prompts = [f"Q: {x}\nA:" for x, _ in task.test]
    lp = option_logprobs(model, prompts, [c.options for c in task.split_choices("test")])
    assert res["option_acc"] == option_accuracy(
        lp, [c.options.index(y) for (_, y), c in zip(task.test, task.split_choices("test"))]
    )
    plain = score_method(model, ZeroShot(), load_task("opposites"), 0, EvalConfig(max_new_tokens=2, max_test=3))
    assert plain["option_acc"] is None
