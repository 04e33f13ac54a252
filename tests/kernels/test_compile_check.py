"""Every Triton kernel compiles for Hopper (sm_90) on this CPU-only machine, pipelined."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_kernels_compile_for_sm90() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    run = subprocess.run(
        [sys.executable, "-m", "kernels.compile_check", "--arch", "90"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 18 and all(line.startswith("ok") for line in lines)
    assert all(int(line.rsplit(" ", 1)[1]) > 0 for line in lines), "a main loop not pipelined"


@pytest.mark.slow
def test_refuses_interpreter_mode() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "kernels.compile_check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "TRITON_INTERPRET=0" in run.stderr
