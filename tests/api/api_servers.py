"""Helpers for the API tests: a real uvicorn server around a tiny engine, waits, traffic."""

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from websockets.sync.client import ClientConnection, connect

from api.app import create_app
from api.server import ServerThread, build_loop
from api.settings import ServerSettings
from engine import SamplingParams
from engine.loop import EngineLoop

MODEL = "synthetic:tiny"
KV_BLOCKS = 256


@dataclass
class Served:
    server: ServerThread
    loop: EngineLoop
    settings: ServerSettings

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/ws/telemetry"


def serve(
    settings: ServerSettings, send_buffer: int | None = None, **engine_args: object
) -> Served:
    args = {
        "num_kv_blocks": KV_BLOCKS,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        **engine_args,
    }
    loop = build_loop(MODEL, **args)
    server = ServerThread(create_app(loop, settings), send_buffer=send_buffer).start()
    return Served(server, loop, settings)


def stop(served: Served) -> None:
    served.server.stop()
    served.loop.stop()


def ws_connect(url: str, **kwargs: Any) -> ClientConnection:
    """A websocket client that keeps reading into memory (closing never waits on unread data)."""
    return connect(url, **{"max_queue": None, "close_timeout": 2, **kwargs})


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def wait_idle(loop: EngineLoop, timeout: float = 30.0) -> None:
    wait_for(
        lambda: not loop.engine.has_unfinished() and not loop.summary()["loop"]["streams"],
        timeout,
        "the engine to go idle",
    )


def traffic(loop: EngineLoop, n: int, max_tokens: int, prompt_len: int = 24) -> list[str]:
    """Submit `n` requests straight to the loop (no HTTP); outputs are discarded."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [
        loop.submit([256, *range(1 + i, prompt_len + i)], params, lambda _: None) for i in range(n)
    ]
