import math
import random

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch

from site_lens.analysis import plots
from site_lens.analysis.overlap import jaccard, jaccard_matrix, pearson_matrix
from site_lens.analysis.plots import (
    alpha_cie_scatter,
    alpha_heatmap,
    alpha_histogram,
    benchmark_figure,
    jaccard_chance,
    overlap_heatmap,
    patching_curves,
    relative_transfer,
    save_figure,
    training_curve,
    transfer_heatmap,
)

TOTAL = 12  # heads in the fake model behind _sweep


def _sweep(tasks=("a", "b", "c"), draws=3):
    """A head_patching_sweep-shaped frame for several tasks: k = 1, 2, 4, 8 and all 12 heads."""
    rows = []
    for n, task in enumerate(tasks):
        base = [("zero_shot", 0, 0.0), ("all", TOTAL, 0.05 * n), ("site", TOTAL, 1.0)]
        rows += [{"task": task, "condition": c, "k": k, "draw": 0, "recovery_prob": v} for c, k, v in base]
        for cond, nd in (("top", 1), ("bottom", 1), ("random", draws)):
            for d in range(nd):
                for k in (1, 2, 4, 8, TOTAL):
                    v = k / 8 + 0.1 * d + 0.05 * n if cond == "top" else 0.01 * k + 0.1 * d + 0.02 * n
                    rows.append({"task": task, "condition": cond, "k": k, "draw": d, "recovery_prob": v})
    df = pd.DataFrame(rows)
    df["reference"] = "site"
    return df


def _rows():
    rng = random.Random(0)
    out = []
    for model in ("m1", "m2"):
        for i in range(6):
            cat = "abstractive" if i < 3 else "extractive"
            for method in ("lora", "site", "zero_shot", "icl", "fv"):
                for seed in (0, 1):
                    out.append({"model": model, "task": f"t{i}", "category": cat, "method": method, "seed": seed,
                                "exact_match": rng.random()})  # fmt: skip
    return pd.DataFrame(out)


def _alphas(n=4, shape=(3, 4)):
    g = torch.Generator().manual_seed(0)
    return {f"task{i}": torch.rand(*shape, generator=g) for i in range(n)}


def _all_figures() -> list[go.Figure]:
    al = _alphas()
    cats = {"task0": "abstractive", "task1": "extractive", "task2": "abstractive", "task3": "extractive"}
    tm = pd.DataFrame(np.random.default_rng(0).uniform(0.1, 0.9, (4, 4)), index=list(al), columns=list(al))
    hist = {"step": [1, 2, 3], "loss": [3.0, 2.0, 1.0], "valid_step": [3], "valid_loss": [1.5], "best_step": 3,
            "best_valid_loss": 1.5}  # fmt: skip
    return [
        alpha_heatmap(torch.rand(3, 4)),
        alpha_cie_scatter(torch.rand(2, 3), torch.randn(2, 3)),
        patching_curves(_sweep()),
        patching_curves(_sweep(tasks=("a",))),
        overlap_heatmap(pearson_matrix(al), categories=cats),
        overlap_heatmap(jaccard_matrix(al, 3), diverging=False, chance=jaccard_chance(3, 12)),
        transfer_heatmap(tm, categories=cats),
        training_curve(hist),
        alpha_histogram(al),
        alpha_histogram(torch.rand(2, 3)),
        benchmark_figure(_rows()),
        benchmark_figure(_rows(), by_category=True),
    ]


def _axis_titles(fig: go.Figure) -> list[str]:
    layout = fig.layout.to_plotly_json()
    titles = [v.get("title", {}).get("text") for k, v in layout.items() if k.startswith(("xaxis", "yaxis"))]
    for tr in fig.data:
        bar = getattr(tr, "colorbar", None) or getattr(getattr(tr, "marker", None), "colorbar", None)
        if bar is not None and bar.title.text:
            titles.append(bar.title.text)
    return [t for t in titles if t]


def test_every_figure_uses_the_house_template_and_worded_titles():
    for fig in _all_figures():
        assert fig.layout.template.layout.font.family == pio.templates[plots.THEME].layout.font.family
        assert fig.layout.template.layout.plot_bgcolor == "white"
        titles = _axis_titles(fig)
        assert titles and all("_" not in t for t in titles), titles


def test_every_heatmap_puts_the_first_row_at_the_top():
    heatmaps = [f for f in _all_figures() if any(isinstance(t, go.Heatmap) for t in f.data)]
    assert len(heatmaps) == 4
    assert all(f.layout.yaxis.autorange == "reversed" for f in heatmaps)


