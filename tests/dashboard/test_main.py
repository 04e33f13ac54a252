"""`python -m dashboard` runs at the caller's CPU priority unless told to lower it (streamlit
inherits it)."""

import os
import subprocess
import sys

# main() with streamlit replaced by "exit with the niceness this process now has"
PROBE = """
import os, sys
import dashboard.__main__ as m
m.subprocess.call = lambda cmd: os.nice(0) if cmd[2:4] == ["streamlit", "run"] else -1
sys.exit(m.main(sys.argv[1:]))
"""


def _niceness(*args: str) -> int:
    return subprocess.run([sys.executable, "-c", PROBE, *args], timeout=60).returncode


def test_the_dashboard_runs_at_the_callers_priority_unless_told() -> None:
    base = os.nice(0)
    assert _niceness("--url", "http://127.0.0.1:1") == base
    assert _niceness("--url", "http://127.0.0.1:1", "--nice", "5") == min(base + 5, 19)
