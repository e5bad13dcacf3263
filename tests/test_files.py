"""Folders put in place whole: ``files.replace_dir``, as the weight cache and the transformers cache use it."""

import os
import shutil
from pathlib import Path

import pytest

from site_lens import files


def _folder(path, text):
    path.mkdir()
    (path / "weights").write_text(text)
    (path / "sub").mkdir()
    (path / "sub" / "meta").write_text(text)
    return path


def _texts(path):
    return {p.relative_to(path).as_posix(): p.read_text() for p in path.rglob("*") if p.is_file()}


def test_a_new_entry_is_the_finished_folder(tmp_path):
    tmp = _folder(tmp_path / ".tmp", "new")
    assert files.replace_dir(tmp, tmp_path / "entry", keep=lambda e: pytest.fail("nothing there to keep"))
    assert _texts(tmp_path / "entry") == {"weights": "new", "sub/meta": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_a_kept_entry_stays_and_the_new_folder_goes(tmp_path):
    entry = _folder(tmp_path / "entry", "theirs")
    tmp = _folder(tmp_path / ".tmp", "mine")
    seen = []
    assert not files.replace_dir(tmp, entry, keep=lambda e: seen.append(e) or True)
    assert seen == [entry]
    assert _texts(entry) == {"weights": "theirs", "sub/meta": "theirs"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_an_old_entry_is_moved_aside_never_deleted_where_it_stands(tmp_path, monkeypatch):
    """A reader of ``entry`` meets the old folder whole, the new one whole or none: the old is renamed away first."""
    entry = _folder(tmp_path / "entry", "stale")
    tmp = _folder(tmp_path / ".tmp", "fresh")
    removed = []
    rmtree = shutil.rmtree

    def recorded(path, *args, **kwargs):
        removed.append(Path(path))
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", recorded)
    assert files.replace_dir(tmp, entry, keep=lambda e: False)
    assert _texts(entry) == {"weights": "fresh", "sub/meta": "fresh"}
    assert len(removed) == 1 and removed[0] != entry and removed[0].parent == tmp_path  # the old one, renamed aside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def _publish_before(monkeypatch, call: int, act):
    """Run ``act`` just before the ``call``-th ``os.replace`` (from 1): another writer acting in between."""
    replace = os.replace
    calls = []

    def racing(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == call:
            act()
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", racing)
    return calls


def test_an_entry_another_writer_publishes_meanwhile_is_kept(tmp_path, monkeypatch):
    """No entry when the call starts; one appears before the rename: the rename fails, then ``keep`` is asked."""
    entry = tmp_path / "entry"
    tmp = _folder(tmp_path / ".tmp", "mine")
    calls = _publish_before(monkeypatch, 1, lambda: _folder(entry, "theirs"))
    assert not files.replace_dir(tmp, entry, keep=lambda e: (e / "weights").read_text() == "theirs")
    assert _texts(entry)["weights"] == "theirs"
    assert not tmp.exists() and len(calls) == 1


def test_an_entry_another_writer_removes_meanwhile_is_retried(tmp_path, monkeypatch):
    """The stale entry vanishes before it can be moved aside: the next round renames ``tmp`` straight in."""
    entry = _folder(tmp_path / "entry", "stale")
    tmp = _folder(tmp_path / ".tmp", "fresh")
    calls = _publish_before(monkeypatch, 2, lambda: shutil.rmtree(entry))
    assert files.replace_dir(tmp, entry, keep=lambda e: False)
    assert _texts(entry)["weights"] == "fresh"
    assert [c[1] for c in calls] == ["entry", calls[1][1], "entry"] and calls[1][0] == "entry"  # aside failed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_an_aside_folder_a_killed_writer_left_is_swept(tmp_path):
    from site_lens.locks import temp_beside

    entry = _folder(tmp_path / "entry", "old")
    dead = tmp_path / temp_beside(entry, "old").name.replace(f".{os.getpid()}.", ".999999999.")
    _folder(dead, "left behind")
    mine = _folder(tmp_path / temp_beside(entry, "old").name, "a live writer's")  # this process: alive, kept
    assert files.replace_dir(_folder(tmp_path / ".tmp", "new"), entry, keep=lambda e: False)
    assert not dead.exists() and mine.exists()


def test_other_errors_are_raised_and_leave_the_entry(tmp_path):
    entry = _folder(tmp_path / "entry", "old")
    with pytest.raises(FileNotFoundError):
        files.replace_dir(tmp_path / "missing", entry, keep=lambda e: False)
    assert _texts(entry)["weights"] == "old"
