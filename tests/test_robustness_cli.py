"""Robustness of the command line (issue 6).

Every subcommand's --help works (found from the parser, so new subcommands are
covered); wrong arguments are usage errors (exit 2), bad values one-line
``site-lens: error: ...`` (exit 2), both before any model loads; failures
never exit 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from site_lens import cli
from site_lens.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def _subcommands() -> list[str]:
    parser = build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(subs) == 1
    return sorted(subs[0].choices)


@pytest.fixture(autouse=True)
def no_model_loading(monkeypatch, tmp_path):
    """Run in a scratch folder; any model load fails the test (errors must come first)."""
    import site_lens.models

    monkeypatch.chdir(tmp_path)

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the bad input was reported")

    monkeypatch.setattr(site_lens.models, "load_model", refuse)


def test_known_subcommands_are_found():
    assert {"run", "demo", "tasks"} <= set(_subcommands())


@pytest.mark.parametrize("cmd", [None, *_subcommands()])
def test_every_help_works(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main(([cmd] if cmd else []) + ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: site-lens{' ' + cmd if cmd else ''}")


@pytest.mark.parametrize("cmd", _subcommands())
def test_every_subcommand_rejects_an_unknown_option(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--no-such-option", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: site-lens" in err and ": error:" in err.splitlines()[-1] and "Traceback" not in err


USAGE_ERRORS = [
    [],  # no subcommand
    ["no-such-command"],
    ["run"],  # --task is required
    ["run", "--task"],  # option without its value
    ["run", "--task", "opposites", "--steps", "ten"],
    ["run", "--task", "opposites", "--seed", "1.5"],
    ["run", "--task", "opposites", "--lr", "fast"],
    ["run", "--task", "opposites", "--shots", ""],
    ["run", "--task", "opposites", "--max-test", "some"],
    ["bench", "--seeds", "0,x"],
    ["bench", "--seeds", ","],
    ["run", "--task", "opposites", "--tasks", "opposites"],  # demo's option on run
    ["run", "--task", "opposites", "--figures", "f"],
    ["run", "--task", "opposites", "extra-positional"],
    ["demo", "--task-list", "opposites"],
    ["demo", "--steps"],
    ["tasks", "--model", "smollm2-135m"],  # run's option on tasks
    ["tasks", "--task", "opposites"],
    ["tasks", "opposites"],
]


@pytest.mark.parametrize("argv", USAGE_ERRORS, ids=[" ".join(a) or "(none)" for a in USAGE_ERRORS])
def test_wrong_arguments_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: site-lens") and "site-lens" in err.splitlines()[-1] and "Traceback" not in err


def _blocker(tmp_path: Path) -> Path:
    f = tmp_path / "a-file"
    f.write_text("x")
    return f / "sub"


BAD_VALUES = [
    (["figures"], "nothing to draw"),
    (["demo", "--tasks", ","], "--tasks is empty"),
    (["demo", "--tasks", "antonym", "--data", "."], "unknown task 'antonym' in"),
    (["predict", "--adapter", "/no/such/adapter", "--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
    (["figures", "--bench", "/no/such/bench"], "no rows.csv"),
    (["analyse", "--runs", "/no/such/runs"], "/no/such/runs: no such folder"),
    (["predict", "--adapter", "/no/such/adapter"], "adapter folder not found"),
    (["run", "--task", "opposites", "--shots", "0"], "n_shots must be >= 1"),
    (["run", "--task", "opposites", "--prompts", "0"], "n_prompts must be >= 1"),
    (["run", "--task", "opposites", "--lr", "inf"], "finite number > 0"),
    (["run", "--task", "opposites", "--lr", "nan"], "finite number > 0"),
    (["run", "--task", "opposites", "--lr", "-0.1"], "finite number > 0"),
    (["run", "--task", "opposites", "--batch-size", "0"], "batch_size must be >= 1"),
    (["run", "--task", "opposites", "--max-test", "0"], "max_test must be >= 1"),
    (["run", "--task", "opposites", "--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
    (["analyse", "--runs", "/no/such/runs", "--max-test", "0"], "max_test and cie_prompts must be >= 1"),
    (["sparsify", "--tasks", "opposites", "--weights-l0", "0.1,0.01"], "weights_l0 must be numbers >= 0 in increasing"),
    (["sparsify", "--tasks", "opposites", "--ks", "0,2"], "ks must be positive integers"),
    (["run", "--task", "opposites", "--shots", "10000"], "10001 are needed"),
    (["run", "--task", ""], "unknown task ''"),
    (["run", "--task", "antonym", "--data", "."], "unknown task 'antonym' in"),
    (["run", "--task", "opposites", "--out", "{blocker}"], "not writable"),
    (["demo", "--out", "{blocker}"], "not writable"),
    (["demo", "--figures", "{blocker}"], "not writable"),
    (["demo", "--tasks", "opposites,no-such-task"], "unknown task 'no-such-task'"),
    (["demo", "--shots", "500"], "501 are needed"),
    (["demo", "--steps", "-3"], "steps must be >= 0"),
    (["tasks", "--data", "/no/such/folder"], "data folder not found"),
]


@pytest.mark.parametrize("argv, message", BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_bad_values_are_one_line_errors_before_any_work(argv, message, tmp_path, capsys):
    argv = [a.replace("{blocker}", str(_blocker(tmp_path))) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("site-lens: error:") and message in err and len(err.splitlines()) == 1, err


def test_bad_model_settings_fail_before_loading(monkeypatch, tmp_path, capsys):
    """--device / --dtype / --model mistakes are reported before minutes of loading."""
    import site_lens.models

    monkeypatch.undo()  # the real load_model, which must fail fast
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(site_lens.models.load, "_load_embedded", lambda *a, **k: pytest.fail("loaded"))
    cases = [
        (["--device", "nope"], "unknown device 'nope'"),
        (["--device", "cuda:7"], "device 'cuda:7' is not available"),
        (["--dtype", "float7"], "unknown dtype 'float7'"),
        (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    ]
    for extra, message in cases:
        assert main(["run", "--task", "opposites", "--out", "o", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("site-lens: error:") and message in err and len(err.splitlines()) == 1, err


def test_interrupt_exits_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_tasks", interrupted)
    assert main(["tasks"]) == 130
    assert capsys.readouterr().err.strip() == "site-lens: interrupted"


def _site_lens(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "site_lens", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)


def test_exit_codes_of_the_real_process(tmp_path):
    """As a process: 0 on success, 2 on bad input, 1 (with a traceback) on an internal failure."""
    ok = _site_lens("tasks")
    assert ok.returncode == 0 and "opposites" in ok.stdout
    bad = _site_lens("run", "--task", "no-such-task")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("site-lens: error: unknown task")
    usage = _site_lens()
    assert usage.returncode == 2 and "usage: site-lens" in usage.stderr
    crash = _site_lens(
        code="import sys, site_lens.cli as c\n"
        "def boom(args): raise RuntimeError('internal bug')\n"
        "c.cmd_tasks = boom\nsys.exit(c.main(['tasks']))"
    )
    assert crash.returncode == 1 and "RuntimeError: internal bug" in crash.stderr
