"""The engine thread's torch thread count: fixed, left alone, or adapted to free cores."""

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from engine import LLMEngine, SamplingParams
from engine.config import engine_config
from engine.threads import ThreadGovernor, busy_seconds, threads_for

TIMEOUT = 60.0  # for a wait on a condition: only a hang should reach it


@pytest.mark.parametrize(
    ("others", "current", "cores", "expected"),
    [
        (0.0, 2, 2, 2),
        (0.35, 2, 2, 2),  # inside the band: keep
        (0.5, 2, 2, 1),  # a neighbour takes half a core: give one up
        (1.0, 1, 2, 1),
        (0.35, 1, 2, 1),  # inside the band: do not take it back yet
        (0.1, 1, 2, 2),
        (1.5, 4, 4, 2),
        (3.9, 4, 4, 1),  # never below one
        (0.0, 1, 4, 4),
    ],
)
def test_threads_for_others_load(others: float, current: int, cores: int, expected: int) -> None:
    assert threads_for(others, current, cores) == expected


class FakeCpu:
    """A clock, the machine's busy seconds and this process's CPU seconds, set by the test."""

    def __init__(self) -> None:
        self.now = self.busy = self.own = 0.0

    def advance(self, seconds: float, others: float, own: float) -> None:
        self.now += seconds
        self.own += own * seconds
        self.busy += (others + own) * seconds


@pytest.fixture
def restore_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def governor(cpu: FakeCpu) -> ThreadGovernor:
    return ThreadGovernor(
        "auto", cores=2, busy=lambda: cpu.busy, clock=lambda: cpu.now, own=lambda: cpu.own
    )


@pytest.mark.usefixtures("restore_threads")
def test_auto_gives_up_a_thread_to_a_neighbour_and_takes_it_back() -> None:
    cpu = FakeCpu()
    gov = governor(cpu)
    assert gov.tick() == 2 and torch.get_num_threads() == 2
    cpu.advance(0.5, others=1.0, own=1.0)
    assert gov.tick() == 2  # under a second since the last sample: no decision yet
    cpu.advance(0.6, others=1.0, own=1.0)
    assert gov.tick() == 1 and torch.get_num_threads() == 1
    cpu.advance(1.0, others=0.3, own=1.0)
    assert gov.tick() == 1  # the neighbour is nearly gone, but inside the band
    cpu.advance(1.0, others=0.05, own=1.0)
    assert gov.tick() == 2 and torch.get_num_threads() == 2


@pytest.mark.usefixtures("restore_threads")
def test_without_proc_stat_auto_keeps_every_core() -> None:
    gov = ThreadGovernor("auto", cores=2, busy=lambda: None)
    assert [gov.tick() for _ in range(3)] == [2, 2, 2]


@pytest.mark.usefixtures("restore_threads")
def test_fixed_and_left_alone() -> None:
    torch.set_num_threads(1)
    assert ThreadGovernor(None).tick() is None and torch.get_num_threads() == 1
    assert ThreadGovernor(2).tick() == 2 and torch.get_num_threads() == 2


def test_busy_seconds_grows_with_work() -> None:
    first = busy_seconds()
    assert first is not None
    deadline = time.monotonic() + TIMEOUT
    while (now := busy_seconds()) == first and time.monotonic() < deadline:
        sum(range(100_000))
    assert now is not None and now > first


@pytest.mark.slow
@pytest.mark.usefixtures("restore_threads")
def test_auto_measures_a_real_busy_neighbour() -> None:
    """A busy-loop process beside the engine thread: auto drops to one thread."""
    gov = ThreadGovernor("auto", cores=2)
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        deadline = time.monotonic() + TIMEOUT
        while gov.tick() != 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for the condition; the governor samples once a second
        assert gov.current == 1
    finally:
        spin.kill()
        spin.wait()


def test_the_engine_sets_its_own_threads_count() -> None:
    """OpenMP's count is per thread: the engine applies it on the thread that steps it."""
    seen: list[int] = []

    def run() -> None:
        engine = LLMEngine(model="synthetic:tiny", threads=2)
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
        while engine.has_unfinished():
            engine.step()
        seen.append(torch.get_num_threads())

    before = torch.get_num_threads()
    worker = threading.Thread(target=run)
    worker.start()
    worker.join(TIMEOUT)
    assert seen == [2] and torch.get_num_threads() == before


@pytest.mark.parametrize("bad", [0, -1, "all", 1.5, True])
def test_bad_threads_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="threads must be a positive integer or 'auto'"):
        engine_config(threads=bad)