def test_alpha_heatmap_labels_and_scale():
    fig = alpha_heatmap(torch.rand(3, 4))
    hm = fig.data[0]
    assert hm.z.shape == (3, 4) and hm.text[2][1] == "L2H1" and list(hm.y) == [0, 1, 2]
    assert (hm.zmin, hm.zmax) == (0, 1) and hm.colorbar.title.text == "alpha (head weight)"
    narrow = alpha_heatmap(torch.full((3, 4), 0.2) + 0.1 * torch.rand(3, 4)).data[0]
    assert 0.15 <= narrow.zmin and narrow.zmax <= 0.35 and "fitted" in narrow.colorbar.title.text


def test_patching_curves_join_measured_k_only_and_keep_all_heads_apart():
    fig = patching_curves(_sweep())
    lines = {t.name: t for t in fig.data if t.mode == "lines+markers"}
    assert set(lines) == {"top-k by alpha", "bottom-k by alpha", "random k"}
    for t in lines.values():
        assert list(t.x) == [1, 2, 4, 8] and t.xaxis == "x"  # the measured k below every head, nothing in between
    (top,) = [t for t in fig.data if t.name == "top-k by alpha"]
    assert np.allclose(top.y, [k / 8 + 0.05 for k in (1, 2, 4, 8)])  # mean over the three tasks
    (all_heads,) = [t for t in fig.data if t.name == f"all {TOTAL} heads"]
    assert all_heads.xaxis == "x2" and np.isclose(all_heads.y[0], 0.05)  # its own panel, not the curve's end
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(bands) == 3 and all(list(b.x) == [1, 2, 4, 8, 8, 4, 2, 1] for b in bands)
    assert any(t.name == "min-max of 3 tasks" for t in fig.data)
    assert fig.layout.xaxis.title.text == "heads patched (k)"
    assert fig.layout.yaxis.title.text == "recovery of SITE's answer probability"
    refs = {s.name for s in fig.layout.shapes if s.showlegend}  # reference lines named in the legend
    assert refs == {"SITE (soft alpha)", "zero-shot"}


def test_patching_curves_one_task_bands_the_random_draws():
    fig = patching_curves(_sweep(tasks=("a",)).drop(columns="task"))
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(bands) == 1 and any(t.name == "min-max of 3 draws" for t in fig.data)


def test_alpha_cie_scatter_puts_small_effects_in_units():
    cie = torch.tensor([[8e-4, -3e-4, 1e-5], [0.0, 2e-4, 5e-4]])
    fig = alpha_cie_scatter(torch.rand(2, 3), cie)
    assert len(fig.data[0].x) == 6 and fig.data[0].text[4] == "L1H1"
    assert np.allclose(fig.data[0].y, (cie * 1e4).flatten()) and np.allclose(fig.data[0].customdata, cie.flatten())
    assert "×10⁻⁴" in fig.layout.yaxis.title.text and "Pearson r" in fig.layout.title.subtitle.text


def test_jaccard_chance_is_the_expected_overlap_of_random_sets():
    rng = random.Random(0)
    n, k = 30, 6
    mc = np.mean([jaccard(set(rng.sample(range(n), k)), set(rng.sample(range(n), k))) for _ in range(20000)])
    assert jaccard_chance(k, n) == pytest.approx(mc, abs=0.005)
    assert jaccard_chance(k, k) == 1.0 and jaccard_chance(1, 4) == pytest.approx(0.25)
    # near the plug-in E|A & B| / (2k - E|A & B|) = k / (2n - k), with E|A & B| = k^2 / n, and above it (Jensen)
    assert 20 / 520 < jaccard_chance(20, 270) < 1.1 * 20 / 520
    with pytest.raises(ValueError):
        jaccard_chance(5, 4)


def test_overlap_heatmap_fitted_diverging_grouped_and_diagonal_masked():
    al = _alphas()
    m = pearson_matrix(al)
    cats = {"task0": "extractive", "task1": "abstractive", "task2": "extractive", "task3": "abstractive"}
    fig = overlap_heatmap(m, categories=cats, colorbar_title="Pearson r")
    hm = fig.data[0]
    order = list(hm.x)
    assert [cats[n] for n in order] == ["abstractive"] * 2 + ["extractive"] * 2 and list(hm.y) == order
    off = m.loc[order, order].to_numpy()[~np.eye(4, dtype=bool)]
    assert hm.zmid == 0 and hm.zmax == -hm.zmin and np.abs(off).max() <= hm.zmax < np.abs(off).max() + 0.05
    assert hm.zmax < 1 and hm.colorscale[0][1].startswith("rgb")
    assert all(math.isnan(hm.z[i][i]) for i in range(4))
    assert {a.text for a in fig.layout.annotations} >= {"<b>abstractive</b>", "<b>extractive</b>"}
    assert len([s for s in fig.layout.shapes if s.type == "line"]) == 2  # one boundary, both ways
    # an explicit order is kept within each category
    fig = overlap_heatmap(m, ["task3", "task2", "task1", "task0"], categories=cats)
    assert list(fig.data[0].x) == ["task3", "task1", "task2", "task0"]


