"""MkDocs hooks for the reference site (``make docs``; named in mkdocs.yml).

The site is the repository as a reader browses it: README.md is the home page, docs/*.md the
guides, the notebooks are rendered with their saved outputs, and the files those pages link to
(BENCHMARKS.md, results/**/*.md, figures) are pages or assets at their repository paths. Links
are written for the repository (``docs/install.md`` from README, ``../BENCHMARKS.md`` from a
guide); each is rewritten to where its target is in the site. A link to something the site does
not hold (a folder) keeps its text and loses the link.

The public API page is a table of every name of ``site_lens.__all__``, each linked to its entry
on the page of the module that defines it (found by importing the package, so the table follows
the package whichever way ``__init__`` imports).
"""

from __future__ import annotations

import inspect
import json
import posixpath
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
MAX_ASSET = 5 * 2**20  # a linked file larger than this stays out of the site
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
CODE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
API_PAGE = "api/index.md"


def _site_path(repo_path: str) -> str:
    """Where a repository file is in the site."""
    if repo_path == "README.md":
        return "index.md"
    return repo_path.removeprefix("docs/")


def _repo_path(src_uri: str) -> str:
    """The repository file a page of the site comes from (the inverse of _site_path)."""
    if src_uri == "index.md":
        return "README.md"
    if (ROOT / "docs" / src_uri).is_file():
        return f"docs/{src_uri}"
    return src_uri


def _links(markdown: str):
    """(match, target without anchor) of each relative link outside code blocks."""
    prose = CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), markdown)  # same offsets, no code
    for m in LINK.finditer(prose):
        target = m.group(3).split("#")[0]
        if target and "://" not in target and not target.startswith(("mailto:", "/")):
            yield m, target


def _resolve(page_repo_path: str, target: str) -> str | None:
    """The repository path a link of a page names, if the repository has that file."""
    path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), target))
    if path.startswith("../") or not (ROOT / path).is_file():
        return None
    return path


def _add(files: Files, repo_path: str, config) -> bool:
    site = _site_path(repo_path)
    if files.get_file_from_path(site) is not None:
        return False
    if (ROOT / repo_path).stat().st_size > MAX_ASSET:
        return False
    if site == repo_path:  # a real file under src_dir, as mkdocs-jupyter needs for a notebook
        files.append(File(site, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    else:  # README.md as index.md
        files.append(File.generated(config, site, abs_src_path=str(ROOT / repo_path)))
    return True


def _api_page() -> str:
    """A table of every public name, linked to where the subpackage pages document it."""
    import site_lens

    out = [
        "# Public API",
        "",
        (
            "Every name that `import site_lens as sl` gives, linked to its documentation under the module"
            " that defines it; the pages below this one document each module in full. Each entry has an example"
            " that the test suite runs; those built on `sl.tiny_model` (a tiny random HookedTransformer) need"
            " TransformerLens 3.9 (`make venv`, or `pip install \".[tl3]\"`), the others run on either line."
        ),
        "",
        "| name | module | what it is |",
        "| --- | --- | --- |",
    ]
    for name in site_lens.__all__:
        obj = getattr(site_lens, name)
        module = getattr(obj, "__module__", None)
        if name.startswith("__") or not isinstance(module, str) or not module.startswith("site_lens"):
            continue
        doc = (inspect.getdoc(obj) or "").strip().split("\n\n")[0].replace("\n", " ").replace("|", "\\|")
        ref = f"{module}.{getattr(obj, '__qualname__', name)}"
        out.append(f"| [`{name}`][{ref}] | `{module}` | {doc} |")
    return "\n".join(out) + "\n"


@event_priority(100)  # before mkdocs-jupyter turns the notebooks into pages
def on_files(files: Files, config) -> Files:
    _add(files, "README.md", config)
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        _add(files, nb.relative_to(ROOT).as_posix(), config)
    files.append(File.generated(config, API_PAGE, content=_api_page()))
    todo = [f for f in files if f.src_uri.endswith(".md")]
    while todo:  # the files that the pages link to, and those that they link to
        f = todo.pop()
        if f.abs_src_path is None:
            continue
        page = _repo_path(f.src_uri)
        for _, target in _links(Path(f.abs_src_path).read_text()):
            found = _resolve(page, target)
            if found and _add(files, found, config) and found.endswith(".md"):
                todo.append(files.get_file_from_path(_site_path(found)))
    return files


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    page_repo = _repo_path(page.file.src_uri)
    here = posixpath.dirname(page.file.src_uri)
    edits = []
    for m, target in _links(markdown):
        found = _resolve(page_repo, target)
        anchor = m.group(3)[len(target) :]
        if found and files.get_file_from_path(_site_path(found)) is not None:
            new = posixpath.relpath(_site_path(found), here or ".") + anchor
            edits.append((m.span(), f"{m.group(1)}[{m.group(2)}]({new})"))
        elif (ROOT / posixpath.dirname(page_repo) / target).exists():  # a folder, a large file: the text stays
            edits.append((m.span(), "" if m.group(1) else m.group(2)))
    for (start, end), new in reversed(edits):
        markdown = markdown[:start] + new + markdown[end:]
    return markdown


def on_post_page(output: str, page, config) -> str:
    """A notebook page loads MathJax and mermaid from a CDN only if it has math or a diagram: the site works offline."""
    if not page.file.src_uri.endswith(".ipynb"):
        return output
    cells = json.loads(Path(page.file.abs_src_path).read_text())["cells"]
    prose = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    if not re.search(r"\$|\\\(|\\\[", prose):
        output = re.sub(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", "", output, flags=re.DOTALL)
    if 'class="jp-Mermaid' not in output:
        output = re.sub(r'<script type="module">(?:(?!</script>).)*?mermaid.*?</script>', "", output, flags=re.DOTALL)
    return output
