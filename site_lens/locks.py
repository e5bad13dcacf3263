"""Locks for one output folder shared by concurrent processes, on one host or several.

A lock is a file made by atomic exclusive creation (a hard link of a finished temp
file, or ``O_CREAT | O_EXCL`` where hard links are refused), which network file systems
honour where ``flock`` is not; it names its holder (host and pid namespace, pid, the
process's start time) in JSON, present from the moment the file exists where hard links
work. While held, a background thread refreshes the file's modification time every
``heartbeat`` seconds. A lock is
*stale* when its holder is a process of this host that is gone, or, for a
holder on another host (whose processes cannot be seen from here), when the
file has not been refreshed for ``stale_after`` seconds.

A stale lock is taken over without deleting it first: lock ``L`` is a series of
generation files ``L.0``, ``L.1``, ... whose newest rules; taking over
generation ``n`` means creating ``L.{n+1}``, which exactly one process can do.
No generation file is ever deleted (releasing rewrites it as released, by an
atomic rename), so every number is created once only and two processes can
never both create the newest; a holder that finds a newer generation than its
own has lost the lock (``still_held``). The files, a few bytes each, stay.
Temp files carry their writer's host and pid in their names (``owner_tag``), so
a process removes only temps whose writer is known to be gone
(``temp_is_orphan``) and never another live process's.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

HEARTBEAT_S = 30.0
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS}  # link() refused by the file system
STALE_AFTER_S = 600.0  # another host's lock unrefreshed this long is dead (20 missed heartbeats)


def _host_id() -> str:
    """The host name, plus the pid namespace where it can be read: containers sharing a host name differ."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()) or "host"
    try:
        return f"{name}-ns{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return name


_HOST = _host_id()


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), telling a reused pid apart; None elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22 of stat; the command name may hold spaces


def owner_tag() -> str:
    """``host.pid``: what this process's temp file names carry."""
    return f"{_HOST}.{os.getpid()}"


def temp_beside(path: Path, kind: str = "") -> Path:
    """A temp file's path beside ``path``: hidden, named for this host and pid plus a random part (so two writers
    in one process never share one), ending ``.tmp``; ``temp_is_orphan`` reads its writer back from the name."""
    return path.with_name(f".{path.name}.{owner_tag()}.{secrets.token_hex(4)}{kind}.tmp")


def _alive(pid: int, start: str | None = None) -> bool:
    """Whether process ``pid`` runs and (when ``start`` is known) is the one that started then, not a reused pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: /proc still tells its start time
        pass
    return start is None or _start_time(pid) in (None, start)


def temp_is_orphan(path: Path, stale_after: float = STALE_AFTER_S) -> bool:
    """Whether a temp file's writer is gone: a dead process of this host, or an old file from elsewhere."""
    m = re.search(r"\.([A-Za-z0-9_-]+)\.(\d+)\.[^.]*\.tmp$", path.name)
    if m and m.group(1) == _HOST:
        return not _alive(int(m.group(2)))
    try:
        return time.time() - path.stat().st_mtime > stale_after
    except FileNotFoundError:
        return False


