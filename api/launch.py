"""Running the app: the engine from command-line style arguments, and uvicorn on a thread."""

import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI

from engine import LLMEngine
from engine.config import EngineConfig, engine_config
from engine.loop import EngineLoop


def config_from_args(model: str, **engine_args: Any) -> EngineConfig:
    """The engine config for command-line style arguments (None takes the engine default)."""
    return engine_config(model, **{k: v for k, v in engine_args.items() if v is not None})


def build_loop(model: str, **engine_args: Any) -> EngineLoop:
    """An EngineLoop around a new LLMEngine, built on the engine thread (arguments left as
    None take engine defaults)."""
    config = config_from_args(model, **engine_args)
    return EngineLoop.built_on_its_thread(lambda: LLMEngine(config))


class ServerThread:
    """A uvicorn server on its own thread, on a free port of 127.0.0.1 unless told otherwise.

    `send_buffer` fixes the kernel send buffer of every connection (no autotuning up to
    megabytes), so tests see a slow client's backlog reach the app within a few steps.
    """

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        send_buffer: int | None = None,
    ) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if send_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        self.sock.bind((host, port))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="uvicorn", daemon=True
        )
        self.host = host
        self.port = self.sock.getsockname()[1]

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()
