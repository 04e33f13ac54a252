"""A server a benchmark starts as a subprocess: wait until it answers, stop it after."""

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

from cli.demo import wait_ready


@contextlib.contextmanager
def healthy(
    proc: "subprocess.Popen[Any]",
    url: str,
    path: str,
    timeout_s: float,
    why: Callable[[], str],
) -> Iterator[None]:
    """The block once `url` answers 200 on `path`, and `proc` stopped after it. RuntimeError,
    ending with `why()`, if the process exits first or `timeout_s` passes."""
    try:
        failure = wait_ready(url, proc, timeout_s, path)
        if failure is not None:
            raise RuntimeError(f"{failure}: {why()}")
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
