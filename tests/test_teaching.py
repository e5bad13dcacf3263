"""Notebook 03's exercises: solutions pass their checks, skeletons and wrong answers do not, the notebook runs.

Exercise cells are the code cells tagged ``exercise`` whose first line is
``# exercise: NAME``; ``notebooks/solutions/03_teaching_solutions.py`` has a
function of each NAME and ``site_lens.teaching`` a ``check_NAME``.
"""

from __future__ import annotations

import importlib.util
import inspect
import random
from pathlib import Path

import nbformat
import pytest
import torch

import site_lens as sl
from site_lens import teaching
from site_lens.tasks import sample_icl_prompts, zero_shot_prompts
from site_lens.tokens import encode, make_examples

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "03_teaching.ipynb"
SOLUTIONS = ROOT / "notebooks" / "solutions" / "03_teaching_solutions.py"
MARKER = "# exercise: "


def load_solutions():
    spec = importlib.util.spec_from_file_location("teaching_solutions", SOLUTIONS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exercise_cells(nb) -> dict[str, int]:
    """Exercise name -> index of its cell."""
    out = {}
    for i, cell in enumerate(nb.cells):
        first = cell.source.split("\n", 1)[0]
        if cell.cell_type == "code" and first.startswith(MARKER):
            assert "exercise" in cell.metadata.get("tags", []), f"cell {i} ({first}) is not tagged 'exercise'"
            out[first[len(MARKER) :].strip()] = i
    return out


def with_solutions(nb, solutions):
    """A copy of ``nb`` with each exercise cell's source replaced by its solution function."""
    nb = nbformat.from_dict(nb)
    for name, i in exercise_cells(nb).items():
        nb.cells[i].source = MARKER + name + "\n" + inspect.getsource(getattr(solutions, name))
        nb.cells[i].outputs = []
    return nb


def skeletons(nb, solutions) -> dict:
    """Exercise name -> the unfilled function, defined in the solutions module's namespace (its imports)."""
    out = {}
    for name, i in exercise_cells(nb).items():
        ns = dict(vars(solutions))
        exec(compile(nb.cells[i].source, f"<exercise {name}>", "exec"), ns)  # noqa: S102 (the notebook's own cell)
        out[name] = ns[name]
    return out


@pytest.fixture(scope="module")
def nb():
    return nbformat.read(NOTEBOOK, as_version=4)


@pytest.fixture(scope="module")
def solutions():
    return load_solutions()


@pytest.fixture(scope="module")
def tiny_setup(model):
    """The tiny model with the opposites task: inputs for every check."""
    task = sl.load_task("opposites")
    icl = encode(model, [p for p, _ in sample_icl_prompts(task.train, 3, 2, random.Random(0))])
    examples = make_examples(model, zero_shot_prompts(task.train[:4]))
    t = sl.build_task_embedding(model, icl)
    alpha = torch.rand(model.cfg.n_layers, model.cfg.n_heads, generator=torch.Generator().manual_seed(0))
    return dict(icl=icl, examples=examples, t=t, alpha=alpha)


def run_check(name, fn, model, s):
    """Call check_NAME on ``fn`` with the tiny inputs."""
    ex = s["examples"]
    prompts = [e.tokens for e in ex]
    calls = {
        "attn_out_from_z": lambda: teaching.check_attn_out_from_z(fn, model, torch.tensor([prompts[0]]), layer=1),
        "mean_hook_z": lambda: teaching.check_mean_hook_z(fn, model, s["icl"]),
        "gate_hook": lambda: teaching.check_gate_hook(fn, model.cfg.n_heads, model.cfg.d_head),
        "site_loss": lambda: teaching.check_site_loss(fn, model, s["t"], torch.tensor([prompts[0]]), ex[0].target),
        "train_theta": lambda: teaching.check_train_theta(fn, model, s["t"], ex, steps=3),
        "generate_with_injection": lambda: teaching.check_generate_with_injection(
            fn, model, prompts[:2], s["t"], s["alpha"], max_new_tokens=4
        ),
        "patch_heads": lambda: teaching.check_patch_heads(
            fn, model, prompts, [e.target for e in ex], s["t"], s["alpha"]
        ),
    }
    return calls[name]()


def test_exercises_checks_and_solutions_line_up(nb, solutions):
    assert list(exercise_cells(nb)) == list(teaching.EXERCISES)
    for name in teaching.EXERCISES:
        assert callable(getattr(solutions, name)), name
        assert callable(getattr(teaching, f"check_{name}")), name
        assert inspect.signature(teaching.reference(name)).parameters.keys() == (
            inspect.signature(getattr(solutions, name)).parameters.keys()
        ), name


def test_committed_notebook_has_skeletons_and_static_outputs(nb):
    for name, i in exercise_cells(nb).items():
        assert "raise NotImplementedError" in nb.cells[i].source, name
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    if outputs:  # saved executed: the figures as PNG
        assert sum("image/png" in o.get("data", {}) for o in outputs) >= 3
    assert not any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs)
    assert not any(o.get("output_type") == "error" for o in outputs)
    assert "/work/" not in nbformat.writes(nb) and "/home/" not in nbformat.writes(nb)