def test_overlap_heatmap_sequential_states_chance():
    al = _alphas()
    fig = overlap_heatmap(jaccard_matrix(al, 3), diverging=False, chance=0.12, colorbar_title="Jaccard")
    hm = fig.data[0]
    assert hm.zmid is None and hm.zmin == 0 and "chance 0.120" in hm.colorbar.title.text
    assert "chance" in hm.colorbar.ticktext and 0.12 in hm.colorbar.tickvals


def test_transfer_is_relative_to_each_tasks_own_alpha():
    names = ["a", "b", "c"]
    raw = pd.DataFrame([[0.5, 0.2, 0.0], [0.25, 0.4, 0.3], [0.1, 0.8, 0.6]], index=names, columns=names)
    rel = relative_transfer(raw)
    assert np.allclose(np.diag(rel), 1.0)
    assert rel.loc["c", "b"] == pytest.approx(2.0) and rel.loc["b", "a"] == pytest.approx(0.5)
    fig = transfer_heatmap(raw, categories={"a": "extractive", "b": "abstractive", "c": "abstractive"})
    hm = fig.data[0]
    order = list(hm.x)
    assert order == ["b", "c", "a"] and np.allclose(np.diag(np.asarray(hm.z, dtype=float)), 1.0)
    assert hm.zmin == 0 and hm.zmax >= 2.0 and hm.colorbar.title.text.startswith("accuracy relative to")
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [(r.x0, r.y0) for r in rects] == [(i - 0.5, i - 0.5) for i in range(3)]  # the diagonal, outlined


def test_training_curve_smooths_and_marks_the_kept_step():
    steps = list(range(1, 101))
    hist = {"step": steps, "loss": [5.0 / s + (s % 2) for s in steps], "valid_step": [50, 100],
            "valid_loss": [1.5, 1.2], "best_step": 100, "best_valid_loss": 1.2}  # fmt: skip
    fig = training_curve(hist)
    raw, smooth, valid, kept = fig.data
    assert len(raw.x) == len(smooth.x) == 100 and np.std(np.diff(smooth.y)) < np.std(np.diff(raw.y))
    assert list(valid.x) == [50, 100] and list(kept.x) == [100] and "kept" in kept.name
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert plots.ema([1.0, float("nan"), 3.0], 1.0) == [1.0, 1.0, 3.0]


def test_alpha_histogram_small_multiples_and_tensor():
    fig = alpha_histogram({"a": torch.rand(2, 3), "b": torch.rand(2, 3)})
    assert len(fig.data) == 2 and fig.data[0].xaxis == "x" and fig.data[1].xaxis == "x2"
    assert fig.layout.annotations[0].text.startswith("a<br>")
    cats = {"a": "abstractive", "b": "extractive", "c": "abstractive"}
    fig = alpha_histogram({n: torch.rand(2, 3) for n in "abc"}, categories=cats)
    assert [t.name for t in fig.data if t.showlegend] == ["abstractive", "extractive"]
    assert fig.data[0].marker.color == fig.data[2].marker.color != fig.data[1].marker.color
    fig = alpha_histogram(torch.rand(2, 3))
    assert len(fig.data) == 1 and len(fig.data[0].x) == 6


def test_benchmark_figure_orders_methods_and_marks_means():
    rows = _rows()
    fig = benchmark_figure(rows)
    assert list(fig.layout.xaxis.ticktext) == ["zero-shot", "10-shot ICL", "SITE", "FV", "LoRA"]
    means = [t for t in fig.data if t.name == "m1: mean"][0]
    want = rows[rows.model == "m1"].groupby(["method", "task"]).exact_match.mean().groupby("method").mean()
    assert np.allclose(means.y, [100 * want[m] for m in ("zero_shot", "icl", "site", "fv", "lora")])
    points = [t for t in fig.data if t.name == "m2: one task"][0]
    assert len(points.x) == 5 * 6  # one point per method and task, seeds averaged
    fig = benchmark_figure(rows, by_category=True)
    assert [a.text for a in fig.layout.annotations] == ["abstractive (3 tasks)", "extractive (3 tasks)"]


