"""Freed memory kept for reuse: a long prompt's big tensors without a page fault for every 4 KB.

glibc's malloc serves a block over its mmap threshold (128 KB, sliding up to 32 MB) with a fresh
``mmap`` and gives it back to the kernel when it is freed. A forward over a long prompt allocates
and frees such blocks every layer (a 2,000-token SmolLM2 prompt: 393 MB of logits, 144 MB of
attention scores), so each forward faults in and zeroes every page of them again: on one such
forward, system time equalled user time (BENCHMARKS.md, "Big tensors and page faults").

``keep_freed()`` asks malloc to serve every block from its heap and to keep what is freed there
(``mallopt(M_MMAP_MAX, 0)`` and ``mallopt(M_TRIM_THRESHOLD, 1 GiB)``): pages are faulted once and
reused by the next forward (blocks allocated outside the main thread still come from ``mmap``
past 64 MiB, glibc's per-thread heaps; torch allocates a forward's tensors from the calling
thread). The cost is that the process keeps the memory it has used (its
resident size stays near its peak; free space above 1 GiB at the top of the heap still goes
back). It is process-wide and is applied once, by site-lens's long calls
(``threads.adaptive_threads``) and the CLI. Off with ``SITE_LENS_KEEP_FREED=0`` (read before it is
applied); nothing is done where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

ENV_SWITCH = "SITE_LENS_KEEP_FREED"
M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_MAX = -4
TRIM_THRESHOLD = 1 << 30  # free space at the top of the heap past this goes back to the kernel

_applied: bool | None = None  # None: not tried yet in this process


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  (absent from musl and other C libraries)
        return libc
    except (OSError, AttributeError):
        return None


def keep_freed() -> bool:
    """Serve big blocks from malloc's heap and keep freed ones for reuse (once per process); whether it is on."""
    global _applied
    if _applied is None:
        _applied = False
        if os.environ.get(ENV_SWITCH, "1") != "0" and (libc := _glibc()) is not None:
            trim = bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))  # first, so that a failure leaves mmap on
            _applied = trim and bool(libc.mallopt(M_MMAP_MAX, 0))
            log.debug("malloc keeps freed memory: %s (%s=0 leaves malloc as it is)", _applied, ENV_SWITCH)
    return _applied
