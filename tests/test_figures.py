import json
import math
import re
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch
from safetensors.torch import save_file

from site_lens.adapter import Adapter, save_adapter
from site_lens.analysis import plots
from site_lens.analysis.patching import k_sweep
from site_lens.cli import main
from site_lens.experiments.report import (
    CIE_FILE,
    PATCHING_FILE,
    TRANSFER_FILE,
    analyse_runs,
    find_runs,
    summarise,
    write_benchmark_figures,
    write_figures,
)
from site_lens.models import model_identity


@pytest.fixture(autouse=True)
def no_png_exporter(request, monkeypatch):
    """Figures are checked as HTML and as figure objects; only test_png_* tests export PNGs (if a Chromium is here)."""
    if request.node.name.startswith("test_png_"):
        return

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
    _fake_runs(tmp_path / "runs", model, names=("opposites", "uppercase"))  # built-in tasks: analyse loads them
    runs = find_runs(tmp_path / "runs")
    assert [r.name for r in runs] == ["opposites", "uppercase"]
    analyse_runs(model, runs, max_items=4, cie_prompts=2, draws=1, n_shots=2)
    assert all(r.patching is not None and r.cie is not None for r in runs)
    assert (tmp_path / "runs" / "sub" / "transfer.csv").is_file()
    tables = summarise(runs, {"opposites": "abstractive", "uppercase": "abstractive"})
    assert {"tasks", "patching", "overlap"} <= set(tables)
    stems = {p.stem for p in write_figures(runs, tmp_path / "f")}
    assert {"patching_opposites", "alpha_cie_uppercase", "patching_all"} <= stems


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
    assert any("of 2 tasks" in (t.name or "") for t in figures["patching_all"].data)
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
    assert list(fig.layout.xaxis.ticktext) == ["zero-shot", "10-shot ICL", "SITE", "FV", "(IA)³"]
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


# ---------------------------------------------------------------- print size, offline HTML, what each figure says

PRINTED_IN = {plots.COLUMN: 3.5, plots.FULL: 7.0}  # layout width (px) -> printed width (in): one column, the page
ROOT = Path(__file__).resolve().parents[1]
GEMMA_MINIMAL = ROOT / "results" / "minimal" / "gemma-3-270m"


def _font_sizes(obj, path: str = "") -> list[tuple[str, float]]:
    """(where, px) of every font size in a figure's JSON (traces, layout and its template) and in inline styles."""
    out = []
    if isinstance(obj, dict):
        for key, v in obj.items():
            if key == "size" and "font" in path.rsplit(".", 1)[-1] and isinstance(v, int | float):
                out.append((f"{path}.size", float(v)))
            else:
                out += _font_sizes(v, f"{path}.{key}")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            out += _font_sizes(v, f"{path}[{i}]")
    elif isinstance(obj, str):
        out += [(path, float(m)) for m in re.findall(r"font-size:\s*([\d.]+)px", obj)]
    return out


def _strings(obj) -> list[str]:
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list | tuple):
        return [s for v in obj for s in _strings(v)]
    return [obj] if isinstance(obj, str) else []


def _check_print_size(name: str, fig: go.Figure) -> None:
    """One of the two widths, and no text under 7 pt at its printed width (nor shrunk by <sup>, <sub>, <small>)."""
    width = fig.layout.width
    assert width in PRINTED_IN, (name, width)
    assert fig.layout.template.layout.font.size, name  # the size every text without its own inherits
    pt_per_px = PRINTED_IN[width] * 72 / width
    js = fig.to_plotly_json()
    sizes = _font_sizes(js)
    assert sizes, name
    small = [(where, px, round(px * pt_per_px, 2)) for where, px in sizes if px * pt_per_px < 7.0]
    assert not small, (name, small)
    shrunk = [s for s in _strings(js) if re.search(r"<(sup|sub|small)>", s)]
    assert not shrunk, (name, shrunk)


