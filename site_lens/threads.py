"""Threads from the cores that are free: torch's thread count follows what other processes use.

torch's OpenMP threads wait for each other at every parallel region (hundreds per training
step). When another process holds one of the cores, a thread of ours is descheduled and its
partner spins at each region until it returns: a step beside one busy process ran 2-3.3x slower
than idle (BENCHMARKS.md), where a fair share of the cores costs at most 2x. One thread per
*free* core avoids it. ``adapt()`` is called at step boundaries of site-lens's long loops (training
steps, stage-1 and generation batches, decode steps); at most every ``INTERVAL`` seconds it
reads how much of this process's cores (its affinity) other processes used since the last
look (``/proc/stat`` less this process's own CPU time; processes with a positive nice value
are not counted, since they yield to us) and sets ``torch.set_num_threads`` to the free cores
rounded, between 1 and the count the process started with (``OMP_NUM_THREADS``, or a
``torch.set_num_threads`` of the user's, which is noticed and becomes the new ceiling).

Off with ``SITE_LENS_ADAPTIVE_THREADS=0`` (read at each look; torch's count is then never
touched), and where ``/proc/stat`` does not exist (not Linux). ``adapt()`` acts only inside an
``adaptive_threads()`` block, which wraps a long call and puts the user's count back when it ends.

    with adaptive_threads():       # fit_site, bench rows, evaluate: already wrapped
        for step in ...:
            adapt()
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from .malloc import keep_freed

log = logging.getLogger(__name__)

ENV_SWITCH = "SITE_LENS_ADAPTIVE_THREADS"
INTERVAL = 0.5  # seconds between looks at the load
STALE = 30.0  # a window longer than this (the process sat idle) only restarts the measurement
PROC_STAT = Path("/proc/stat")
_BUSY_FIELDS = (0, 2, 5, 6, 7)  # user, system, irq, softirq, steal; nice (1), idle (3), iowait (4) left out


def _read_busy(cpus: set[int], text: str) -> tuple[float, float]:
    """(busy seconds of ``cpus`` not counting niced processes, niced seconds) from /proc/stat's text."""
    hz = os.sysconf("SC_CLK_TCK")
    busy = nice = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        if int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in rest.split()]
        busy += sum(v[i] for i in _BUSY_FIELDS if i < len(v))
        nice += v[1]
    return busy / hz, nice / hz


def threads_for(others: float, n_cpus: int, ceiling: int) -> int:
    """Threads to run: the cores other processes leave free, rounded, between 1 and ``ceiling``."""
    return max(1, min(ceiling, int(n_cpus - others + 0.5)))


class Governor:
    """Keeps torch's thread count at the free cores; see the module docstring."""

    def __init__(self) -> None:
        self.enabled = PROC_STAT.exists()  # and the environment switch, read at each look
        try:
            self.cpus = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self.cpus = set(range(os.cpu_count() or 1))
        self.ceiling: int | None = None  # the count to return to (the user's)
        self.current: int | None = None  # the count this governor last set
        self.last: tuple[float, float, float] | None = None  # (wall, others' busy seconds, own CPU seconds)
        self.depth = 0
        self.told = False  # the first drop is logged at INFO, later changes at DEBUG

    def _sample(self) -> tuple[float, float, float]:
        busy, nice = _read_busy(self.cpus, PROC_STAT.read_text())
        own = time.process_time()
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:  # niced ourselves: our time is in the nice column
            busy += nice
        return time.monotonic(), busy, own

    def adapt(self) -> None:
        if not self.enabled or self.depth == 0 or os.environ.get(ENV_SWITCH, "1") == "0":
            return  # off, or outside an adaptive_threads() block (nothing would give the count back)
        now = time.monotonic()
        if self.last is not None and now - self.last[0] < INTERVAL:
            return
        try:
            sample = self._sample()
        except (OSError, ValueError, IndexError) as e:  # an unreadable /proc/stat: stop looking
            log.debug("adaptive threads off: %s", e)
            self.enabled = False
            return
        threads = torch.get_num_threads()
        if self.ceiling is None or threads != self.current:  # first look, or the user set a count since
            self.ceiling = threads
        prev, self.last = self.last, sample
        if prev is None or sample[0] - prev[0] > STALE:
            return
        wall = sample[0] - prev[0]
        others = max(0.0, (sample[1] - prev[1]) - (sample[2] - prev[2])) / wall  # cores other processes used
        want = threads_for(others, len(self.cpus), self.ceiling)
        if want != threads:
            say = log.info if want < threads and not self.told else log.debug
            say("other processes use %.1f of %d cores: %d torch threads instead of %d (%s=0 keeps the count)",
                others, len(self.cpus), want, threads, ENV_SWITCH)  # fmt: skip
            self.told = self.told or want < threads
            torch.set_num_threads(want)
        self.current = want

    def restore(self) -> None:
        """The user's thread count again (the ceiling), if this governor changed it."""
        mine = self.current is not None and torch.get_num_threads() == self.current  # not changed by the user since
        if mine and self.ceiling is not None and self.current != self.ceiling:
            torch.set_num_threads(self.ceiling)
        self.ceiling = self.current = self.last = None


GOVERNOR = Governor()


def adapt() -> None:
    """Match torch's thread count to the free cores (cheap: looks at most every ``INTERVAL`` seconds)."""
    GOVERNOR.adapt()


@contextmanager
def adaptive_threads():
    """Adapt the thread count inside (reentrant); the user's count is back when the outermost block ends. Freed
    memory is kept for reuse from the first block on (``malloc.keep_freed``)."""
    keep_freed()
    GOVERNOR.depth += 1
    try:
        adapt()
        yield
    finally:
        GOVERNOR.depth -= 1
        if GOVERNOR.depth == 0:
            GOVERNOR.restore()
