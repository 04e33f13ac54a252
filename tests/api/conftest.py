"""The API suite's shared server: a real uvicorn server on a free port of 127.0.0.1."""

from collections.abc import Iterator

import pytest
from api_servers import MODEL, Served, serve, stop

from server.settings import ServerSettings


@pytest.fixture(scope="session")
def served() -> Iterator[Served]:
    s = serve(
        ServerSettings(
            model_name=MODEL,
            max_prompt_tokens=512,
            max_tokens_limit=1000,
            ws_buffer=32,
            metrics_interval_s=0.1,
            max_body_bytes=64 * 1024,
        ),
        send_buffer=16384,
    )
    yield s
    stop(s)