def test_every_figure_is_one_of_two_widths_with_no_text_under_7_pt(tmp_path, model, monkeypatch):
    _fake_runs(tmp_path / "runs", model)
    tm, _ = _fake_analyses(tmp_path / "runs", model)
    figures = _capture(monkeypatch)
    write_figures(find_runs(tmp_path / "runs"), tmp_path / "f", tm)
    write_benchmark_figures([_bench_dir(tmp_path / "b", "model-a")], tmp_path / "f")
    if GEMMA_MINIMAL.is_dir():
        from site_lens.experiments.minimal_report import write_minimal_figures

        write_minimal_figures(GEMMA_MINIMAL, tmp_path / "m")
    assert len(figures) > 10
    for name, fig in figures.items():
        _check_print_size(name, fig)
    assert {f.layout.width for f in figures.values()} == {plots.COLUMN, plots.FULL}
    # the rule itself: 150 px per printed inch, PNGs at 300 dpi, the smallest font 7.2 pt
    assert (plots.COLUMN, plots.FULL, plots.SCALE * 150) == (525, 1050, plots.DPI)
    assert plots.px_to_pt(15) == pytest.approx(7.2) and plots.pt_to_px(7.2) == pytest.approx(15)


def test_a_figure_with_small_text_fails_the_print_size_check():
    fig = plots.alpha_heatmap(torch.rand(2, 3))
    fig.add_annotation(text="tiny", x=0, y=0, font={"size": 12})  # 5.8 pt at 3.5 in
    with pytest.raises(AssertionError, match="annotations"):
        _check_print_size("heatmap", fig)
    with pytest.raises(AssertionError):
        _check_print_size("sup", plots.alpha_heatmap(torch.rand(2, 3), title="a<br><sup>note</sup>"))
    with pytest.raises(AssertionError):
        _check_print_size("width", plots.alpha_heatmap(torch.rand(2, 3)).update_layout(width=600))


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return struct.unpack(">II", head[16:24])


def test_png_width_is_the_printed_width_at_300_dpi(tmp_path):
    try:
        pio.to_image(go.Figure(), format="png", width=20, height=20)
    except Exception as e:  # no kaleido or no Chromium here
        pytest.skip(f"no PNG export here ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    column = plots.save_figure(plots.alpha_heatmap(torch.rand(4, 3)), tmp_path / "column")
    full = plots.save_figure(plots.alpha_histogram({f"t{i}": torch.rand(3, 4) for i in range(4)}), tmp_path / "full")
    for written, inches in ((column, 3.5), (full, 7.0)):
        (png,) = [p for p in written if p.suffix == ".png"]
        width, height = _png_size(png)
        assert width == round(inches * 300) and height > 0, (png.name, width)


def test_html_opens_offline_with_the_plotly_js_written_next_to_it(tmp_path):
    (html,) = plots.save_figure(plots.alpha_heatmap(torch.rand(2, 3)), tmp_path / "figs" / "a")
    plots.save_figure(plots.training_curve({"step": [1, 2], "loss": [2.0, 1.0]}), tmp_path / "figs" / "b")
    for page in (html, tmp_path / "figs" / "b.html"):
        text = page.read_text(encoding="utf-8")
        assert "cdn" not in text.lower(), page.name
        sources = re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", text)
        assert sources == ["plotly.min.js"], sources  # one local, relative script: plotly.js itself
    js = tmp_path / "figs" / "plotly.min.js"
    assert js.stat().st_size > 1_000_000 and js.read_text(encoding="utf-8").lstrip().startswith("/**")
    assert "plotly.js" in js.read_text(encoding="utf-8")[:400]


def test_figures_writes_into_runs_figures_by_default(tmp_path, model, monkeypatch, capsys):
    _fake_runs(tmp_path / "in", model)
    monkeypatch.chdir(tmp_path)
    assert main(["figures", "--runs", "in"]) == 0
    out = tmp_path / "runs" / "figures"
    assert (out / "alpha_antonym.html").is_file() and (out / "plotly.min.js").is_file()
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["figures", "--help"])
    assert "default: runs/figures" in " ".join(capsys.readouterr().out.split())
    assert "/runs/" in (ROOT / ".gitignore").read_text().split()  # not tracked by git


