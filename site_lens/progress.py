"""Progress of long work: a bar on a terminal, one line per finished unit in a log.

The library reports through ``Progress`` (units of work: bench rows, analyses, stages) and ``note``
(one-off status lines). By default these are log records of ``site_lens.progress`` at INFO. The
command line runs each command inside ``shown()``: where stderr is a terminal, a ``tqdm`` bar per
``Progress``; otherwise one line per finished unit on stderr, such as::

    [12/90] antonym seed 1 site: prefix 0.62 strict 0.58 (41 s, about 52 min left)

Units another unit's work is part of are indented under it. This module imports nothing heavy
(tqdm only once a bar is drawn), so the command line stays importable without torch.
"""

from __future__ import annotations

import logging
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("site_lens.progress")

# mode None: log records only (the library's default); "bars": tqdm bars on stderr; "lines": lines on stderr
_state: dict[str, Any] = {"mode": None}
_open: weakref.WeakSet[Progress] = weakref.WeakSet()  # a Progress left unclosed goes with its frame


@contextmanager
def shown(stream: Any = None) -> Iterator[None]:
    """Inside this block progress is shown: bars where ``stream`` (default stderr) is a terminal, else lines."""
    stream = stream if stream is not None else sys.stderr
    saved = _state["mode"]
    _state["mode"] = "bars" if _isatty(stream) else "lines"
    try:
        yield
    finally:
        _state["mode"] = saved


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or stream-like object
        return False


def duration(seconds: float | int) -> str:  # noqa: PYI041 (beartype, which the tests run, rejects an int for float)
    """``41 s``, ``3 min 12 s``, ``1 h 05 min``."""
    s = round(seconds)
    if s < 60:
        return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.1f} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def write(line: str, file: Any = None) -> None:
    """Print ``line`` (to stdout by default) without breaking a bar on the terminal."""
    file = file if file is not None else sys.stdout
    if _state["mode"] == "bars" and len(_open):
        from tqdm import tqdm

        tqdm.write(line, file=file)
        file.flush()
    else:
        print(line, file=file, flush=True)


def note(text: str) -> None:
    """A one-off status line: on stderr under ``shown()``, else a log record at INFO."""
    if _state["mode"] is None:
        log.info("%s", text)
    else:
        log.debug("%s", text)
        write(text, sys.stderr)


class Progress:
    """Counts the finished units of one piece of work (``total`` of them).

    ``start(text)`` names the unit now running (shown on the bar); ``done(text)`` reports a finished
    one with its seconds, ``skip()`` counts units found finished already. Lines are written for every
    ``every``-th unit and the last (0: bar only, no lines). Use as a context manager, or ``close()``.
    """

    _bar = None

    def __init__(self, total: int, what: str, unit: str = "unit", every: int = 1) -> None:
        self.total, self.what, self.unit, self.every = int(total), what, unit, every
        self.n = 0
        self.depth = len(_open)
        self._computed = 0  # units done here (not skipped), for the time left
        self._spent = 0.0
        self._t = time.perf_counter()
        self._bar = None
        _open.add(self)
        if _state["mode"] == "bars":
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=what, unit=unit, file=sys.stderr, dynamic_ncols=True,
                             leave=self.depth == 0)  # fmt: skip

    def __enter__(self) -> Progress:  # noqa: PYI034 (beartype, which the tests run, rejects typing.Self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, text: str) -> None:
        """The unit that runs now (its seconds count from here)."""
        self._t = time.perf_counter()
        if self._bar is not None:
            self._bar.set_postfix_str(text)

    def skip(self, n: int = 1) -> None:
        """``n`` units found finished already: counted, not timed, no line."""
        self.n += n
        self._t = time.perf_counter()
        if self._bar is not None:
            self._bar.update(n)

    def done(self, text: str, n: int = 1) -> None:
        """``n`` units finished (the last described by ``text``); their seconds since ``start`` or the last unit."""
        now = time.perf_counter()
        took, self._t = now - self._t, now
        self.n += n
        self._computed += n
        self._spent += took
        left = (self.total - self.n) * self._spent / self._computed
        when = duration(took) + (f", about {duration(left)} left" if self.n < self.total and left >= 1 else "")
        line = f"{'  ' * self.depth}[{self.n}/{self.total}] {text} ({when})"
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.update(n)
            log.debug("%s", line)
            return
        if not self.every or (self.n % self.every and self.n < self.total):
            log.debug("%s", line)
        elif _state["mode"] == "lines":
            log.debug("%s", line)
            print(line, file=sys.stderr, flush=True)
        else:
            log.info("%s", line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        _open.discard(self)

    def __del__(self) -> None:
        self.close()
