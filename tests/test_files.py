"""Folders put in place whole: ``files.replace_dir``, as the weight cache and the transformers cache use it."""

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
    """A reader of ``entry`` meets the old folder whole or the new one whole: the old is renamed away first."""
    entry = _folder(tmp_path / "entry", "stale")
    tmp = _folder(tmp_path / ".tmp", "fresh")
    removed = []
    rmtree = shutil.rmtree

    def recorded(path, *args, **kwargs):
        removed.append(Path(path))
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", recorded)
    with (entry / "weights").open() as held:  # opened before the swap
        assert files.replace_dir(tmp, entry, keep=lambda e: False)
        assert held.read() == "stale"
    assert _texts(entry) == {"weights": "fresh", "sub/meta": "fresh"}
    assert len(removed) == 1 and removed[0] != entry and removed[0].parent == tmp_path  # the old one, renamed aside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_an_entry_finished_by_another_writer_meanwhile_is_kept(tmp_path):
    """The replace fails on a folder another process put in place since; ``keep`` is asked then, not before."""
    entry = tmp_path / "entry"
    tmp = _folder(tmp_path / ".tmp", "mine")
    _folder(entry, "theirs")  # published after this writer checked, before it renames
    assert not files.replace_dir(tmp, entry, keep=lambda e: (e / "weights").read_text() == "theirs")
    assert _texts(entry)["weights"] == "theirs"
    assert not tmp.exists()


def test_other_errors_are_raised_and_leave_the_entry(tmp_path):
    entry = _folder(tmp_path / "entry", "old")
    with pytest.raises(FileNotFoundError):
        files.replace_dir(tmp_path / "missing", entry, keep=lambda e: False)
    assert _texts(entry)["weights"] == "old"
