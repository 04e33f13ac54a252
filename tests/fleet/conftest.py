"""One fleet per test module: a local Ray with few CPUs, 2 replicas of synthetic:tiny with one
torch thread each, recording into one SQLite database. Starting Ray on 2 busy cores takes
tens of seconds, so modules share it rather than tests."""

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

# the dashboard suite's browser helpers (which read tests/api's)
sys.path[:0] = [str(Path(__file__).parents[1] / d) for d in ("dashboard", "api")]

from engine.ep.ranks import free_port  # noqa: E402
from server.settings import ServerSettings  # noqa: E402

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


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from fleet.app import FleetSpec, start

    db: Path = tmp_path_factory.mktemp("fleet") / "fleet.db"
    spec = FleetSpec(
        model=MODEL,
        engine_args={"threads": 1, "num_kv_blocks": 256, "max_num_seqs": 16},
        settings=ServerSettings(model_name=MODEL, db_url=f"sqlite:///{db}"),
        replicas=2,
        cpus_per_replica=0.5,
        port=free_port(),
    )
    running = start(spec)
    running.db = db  # type: ignore[attr-defined]
    try:
        yield running
    finally:
        running.stop()
        import ray

        ray.shutdown()


@pytest.fixture
def client(fleet: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fleet.url, timeout=120) as c:
        yield c


def live_rows(client: httpx.Client) -> list[dict[str, Any]]:
    return [r for r in client.get("/fleet/status").json()["replicas"] if r["health"] == "ok"]
