"""The bench: name checks, shards, resume, and surviving a SIGKILL mid-task."""

import csv
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from small import SMALL_EMBEDDING, bench_cmd, small_methods, write_task_dir

from site_lens.cli import main
from site_lens.config import ConfigError, EvalConfig, SiteConfig
from site_lens.experiments import bench, bench_report
from site_lens.tasks import category

SCORES = (
    "task",
    "category",
    "method",
    "seed",
    "first_token_acc",
    "exact_match",
    "strict_match",
    "n_trainable",
    "n_test",
)


@pytest.fixture
def data(tmp_path):
    return write_task_dir(tmp_path / "data")


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--methods", "site,nope", "unknown method(s) 'nope'; valid: zero_shot, icl, site"),
        ("--tasks", "upper,nope", "unknown task(s) 'nope'; valid: lower, upper"),
    ],
)
def test_unknown_names_are_one_line_errors(data, tmp_path, capsys, flag, value, message):
    assert main(["bench", "--data", str(data), "--out", str(tmp_path / "o"), flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("site-lens: error:") and message in err and len(err.splitlines()) == 1


def test_bad_shard(data, tmp_path, capsys):
    assert main(["bench", "--data", str(data), "--out", str(tmp_path / "o"), "--shard", "2/2"]) == 2
    assert "0 <= I < N" in capsys.readouterr().err


def test_shards_are_disjoint_and_cover():
    tasks = [f"t{i}" for i in range(7)]
    parts = [bench.shard(tasks, f"{i}/3") for i in range(3)]
    assert sorted(t for p in parts for t in p) == sorted(tasks)
    assert all(not set(a) & set(b) for a in parts for b in parts if a is not b)


def test_categories():
    assert category("antonym") == "abstractive"
    assert category("choose_first_of_5") == "extractive"
    assert category("upper") == "other"


def test_resume_skips_finished_rows_and_merge(data, tmp_path):
    from helpers import tiny

    model = tiny(n_ctx=256)
    out = tmp_path / "out"
    seen = []
    kw = {
        "methods": ["zero_shot", "ia3"],
        "seeds": [0],
        "data_dir": data,
        "cfg": SiteConfig(embedding=SMALL_EMBEDDING, eval=EvalConfig(max_test=2)),
        "factories": small_methods(),
        "report": seen.append,
    }
    rows = bench.run_bench(model, ["upper"], out=out, **kw)
    assert len(seen) == 2 and len(rows) == 2
    bench.run_bench(model, ["upper"], out=out, **kw)
    assert len(seen) == 2  # nothing re-run
    # a committed folder (rows.csv and bench.json, no row files) resumes too: its rows are not run again
    text = (out / "rows.csv").read_text()
    shutil.rmtree(out / "rows")
    bench.run_bench(model, ["upper"], out=out, **{**kw, "seeds": [0, 1]})
    assert [(r["method"], r["seed"]) for r in seen[2:]] == [("zero_shot", 1), ("ia3", 1)]
    after = (out / "rows.csv").read_text().splitlines()
    assert set(text.splitlines()) < set(after) and len(after) == 5
    # rows/ holding only what came later (a kept t, say) and one of the listed rows: the others are restored
    text = (out / "rows.csv").read_text()
    for f in (out / "rows").glob("upper/seed1/*.json"):
        f.unlink()
    (out / "rows" / "upper" / "seed1" / "t.safetensors").write_bytes(b"kept t")
    bench.run_bench(model, ["upper"], out=out, **{**kw, "seeds": [0, 1]})
    assert len(seen) == 4 and (out / "rows.csv").read_text() == text  # nothing run again, no row dropped
    assert (out / "rows" / "upper" / "seed1" / "t.safetensors").read_bytes() == b"kept t"
    assert not list(out.glob(".rows.restoring*"))
    shutil.rmtree(out / "rows")  # settings other than the folder's: its rows are run again
    other = {**kw, "cfg": SiteConfig(embedding=SMALL_EMBEDDING, eval=EvalConfig(max_test=3))}
    bench.run_bench(model, ["upper"], out=out, **other)
    assert len(seen) == 6
    # the folder now holds rows of two settings per method (seed 1 at max_test 2): none counts as finished
    shutil.rmtree(out / "rows")
    bench.run_bench(model, ["upper"], out=out, **{**other, "seeds": [0, 1]})
    assert len(seen) == 10
    # a bad line: a one-line error, no rows/ folder, rows.csv as it was
    shutil.rmtree(out / "rows")
    (out / "rows.csv").write_text((out / "rows.csv").read_text().replace(",0,", ",zero,", 1))
    text = (out / "rows.csv").read_text()
    with pytest.raises(ConfigError, match=r"rows.csv, line 2: not a bench row"):
        bench.run_bench(model, ["upper"], out=out, **kw)
    assert not (out / "rows").exists() and (out / "rows.csv").read_text() == text
    out = tmp_path / "out2"
    rows = bench.run_bench(model, ["upper"], out=out, **kw)
    # a second "shard" elsewhere, then merge both
    bench.run_bench(model, ["lower"], out=tmp_path / "shard1", **kw)
    merged = bench.merge([out, tmp_path / "shard1"], tmp_path / "merged")
    assert {(r["task"], r["method"]) for r in merged} == {
        (t, m) for t in ("upper", "lower") for m in ("zero_shot", "ia3")
    }
    md = (tmp_path / "merged" / "summary.md").read_text()
    assert "| ia3 |" in md and "| zero_shot |" in md
    summary = list(csv.DictReader((tmp_path / "merged" / "summary.csv").open()))
    assert [s["method"] for s in summary] == ["zero_shot", "ia3"] and all(s["n_tasks"] == "2" for s in summary)


def test_run_and_bench_give_the_same_rows(data, tmp_path):
    """``run`` and ``bench`` on one (task, seed) and settings: equal scores, predictions and fits."""
    from helpers import char_tokenizer, tiny

    from site_lens.config import SelectionConfig
    from site_lens.experiments.run import RUN_METHODS, run_task
    from site_lens.models.engines import HOOKED
    from site_lens.models.tiny import tiny_bridge
    from site_lens.tasks import load_task

    if HOOKED is None:  # TransformerLens 4: the bridge engine
        model = tiny_bridge("llama", char_tokenizer(), name="tiny", max_position_embeddings=256)
    else:
        model = tiny(n_ctx=256)
    cfg = SiteConfig(
        seed=1,
        embedding=SMALL_EMBEDDING,
        selection=SelectionConfig(steps=6, eval_every=3, max_valid=4),
        eval=EvalConfig(max_test=3, max_new_tokens=3),
    )
    results, adapter = run_task(model, load_task("upper", data_dir=data), cfg)
    rows = bench.run_bench(model, ["upper"], RUN_METHODS, [1], tmp_path / "out", data_dir=data, cfg=cfg)
    timing = ("fit_seconds", "eval_seconds", "ms_per_query", "seconds")
    untimed = lambda r: {k: untimed(v) if isinstance(v, dict) else v for k, v in r.items() if k not in timing}
    for m in RUN_METHODS:
        on_disk = json.loads(bench.row_path(tmp_path / "out", "upper", 1, m).read_text())
        assert set(on_disk) - {"spec", "computed_by"} == set(results[m])  # one record, one set of names
        assert untimed(results[m]) == untimed({k: on_disk[k] for k in results[m]})
    assert {r["method"]: (r["first_token_acc"], r["n_test"]) for r in rows} == {
        m: (results[m]["first_token_acc"], 3) for m in RUN_METHODS
    }
    assert results["site"]["info"]["best_step"] == adapter.meta["history"]["best_step"]
    assert results["icl"]["predictions"] != results["zero_shot"]["predictions"]  # the rows differ by method


def _row(task, method, em, category="abstractive"):
    return {
        "task": task,
        "category": category,
        "method": method,
        "seed": 0,
        "first_token_acc": em,
        "exact_match": em,
        "strict_match": em,
        "n_trainable": 0,
        "fit_seconds": 1.0,
        "ms_per_query": 1.0,
        "n_test": 2,
    }


def test_summary_averages_only_tasks_every_method_finished():
    rows = [_row("a", "zero_shot", 0.0), _row("a", "site", 0.5), _row("b", "zero_shot", 1.0)]  # site has not run b
    zs, site = bench_report.summarise(rows)
    assert (zs["method"], zs["n_tasks"], zs["n_tasks_run"], zs["exact_match"]) == ("zero_shot", 1, 2, 0.0)
    assert (site["method"], site["n_tasks"], site["n_tasks_run"], site["exact_match"]) == ("site", 1, 1, 0.5)
    md = bench_report.markdown(rows, bench_report.summarise(rows + [_row("c", "lora", 1.0)]))  # no task in common: dashes
    assert "| lora | 0 | 1 | - | - | - |" in md


def test_option_column_says_which_tasks_it_covers():
    rows = [{**_row("a", "site", 0.5), "option_acc": 0.75}, _row("b", "site", 1.0)]
    (site,) = bench_report.summarise(rows)
    assert site["option_acc"] == 0.75 and site["exact_match"] == 0.75
    md = bench_report.markdown(rows, [site])
    assert "| option % |" in md.splitlines()[0] and "tasks with options only (a)" in md
    assert "options only" not in bench_report.markdown(rows[:1], bench_report.summarise(rows[:1]))
    partial = [*rows, {**_row("c", "site", 0.0), "option_acc": 0.5}, _row("a", "lora", 1.0), _row("b", "lora", 1.0)]
    assert "tasks with options only (a)." in bench_report.markdown(partial, bench_report.summarise(partial))  # not c


def _scores(out: Path):
    return [{k: r[k] for k in SCORES} for r in csv.DictReader((out / "rows.csv").open())]


def _env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def test_sigkill_mid_task_then_resume_equals_uninterrupted(bench_reference, tmp_path):
    data, ref = bench_reference
    out = tmp_path / "out"
    proc = subprocess.Popen(bench_cmd(data, out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and not list(
        out.glob("rows/*/*/*.json")
    ):  # the first row of the first task is written
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rows = list(out.glob("rows/*/*/*.json"))
    assert 1 <= len(rows) < 8, "killed mid-task: some rows but not all"
    for p in rows:
        json.loads(p.read_text())  # every file is whole
    again = subprocess.run(bench_cmd(data, out), env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0, again.stderr
    assert list(out.rglob("*.tmp")) == []
    assert all(json.loads(p.read_text()) for p in out.rglob("*.json"))
    assert _scores(out) == _scores(ref)
    assert len(_scores(out)) == 8


def test_row_spec_keys_each_method_on_what_changes_its_numbers():
    from site_lens.config import EmbeddingConfig, EngineConfig, SelectionConfig

    default = SiteConfig(eval=EvalConfig(max_test=50))
    old = {"model": "m", "max_test": 50, "max_new_tokens": 20}  # the spec of rows made before settings were recorded
    assert all(bench.row_spec("m", default, m) == old for m in ("zero_shot", "icl", "site", "lora"))
    steps = SiteConfig(
        selection=SelectionConfig(steps=7), eval=EvalConfig(max_test=50, batch_size=3), engine=EngineConfig(backend="hooked")
    )
    assert bench.row_spec("m", steps, "site")["settings"] == {"selection.steps": 7}  # backend, batch sizes: no effect
    naive = SiteConfig(eval=EvalConfig(max_test=50), engine=EngineConfig(fast=False))
    assert bench.row_spec("m", naive, "site")["settings"] == {"selection.fast": False}  # whole prompts: kept apart
    assert bench.row_spec("m", naive, "icl") == old
    assert bench.row_spec("m", steps, "zero_shot") == old  # SITE's budget does not touch the other rows
    shots = SiteConfig(embedding=EmbeddingConfig(n_shots=3), eval=EvalConfig(max_test=50))
    assert bench.row_spec("m", shots, "icl")["settings"] == {"embedding.n_shots": 3}
    assert bench.row_spec("m", shots, "lora") == old
