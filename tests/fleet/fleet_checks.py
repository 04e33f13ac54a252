"""What the fleet tests share besides fixtures: the model, waiting on a condition, the live
replicas. A module of its own, since `from conftest import` finds whichever conftest comes
first on sys.path (tests/api's when tests/api runs in the same session)."""

import time
from collections.abc import Callable
from typing import Any

import httpx

MODEL = "synthetic:tiny"
DEADLINE_S = 180.0  # only a hang should reach it: a replica restart on 2 busy cores is slow


def wait_for(cond: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> Any:
    """Poll `cond` until it returns something true; that value."""
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return value


def live_rows(client: httpx.Client) -> list[dict[str, Any]]:
    return [r for r in client.get("/fleet/status").json()["replicas"] if r["health"] == "ok"]