def test_save_figure_writes_html_without_a_png_exporter(tmp_path, monkeypatch):
    def no_exporter(*args, **kwargs):
        raise RuntimeError("no Chromium")

    monkeypatch.setattr(go.Figure, "write_image", no_exporter)
    written = save_figure(alpha_heatmap(torch.rand(2, 2)), tmp_path / "sub" / "fig")
    assert written == [tmp_path / "sub" / "fig.html"] and written[0].is_file()
    assert (tmp_path / "sub" / "plotly.min.js").is_file()  # the HTML's plotly.js, next to it


def test_claims_figures_draw_what_they_are_given():
    import numpy as np
    import pandas as pd

    from site_lens.analysis.plots.claims import method_intervals_figure, patching_contrast, seed_stability_figure

    iv = pd.DataFrame(
        [(m, met, 0.1 * i, 0.1 * i - 0.05, 0.1 * i + 0.02) for i, m in enumerate(["icl", "site"]) for met in
         ("exact_match", "strict_match")], columns=["method", "metric", "mean", "low", "high"])  # fmt: skip
    fig = method_intervals_figure({"A": iv, "B": iv})
    assert len(fig.data) == 4 and [t.name for t in fig.data[::2]] == ["A", "B"]
    site = fig.data[0]
    assert list(site.x) == pytest.approx([0.0, 10.0]) and list(site.error_x.arrayminus) == pytest.approx([5.0, 5.0])
    assert list(site.error_x.array) == pytest.approx([2.0, 2.0])
    rows = [(t, s, c, d, r) for t in "ab" for s in (0, 1) for c, r in (("top", 0.8), ("bottom", 0.1), ("random", 0.3))
            for d in range(2)] + [("a", 0, "site", 0, 1.0)]  # fmt: skip
    df = pd.DataFrame(rows, columns=["task", "seed", "condition", "draw", "recovery_acc"])
    fig = patching_contrast(df, k=27)
    points = {t.name: t for t in fig.data if t.mode == "markers"}
    assert set(points) == {"top-k by alpha", "random k", "bottom-k by alpha"}
    assert list(points["top-k by alpha"].y) == [0.8, 0.8] and list(points["bottom-k by alpha"].text) == ["a", "b"]
    means = [t.y[0] for t in fig.data if t.mode == "lines"]
    assert means == pytest.approx([0.8, 0.3, 0.1])
    stab = pd.DataFrame({"task": ["a", "b"], "jaccard": [0.5, 0.2], "spearman": [0.9, 0.1], "jaccard_chance": 0.05})
    fig = seed_stability_figure(stab)
    assert list(fig.data[0].y) == [0.5, 0.2] and list(fig.data[1].y) == [0.9, 0.1]
    assert any(np.isclose(s.y0, 0.05) for s in fig.layout.shapes)


def test_png_export_is_retried_once_after_it_has_worked(tmp_path, monkeypatch, caplog):
    """kaleido's page can fail once on a loaded machine: a failure after a success is retried, once."""
    from pathlib import Path

    from site_lens.analysis.plots import theme

    calls = []

    def flaky(self, path, **kw):
        calls.append(path)
        if len(calls) == 2:
            raise RuntimeError("{'description': 'ReferenceError: kaleido_scopes is not defined'" + " x" * 200 + "}")
        Path(path).write_bytes(b"png")

    monkeypatch.setattr(go.Figure, "write_image", flaky)
    monkeypatch.setattr(theme, "_PNG_WORKED", [])
    fig = go.Figure(go.Scatter(x=[1, 2], y=[1, 2]))
    assert [p.suffix for p in theme.save_figure(fig, tmp_path / "a")] == [".html", ".png"]
    assert [p.suffix for p in theme.save_figure(fig, tmp_path / "b")] == [".html", ".png"]  # failed, then retried
    assert len(calls) == 3 and not [r for r in caplog.records if "PNG" in r.getMessage()]

    def twice(self, path, **kw):
        raise RuntimeError("kaleido_scopes is not defined")

    monkeypatch.setattr(go.Figure, "write_image", twice)  # it worked before: retried, then said as what it is
    assert [p.suffix for p in theme.save_figure(fig, tmp_path / "d")] == [".html"]
    (record,) = [r for r in caplog.records if "PNG" in r.getMessage()]
    assert record.getMessage().startswith("PNG export of d failed twice") and "install" not in record.getMessage()
    caplog.clear()

    def broken(self, path, **kw):
        raise RuntimeError("{'description': 'no browser'" + " x" * 200 + "}")

    monkeypatch.setattr(go.Figure, "write_image", broken)
    monkeypatch.setattr(theme, "_PNG_WORKED", [])  # never worked here: no retry, one short warning
    assert [p.suffix for p in theme.save_figure(fig, tmp_path / "c")] == [".html"]
    (record,) = [r for r in caplog.records if "PNG" in r.getMessage()]
    assert "PNG export unavailable" in record.getMessage() and len(record.getMessage()) < 300
