"""The thread count follows the cores other processes leave free (site_lens.threads)."""

from __future__ import annotations

import pytest
import torch

from site_lens import threads

STAT = """cpu  900 50 300 5000 20 1 2 7 0 0
cpu0 100 40 50 1000 10 1 1 3 0 0
cpu1 200 10 60 2000 10 0 1 4 0 0
cpu2 600 0 190 2000 0 0 0 0 0 0
intr 12345
"""


@pytest.fixture(autouse=True)
def keep_threads(monkeypatch):
    monkeypatch.delenv(threads.ENV_SWITCH, raising=False)  # conftest switches it off for the other tests
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_threads_for_rounds_the_free_cores_between_one_and_the_ceiling():
    assert threads.threads_for(0.0, 2, 2) == 2
    assert threads.threads_for(0.4, 2, 2) == 2  # less than half a core taken: keep both
    assert threads.threads_for(0.67, 2, 2) == 1  # one busy process beside two spinning threads
    assert threads.threads_for(1.0, 2, 2) == 1
    assert threads.threads_for(5.0, 2, 2) == 1  # never below one
    assert threads.threads_for(0.0, 8, 3) == 3  # never above the user's count
    assert threads.threads_for(2.2, 8, 8) == 6


def test_read_busy_counts_only_the_given_cpus_and_leaves_nice_and_idle_out(monkeypatch):
    monkeypatch.setattr(threads.os, "sysconf", lambda name: 100)
    busy, nice = threads._read_busy({0, 1}, STAT)
    # user + system + irq + softirq + steal of cpu0 and cpu1; nice apart; idle and iowait never
    assert busy == pytest.approx(((100 + 50 + 1 + 1 + 3) + (200 + 60 + 0 + 1 + 4)) / 100)
    assert nice == pytest.approx((40 + 10) / 100)
    assert threads._read_busy({2}, STAT)[0] == pytest.approx(7.9)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def scripted(monkeypatch, cpus: int, samples: list[tuple[float, float]]):
    """A governor over ``cpus`` cores whose looks return ``samples`` (busy, own CPU seconds) in turn."""
    clock = Clock()
    monkeypatch.setattr(threads.time, "monotonic", clock)
    gov = threads.Governor()
    gov.enabled, gov.cpus, gov.depth = True, set(range(cpus)), 1  # as inside an adaptive_threads() block
    feed = iter(samples)
    gov._sample = lambda: (clock.now, *next(feed))
    return gov, clock


def test_governor_drops_to_the_free_cores_and_returns_when_they_free(monkeypatch):
    torch.set_num_threads(2)
    # others' cores per second of wall: (busy delta - own delta) / wall
    gov, clock = scripted(monkeypatch, 2, [(0.0, 0.0), (2.0, 1.0), (3.0, 2.0), (3.2, 2.2)])
    gov.adapt()  # first look: nothing to compare with yet
    assert torch.get_num_threads() == 2
    clock.now += 0.1
    gov.adapt()  # too soon after the last look: no new look (the feed would run out)
    clock.now += 0.9
    gov.adapt()  # one core's worth of others over 1 s
    assert torch.get_num_threads() == 1
    clock.now += 1.0
    gov.adapt()  # others gone
    assert torch.get_num_threads() == 2
    clock.now += threads.STALE + 1  # a long pause: the window only restarts
    gov.adapt()
    assert torch.get_num_threads() == 2


def test_a_count_the_user_sets_becomes_the_ceiling_and_restore_gives_it_back(monkeypatch):
    torch.set_num_threads(2)
    gov, clock = scripted(monkeypatch, 4, [(0.0, 0.0), (3.0, 1.0), (4.0, 2.0), (7.0, 3.0)])
    gov.adapt()
    clock.now += 1.0
    gov.adapt()  # others use 2 of 4 cores: 2 free, the ceiling (2) allows 2
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)  # the user's own choice
    clock.now += 1.0
    gov.adapt()  # nobody else busy, but the user's 1 is the ceiling now
    assert (torch.get_num_threads(), gov.ceiling) == (1, 1)
    torch.set_num_threads(3)
    clock.now += 1.0
    gov.adapt()  # others use 2 of 4: 2 threads under the new ceiling of 3
    assert (torch.get_num_threads(), gov.ceiling) == (2, 3)
    gov.restore()
    assert torch.get_num_threads() == 3


def test_adaptive_threads_restores_the_count_when_the_outermost_block_ends(monkeypatch):
    torch.set_num_threads(2)
    gov, clock = scripted(monkeypatch, 2, [(0.0, 0.0), (2.0, 1.0)])
    gov.depth = 0
    monkeypatch.setattr(threads, "GOVERNOR", gov)
    with threads.adaptive_threads():  # first look
        with threads.adaptive_threads():
            clock.now += 1.0
            threads.adapt()  # one busy core beside us
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1  # the inner block's end keeps the outer's choice
    assert torch.get_num_threads() == 2


def test_switched_off_by_the_environment_and_outside_a_block(monkeypatch):
    gov = threads.Governor()
    gov.enabled = True
    gov._sample = lambda: pytest.fail("a switched-off governor must not look at the load")
    gov.adapt()  # outside any adaptive_threads() block: nothing would give the count back
    monkeypatch.setattr(threads, "GOVERNOR", gov)
    monkeypatch.setenv(threads.ENV_SWITCH, "0")  # set after import: read at each look
    with threads.adaptive_threads():
        threads.adapt()


@pytest.mark.skipif(not threads.PROC_STAT.exists(), reason="/proc/stat is Linux's")
def test_a_real_look_at_this_machine_keeps_the_count_in_range(monkeypatch):
    monkeypatch.delenv(threads.ENV_SWITCH, raising=False)
    torch.set_num_threads(2)
    gov = threads.Governor()
    gov.enabled, gov.depth = True, 1
    gov.adapt()
    monkeypatch.setattr(threads, "INTERVAL", 0.0)
    sum(range(10**6))  # a little work of our own between the looks
    gov.adapt()
    assert 1 <= torch.get_num_threads() <= 2 and gov.ceiling == 2  # between one and the count the process had
