import json
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch
from safetensors.torch import save_file

from site_lens import plots
from site_lens.cli import main
from site_lens.io import Adapter, save_adapter
from site_lens.models import model_identity
from site_lens.patching import k_sweep
from site_lens.report import (
    CIE_FILE,
    PATCHING_FILE,
    TRANSFER_FILE,
    analyse_runs,
    find_runs,
    summarise,
    write_benchmark_figures,
    write_figures,
)


@pytest.fixture(autouse=True)
def no_png_exporter(monkeypatch):
    """Figures are checked as HTML and as figure objects; PNG export (a Chromium) is never needed here."""

    def unavailable(*args, **kwargs):
        raise RuntimeError("no Chromium in the tests")

    monkeypatch.setattr(go.Figure, "write_image", unavailable)


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


def _fake_analyses(root, model, names=("antonym", "uppercase")):
    """patching.csv and cie.safetensors in each fake run, transfer.csv at their root, as analyse_runs writes them."""
    total = model.cfg.n_layers * model.cfg.n_heads
    rng = np.random.default_rng(0)
    for i, name in enumerate(names):
        rows = [("zero_shot", 0, 0, 0.0), ("all", total, 0, 0.1), ("site", total, 0, 1.0)]
        for cond, draws in (("top", 1), ("bottom", 1), ("random", 3)):
            rows += [(cond, k, d, float(rng.uniform(0, k / total))) for d in range(draws) for k in k_sweep(total)]
        df = pd.DataFrame(rows, columns=["condition", "k", "draw", "recovery_prob"])
        df["recovery_acc"], df["acc"], df["prob"], df["reference"] = df.recovery_prob, 0.5, 0.5, "site"
        df.to_csv(root / "sub" / name / PATCHING_FILE, index=False)  # no task column: report adds it
        save_file({"cie": torch.randn(model.cfg.n_layers, model.cfg.n_heads)}, str(root / "sub" / name / CIE_FILE))
    tm = pd.DataFrame(rng.uniform(0.2, 0.8, (len(names), len(names))), index=list(names), columns=list(names))
    tm.to_csv(root / "sub" / TRANSFER_FILE)
    return tm, total


def _capture(monkeypatch):
    figures = {}
    save = plots.save_figure

    def recording(fig, stem):
        figures[Path(stem).name] = fig
        return save(fig, stem)

    monkeypatch.setattr(plots, "save_figure", recording)
    return figures


def _axis_titles(fig):
    layout = fig.layout.to_plotly_json()
    titles = [v.get("title", {}).get("text") for k, v in layout.items() if k.startswith(("xaxis", "yaxis"))]
    titles += [t.colorbar.title.text for t in fig.data if isinstance(t, go.Heatmap)]
    return [t for t in titles if t]


def test_write_figures_draws_every_analysis_in_the_house_style(tmp_path, model, monkeypatch):
    _fake_runs(tmp_path / "runs", model)
    tm, total = _fake_analyses(tmp_path / "runs", model)
    figures = _capture(monkeypatch)
    written = write_figures(find_runs(tmp_path / "runs"), tmp_path / "f", tm)
    assert all(p.suffix == ".html" and p.is_file() for p in written)
    stems = {p.stem for p in written}
    for kind in ("alpha", "training", "patching", "alpha_cie"):
        assert {f"{kind}_antonym", f"{kind}_uppercase"} <= stems
    assert {"alpha_histogram", "patching_all", "overlap_pearson", "overlap_spearman", "overlap_jaccard"} <= stems
    assert "transfer" in stems and set(figures) == stems
    for name, fig in figures.items():
        assert fig.layout.template.layout.plot_bgcolor == "white", name  # the house template
        titles = _axis_titles(fig)
        assert titles and not any("_" in t for t in titles), (name, titles)
        if any(isinstance(t, go.Heatmap) for t in fig.data):
            assert fig.layout.yaxis.autorange == "reversed", name  # layer 0 / the first task at the top
    measured = [k for k in k_sweep(total) if k < total]
    curves = [t for t in figures["patching_all"].data if t.mode == "lines+markers"]
    assert len(curves) == 3 and all(list(t.x) == measured for t in curves)
    assert any("over 2 tasks" in (t.name or "") for t in figures["patching_all"].data)
    jac = figures["overlap_jaccard"].data[0].colorbar.title.text
    assert f"chance {plots.jaccard_chance(min(20, total), total):.3f}" in jac
    z = np.asarray(figures["transfer"].data[0].z, dtype=float)
    assert np.allclose(np.diag(z), 1.0)


def _bench_dir(path, model, seed=0, meta=True):
    rng = np.random.default_rng(seed)
    rows = [
        {"task": t, "category": c, "method": m, "seed": 0, "first_token_acc": v, "exact_match": v, "strict_match": v,
         "n_trainable": 0, "fit_seconds": 0.0, "ms_per_query": 1.0, "n_test": 50}
        for t, c in (("antonym", "abstractive"), ("choose_first_of_3", "extractive"), ("capitalize", "abstractive"))
        for m, v in zip(("zero_shot", "icl", "site", "fv", "ia3"), rng.uniform(0, 1, 5))
    ]  # fmt: skip
    path.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(path / "rows.csv", index=False)
    if meta:
        (path / "bench.json").write_text(json.dumps({"model": model, "methods": []}))
    return path


def test_write_benchmark_figures(tmp_path, monkeypatch):
    dirs = [_bench_dir(tmp_path / "a", "model-a"), _bench_dir(tmp_path / "model-b", "ignored", 1, meta=False)]
    figures = _capture(monkeypatch)
    written = write_benchmark_figures(dirs, tmp_path / "f")
    assert [p.name for p in written] == ["benchmark_exact_match.html", "benchmark_exact_match_by_category.html"]
    fig = figures["benchmark_exact_match"]
    assert {t.legendgroup for t in fig.data} == {"model-a", "model-b"}  # bench.json's model, else the folder
    assert list(fig.layout.xaxis.ticktext) == ["zero-shot", "10-shot ICL", "SITE", "FV", "(IA)<sup>3</sup>"]
    panels = [a.text for a in figures["benchmark_exact_match_by_category"].layout.annotations]
    assert panels == ["abstractive (2 tasks)", "extractive (1 task)"]


def test_figures_finds_the_transfer_table_analyse_wrote_next_to_the_runs(tmp_path, model, capsys):
    """analyse writes transfer.csv into the runs' common folder (here runs/sub), not necessarily --runs itself."""
    _fake_runs(tmp_path / "runs", model)
    names = ["antonym", "uppercase"]
    pd.DataFrame([[0.5, 0.2], [0.1, 0.4]], index=pd.Index(names, name="alpha_from"), columns=names).to_csv(
        tmp_path / "runs" / "sub" / TRANSFER_FILE
    )
    out = tmp_path / "figs"
    assert main(["figures", "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert (out / "transfer.html").is_file()


def test_figures_checks_bench_folders_before_drawing(tmp_path, model, capsys):
    _fake_runs(tmp_path / "runs", model)
    out = tmp_path / "figs"
    argv = ["figures", "--runs", str(tmp_path / "runs"), "--bench", str(tmp_path / "typo"), "--out", str(out)]
    assert main(argv) == 2
    assert "no rows.csv" in capsys.readouterr().err
    assert not out.exists()  # nothing drawn half-way
