import json

import pytest
import torch

from site_lens.cli import main
from site_lens.io import Adapter, save_adapter
from site_lens.models import model_identity
from site_lens.report import analyse_runs, find_runs, summarise, write_figures


def _fake_runs(root, model, names=("antonym", "uppercase")):
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    for i, name in enumerate(names):
        g = torch.Generator().manual_seed(i)
        ad = Adapter(
            t=torch.randn(*shape, model.cfg.d_head, generator=g),
            theta=torch.randn(*shape, generator=g) * 3,
            model=model_identity(model),
        )
        d = root / "sub" / name
        save_adapter(ad, d / "adapter")
        hist = {"step": [1, 2], "loss": [2.0, 1.0], "valid_step": [2], "valid_loss": [1.2], "best_step": 2}
        res = {"task": name, "task_source": f"builtin:{name}", "model": "tiny", "history": hist}
        res.update({m: {"first_token_acc": 0.5} for m in ("zero_shot", "icl", "site")})
        (d / "results.json").write_text(json.dumps(res))
    (root / "not-a-run").mkdir()


def test_figures_command_writes_the_files_it_lists(tmp_path, model, capsys):
    _fake_runs(tmp_path / "runs", model)
    out = tmp_path / "figs"
    assert (
        main(["figures", "--runs", str(tmp_path / "runs"), "--out", str(out), "--tables", str(tmp_path / "tables")])
        == 0
    )
    text = capsys.readouterr().out
    listed = [line.strip() for line in text.split("files under")[1].splitlines()[1:] if line.strip()]
    assert listed and all((p := __import__("pathlib").Path(x)).is_file() and p.stat().st_size > 0 for x in listed)
    stems = {__import__("pathlib").Path(x).stem for x in listed}
    assert {"alpha_antonym", "training_uppercase", "alpha_histogram", "overlap_pearson", "overlap_jaccard"} <= stems
    assert any(x.endswith(".html") for x in listed)
    assert (tmp_path / "tables" / "tasks.csv").is_file()


def test_figures_without_runs_is_an_error(tmp_path, capsys):
    assert main(["figures", "--runs", str(tmp_path), "--out", str(tmp_path / "f")]) == 2
    assert "no run folders" in capsys.readouterr().err


def test_analyse_then_figures(tmp_path, model):
    _fake_runs(tmp_path / "runs", model)
    runs = find_runs(tmp_path / "runs")
    assert [r.name for r in runs] == ["antonym", "uppercase"]
    analyse_runs(model, runs, max_items=4, cie_prompts=2, draws=1, n_shots=2)
    assert all(r.patching is not None and r.cie is not None for r in runs)
    assert (tmp_path / "runs" / "sub" / "transfer.csv").is_file()
    tables = summarise(runs, {"antonym": "abstractive", "uppercase": "abstractive"})
    assert {"tasks", "patching", "overlap"} <= set(tables)
    stems = {p.stem for p in write_figures(runs, tmp_path / "f")}
    assert {"patching_antonym", "alpha_cie_uppercase", "patching_all"} <= stems


def test_categories_come_from_task_metadata_then_the_fv_lists(tmp_path):
    from site_lens.tasks import TaskError, category, load_task

    assert category("antonym") == "abstractive" and category("alphabetically_last_5") == "extractive"
    assert category("choose_middle_of_3") == "extractive" and category("word_length") == "abstractive"
    assert category("my_task") == "other"
    d = tmp_path / "antonym"
    d.mkdir()
    for split in ("train", "valid", "test"):
        (d / f"{split}.json").write_text('[{"input": "a", "output": "b"}]')
    assert category(load_task(d)) == "abstractive"  # no meta.json: the FV list
    (d / "meta.json").write_text('{"category": "lexical"}')
    assert category(load_task(d)) == "lexical"  # the task's own metadata wins
    (d / "meta.json").write_text('{"category": 3}')
    with pytest.raises(TaskError, match="category"):
        load_task(d)
