"""Freed memory kept for reuse (site_lens.malloc): a big block allocated again faults no pages in."""

import json
import os
import subprocess
import sys

import pytest

from site_lens import malloc

PROBE = """
import ctypes, json, resource, sys
from site_lens.malloc import _glibc, keep_freed
on = keep_freed() if sys.argv[1] == "apply" else False
libc = _glibc()
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(64 * 2**20)  # past malloc's largest mmap threshold (32 MB)
    assert block
    libc.memset(block, 1, 64 * 2**20)
    n = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    libc.free(block)
    return n
first = faults()
print(json.dumps({"on": on, "first": first, "again": [faults() for _ in range(3)]}))
"""

pytestmark = pytest.mark.skipif(malloc._glibc() is None, reason="mallopt is glibc's")


def _python(code: str, *args: str, switch: str | None = None) -> str:
    """stdout of ``code`` in a fresh interpreter, the switch unset unless given."""
    env = {k: v for k, v in os.environ.items() if k != malloc.ENV_SWITCH}
    if switch is not None:
        env[malloc.ENV_SWITCH] = switch
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True).stdout


def _probe(apply: bool, switch: str | None = None) -> dict:
    return json.loads(_python(PROBE, "apply" if apply else "leave", switch=switch))


def test_a_freed_big_block_is_reused_without_page_faults():
    """Counts, not times. Relative, so that huge pages (one fault per 2 MB where THP is 'always') pass too."""
    left = _probe(apply=False)
    kept = _probe(apply=True)
    assert not left["on"] and kept["on"]
    assert min(left["again"]) > 0 and kept["first"] > 0  # fresh pages: malloc's default every time, kept the first
    assert max(kept["again"]) * 20 < min(left["again"])  # then kept reuses them


def test_the_switch_leaves_malloc_as_it_is():
    off = _probe(apply=True, switch="0")
    kept = _probe(apply=True)
    assert not off["on"] and max(kept["again"]) * 20 < min(off["again"])


def test_long_calls_keep_freed_memory():
    code = (
        "from site_lens import malloc\n"
        "from site_lens.threads import adaptive_threads\n"
        "assert malloc._applied is None\n"
        "with adaptive_threads():\n"
        "    print(malloc._applied)\n"
    )
    assert _python(code).strip() == "True"
