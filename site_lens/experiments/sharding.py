"""Choosing what a bench run covers: names from 'all' or a comma list, a shard of the tasks (``--shard I/N``,
or the element of a Slurm job array it runs in), and SITE's rows grouped into shared loops (``--task-batch``)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..config import ConfigError
from ..tasks import TaskError


def resolve(spec: str, valid: Sequence[str], what: str, every: Sequence[str] | None = None) -> list[str]:
    """'all' (``every``, default ``valid``) or a comma list, checked against ``valid`` (an unknown name is a one-line error)."""
    if spec.strip() == "all":
        return list(valid if every is None else every)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        err = TaskError if what == "task" else ConfigError
        raise err(
            f"unknown {what}(s) {', '.join(repr(u) for u in unknown) or '(none given)'}; valid: {', '.join(valid)}"
        )
    return list(dict.fromkeys(names))


def slurm_shard(env: dict[str, str] | None = None) -> str | None:
    """'I/N' for this element of a Slurm job array (None outside one).

    I counts from the array's first index in its step (``--array=10-20:5`` gives 0/3, 1/3, 2/3),
    N is the array's size; an array given as an irregular list has no such I and is refused.
    """
    env = os.environ if env is None else env
    if "SLURM_ARRAY_TASK_ID" not in env:
        return None
    try:
        tid, lo, n = (int(env[k]) for k in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_COUNT"))
        step = int(env.get("SLURM_ARRAY_TASK_STEP", "1"))
    except (KeyError, ValueError) as e:
        raise ConfigError(f"Slurm array variables are incomplete or not integers ({e}); pass --shard I/N") from None
    i, rem = divmod(tid - lo, max(step, 1))
    if rem or not 0 <= i < n:
        raise ConfigError(
            f"Slurm array task {tid} is not index I of min {lo}, step {step}, count {n} "
            f"(an irregular --array list?); pass --shard I/N"
        )
    return f"{i}/{n}"


def shard(tasks: Sequence[str], spec: str | None) -> list[str]:
    """Tasks I, I+N, ... of the sorted list for ``spec`` 'I/N' (I from 0); all of them for None."""
    tasks = sorted(tasks)
    if not spec:
        return tasks
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ConfigError(f"--shard must look like I/N (e.g. 0/4), got '{spec}'") from None
    if not (n >= 1 and 0 <= i < n):
        raise ConfigError(f"--shard I/N needs 0 <= I < N, got '{spec}'")
    return tasks[i::n]


def together(tasks: Sequence[str], seeds: Sequence[int], n: int) -> list[list[tuple[str, int]]]:
    """(task, seed) rows in loops of at most ``n``: whole tasks (every seed) per loop where ``n`` allows."""
    seeds = list(dict.fromkeys(seeds))
    if not seeds:
        return []
    if n >= len(seeds):
        per = n // len(seeds)
        return [[(t, s) for t in tasks[i : i + per] for s in seeds] for i in range(0, len(tasks), per)]
    pairs = [(t, s) for t in tasks for s in seeds]
    return [pairs[i : i + n] for i in range(0, len(pairs), n)]
