"""The walk a reader makes through ``site-lens run``: which modules ("rooms") it passes through, and how often.

``site-lens run`` is run on a small setting under a profiler that records the first call of every site-lens
function below ``cmd_run``, in the order they are first called (a reader reads each function once), down to
``--depth`` site-lens calls below ``cmd_run`` (4 by default: the story down to the methods' ``fit``;
``--depth 99`` follows every helper down to the kernels; calls through torch or transformers add no depth).
Comprehensions and lambdas belong to the function around them; class bodies, finalisers (``__del__``) and what
runs while a module is imported are left out. Consecutive functions of one module are one stay; a module's
entries are its stays that begin with a call from another module (back in a module that called out: a return, not
an entry), so a module's entries count the times the walk comes into it from elsewhere, to a function not met yet.
A climb back up is an entry into a module already on the call stack below the caller (a callback: a lower layer
calling back into a higher one).

    .venv/bin/python benchmarks/walk.py [--engine hooked|bridge] [--depth N] [--show]

Prints the functions met, stays, rooms, climbs and each room's entries, most entered first; ``--show`` prints
the walk itself.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import sys
import tempfile
from pathlib import Path

import site_lens

ROOT = Path(site_lens.__file__).resolve().parent


def _room(filename: str) -> str | None:
    p = Path(filename)
    try:
        rel = p.resolve().relative_to(ROOT)
    except ValueError:
        return None
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "site_lens"


INNER = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>", "<lambda>")
SKIPPED = (*INNER, "__del__")  # a finaliser runs when the collector decides, not where the reader is


def trace(argv: list[str], depth: int) -> list[tuple[str, str, list[str]]]:
    """(room, function, rooms on the stack below) for each site-lens function within ``depth`` calls of
    ``cmd_run``, at its first call."""
    from site_lens.cli import main

    seen, walk, rooms = set(), [], {}

    def room_of(code) -> str | None:
        r = rooms.get(code.co_filename, ...)
        if r is ...:
            r = rooms[code.co_filename] = _room(code.co_filename)
        return r

    def prof(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        room = room_of(code)
        if room is None or code.co_name in SKIPPED or not code.co_flags & inspect.CO_NEWLOCALS or code in seen:
            return
        if code.co_name == "cmd_run":
            seen.add(code)
            walk.append((room, code.co_qualname, []))
            return
        below, calls, f = [], 0, frame.f_back
        while f is not None and f.f_code.co_name != "cmd_run":
            if f.f_code.co_name == "<module>":  # run while importing a module: not the run's path
                return
            r = room_of(f.f_code)
            if r is not None and f.f_code.co_name not in INNER:  # site-lens frames count, others' do not
                calls += 1
                if not below or below[-1] != r:
                    below.append(r)
            f = f.f_back
        if f is None or calls >= depth:
            return
        seen.add(code)
        walk.append((room, code.co_qualname, below + [room_of(f.f_code)]))

    sys.setprofile(prof)
    try:
        rc = main(argv)
    finally:
        sys.setprofile(None)
    if rc:
        raise SystemExit(f"site-lens run exited {rc}")
    return walk


def summarise(walk: list[tuple[str, str, list[str]]]) -> dict:
    stays, entries, climbs = [], collections.Counter(), 0
    for room, fn, below in walk:
        if stays and stays[-1][0] == room:  # read on from the last function: the same stay
            stays[-1][1].append(fn)
            continue
        if below and below[0] == room:  # called from its own room, back from a trip: a return, not an entry
            stays.append((room, [fn]))
            continue
        if below and room in below[1:]:  # the caller's room is below[0]; a room deeper down: a climb back up
            climbs += 1
        stays.append((room, [fn]))
        entries[room] += 1
    return {"stays": stays, "entries": entries, "climbs": climbs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default=None, help="hooked or bridge (default: the TransformerLens line's)")
    ap.add_argument("--depth", type=int, default=4, help="calls below cmd_run followed (default: 4)")
    ap.add_argument("--show", action="store_true", help="print the walk, one stay per line")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        argv = ["run", "--task", "opposites", "--prompts", "2", "--shots", "2", "--steps", "2", "--eval-every", "2"]
        argv += ["--max-valid", "2", "--max-test", "2", "--max-new-tokens", "4", "--out", out]
        argv += ["--engine", args.engine] if args.engine else []
        walk = trace(argv, args.depth)
    s = summarise(walk)
    if args.show:
        for room, fns in s["stays"]:
            print(f"{room}: {', '.join(fns)}")
    entries = s["entries"]
    print(f"functions {len(walk)}, stays {len(s['stays'])}, rooms {len(entries)}, climbs back up {s['climbs']}")
    print("entries per room: " + ", ".join(f"{r} {n}" for r, n in entries.most_common()))


if __name__ == "__main__":
    main()
