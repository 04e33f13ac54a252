"""A server a benchmark starts as a subprocess: wait until it answers, stop it after."""

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx


@contextlib.contextmanager
def healthy(
    proc: "subprocess.Popen[Any]", health_url: str, timeout_s: float, why: Callable[[], str]
) -> Iterator[None]:
    """The block once `health_url` answers 200, and `proc` stopped after it. RuntimeError,
    ending with `why()`, if the process exits first or `timeout_s` passes."""
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited ({proc.returncode}): {why()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(health_url, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server was not up after {timeout_s:.0f} s: {why()}")
            time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
