"""The server's analysis process: it runs what it is given, closing does not wait for what it
is running, and it does not outlive a server killed outright."""

import gc
import os
import subprocess
import sys
import threading
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import psutil
import pytest
from api_servers import TIMEOUT, wait_for

from server.analysis import Analysis

# a "server" that starts its analysis worker, says the worker's pid, and dies at once
KILLED = """
import os, sys
from server.analysis import Analysis
a = Analysis(preload=())
print(a.submit(os.getpid).result(), flush=True)
os._exit(9)
"""


def test_it_runs_a_function_in_another_process() -> None:
    analysis = Analysis(preload=("server.twins",))
    try:
        pid = analysis.submit(os.getpid).result(TIMEOUT)
        assert pid != os.getpid()
        assert analysis.submit(sum, [1, 2, 3]).result(TIMEOUT) == 6
        # the preloaded modules' objects are out of the collector's way
        assert analysis.submit(gc.get_freeze_count).result(TIMEOUT) > 10_000
    finally:
        analysis.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_its_worker_ends_when_the_server_is_killed() -> None:
    out = subprocess.run(
        [sys.executable, "-c", KILLED], capture_output=True, text=True, timeout=TIMEOUT
    )
    worker = int(out.stdout.split()[0])

    def gone() -> bool:
        try:
            return psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, what="the orphaned worker to end")


def test_closing_ends_a_simulation_in_flight(tmp_path: Path) -> None:
    analysis = Analysis(preload=())
    pid = analysis.submit(os.getpid).result(TIMEOUT)
    started = tmp_path / "started"
    code = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(3600)"
    running = analysis.submit(exec, code)
    queued = analysis.submit(sum, [1, 2])
    wait_for(started.exists, what="the long run to start")
    closing = threading.Thread(target=analysis.close)
    closing.start()
    wait_for(lambda: not closing.is_alive(), what="close() to return")
    with pytest.raises(BrokenProcessPool):
        running.result(0)
    assert queued.cancelled() or isinstance(queued.exception(0), BrokenProcessPool)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
