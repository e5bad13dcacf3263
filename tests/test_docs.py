"""The code in README.md, docs/ and BENCHMARKS.md runs as written.

Python blocks are executed (in a temporary folder); a block whose first line says it
needs the Hugging Face hub or a data folder (and minutes of CPU) is only compiled. Shell blocks are checked without running
the heavy commands: every ``site-lens ...`` command must parse with the real argument
parser, every ``make`` target must exist, every script named must exist.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(lang: str) -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for i, m in enumerate(FENCE.finditer(doc.read_text())):
            if (m.group(1) or "bash") == lang:
                out.append((f"{doc.relative_to(ROOT)}#{i}", m.group(2)))
    return out


PY = blocks("python")
SHELL = blocks("bash")


def test_docs_have_code():
    assert len(PY) >= 3 and len(SHELL) >= 5
    assert _outputs(), "README's quickstart shows its output in a text block after the code"


OUTSIDE = re.compile(r"""(?:^|[\s=,'"(])((?:\.\./|~/|/(?!dev/null))[\w.-][^\s,'")]*)""")


@pytest.mark.parametrize("block", [b for _, b in SHELL + PY], ids=[i for i, _ in SHELL + PY])
def test_commands_name_no_path_outside_the_repository(block):
    """A reader has the repository and nothing else: no ../, ~/ or absolute paths in commands or code."""
    code = "\n".join(re.split(r"(?:^|\s)#", line)[0] for line in block.splitlines())  # comments are prose
    assert not OUTSIDE.findall(code), OUTSIDE.findall(code)


MACHINE = re.compile(r"\.\./shared/|/work/|/root/|/home/\w+/|/Users/\w+/")


def _texts() -> list[Path]:
    """Every markdown file and notebook a reader gets with the repository."""
    found = [*DOCS, *ROOT.glob("results/**/*.md"), *ROOT.glob("site_lens/**/*.md"), *ROOT.glob("notebooks/*.ipynb")]
    return sorted(set(found))


@pytest.mark.parametrize("path", _texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_text_names_a_machine_path(path):
    """No path of the machine the docs were written on, in prose, commands or a notebook's saved outputs."""
    text = path.read_text()
    if path.suffix == ".ipynb":  # sources and text outputs, not the images
        cells = json.loads(text)["cells"]
        text = "\n".join(
            "".join(c["source"]) + "".join("".join(o.get("text", "")) for o in c.get("outputs", [])) for c in cells
        )
    assert not MACHINE.findall(text), MACHINE.findall(text)


def _outputs() -> list[tuple[str, str, str]]:
    """(id, python code, printed output) for each python block followed at once by a ```text block."""
    out = []
    for doc in DOCS:
        ms = list(FENCE.finditer(doc.read_text()))
        text = doc.read_text()
        for i, (m, n) in enumerate(itertools.pairwise(ms)):
            gap = text[m.end() : n.start()]
            if m.group(1) == "python" and n.group(1) == "text" and not gap.strip():
                out.append((f"{doc.relative_to(ROOT)}#{i}", m.group(2), n.group(2)))
    return out


NUMBER = re.compile(r"-?\d+\.\d+")


@pytest.mark.slow
@pytest.mark.parametrize("code,shown", [(c, o) for _, c, o in _outputs()], ids=[i for i, _, _ in _outputs()])
def test_shown_output_is_what_the_code_prints(code, shown, tmp_path):
    """The text block after a python block is its output: the same words, numbers within 0.02.

    The block runs as a reader runs it: a script in a fresh interpreter (greedy generation of a
    4-bit model is sensitive to the last bits of its floating-point state).
    """
    script = tmp_path / "block.py"
    script.write_text(code)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = done.stdout
    assert NUMBER.sub("#", printed).split() == NUMBER.sub("#", shown).split(), printed
    for got, want in zip(NUMBER.findall(printed), NUMBER.findall(shown), strict=True):
        assert abs(float(got) - float(want)) <= 0.02 + 1e-9, (got, want, printed)


SHOWN = {c for _, c, _ in _outputs()}  # blocks run by test_shown_output_is_what_the_code_prints


def _slow(code: str) -> bool:
    return "load_model(" in code or "load_hf_model(" in code  # an embedded model: seconds to load


@pytest.mark.parametrize(
    "code",
    [pytest.param(c, id=i, marks=[pytest.mark.slow] if _slow(c) else []) for i, c in PY if c not in SHOWN],
)
def test_python_blocks_run(code, tmp_path, monkeypatch):
    first = code.splitlines()[0]
    monkeypatch.chdir(ROOT if "from the repository root" in first else tmp_path)  # else: a scratch folder
    if "needs the Hugging Face hub" in first or "needs a data folder" in first:
        compile(code, "<doc>", "exec")
        return
    exec(compile(code, "<doc>", "exec"), {"__name__": "__doc_block__"})  # noqa: S102 (the documented code is the test)


def _logical_lines(text: str) -> list[str]:
    return [line for line in text.replace("\\\n", " ").splitlines() if line.strip()]


def _commands(line: str, word: str) -> list[list[str]]:
    """Each ``word ...`` command in a shell line, up to a pipe, ';', '&&' or a comment."""
    out = []
    for m in re.finditer(rf"(?:^|[\s/]){re.escape(word)}\s(.*)", line):
        segment = re.split(r"\s+#|\||;|&&", m.group(1))[0]
        segment = segment.replace("[", "").replace("]", "")  # optional parts: check them too
        out.append(shlex.split(segment))
    return out


@pytest.mark.parametrize("block", [b for _, b in SHELL], ids=[i for i, _ in SHELL])
def test_shell_blocks_parse(block):
    from site_lens.cli import build_parser

    parser = build_parser()
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    for line in _logical_lines(block):
        line = re.split(r"(?:^|\s)#", line)[0]  # a comment is prose, not a command
        for argv in _commands(line, "site-lens"):
            if argv in (["--help"], ["--version"]):
                continue
            try:
                parser.parse_args(argv)
            except SystemExit as e:
                raise AssertionError(f"does not parse: site-lens {' '.join(argv)}") from e
        for argv in _commands(line, "make"):
            assert argv[0] in targets, f"no make target {argv[0]}"
        for script in re.findall(r"(?:benchmarks|scripts)/[\w./-]+\.py", line):
            assert (ROOT / script).is_file(), script


# README's paired differences in the order its text gives them: (model, difference, metric)
README_INTERVALS = [
    ("smollm2-135m", "site - icl", "exact_match"),
    ("gemma-3-270m", "site - icl", "exact_match"),
    ("gemma-3-270m", "site - i2cl", "exact_match"),
    ("smollm2-135m", "site - i2cl", "exact_match"),
    ("smollm2-135m", "site - icl", "strict_match"),
    ("gemma-3-270m", "site - icl", "strict_match"),
]


def test_readme_intervals_are_recomputed_from_the_committed_rows():
    """Each of README's paired differences (SITE minus ICL, minus I2CL: mean [low, high] in points) is what
    benchmarks/seed_table.py computes from the committed rows (results/MODEL/rows.csv for seed 0,
    results/seeds/MODEL/rows.csv for the further seeds), rounded as README prints it."""
    from site_lens.experiments.seed_report import paired_differences, read_rows

    script = (ROOT / "benchmarks" / "seed_table.py").read_text()
    (n_boot,) = re.findall(r'"--n-boot", type=int, default=([\d_]+)\)', script)  # the script's bootstrap size
    readme = " ".join((ROOT / "README.md").read_text().split())  # line breaks as spaces
    # "+16.7 points [11.6, 21.7]", "-4.1 [-8.0, -0.5]"
    quoted = re.findall(r"([+-]\d+\.\d)(?: points)? \[(-?\d+\.\d), (-?\d+\.\d)\]", readme)
    want = {}
    for model in dict.fromkeys(m for m, _, _ in README_INTERVALS):
        paths = [ROOT / "results" / model / "rows.csv", ROOT / "results" / "seeds" / model / "rows.csv"]
        rows = read_rows([p for p in paths if p.is_file()])
        diff = paired_differences(rows, "site", ["icl", "i2cl"], n_boot=int(n_boot))
        for r in diff.itertuples():
            want[model, r.difference, r.metric] = (f"{100 * r.mean:+.1f}", f"{100 * r.low:.1f}", f"{100 * r.high:.1f}")
    assert quoted == [want[k] for k in README_INTERVALS], list(zip(README_INTERVALS, quoted))
