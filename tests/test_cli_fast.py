"""The site-lens command starts without torch where it needs no model.

--help, --version, ``tasks``, every subcommand's --help and argument errors run in a fresh interpreter, as
``python -m site_lens ...`` does; the test fails if torch, TransformerLens or transformers got imported.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from site_lens.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformer_lens", "transformers")

# runs ``python -m site_lens ARGV`` once per ARGV in one interpreter; prints the exit codes and the heavy modules loaded
RUNNER = """
import contextlib, io, json, runpy, sys
argvs, heavy_roots = json.loads(sys.argv[1]), json.loads(sys.argv[2])
codes, outputs = [], []
for argv in argvs:
    sys.argv = ["site-lens", *argv]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_module("site_lens", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    codes.append(code)
    outputs.append(out.getvalue())
heavy = sorted(m for m in sys.modules if m.split(".")[0] in heavy_roots)
print(json.dumps({"codes": codes, "outputs": outputs, "heavy": heavy}))
"""


def _python(*args: str) -> subprocess.CompletedProcess:
    """A fresh interpreter in the repository root (so ``-m site_lens`` is this checkout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _run(argvs: list[list[str]]) -> dict:
    proc = _python("-c", RUNNER, json.dumps(argvs), json.dumps(HEAVY))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under ``parser``: ("run",), ("data", "fv"), ("atlas", "build"), ..."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((*prefix, name))
                found += _commands(sub, (*prefix, name))
    return found


def test_help_version_and_task_listings_load_no_torch(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "shout.json").write_text(json.dumps([{"input": f"w{i}", "output": f"W{i}"} for i in range(20)]))
    cases = {
        ("--help",): 0,
        ("--version",): 0,
        ("tasks",): 0,
        ("tasks", "--json"): 0,
        ("tasks", "--data", str(data)): 0,
        ("-v", "tasks", "--data", str(tmp_path / "missing")): 2,  # a one-line error, reported without torch
    }
    result = _run([list(argv) for argv in cases])
    assert result["heavy"] == []
    assert result["codes"] == list(cases.values()), result["outputs"]
    help_text, version, listing, listing_json, data_listing, missing = result["outputs"]
    assert "usage: site-lens" in help_text and version.startswith("site-lens ")
    assert "opposites" in listing and any(t["name"] == "opposites" for t in json.loads(listing_json))
    assert data_listing.startswith("shout ")
    assert missing.strip().endswith("site-lens: error: " + f"{tmp_path / 'missing'}: data folder not found")


def test_every_subcommands_help_loads_no_torch():
    commands = _commands(build_parser())
    assert {("run",), ("tasks",), ("bench",), ("data", "fv"), ("atlas", "build")} <= set(commands)
    result = _run([[*c, "--help"] for c in commands])
    assert result["heavy"] == []
    assert result["codes"] == [0] * len(commands), result["outputs"]
    assert all(out.startswith(f"usage: site-lens {' '.join(c)}") for c, out in zip(commands, result["outputs"]))


@pytest.mark.parametrize(
    "argv",
    [
        [],  # no command
        ["no-such-command"],
        ["run", "--no-such-flag"],
        ["run"],  # --task missing
        ["bench", "--seeds", "x"],
        ["predict", "--adapter", "a", "--engine", "nope"],
        ["analyse", "--runs", "r", "--max-test", "-3"],
        ["sparsify", "--tasks", "x", "--ks", "0,2"],
    ],
)
def test_argument_errors_load_no_torch(argv):
    result = _run([argv])
    assert result["heavy"] == []
    assert result["codes"] == [2] and "error:" in result["outputs"][0]


def test_python_m_site_lens_help_loads_no_torch():
    """The command as users start it, read from ``-X importtime`` (the interpreter's own list of imports)."""
    proc = _python("-X", "importtime", "-m", "site_lens", "--help")
    assert proc.returncode == 0 and "usage: site-lens" in proc.stdout
    imported = [line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "site_lens.cli" in imported
    assert [m for m in imported if m.split(".")[0] in HEAVY] == []


def test_public_api_still_complete():
    code = (
        "import site_lens as sl, sys; "
        "names = [n for n in sl.__all__ if getattr(sl, n, None) is None]; "
        "from site_lens import load_model, fit_site, Task, overlap; "
        "print(names, sl.engine.__name__, 'torch' in sys.modules)"
    )
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "site_lens.engine", "True"]


# a CUDA build of torch on a machine without a GPU, as far as torch.utils.cpp_extension can tell (imported after this)
CUDA_BUILD = """
import os, sys, torch
from site_lens.engine import kernels
torch.cuda._is_compiled = lambda: True
torch.cuda.is_available = lambda: False
torch.version.cuda = torch.version.cuda or "12.0"
os.environ["CUDA_HOME"] = sys.argv[1]
"""


@pytest.mark.parametrize("via_kernels", [False, True])
def test_no_cuda_runtime_notice_on_cpu(tmp_path, via_kernels):
    load = "print(kernels._cpp_extension().load.__name__)" if via_kernels else "import torch.utils.cpp_extension"
    proc = _python("-c", CUDA_BUILD + load, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    if via_kernels:
        assert proc.stdout.strip() == "load" and "No CUDA runtime" not in proc.stderr
    else:  # the notice itself, as torch writes it where the kernels do not silence it
        assert "No CUDA runtime is found" in proc.stderr


def test_kernels_import_cpp_extension_through_the_quiet_import(tmp_path, monkeypatch):
    monkeypatch.setenv("SITE_LENS_CACHE", str(tmp_path))  # no finished build there: load goes on to build
    monkeypatch.delenv("SITE_LENS_KERNELS", raising=False)
    code = (
        "from site_lens.engine import kernels\n"
        "calls = []\n"
        "def quiet():\n"
        "    calls.append(1)\n"
        "    raise RuntimeError('no build here')\n"
        "kernels._cpp_extension = quiet\n"
        "print(kernels.load(), calls)"
    )
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[-2:] == ["None [1]", ""] and "no build here" in proc.stderr
