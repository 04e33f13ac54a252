"""Storage suite setup: the API suite's server helpers on the path, and the databases to test."""

import sys
from pathlib import Path

import pytest
from storage_helpers import fresh_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_url(request.param, tmp_path)
