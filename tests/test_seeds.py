"""The bootstrap over tasks and seeds, and the seed tables built on it (no model)."""

import numpy as np
import pandas as pd
import pytest

from site_lens.experiments.seed_report import (
    markdown,
    method_intervals,
    paired_differences,
    read_rows,
    seed_spread,
)
from site_lens.stats import bootstrap_interval


def test_a_constant_has_no_interval():
    assert bootstrap_interval(np.full((10, 3), 0.4), n_boot=200) == pytest.approx((0.4, 0.4, 0.4))


def test_interval_over_many_tasks_matches_the_normal_approximation():
    rng = np.random.default_rng(1)
    v = rng.normal(0.3, 0.1, size=(400, 1))
    est, low, high = bootstrap_interval(v, n_boot=4000)
    half = 1.959964 * v.std(ddof=1) / np.sqrt(len(v))  # the textbook 95 % interval of a mean
    assert est == pytest.approx(v.mean())
    assert low < est < high
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)


def test_the_seeds_noise_is_counted_once():
    """Tasks that agree but seeds that scatter: the interval is the seeds' noise, not zero and not doubled."""
    rng = np.random.default_rng(2)
    v = 0.5 + rng.normal(0, 0.2, size=(30, 3))  # no task effect, all noise between seeds
    _, low, high = bootstrap_interval(v, n_boot=4000)
    expected = 2 * 1.96 * 0.2 / np.sqrt(v.size)  # every value independent: sd / sqrt(all values)
    assert high - low == pytest.approx(expected, rel=0.1)


def test_missing_seeds_weigh_each_task_the_same():
    v = np.array([[1.0, np.nan, np.nan], [0.0, 0.0, 0.0]])  # task 0 ran one seed, task 1 three
    est, low, high = bootstrap_interval(v, n_boot=2000)
    assert est == 0.5  # the mean of the two task means, not of the four values
    assert low == 0.0 and high == 1.0  # a draw of only task 0 (or only task 1) is possible
    assert bootstrap_interval(np.array([[np.nan, np.nan], [2.0, 4.0]]), n_boot=50)[0] == 3.0


def test_pairing_removes_the_task_effect():
    """A small, constant edge of method A over B hides under large task differences unless paired."""
    rng = np.random.default_rng(3)
    task = rng.normal(0.5, 0.2, size=(45, 1))
    a = task + 0.03 + rng.normal(0, 0.005, size=(45, 3))
    b = task + rng.normal(0, 0.005, size=(45, 3))
    est, low, high = bootstrap_interval(a - b, n_boot=4000)
    assert est == pytest.approx(0.03, abs=0.002)
    assert low > 0 and low < 0.03 < high and high - low < 0.01
    _, a_low, a_high = bootstrap_interval(a, n_boot=4000)
    assert a_high - a_low > 0.08  # unpaired, each method's own interval is wide


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="task, seed"):
        bootstrap_interval(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="no values"):
        bootstrap_interval(np.full((2, 2), np.nan))


def _rows(tmp_path, records, name="rows.csv"):
    df = pd.DataFrame(records, columns=["task", "method", "seed", "first_token_acc", "exact_match", "strict_match"])
    path = tmp_path / name
    df.to_csv(path, index=False)
    return path


def test_tables_pair_the_same_seeds(tmp_path):
    """SITE beats ICL by 0.1 on every (task, seed); I2CL ran seed 0 only, so its difference uses seed 0 only."""
    recs0, recs1 = [], []
    for i, task in enumerate(["a", "b", "c", "d"]):
        base = 0.2 * i
        for seed, out in ((0, recs0), (1, recs1), (2, recs1)):
            out.append((task, "icl", seed, 0, base + 0.01 * seed, base))
            out.append((task, "site", seed, 0, base + 0.1 + 0.01 * seed, base + 0.05))
        recs0.append((task, "i2cl", 0, 0, base + 0.3, base))
    rows = read_rows([_rows(tmp_path, recs0, "r0.csv"), _rows(tmp_path, recs1, "r1.csv")])
    iv = method_intervals(rows, ["icl", "site"], n_boot=500)
    site = iv[(iv.method == "site") & (iv.metric == "exact_match")].iloc[0]
    assert (site.n_tasks, site.n_rows, site.seeds) == (4, 12, "0,1,2")
    assert site["mean"] == pytest.approx(0.3 + 0.1 + 0.01)
    d = paired_differences(rows, "site", ["icl", "i2cl"], n_boot=500)
    vs_icl = d[(d.difference == "site - icl") & (d.metric == "exact_match")].iloc[0]
    assert vs_icl[["mean", "low", "high"]].tolist() == pytest.approx([0.1, 0.1, 0.1])
    assert (vs_icl.tasks_ahead, vs_icl.tasks_behind, vs_icl.n_rows) == (4, 0, 12)
    vs_i2cl = d[(d.difference == "site - i2cl") & (d.metric == "exact_match")].iloc[0]
    assert vs_i2cl.n_rows == 4 and vs_i2cl["mean"] == pytest.approx(-0.2)
    spread = seed_spread(rows, ["icl", "site"])
    assert len(spread) == 8 and spread["range"].to_numpy() == pytest.approx(0.02)
    text = markdown(iv, d, spread, "t")
    assert "| site | prefix match | 0,1,2 | 4 | 12 | 41.0 | [" in text and "| site - icl | prefix match |" in text


def test_rows_given_twice_must_agree(tmp_path):
    a = _rows(tmp_path, [("x", "site", 0, 0, 0.5, 0.4)], "a.csv")
    same = _rows(tmp_path, [("x", "site", 0, 0, 0.5, 0.4)], "b.csv")
    other = _rows(tmp_path, [("x", "site", 0, 0, 0.6, 0.4)], "c.csv")
    assert len(read_rows([a, same])) == 1
    with pytest.raises(ValueError, match="twice"):
        read_rows([a, other])
