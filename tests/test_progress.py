"""Progress of long commands: one line per finished unit without a terminal; the kernels' build folder per torch build."""

import io
import logging
import re
import subprocess
from types import SimpleNamespace

import pytest
from small import SMALL_EMBEDDING, bench_cmd, small_methods, write_task_dir

from site_lens import progress
from site_lens.config import EvalConfig, SiteConfig
from site_lens.progress import Progress, shown

ROW = re.compile(r"^\[(\d+)/(\d+)\] (\S+) seed (\d+) (\S+): prefix \d\.\d\d strict \d\.\d\d \(\d")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_lines_without_a_terminal_nested_indented_skipped_counted(capsys, monkeypatch):
    clock = iter(range(0, 10**6, 10))  # 10 s between two looks at the clock
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    with shown(io.StringIO()), Progress(3, "outer") as outer:
        outer.skip()
        with Progress(2, "inner") as inner:
            inner.done("a")
            inner.done("b")
        outer.done("c")
        with Progress(10, "steps", every=5) as steps:
            for i in range(10):
                steps.done(f"step {i + 1}")
        with Progress(4, "bar only", every=0) as quiet:
            quiet.done("x")
    err = capsys.readouterr().err.splitlines()
    assert [re.sub(r" \(.*\)$", "", line) for line in err] == [
        "  [1/2] a", "  [2/2] b", "[2/3] c", "  [5/10] step 5", "  [10/10] step 10",
    ]  # fmt: skip
    assert err[0].endswith("(10 s, about 10 s left)") and err[1].endswith("(10 s)")  # time left while units remain
    assert progress._state["mode"] is None and not len(progress._open)


def test_a_bar_on_a_terminal_and_log_records_in_the_library(caplog, capsys):
    with shown(Terminal()), Progress(2, "work") as p:
        assert p._bar is not None
        p.done("a")
    assert "[1/2] a" not in capsys.readouterr().err  # a bar, not lines
    with caplog.at_level(logging.INFO, logger="site_lens.progress"), Progress(1, "work") as p:
        p.done("a")
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["[1/1] a"]
    assert progress.duration(41.2) == "41 s" and progress.duration(192) == "3 min 12 s"
    assert progress.duration(3900) == "1 h 05 min"


def test_bench_logs_one_line_per_row_and_none_for_finished_rows(tmp_path, caplog):
    from helpers import char_tokenizer, tiny

    from site_lens.experiments import bench
    from site_lens.models.engines import HOOKED
    from site_lens.models.tiny import tiny_bridge

    data = write_task_dir(tmp_path / "data")
    kw = {
        "methods": ["zero_shot", "ia3"],
        "seeds": [0],
        "data_dir": data,
        "cfg": SiteConfig(embedding=SMALL_EMBEDDING, eval=EvalConfig(max_test=2)),
        "factories": small_methods(),
    }
    if HOOKED is None:  # TransformerLens 4: the bridge engine
        model = tiny_bridge("llama", char_tokenizer(), name="tiny", max_position_embeddings=256)
    else:
        model = tiny(n_ctx=256)
    with caplog.at_level(logging.INFO, logger="site_lens.progress"):
        bench.run_bench(model, ["lower", "upper"], out=tmp_path / "out", **kw)
        lines = [r.getMessage() for r in caplog.records if r.name == "site_lens.progress"]
        assert [ROW.match(line).groups() for line in lines] == [
            ("1", "4", "lower", "0", "zero_shot"), ("2", "4", "lower", "0", "ia3"),
            ("3", "4", "upper", "0", "zero_shot"), ("4", "4", "upper", "0", "ia3"),
        ]  # fmt: skip
        caplog.clear()
        bench.run_bench(model, ["lower", "upper"], out=tmp_path / "out", **kw)  # all rows finished: no lines
        assert not [r for r in caplog.records if r.name == "site_lens.progress"]


def test_bench_command_writes_a_progress_line_per_row_to_stderr(tmp_path):
    """The command line, stderr not a terminal: one line per row on stderr, the table lines on stdout."""
    cmd = bench_cmd(write_task_dir(tmp_path / "data"), tmp_path / "out")
    cmd[cmd.index("--methods") + 1] = "zero_shot,ia3"
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = [ROW.match(line) for line in done.stderr.splitlines() if ROW.match(line)]
    assert [(m[1], m[2], m[3], m[5]) for m in rows] == [
        ("1", "4", "lower", "zero_shot"), ("2", "4", "lower", "ia3"),
        ("3", "4", "upper", "zero_shot"), ("4", "4", "upper", "ia3"),
    ]  # fmt: skip
    assert "first-tok" in done.stdout and "[1/4]" not in done.stdout


def test_analyse_logs_each_analysis(tmp_path, model, caplog):
    from test_figures import _fake_runs

    from site_lens.experiments.report import analyse_runs, find_runs

    _fake_runs(tmp_path / "runs", model, names=("opposites", "uppercase"))
    runs = find_runs(tmp_path / "runs")
    with caplog.at_level(logging.INFO, logger="site_lens.progress"):
        analyse_runs(model, runs, max_items=4, cie_prompts=2, draws=1, n_shots=2)
    lines = [r.getMessage().split(" (")[0] for r in caplog.records if r.name == "site_lens.progress"]
    assert [re.sub(r", \d+ head sets| over \d+ heads", "", line) for line in lines] == [
        "[1/5] opposites: patching", "[2/5] opposites: CIE", "[3/5] uppercase: patching", "[4/5] uppercase: CIE",
        "[5/5] transfer between 2 runs",
    ]  # fmt: skip


def test_kernel_build_folder_is_per_torch_build(monkeypatch, tmp_path):
    import torch

    from site_lens.engine import kernels

    monkeypatch.setenv("SITE_LENS_CACHE", str(tmp_path))
    here = kernels.build_dir()
    assert here.parent == tmp_path / "ext" and f"torch{torch.__version__}" in here.name
    monkeypatch.setattr(torch, "__version__", "9.9.9+other")
    there = kernels.build_dir()
    assert there != here and there.name.startswith("kernels-torch9.9.9+other-py")
    assert kernels.build_dir() == there  # the same torch build: the same folder
    monkeypatch.setattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", not torch._C._GLIBCXX_USE_CXX11_ABI)
    assert kernels.build_dir() != there  # another C++ ABI


@pytest.mark.skipif(not __import__("site_lens.engine.kernels").engine.kernels.available(), reason="no C++ compiler")
def test_a_finished_build_loads_without_compiling(monkeypatch):
    from torch.utils import cpp_extension

    from site_lens.engine import kernels

    monkeypatch.setitem(kernels._state, "tried", False)
    monkeypatch.setitem(kernels._state, "ext", None)

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    assert kernels.load() is not None