@pytest.mark.parametrize("name", teaching.EXERCISES)
def test_solution_passes_its_check(name, model, tiny_setup, solutions, monkeypatch, capsys):
    monkeypatch.setenv(teaching.STRICT_ENV, "1")
    assert run_check(name, getattr(solutions, name), model, tiny_setup) is True
    assert capsys.readouterr().out.startswith(f"PASS {name}:")


@pytest.mark.parametrize("name", teaching.EXERCISES)
def test_skeleton_fails_its_check_without_raising(name, model, tiny_setup, nb, solutions, monkeypatch, capsys):
    monkeypatch.delenv(teaching.STRICT_ENV, raising=False)
    assert run_check(name, skeletons(nb, solutions)[name], model, tiny_setup) is False
    assert capsys.readouterr().out.startswith(f"TODO {name}: not done yet")


def test_strict_mode_raises_on_a_skeleton(model, tiny_setup, nb, solutions, monkeypatch):
    monkeypatch.setenv(teaching.STRICT_ENV, "1")
    with pytest.raises(teaching.ExerciseFailed, match="TODO mean_hook_z"):
        run_check("mean_hook_z", skeletons(nb, solutions)["mean_hook_z"], model, tiny_setup)


def _gate_everywhere(z, hook, t_layer, alpha_layer):
    a = alpha_layer[:, None]
    return (1 - a) * z + a * t_layer


def _gate_in_place(z, hook, t_layer, alpha_layer):
    a = alpha_layer[:, None]
    z[:, -1] = (1 - a) * z[:, -1] + a * t_layer
    return z


def _gate_detached(z, hook, t_layer, alpha_layer):
    return _gate_everywhere(z, hook, t_layer, alpha_layer.detach()).where(
        torch.arange(z.shape[1])[None, :, None, None] == z.shape[1] - 1, z
    )


def _mean_first_token(model, prompts):
    from transformer_lens.utilities import get_act_name

    names = [get_act_name("z", layer) for layer in range(model.cfg.n_layers)]
    zs = []
    for ids in prompts:
        _, cache = model.run_with_cache(torch.tensor([ids]), names_filter=names)
        zs.append(torch.stack([cache[n][0, 0] for n in names]))
    return torch.stack(zs).mean(0)


def _leaves_hooks(model, tokens, t, alpha, max_new_tokens):
    model.add_hook("blocks.0.attn.hook_z", lambda z, hook: z)
    return [0] * max_new_tokens


@pytest.mark.parametrize(
    ("name", "wrong", "says"),
    [
        ("gate_hook", _gate_everywhere, "positions before the last one"),
        ("gate_hook", _gate_in_place, "in place"),
        ("gate_hook", _gate_detached, "no gradient"),
        ("mean_hook_z", _mean_first_token, "differs from the reference"),
        ("generate_with_injection", _leaves_hooks, "left hooks on the model"),
        ("attn_out_from_z", lambda z, W_O, b_O: torch.einsum("bphd,hdm->bpm", z, W_O), None),
        ("attn_out_from_z", lambda z, W_O, b_O: z.sum(2), "shape"),
    ],
)
def test_wrong_answers_fail_saying_what_differed(name, wrong, says, model, tiny_setup, monkeypatch, capsys):
    monkeypatch.delenv(teaching.STRICT_ENV, raising=False)
    b_O = model.blocks[1].attn.b_O
    saved = b_O.detach().clone()
    if says is None:  # the tiny model's b_O is zero: make the missing bias matter
        b_O.data.fill_(1.0)
        says = "differs from the reference"
    try:
        assert run_check(name, wrong, model, tiny_setup) is False
    finally:
        b_O.data.copy_(saved)
    out = capsys.readouterr().out
    assert out.startswith(f"FAIL {name}:") and says in out, out
    assert not teaching._hooks_left(model)


def test_fallback_and_reference():
    def mean_hook_z(model, prompts):
        raise NotImplementedError

    assert teaching.fallback(mean_hook_z, True) is mean_hook_z
    assert teaching.fallback(mean_hook_z, False) is teaching.reference("mean_hook_z")
    with pytest.raises(KeyError, match="no exercise"):
        teaching.reference("nope")


@pytest.mark.slow
def test_notebook_with_solutions_passes_every_check(nb, solutions, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv(teaching.STRICT_ENV, "1")
    monkeypatch.setenv("SITE_LENS_NB_SMALL", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    filled = with_solutions(nb, solutions)
    NotebookClient(
        filled, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    text = "".join(
        o.get("text", "") for c in filled.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "stream"
    )
    for name in teaching.EXERCISES:
        assert f"PASS {name}:" in text, name
    assert "FAIL " not in text and "TODO " not in text
