"""Writing files: whole or not at all (``write_*_atomic``, ``save_tensors``), with the modes a plain ``open()`` /
``mkdir()`` gives.

Some writers create private files: ``tempfile.mkdtemp`` makes a 0700 folder, and safetensors'
``save_file`` / ``save_model`` write a 0600 file (through a temporary name of their own). A
folder or file renamed into place from those would keep the private modes, hiding a shared cache
or an output folder from the group and others that the user's umask lets read it.
``plain_modes`` sets 0o666 & ~umask on files and 0o777 & ~umask on folders, as ``open()`` and
``mkdir()`` would have.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .locks import temp_beside, temp_is_orphan


def umask() -> int:
    """The process's umask.

    Read from ``/proc/self/status`` where Linux gives it (kernel 4.7 and later): reading leaves it
    untouched. Elsewhere ``os.umask`` has to set it to read it, so it is set to 0 and back at once;
    in that instant a file another thread creates would get 0666 (the window is a few instructions,
    and only where /proc does not answer).
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def plain_modes(path: str | Path) -> Path:
    """Give ``path`` (a folder: it and everything in it) the modes ``open()`` and ``mkdir()`` give under the umask.

    Files get 0o666 & ~umask (0o777 & ~umask if the owner could execute them), folders
    0o777 & ~umask; links are left alone. Call it on a finished temporary file or folder just
    before renaming it into place.
    """
    path = Path(path)
    mask = umask()
    _chmod(path, mask)
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                _chmod(Path(root) / name, mask)
    return path


def _chmod(path: Path, mask: int) -> None:
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return
    full = 0o777 if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR else 0o666
    if stat.S_IMODE(st.st_mode) != full & ~mask:
        os.chmod(path, full & ~mask)


def save_tensors(path: str | Path, tensors: dict) -> None:
    """``tensors`` as the safetensors file ``path``, written whole or not at all (a temp name renamed into
    place), with the mode ``open()`` gives."""
    from safetensors.torch import save_file

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp))
        plain_modes(tmp)  # safetensors writes 0600
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to a temp file beside ``path`` (named for this host and pid), fsync, then rename it into place."""
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """``write_text_atomic`` for bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)  # the umask's permissions, as open() gives
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (temp file + fsync + rename): never half-written."""
    write_text_atomic(path, json.dumps(obj, indent=1))


def write_dir(entry: Path, fill: Callable[[Path], None], keep: Callable[[Path], bool]) -> bool:
    """Write the folder ``entry`` whole or not at all: ``fill(tmp)`` writes a temporary folder beside it, which gets
    plain modes and is put in place by ``replace_dir`` (its return value). On any error the temporary folder is
    removed and the error raised."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=entry.name + ".tmp"))
    try:
        fill(tmp)
        plain_modes(tmp)  # mkdtemp's 0700 and safetensors' 0600 would hide a shared folder from other users
        return replace_dir(tmp, entry, keep)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already once it became the entry


def replace_dir(tmp: Path, entry: Path, keep: Callable[[Path], bool]) -> bool:
    """Put the finished folder ``tmp`` in place as ``entry``, never deleting a folder where it stands.

    True when ``tmp`` became ``entry``. Where ``entry`` exists and ``keep(entry)`` (another process
    finished the same entry first), ``tmp`` is removed and False returned. An entry that is not
    kept (stale, damaged) is renamed aside, ``tmp`` renamed in, and the old folder removed after:
    a reader that opened the old entry's files keeps them; one opening by name in that instant finds
    no entry (a cache miss), never a half-deleted one. Aside folders a killed writer left are swept.
    """
    for old in entry.parent.glob(f".{entry.name}.*old.tmp"):
        if temp_is_orphan(old):
            shutil.rmtree(old, ignore_errors=True)
    for _ in range(8):  # each retry means another writer moved the entry in between
        try:
            os.replace(tmp, entry)  # no entry (or an empty folder)
            return True
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if keep(entry):
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        aside = temp_beside(entry, "old")
        try:
            os.replace(entry, aside)
        except FileNotFoundError:
            continue
        try:
            os.replace(tmp, entry)
            return True
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    raise OSError(errno.EBUSY, f"{entry} kept changing while this process tried to write it")