def test_make_figures_script_redraws_every_committed_figure_folder():
    script = (ROOT / "scripts" / "make_figures.sh").read_text()
    folders = sorted({p.parent.relative_to(ROOT / "figures") for p in (ROOT / "figures").rglob("*.png")})
    assert folders, "no committed figures"
    for folder in folders:
        target = '"$OUT"' if str(folder) == "." else f'"$OUT/{folder}"'
        assert f"draw {target} " in script, folder


def test_training_curve_clips_no_point_and_counts_zero_losses():
    rng = np.random.default_rng(0)
    loss = [float(v) for v in np.exp(rng.normal(0, 2.5, 300))] + [0.0, 0.0]  # 1e-3 .. 1e3, and two zeros
    hist = {"step": list(range(1, 303)), "loss": loss, "valid_step": [100, 200, 300], "valid_loss": [2.0, 1.5, 1.2],
            "best_step": 300, "best_valid_loss": 1.2}  # fmt: skip
    fig = plots.training_curve(hist)
    lo, hi = fig.layout.yaxis.range
    for t in fig.data:
        ys = [float(y) for y in t.y if y is not None and y > 0]
        assert all(lo <= math.log10(y) <= hi for y in ys), t.name
    (floor,) = [t for t in fig.data if "drawn on the axis" in t.name]
    assert list(floor.x) == [301, 302] and "2 batches" in floor.name and math.log10(floor.y[0]) == pytest.approx(lo)
    runs = sorted((ROOT / "results" / "head_specificity" / "runs").glob("*/results.json"))
    for path in runs:  # the committed runs: every single-batch loss on the axis
        history = json.loads(path.read_text())["history"]
        lo, hi = plots.training_curve(history).layout.yaxis.range
        assert all(lo <= math.log10(v) <= hi for v in history["loss"] if v > 0), path.parent.name


@pytest.mark.skipif(not GEMMA_MINIMAL.is_dir(), reason="no committed minimal-set results")
def test_minimal_figures_say_what_they_draw(tmp_path, monkeypatch):
    from site_lens.experiments.minimal_report import write_minimal_figures

    figures = _capture(monkeypatch)
    write_minimal_figures(GEMMA_MINIMAL, tmp_path)
    heads = {n: f for n, f in figures.items() if n.startswith("minimal_heads_")}
    assert heads
    for name, fig in heads.items():
        bar = fig.data[0].colorbar
        seeds = re.fullmatch(r"share of the (\d+) seeds keeping the head", bar.title.text.replace("<br>", " "))
        assert seeds, (name, bar.title.text)  # the cells: how many of the seeds' minimal sets hold the head
        n = int(seeds.group(1))
        assert list(bar.ticktext) == ["0", *(f"{i}/{n}" for i in range(1, n)), "1"], name
    assert figures["minimal_shared_alpha"].data[0].colorbar.title.text.startswith("alpha")
    fig = figures["minimal_k_recovery_em"]
    total = 18 * 4
    joined = [t for t in fig.data if "lines" in (t.mode or "") and t.fill is None]
    assert joined and all(total not in list(t.x) for t in joined)  # no curve runs into every head
    (every,) = [t for t in fig.data if t.name == f"all {total} heads"]
    assert every.mode == "markers" and list(every.x) == [total]
    sparse = {t.name: t.marker for t in fig.data if t.name and t.name.startswith("sparse SITE")}
    l0, l1 = sparse["sparse SITE (L0)"], sparse["sparse SITE (L1)"]
    assert l0.color != l1.color and l0.symbol != l1.symbol
    assert {l0.color, l1.color} <= set(plots.theme.COLORWAY)  # Okabe-Ito
    assert fig.layout.legend.yref == "container" and fig.layout.legend.y == 0  # under the axes, not on the data
    refs = {s.name for s in fig.layout.shapes if s.showlegend}
    assert refs == {"SITE (1)", "target (0.9)", "zero-shot (0)"}


