"""The server's analysis process: it runs what it is given, and it does not outlive a server
killed outright."""

import os
import subprocess
import sys

import psutil
from api_servers import TIMEOUT, wait_for

from api.analysis import Analysis

# a "server" that starts its analysis worker, says the worker's pid, and dies at once
KILLED = """
import os, sys
from api.analysis import Analysis
a = Analysis(preload=())
print(a.submit(os.getpid).result(), flush=True)
os._exit(9)
"""


def test_it_runs_a_function_in_another_process() -> None:
    analysis = Analysis(preload=("api.twins",))
    try:
        pid = analysis.submit(os.getpid).result(TIMEOUT)
        assert pid != os.getpid()
        assert analysis.submit(sum, [1, 2, 3]).result(TIMEOUT) == 6
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
