"""The 45 function-vector (FV) tasks with the SITE paper's train / valid / test splits.

``site-lens data fv --out data/fv`` (``build_fv``) downloads them from the SITE authors'
code release (github.com/SNU-DRL/Soft_Injection, Apache-2.0), pinned at ``RELEASE_COMMIT``::

    https://raw.githubusercontent.com/SNU-DRL/Soft_Injection/<commit>/dataset/<task>/<split>.json

The release holds all 45 tasks (and 12 others the benchmark does not use), so nothing is
split here: each file is checked (a JSON list of ``{"input", "output"}`` objects, read as
``tasks.load_task_folder`` reads it; the item count and sha256 of the release's file at that
commit, in ``RELEASE``) and written as released, byte for byte, with a ``meta.json``. The task
data are Todd et al.'s (2024, "Function Vectors in Large Language Models", MIT): the splits
divide the items of ``dataset_files/{abstractive,extractive}/<task>.json`` in
github.com/ericwtodd/function_vectors 70 / 9 / 21 %.

A mirror (``source``: a base URL, a file:// URL or a folder) has the release's layout::

    SOURCE/dataset/<task>/{train,valid,test}.json   the splits
    SOURCE/LICENSE                                  the release's licence
    SOURCE/function_vectors/LICENSE                 optional, a site-lens convention: the function_vectors licence

A licence a mirror lacks is read from its own repository at its pinned commit (``_raw``);
offline, README.md names it and its URL. Each task is downloaded into memory, checked, written
to a temporary folder beside its place and renamed into it, so a stopped run leaves only
complete task folders; a rerun skips the task folders that are already complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..locks import owner_tag, temp_is_orphan
from ..tasks import ABSTRACTIVE, EXTRACTIVE, SPLITS, TaskError, _parse_pairs, category, load_task_folder
from . import SourceError
from .fetch import TIMEOUT_S, NotFound, Source
from .fv_release import FV_COMMIT, FV_REPO, LICENCES, RELEASE, RELEASE_COMMIT, RELEASE_REPO, Licence

log = logging.getLogger(__name__)

RAW = "https://raw.githubusercontent.com"  # a module attribute, so tests can point it elsewhere
DEFAULT_SOURCE = f"{RAW}/{RELEASE_REPO}/{RELEASE_COMMIT}"
SUITE = "fv"  # meta.json's "suite" in the task folders this module writes
TMP = "fv.tmp"  # temp names: .<name>.<host>.<pid>.fv.tmp (``locks.temp_is_orphan`` reads them)


def _raw(lic: Licence) -> str:
    """Where a licence's text is served, at its pinned commit."""
    return f"{RAW}/{lic.repo}/{lic.commit}/LICENSE"


def open_source(spec: str | os.PathLike | None = None, timeout: float = TIMEOUT_S) -> Source:
    """The release (``spec`` None) or a mirror of it: a URL, or a folder that holds ``dataset/``."""
    src = Source(DEFAULT_SOURCE if spec is None else spec, timeout)
    if src.folder is not None and not (src.folder / "dataset").is_dir():
        raise SourceError(
            f"source {src.text}: no dataset/ folder there (a mirror holds dataset/TASK/train.json, valid.json, test.json)"
        )
    return src


