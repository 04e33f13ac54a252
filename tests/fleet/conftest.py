"""One fleet per test module: a local Ray with few CPUs, 2 replicas of synthetic:tiny with one
torch thread each, recording into one SQLite database. Starting Ray on 2 busy cores takes
tens of seconds, so modules share it rather than tests."""

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

# the dashboard suite's browser helpers (which read tests/api's)
sys.path[:0] = [str(Path(__file__).parents[1] / d) for d in ("dashboard", "api")]

from fleet_checks import MODEL  # noqa: E402

from engine.ep.ranks import free_port  # noqa: E402
from server.settings import ServerSettings  # noqa: E402


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
    import ray

    try:
        running = start(spec)
    except BaseException:
        ray.shutdown()  # a half-started Serve must not fail the next module's fleet too
        raise
    running.db = db  # type: ignore[attr-defined]
    try:
        yield running
    finally:
        running.stop()
        ray.shutdown()


@pytest.fixture
def client(fleet: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fleet.url, timeout=120) as c:
        yield c