def test_figures_and_analyse_take_an_adapter_folder(tmp_path, model, capsys):
    """An adapter folder (sl.save_adapter) is a run of its own: task, source and history from its meta."""
    import dataclasses

    from small import SMALL_EMBEDDING, SMALL_SITE

    from site_lens import fit_site, load_task

    folder = tmp_path / "opposites-adapter"
    cfg = dataclasses.replace(SMALL_SITE, embedding=dataclasses.replace(SMALL_EMBEDDING, n_shots=2))  # tiny context
    save_adapter(fit_site(model, load_task("opposites"), cfg).adapter, folder)
    (run,) = find_runs(folder)
    assert (run.name, run.path, run.results["task_source"]) == ("opposites", folder, "builtin:opposites")
    assert main(["figures", "--runs", str(folder), "--out", str(tmp_path / "f1")]) == 0
    stems = {Path(p).stem for p in (tmp_path / "f1").iterdir()}
    assert {"alpha_opposites", "training_opposites", "alpha_histogram"} <= stems
    analyse_runs(model, [run], max_items=4, cie_prompts=2, draws=1, n_shots=2)  # what `analyse --runs FOLDER` does
    assert (folder / PATCHING_FILE).is_file() and (folder / CIE_FILE).is_file()
    capsys.readouterr()
    assert main(["figures", "--runs", str(folder), "--out", str(tmp_path / "f2")]) == 0
    out = capsys.readouterr().out
    assert {"patching_opposites", "alpha_cie_opposites"} <= {Path(p).stem for p in (tmp_path / "f2").iterdir()}
    total = model.cfg.n_layers * model.cfg.n_heads
    table = out.split("[patching]")[1].split("\n\n")[0]
    ks = {int(line.split()[1]) for line in table.splitlines()[2:] if line.strip()}
    assert ks == set(k_sweep(total))  # every k measured, the largest included


def test_an_adapter_folder_of_a_run_is_the_run(tmp_path, model):
    _fake_runs(tmp_path / "runs", model)
    (run,) = find_runs(tmp_path / "runs" / "sub" / "uppercase" / "adapter")
    assert run.path == tmp_path / "runs" / "sub" / "uppercase" and run.results["model"] == "tiny"


def test_figures_refuse_what_is_neither_runs_nor_an_adapter_in_one_line(tmp_path, model, capsys):
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    ad = Adapter(t=torch.zeros(*shape, model.cfg.d_head), theta=torch.zeros(shape), model=model_identity(model))
    save_adapter(ad, tmp_path / "no-task")  # meta records no task
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "cfg.json").write_text("{")
    cases = {"no-task": "records no task", "broken": "missing from the adapter folder", "missing": "no such folder"}
    for name, message in cases.items():
        assert main(["figures", "--runs", str(tmp_path / name), "--out", str(tmp_path / "f")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("site-lens: error: ") and message in err and err.count("\n") == 1, err
    (tmp_path / "empty").mkdir()
    assert main(["figures", "--runs", str(tmp_path / "empty"), "--out", str(tmp_path / "f")]) == 2
    assert "no adapter folder" in capsys.readouterr().err


def test_analyse_loads_the_model_the_adapters_name(tmp_path, model, monkeypatch, capsys):
    """Without --model, analyse loads the model the runs' adapters were trained on; mixed models are one line."""
    from site_lens import models
    from site_lens.experiments import report

    _fake_runs(tmp_path / "runs", model)
    asked = []

    def fake_load(name, **kw):
        asked.append(name)
        return model

    monkeypatch.setattr(models, "load_model", fake_load)
    monkeypatch.setattr(report, "analyse_runs", lambda *a, **k: None)
    assert main(["analyse", "--runs", str(tmp_path / "runs")]) == 0
    assert asked == [model_identity(model)["name"]]
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    other = Adapter(t=torch.zeros(*shape, model.cfg.d_head), theta=torch.zeros(shape),
                    model={**model_identity(model), "name": "other"}, meta={"task": "uppercase"})  # fmt: skip
    save_adapter(other, tmp_path / "runs" / "other" / "adapter")
    (tmp_path / "runs" / "other" / "results.json").write_text(
        (tmp_path / "runs" / "sub" / "uppercase" / "results.json").read_text()
    )
    capsys.readouterr()
    assert main(["analyse", "--runs", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("site-lens: error: ") and f"other, {asked[0]}: choose one with --model" in err
    assert err.count("\n") == 1 and len(asked) == 1