def _cannot_write(path: Path, e: OSError) -> SourceError:
    return SourceError(f"cannot write {path} ({e.strerror or e})")


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` atomically: a temp file beside it, renamed onto it."""
    tmp = path.with_name(f".{path.name}.{owner_tag()}.{TMP}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise _cannot_write(path, e) from None


Expected = Mapping[str, Sequence[Any]]  # task -> (train, valid, test item counts[, their sha256 prefixes])


def _expectations(spec: Sequence[Any]) -> dict[str, tuple[int | None, str | None]]:
    counts = tuple(spec[:3])
    digests = tuple(spec[3:6]) or (None, None, None)
    return {s: (counts[i], digests[i]) for i, s in enumerate(SPLITS)}


def check_file(data: bytes, task: str, split: str, count: int | None, digest: str | None, where: str) -> int:
    """Check one split file's bytes: a JSON list of {"input", "output"} items, ``count`` of them, a sha256
    starting with ``digest``. Returns the item count; a one-line SourceError names the task, split and problem."""
    label = f"task {task}, {split}.json"
    try:
        raw = json.loads(data)
    except json.JSONDecodeError as e:
        raise SourceError(f"{label}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno}) from {where}") from None
    except (ValueError, RecursionError) as e:  # undecodable bytes, an integer of > 4300 digits, deep nesting
        raise SourceError(f"{label}: invalid JSON ({e.__class__.__name__}) from {where}") from None
    try:
        _parse_pairs(raw, label)
    except TaskError as e:
        raise SourceError(f"{e} (from {where})") from None
    if count is not None and len(raw) != count:
        raise SourceError(f"{label}: {len(raw)} items, expected {count} (from {where})")
    if digest is not None:
        sha = hashlib.sha256(data).hexdigest()
        if not sha.startswith(digest.lower()):
            raise SourceError(f"{label}: sha256 {sha[: len(digest)]} is not the release's {digest} (from {where})")
    return len(raw)


def _problem(folder: Path, task: str, expect: Mapping[str, tuple[int | None, str | None]]) -> str | None:
    """Why ``folder`` does not hold the task's three split files as expected; None when it does."""
    for s in SPLITS:
        path = folder / f"{s}.json"
        try:
            check_file(path.read_bytes(), task, s, *expect[s], where=str(path))
        except FileNotFoundError:
            return f"no {s}.json"
        except OSError as e:
            return f"cannot read {path} ({e.strerror or e})"
        except SourceError as e:
            return str(e)
    return None


def _read_meta(folder: Path) -> dict[str, Any] | None:
    """``folder/meta.json``; None when it is missing or unreadable."""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def task_meta(task: str, files: Mapping[str, bytes], source: Source) -> dict[str, Any]:
    """meta.json of one task: category, sizes, where the files came from, their sha256, the licences."""
    cat = category(task)
    meta: dict[str, Any] = {
        "suite": SUITE,
        "category": cat,
        "sizes": {s: len(json.loads(files[s])) for s in SPLITS},
        "source": f"https://github.com/{RELEASE_REPO}/tree/{RELEASE_COMMIT}/dataset/{task}",
        "files": {s: source.shown(f"dataset/{task}/{s}.json") for s in SPLITS},
        "fetched_from": source.where,
        "sha256": {s: hashlib.sha256(files[s]).hexdigest() for s in SPLITS},
    }
    if cat in ("abstractive", "extractive"):
        meta["task_data"] = f"https://github.com/{FV_REPO}/blob/{FV_COMMIT}/dataset_files/{cat}/{task}.json"
    meta["licence"] = "Apache-2.0 (the splits, SITE release) and MIT (the task data, Todd et al. 2024)"
    meta["licences"] = [{"spdx": lic.spdx, "covers": lic.covers, "text": lic.url} for lic in LICENCES]
    return meta


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def _install(out: Path, task: str, files: Mapping[str, bytes], meta: dict[str, Any], expect) -> Path:
    """Write the task folder beside its place, check that it loads, and rename it into place."""
    final = out / task
    tmp = at = out / f".{task}.{owner_tag()}.{TMP}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name, data in [*((f"{s}.json", files[s]) for s in SPLITS), ("meta.json", _json(meta))]:
            at = tmp / name
            at.write_bytes(data)
        try:
            load_task_folder(tmp, task)
        except TaskError as e:
            raise SourceError(f"task {task}: the files do not load ({e})") from None
        at = final
        if final.exists():  # replacing (overwrite)
            old = out / f".{task}.{owner_tag()}.old-{TMP}"
            final.rename(old)
            try:
                tmp.rename(final)
            except OSError:
                old.rename(final)
                raise
            if old.is_symlink() or not old.is_dir():  # a file (or a link) where the task folder goes
                old.unlink(missing_ok=True)
            else:
                shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                tmp.rename(final)
            except OSError:
                if final.is_dir() and _problem(final, task, expect) is None:  # another process wrote it meanwhile
                    return final
                raise
    except OSError as e:
        raise _cannot_write(at, e) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def fetch_task(out: Path, task: str, source: Source, spec: Sequence[Any], overwrite: bool = False) -> dict[str, Any]:
    """Download, check and write one task folder unless it is already complete. One summary row."""
    expect = _expectations(spec)
    final = out / task
    if final.exists():
        problem = _problem(final, task, expect) if final.is_dir() else "not a folder"
        if problem is None:
            meta = _read_meta(final)
            if meta is not None and (meta.get("suite") == SUITE or not overwrite):  # a user's meta.json is kept
                log.info("%s: already complete in %s, skipped", task, final)
                status = "present"
            else:  # the release's files, put there by hand: add their meta.json (--overwrite: replace the user's)
                files = {s: (final / f"{s}.json").read_bytes() for s in SPLITS}
                _write_atomic(final / "meta.json", _json(task_meta(task, files, source)))
                log.info("%s: the files in %s are the release's; wrote its meta.json", task, final)
                status = "meta.json written"
            return {"task": task, "category": category(task), "sizes": _sizes(final), "status": status}
        if not overwrite:
            raise SourceError(
                f"{final} exists and is not the release's {task} ({problem}); pass --overwrite to replace it"
            )
    files: dict[str, bytes] = {}
    for s in SPLITS:
        location = source.location(f"dataset/{task}/{s}.json")
        files[s] = source.read(location, f"task {task}, {s}.json")
        check_file(files[s], task, s, *expect[s], where=location)
    meta = task_meta(task, files, source)
    _install(out, task, files, meta, expect)
    log.info("%s: downloaded into %s", task, final)
    return {"task": task, "category": meta["category"], "sizes": meta["sizes"], "status": "downloaded"}


def _sizes(folder: Path) -> dict[str, int]:
    return {s: len(json.loads((folder / f"{s}.json").read_bytes())) for s in SPLITS}


def fetch_licences(out: Path, source: Source) -> list[str]:
    """Write each licence's text under ``out`` unless there already; the files written. A mirror without
    a licence's file falls back to the licence's repository (one try); a licence that cannot be fetched
    is a warning (README.md names it and its URL either way)."""
    written = []
    for lic in LICENCES:
        dest = out / lic.file
        if dest.is_file():
            continue
        default = source.url == DEFAULT_SOURCE
        location = _raw(lic) if default else source.location(lic.mirror_path)
        try:
            try:
                data = source.read(location, lic.file)
            except NotFound:
                if default:
                    raise
                location = _raw(lic)
                data = source.get(location, lic.file, attempts=1)
            text = data.decode("utf-8")
        except (SourceError, UnicodeDecodeError) as e:
            log.warning("%s not written (%s); README.md names the licence and its URL", lic.file, e)
            continue
        if lic.marker not in text:
            log.warning("%s not written: %s does not read as the %s licence text", lic.file, location, lic.spdx)
            continue
        _write_atomic(dest, data)
        written.append(lic.file)
    return written


def remove_orphans(out: Path) -> None:
    """Delete the temp folders and files of a run that was killed (never a live process's)."""
    for p in [*out.glob(f".*{TMP}"), *out.glob(f"*/.*{TMP}")]:  # also .old-fv.tmp, and temp meta.json files
        if temp_is_orphan(p):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def check_request(tasks=None, source=None, expected: Expected | None = None, timeout: float = TIMEOUT_S):
    """The task names, their expectations and the Source of a request; a one-line SourceError if it is bad."""
    known = sorted(ABSTRACTIVE | EXTRACTIVE) if expected is None else sorted(expected)
    table = RELEASE if expected is None else expected
    names = known if tasks is None else list(dict.fromkeys(tasks))
    if not names:
        raise SourceError("no FV task named (--tasks is empty)")
    unknown = [t for t in names if t not in table]
    if unknown:
        raise SourceError(f"unknown FV task(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return names, table, open_source(source, timeout)


def build_fv(
    out: Path,
    tasks: Sequence[str] | None = None,
    source: str | os.PathLike | None = None,
    overwrite: bool = False,
    expected: Expected | None = None,
    timeout: float = TIMEOUT_S,
) -> list[dict[str, Any]]:
    """Download the FV tasks (default: all 45) into ``out``, with the licences and a README.md; one row per task.

    ``expected`` replaces ``RELEASE`` (task -> train, valid, test item counts, optionally followed by the
    sha256 prefixes of the three files): the tasks known, and what each file must hold.
    """
    out = Path(out)
    names, table, src = check_request(tasks, source, expected, timeout)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cannot_write(out, e) from None
    remove_orphans(out)
    rows = [fetch_task(out, t, src, table[t], overwrite) for t in names]
    fetch_licences(out, src)
    write_readme(out)
    return rows


def write_readme(out: Path) -> None:
    """README.md of the FV task folders under ``out``: what they are, sources, licences, split sizes."""
    rows = []
    for meta_file in sorted(out.glob("*/meta.json")):
        meta = _read_meta(meta_file.parent)
        if meta is not None and meta.get("suite") == SUITE:
            rows.append((meta_file.parent.name, meta))
    mirrors = sorted({m.get("fetched_from", "") for _, m in rows} - {DEFAULT_SOURCE, ""})
    short = RELEASE_COMMIT[:7]
    lines = [
        f"# Function-vector tasks ({len(rows)})",
        "",
        'Written by `site-lens data fv`: the few-shot tasks of Todd et al. (2024, "Function Vectors in Large',
        "Language Models\") with the train / valid / test splits (70 / 9 / 21 %) of the SITE paper's code",
        f"release, github.com/{RELEASE_REPO} at commit {RELEASE_COMMIT}, file by file as released.",
        'Each task folder holds `train.json`, `valid.json`, `test.json` (JSON lists of `{"input", "output"}`;',
        "a few outputs are numbers, read as text) and `meta.json` (category, sizes, source URLs, sha256, licences).",
        "Use `train` for demonstrations and training, `valid` for model selection, `test` for reported numbers:",
        '`site-lens run --data DIR --task antonym`, `site_lens.load_task("antonym", data_dir=DIR)`.',
    ]
    if mirrors:
        lines += ["", f"Fetched from a mirror of the release: {', '.join(mirrors)}."]
    lines += ["", "Licences:", ""]
    for lic in LICENCES:
        text = f"; text in `{lic.file}`" if (out / lic.file).is_file() else ""
        lines.append(f"- {lic.covers}: {lic.spdx}, {lic.url}{text}")
    lines += ["", "| task | category | train | valid | test | source |", "|---|---|---|---|---|---|"]
    for task, m in rows:
        s = m.get("sizes", {})
        link = f"[{RELEASE_REPO}@{short} dataset/{task}]({m.get('source', '')})"
        lines.append(
            f"| {task} | {m.get('category', '')} | {s.get('train')} | {s.get('valid')} | {s.get('test')} | {link} |"
        )
    _write_atomic(out / "README.md", ("\n".join(lines) + "\n").encode("utf-8"))
