"""Helpers for the API tests: a real uvicorn server around a tiny engine, waits, traffic."""

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from websockets.sync.client import ClientConnection, connect

from api.app import create_app
from api.launch import ServerThread, build_loop
from engine import SamplingParams
from engine.loop import EngineLoop
from engine.outputs import RequestDelta
from server.settings import ServerSettings
from server.state import state_of
from server.telemetry_fanout import ClientQueue
from storage import Recorder

MODEL = "synthetic:tiny"
KV_BLOCKS = 256
TIMEOUT = 60.0  # for a wait on a condition: generous, since only a hang should ever reach it


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

    @property
    def app(self) -> FastAPI:
        return self.server.server.config.app


def serve(
    settings: ServerSettings,
    send_buffer: int | None = None,
    port: int = 0,
    model: str = MODEL,
    **engine_args: object,
) -> Served:
    """A server on `port` (0: a free one) around a new engine loop of `model`."""
    args = {
        "num_kv_blocks": KV_BLOCKS,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        **engine_args,
    }
    loop = build_loop(model, **args)
    server = ServerThread(create_app(loop, settings), port=port, send_buffer=send_buffer).start()
    return Served(server, loop, settings)


def stop(served: Served) -> None:
    served.server.stop()
    served.loop.stop()


def ws_connect(url: str, **kwargs: Any) -> ClientConnection:
    """A websocket client that keeps reading into memory (closing never waits on unread data)."""
    return connect(url, **{"max_queue": None, "close_timeout": 2, **kwargs})


def telemetry_clients(served: Served) -> list[ClientQueue]:
    """The server's /ws/telemetry clients, as their queues (none before the first client)."""
    hub = state_of(served.app).telemetry_fanout
    return list(hub.clients) if hub is not None else []


@contextmanager
def telemetry_ws(
    served: Served, query: str = "", **kwargs: Any
) -> Iterator[tuple[ClientConnection, ClientQueue]]:
    """A /ws/telemetry client (`query` appended to the URL) and its queue on the server, once
    the server has attached it: from then on it gets every step (the handshake alone finishes
    before that, so a step made right after it may go out before the client is subscribed)."""
    before = telemetry_clients(served)

    def attached() -> list[ClientQueue]:
        return [c for c in telemetry_clients(served) if c not in before]

    with ws_connect(served.ws_url + query, **kwargs) as ws:
        wait_for(attached, what="the server to attach the telemetry client")
        (client,) = attached()
        yield ws, client


def wait_for(cond: Callable[[], Any], timeout: float = TIMEOUT, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def wait_idle(loop: EngineLoop, timeout: float = TIMEOUT) -> None:
    """Until every request from traffic() has finished (one just submitted is not in the
    engine yet: the loop takes it at its next step), no request is left and the loop has
    finished its last step (the engine has no request left from inside that step's
    `engine.step()`; the loop publishes the step's telemetry and counts it after that)."""
    submitted = _submitted.get(loop)
    wait_for(
        lambda: (
            (submitted is None or not submitted.unfinished)
            and not loop.engine.has_unfinished()
            and not loop.summary()["loop"]["streams"]
            and loop.steps == loop.engine.scheduler.step_count
        ),
        timeout,
        "the engine to go idle",
    )


class _Submitted:
    """The requests that traffic() gave one loop and that have not finished yet."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.unfinished: set[str] = set()


_submitted: "weakref.WeakKeyDictionary[EngineLoop, _Submitted]" = weakref.WeakKeyDictionary()


def traffic(
    loop: EngineLoop,
    n: int,
    max_tokens: int,
    prompt_len: int = 24,
    on_output: Callable[[RequestDelta], None] | None = None,
) -> list[str]:
    """Submit `n` requests straight to the loop (no HTTP); their deltas go to `on_output`
    (on the engine thread) when given. wait_idle waits for them all to finish."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    submitted = _submitted.setdefault(loop, _Submitted())

    def done(delta: RequestDelta) -> None:
        if on_output is not None:
            on_output(delta)
        if delta.finished:
            with submitted.lock:
                submitted.unfinished.discard(delta.request_id)

    ids = []
    with submitted.lock:  # an id is in `unfinished` before its last output can take it out
        for i in range(n):
            ids.append(loop.submit([256, *range(1 + i, prompt_len + i)], params, done))
            submitted.unfinished.add(ids[-1])
    return ids


def recorded_session(url: str, requests: int, max_tokens: int, prompt_len: int = 24) -> str:
    """Run a server recording into database `url` through `requests` requests (`traffic`),
    wait until every step is written, and stop it; its session."""
    served = serve(ServerSettings(model_name=MODEL, db_url=url))
    try:
        traffic(served.loop, requests, max_tokens, prompt_len)
        wait_idle(served.loop)
        rec: Recorder = state_of(served.app).recorder
        wait_for(
            lambda: rec.flush() and rec.written_steps == served.loop.steps, what="the recording"
        )
        return served.loop.engine.session
    finally:
        stop(served)
