"""The dashboard suite's server: tests/api's real uvicorn server around a tiny engine."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "api"))

from api_servers import MODEL, Served, serve, stop

from server.settings import ServerSettings


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Recording into a fresh SQLite database, so the replay page has sessions to play; two
    modeled expert-parallel ranks with skewed routing, so rank loads differ and can be
    rebalanced."""
    db = tmp_path_factory.mktemp("db") / "moescope.db"
    s = serve(
        ServerSettings(model_name=MODEL, db_url=f"sqlite:///{db}", record=True),
        ep_size=2,
        router_skew=1.5,
    )
    yield s
    stop(s)