class Locks:
    """Locks held by this process, refreshed by one heartbeat thread while any is held."""

    def __init__(self, heartbeat: float = HEARTBEAT_S, stale_after: float = STALE_AFTER_S) -> None:
        self.heartbeat, self.stale_after = heartbeat, stale_after
        self._held: set[Path] = set()
        self._guard = threading.Lock()
        self._stop = threading.Event()  # one per heartbeat thread
        self._thread: threading.Thread | None = None
        self.me = {"host": _HOST, "pid": os.getpid(), "start": _start_time(os.getpid())}
        self._jitter = random.Random(os.getpid())  # spreads the polls of processes waiting on one lock

    # -- reading a lock
    @staticmethod
    def generations(lock: Path) -> list[tuple[int, Path]]:
        """The generation files of ``lock``, oldest first."""
        gens = []
        for p in lock.parent.glob(f"{lock.name}.*"):
            suffix = p.name[len(lock.name) + 1 :]
            if suffix.isdigit():
                gens.append((int(suffix), p))
        return sorted(gens)

    def holder(self, lock: Path) -> dict | None:
        """Who holds ``lock`` (its newest generation's JSON, or {} while being written), or None if free or stale."""
        gens = self.generations(lock)
        if not gens:
            return None
        path = gens[-1][1]
        try:
            age = time.time() - path.stat().st_mtime
            text = path.read_text()
        except FileNotFoundError:  # listed but gone (a stale directory listing): count it as held
            return {}
        try:
            info = json.loads(text)
        except ValueError:  # being written after an exclusive creation (or its creator died there): judge by age
            info = {}
        if not isinstance(info, dict):
            info = {}
        if info.get("released"):
            return None
        if info.get("host") == _HOST and isinstance(info.get("pid"), int):
            return info if _alive(info["pid"], info.get("start")) else None
        return info if age <= self.stale_after else None

    # -- taking and releasing
    def acquire(self, lock: Path) -> bool:
        """Take ``lock`` if it is free or stale; False (at once) if another live process holds it."""
        lock.parent.mkdir(parents=True, exist_ok=True)
        gens = self.generations(lock)
        if gens and self.holder(lock) is not None:
            return False
        path = lock.parent / f"{lock.name}.{gens[-1][0] + 1 if gens else 0}"
        if not self._create(path):  # another process took it first
            return False
        if self.generations(lock)[-1][1] != path:  # a newer generation appeared (our listing was stale)
            self._mark_released(path)
            return False
        with self._guard:
            self._held.add(path)
            if self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._beat, args=(self._stop,), name="site-lens-locks", daemon=True
                )
                self._thread.start()
        return True

    def _create(self, path: Path) -> bool:
        """Create generation file ``path`` holding this process's JSON, whole; False if it exists.

        The JSON goes into a temp file first, which is then hard-linked to ``path``: creating a link
        fails where the name exists, as ``O_EXCL`` does, and no reader ever sees the file empty
        (a process killed between an exclusive create and its write would leave one, which blocks
        the lock until stale). Where hard links are refused, exclusive creation and a write.
        """
        info = json.dumps({**self.me, "since": time.time()})
        tmp = temp_beside(path, "new")  # killed: an orphan, removed as one
        try:
            tmp.write_text(info)
            try:
                os.link(tmp, path)
            except OSError as e:
                if os.stat(tmp).st_nlink == 2:  # over NFS a link can be made and yet reported as failed
                    return True
                if isinstance(e, FileExistsError):
                    return False
                if e.errno not in _NO_HARD_LINKS:
                    raise
                return self._create_exclusive(path, info)
        finally:
            tmp.unlink(missing_ok=True)
        return True

    @staticmethod
    def _create_exclusive(path: Path, info: str) -> bool:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "w") as f:
                f.write(info)
        except BaseException:
            path.unlink(missing_ok=True)  # ours, half-written: it would block the lock until stale
            raise
        return True

    def release(self, lock: Path) -> None:
        """Release ``lock``: mark this process's generation file released (an atomic rename over it)."""
        with self._guard:
            mine = [p for p in self._held if p.parent == lock.parent and p.name.rsplit(".", 1)[0] == lock.name]
            try:
                for p in mine:
                    self._held.discard(p)
                    self._mark_released(p)
            finally:
                if not self._held and self._thread is not None:
                    self._stop.set()
                    self._thread = None

    def _mark_released(self, path: Path) -> None:
        tmp = temp_beside(path, "rel")
        tmp.write_text(json.dumps({**self.me, "released": time.time()}))
        os.replace(tmp, path)

    def still_held(self, lock: Path) -> bool:
        """Whether this process still holds ``lock``: its generation is the newest (none was taken over)."""
        with self._guard:
            mine = {p for p in self._held if p.parent == lock.parent and p.name.rsplit(".", 1)[0] == lock.name}
        gens = self.generations(lock)
        return bool(mine and gens and gens[-1][1] in mine)

    @contextlib.contextmanager
    def hold(self, lock: Path) -> Iterator[bool]:
        """``with locks.hold(path) as got:`` got is False if another live process holds it (not waited for)."""
        got = self.acquire(lock)
        try:
            yield got
        finally:
            if got:
                self.release(lock)

    @contextlib.contextmanager
    def wait(self, lock: Path, timeout: float | None = None, poll: float = 0.05) -> Iterator[None]:
        """Hold ``lock``, waiting up to ``timeout`` seconds (default: until a dead holder's lock is stale, plus a minute)."""
        timeout = self.stale_after + 60 if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not self.acquire(lock):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{lock}: still held by {self.holder(lock)} after {timeout:.0f} s")
            time.sleep(poll * (0.5 + self._jitter.random()))  # jittered, backing off to 2 s between looks
            poll = min(2 * poll, 2.0)
        try:
            yield
        finally:
            self.release(lock)

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat):
            with self._guard:
                for p in list(self._held):
                    with contextlib.suppress(FileNotFoundError):
                        os.utime(p)
