"""The reference site (mkdocs.yml, ``make docs``) and the docstrings its API pages are made of.

``make test`` builds the site itself (``make docs``, strict); these checks are the fast part:
every public name has a docstring with an example, every example runs as written, and the site's
navigation holds every guide and notebook.
"""

from __future__ import annotations

import doctest
import inspect
import re
import sys
from pathlib import Path

import pytest

import site_lens

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = [n for n in site_lens.__all__ if not n.startswith("__")]


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_has_a_docstring(name):
    obj = getattr(site_lens, name)
    assert (inspect.getdoc(obj) or "").strip(), f"site_lens.{name} has no docstring"


def _examples(name: str) -> list[doctest.DocTest]:
    obj = getattr(site_lens, name)
    module = sys.modules[obj.__module__]
    finder = doctest.DocTestFinder(recurse=False)
    return [t for t in finder.find(obj, f"site_lens.{name}", module=module, globs=vars(module)) if t.examples]


WITH_EXAMPLES = [n for n in PUBLIC if _examples(n)]


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_has_an_example(name):
    """Every public name's docstring has an ``Example:`` with lines to run (doctest ``>>>``)."""
    assert name in WITH_EXAMPLES, f"site_lens.{name}'s docstring has no example (an Example: section with >>> lines)"


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the examples' mkdtemp folders go with the test

    tests = _examples(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0, f"an example of site_lens.{name} does not print what it shows"


def _nav_files() -> set[str]:
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") :]
    return set(re.findall(r"([\w./-]+\.(?:md|ipynb))\s*$", nav, re.MULTILINE))


def test_the_site_navigation_holds_every_guide_notebook_and_api_page():
    nav = _nav_files()
    guides = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    notebooks = {p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("*.ipynb")}
    missing = (guides | notebooks | {"index.md", "api/index.md"}) - nav
    assert not missing, f"mkdocs.yml's nav lacks {sorted(missing)}"
    assert "BENCHMARKS.md" in nav


def test_the_site_needs_no_network():
    """Material's Google Fonts are off, and the notebooks are rendered as saved, never run."""
    text = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^\s+font: false\b", text, re.MULTILINE)
    assert re.search(r"^\s+execute: false\b", text, re.MULTILINE)
