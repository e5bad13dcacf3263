"""Locks on a shared output folder, Slurm array shards, and several bench processes on one folder."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from small import bench_cmd

from site_lens import locks
from site_lens.config import ConfigError
from site_lens.experiments import bench
from site_lens.locks import Locks, owner_tag, temp_is_orphan


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write_gen(lock: Path, n: int, info: dict, age: float = 0.0) -> Path:
    p = lock.parent / f"{lock.name}.{n}"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(info))
    if age:
        t = time.time() - age
        os.utime(p, (t, t))
    return p


def test_a_held_lock_is_refused_then_free_after_release(tmp_path):
    lock = tmp_path / "a" / "row"
    mine, other = Locks(), Locks()  # the same pid: other sees a live holder
    assert mine.acquire(lock)
    assert other.holder(lock)["pid"] == os.getpid()
    assert not other.acquire(lock)
    mine.release(lock)
    assert other.holder(lock) is None
    assert other.acquire(lock)
    # released generation 0 stays, generation 1 rules: no number is created twice
    assert [n for n, _ in Locks.generations(lock)] == [0, 1]
    other.release(lock)
    assert json.loads((lock.parent / "row.1").read_text())["released"]


def test_a_dead_local_holder_is_taken_over_by_exactly_the_next_generation(tmp_path):
    lock = tmp_path / "row"
    _write_gen(lock, 0, {"host": locks._HOST, "pid": _dead_pid()})
    got = Locks()
    assert got.holder(lock) is None
    assert got.acquire(lock)
    assert [n for n, _ in Locks.generations(lock)] == [0, 1]
    assert not Locks().acquire(lock)  # now held by a live process


def test_a_stale_listing_cannot_make_two_holders(tmp_path, monkeypatch):
    """A process that listed the generations before others took and released the lock backs off."""
    lock = tmp_path / "row"
    a, b, c = Locks(), Locks(), Locks()
    assert b.acquire(lock)
    b.release(lock)  # row.0 released
    seen = Locks.generations(lock)  # what A listed, before C's turn
    assert c.acquire(lock)  # row.1, held
    b.acquire(lock)  # refused: C holds it
    monkeypatch.setattr(Locks, "generations", staticmethod(lambda _lock, _seen=seen: list(_seen)))
    monkeypatch.setattr(Locks, "holder", lambda self, _lock: None)  # the stale listing shows it free
    assert not a.acquire(lock)  # row.1 exists: O_EXCL refuses it
    monkeypatch.undo()
    assert c.still_held(lock) and not a.still_held(lock)
    # a holder whose listing missed a newer generation gives its own back at once
    (tmp_path / "row.5").write_text(json.dumps({"host": locks._HOST, "pid": os.getpid()}))
    assert not c.still_held(lock)


def test_a_reused_pid_is_not_the_holder(tmp_path):
    lock = tmp_path / "row"
    _write_gen(lock, 0, {"host": locks._HOST, "pid": os.getpid(), "start": "not-my-start-time"})
    if locks._start_time(os.getpid()) is None:
        pytest.skip("no /proc: start times cannot tell a reused pid apart")
    assert Locks().holder(lock) is None


def test_another_hosts_lock_is_stale_only_when_its_heartbeat_stops(tmp_path):
    lock = tmp_path / "row"
    far = {"host": "another-host", "pid": 1}
    _write_gen(lock, 0, far, age=10)
    assert not Locks(stale_after=60.0).acquire(lock)
    _write_gen(lock, 0, far, age=120)
    assert Locks(stale_after=60.0).acquire(lock)


def test_a_half_written_lock_counts_as_held_until_stale(tmp_path):
    lock = tmp_path / "row"
    (tmp_path / "row.0").write_text("")
    assert not Locks(stale_after=60.0).acquire(lock)
    t = time.time() - 120
    os.utime(tmp_path / "row.0", (t, t))
    assert Locks(stale_after=60.0).acquire(lock)


@pytest.mark.parametrize("dies_in", ["json.dumps", "os.link", "pathlib.Path.unlink"])
def test_a_process_killed_while_taking_a_lock_leaves_it_free(tmp_path, dies_in):
    """Killed (no cleanup runs) while it creates its lock file: the next process takes the lock at once."""
    lock = tmp_path / "a" / "row"
    code = "import json, os, pathlib, sys\nfrom site_lens.locks import Locks\n"
    code += f"{dies_in} = lambda *a, **k: os._exit(9)\nsys.exit(3 if Locks().acquire(pathlib.Path(sys.argv[1])) else 4)"
    died = subprocess.run([sys.executable, "-c", code, str(lock)], check=False, timeout=60)
    assert died.returncode == 9  # killed there
    gens = Locks.generations(lock)
    assert all(json.loads(p.read_text())["pid"] for _, p in gens)  # a lock file is whole or absent
    assert Locks(stale_after=3600.0).acquire(lock)
    bench.remove_stale_temps(tmp_path)
    assert list(tmp_path.rglob("*.tmp")) == []
    assert [p for _, p in Locks.generations(lock)][: len(gens)] == [p for _, p in gens]  # no lock file removed


def test_without_hard_links_a_lock_is_created_exclusively(tmp_path, monkeypatch):
    import errno

    calls = []

    def refuse(*a, **k):
        calls.append(a)
        raise OSError(errno.EPERM, "hard links not supported")

    monkeypatch.setattr(os, "link", refuse)
    lock = tmp_path / "row"
    mine = Locks()
    assert mine.acquire(lock) and not Locks().acquire(lock)
    assert len(calls) == 1  # the link was tried, then exclusive creation made the file
    assert json.loads((tmp_path / "row.0").read_text())["pid"] == os.getpid()
    assert list(tmp_path.glob(".*.tmp")) == []
    mine.release(lock)
    assert Locks().acquire(lock)


def test_the_heartbeat_refreshes_a_held_lock(tmp_path):
    lock = tmp_path / "row"
    held = Locks(heartbeat=0.02)
    assert held.acquire(lock)
    gen = Locks.generations(lock)[-1][1]
    t = time.time() - 1000
    os.utime(gen, (t, t))
    time.sleep(0.3)
    assert time.time() - gen.stat().st_mtime < 5
    held.release(lock)
    assert held._thread is None


def test_wait_times_out_naming_the_holder(tmp_path):
    lock = tmp_path / "row"
    assert Locks().acquire(lock)
    with pytest.raises(TimeoutError, match="still held"), Locks().wait(lock, timeout=0.1):
        pass


def test_only_orphaned_temps_are_removed(tmp_path):
    mine = tmp_path / f".rows.csv.{owner_tag()}.abc.tmp"
    dead = tmp_path / f".rows.csv.{locks._HOST}.{_dead_pid()}.abc.tmp"
    far_new = tmp_path / ".rows.csv.another-host.12.abc.tmp"
    far_old = tmp_path / ".rows.csv.another-host.13.abc.tmp"
    for p in (mine, dead, far_new, far_old):
        p.write_text("x")
    t = time.time() - 2 * locks.STALE_AFTER_S
    os.utime(far_old, (t, t))
    assert [temp_is_orphan(p) for p in (mine, dead, far_new, far_old)] == [False, True, False, True]
    assert bench.remove_stale_temps(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, far_new.name])


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, None),
        ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "4"}, "3/4"),
        ({"SLURM_ARRAY_TASK_ID": "11", "SLURM_ARRAY_TASK_MIN": "10", "SLURM_ARRAY_TASK_COUNT": "2"}, "1/2"),
        (
            {
                "SLURM_ARRAY_TASK_ID": "20",
                "SLURM_ARRAY_TASK_MIN": "10",
                "SLURM_ARRAY_TASK_COUNT": "3",
                "SLURM_ARRAY_TASK_STEP": "5",
            },
            "2/3",
        ),
    ],
)
def test_slurm_array_shard(env, want):
    assert bench.slurm_shard(env) == want


@pytest.mark.parametrize(
    "env",
    [
        {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "3"},  # --array=1,3,7
        {
            "SLURM_ARRAY_TASK_ID": "12",
            "SLURM_ARRAY_TASK_MIN": "10",
            "SLURM_ARRAY_TASK_COUNT": "3",
            "SLURM_ARRAY_TASK_STEP": "5",
        },
        {"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "2"},
        {"SLURM_ARRAY_TASK_ID": "1"},
    ],
)
def test_slurm_arrays_without_a_shard_index_are_refused(env):
    with pytest.raises(ConfigError, match="--shard I/N"):
        bench.slurm_shard(env)


def test_a_summary_without_its_rows_is_not_overwritten(tmp_path):
    (tmp_path / "rows.csv").write_text("task,method\nantonym,site\n")
    with pytest.raises(ConfigError, match="rows.csv has no rows/ folder and its bench.json does not record"):
        bench._merge_spec(tmp_path, {"model": "smollm2-135m", "methods": ["site"], "seeds": [0]}, Locks())
    assert (tmp_path / "rows.csv").read_text() == "task,method\nantonym,site\n"


def test_a_folder_of_another_model_is_refused(tmp_path):
    (tmp_path / bench.SPEC_FILE).write_text(json.dumps({"model": "gpt2", "methods": [], "seeds": []}))
    with pytest.raises(ConfigError, match="model 'gpt2'"):
        bench._merge_spec(tmp_path, {"model": "smollm2-135m", "methods": ["site"], "seeds": [0]}, Locks())


def _printed(text: str) -> list[tuple[str, str]]:
    """(task, method) of each row line the CLI printed."""
    return [tuple(line.split()[:2]) for line in text.splitlines() if " first-tok " in line]


def test_processes_sharing_a_folder_compute_each_row_once_even_when_one_is_killed(bench_reference, tmp_path):
    data, ref = bench_reference
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    logs = [tmp_path / f"p{i}.log" for i in range(3)]
    slow = {**env, "SMALL_ROW_SECONDS": "4"}  # the victim's rows last long enough to be caught holding one

    def start(i):
        return subprocess.Popen(
            bench_cmd(data, out), env=slow if i == 0 else env, stdout=logs[i].open("w"), stderr=subprocess.STDOUT
        )

    # The victim starts first: started together, the other two could finish every row while it
    # is still importing. They start once it holds a row; it is killed holding one once another
    # process has taken a row (so that one has passed the victim's live lock).
    procs = [start(0)]
    try:
        victim = procs[0]
        deadline = time.time() + 240
        killed = False
        while time.time() < deadline and not killed and victim.poll() is None:
            holds, others = False, False
            for p in (out / bench.LOCKS_DIR).rglob("*"):
                if not p.parent.name.startswith("seed") or p.name.startswith("."):  # a temp is not a lock
                    continue
                try:
                    info = json.loads(p.read_text())
                except (OSError, ValueError):
                    continue
                holds |= info.get("pid") == victim.pid and "released" not in info
                others |= info.get("pid") in {q.pid for q in procs[1:]}
            if holds and len(procs) == 1:
                procs += [start(1), start(2)]
            elif holds and others:
                victim.send_signal(signal.SIGKILL)  # while it holds a row's lock
                killed = True
            time.sleep(0.01)
        if len(procs) == 1:
            procs += [start(1), start(2)]
        assert killed, "the victim never held a row lock"
        for p in procs:
            p.wait(timeout=300)
    finally:  # none left running if an assertion above fails
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs[1:]] == [0, 0], [f.read_text()[-2000:] for f in logs[1:]]
    again = subprocess.run(bench_cmd(data, out), env=env, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0, again.stderr
    printed = [_printed(f.read_text()) for f in logs] + [_printed(again.stdout)]
    flat = [r for part in printed for r in part]
    assert len(flat) == len(set(flat)), f"a row was computed twice: {printed}"
    rows = {p: json.loads(p.read_text()) for p in out.glob("rows/*/seed1/*.json")}
    assert len(rows) == 8

    def wrote(pid):
        return {(r["task"], r["method"]) for r in rows.values() if r["computed_by"].endswith(f".{pid}")}

    for part, proc in zip(printed[1:3], procs[1:]):  # each survivor printed exactly the rows it wrote
        assert sorted(part) == sorted(wrote(proc.pid))
    assert set(printed[0]) <= wrote(victim.pid)  # it may have been killed between writing a row and printing it
    assert len(flat) + len(wrote(victim.pid) - set(printed[0])) == 8
    assert list(out.rglob("*.tmp")) == []
    scores = ("task", "method", "first_token_acc", "exact_match", "strict_match", "n_test")
    table = [{k: r[k] for k in scores} for r in csv.DictReader((out / "rows.csv").open())]
    assert table == [{k: r[k] for k in scores} for r in csv.DictReader((ref / "rows.csv").open())]
    spec = json.loads((out / bench.SPEC_FILE).read_text())
    assert spec["methods"] == ["zero_shot", "site", "fv", "ia3"]
