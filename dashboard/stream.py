"""A telemetry websocket consumer on a background thread, feeding a bounded ring buffer."""

import json
import threading
import time
from collections import deque
from typing import Any

from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

from dashboard.window import StepWindow, WindowView

CONNECTING, CONNECTED, RECONNECTING, GONE, STOPPED = (
    "connecting",
    "connected",
    "reconnecting",
    "server gone",
    "stopped",
)


class TelemetryStream:
    """Keeps the last `maxlen` frames of `ws_url`; reconnects by itself with backoff.

    `state` is connecting, connected, reconnecting (lost, retrying), server gone (no answer
    for `gone_after_s`; still retrying) or stopped. A message is one frame or a bundle (a
    JSON array) of them. `dropped` counts steps the server dropped for this client (its
    `dropped` field); `received` counts frames received. On a replay
    socket, `replay` holds the player's last state message and `send` steers it. It asks for
    no compression: the server would deflate every message once per client, the largest part
    of what a dashboard costs it. With a `window`, each frame also goes into it as it
    arrives, so the charts' statistics are ready when the page asks for a `view`.
    """

    def __init__(
        self,
        ws_url: str,
        maxlen: int = 600,
        gone_after_s: float = 5.0,
        max_backoff_s: float = 2.0,
        window: StepWindow | None = None,
    ) -> None:
        self.ws_url = ws_url
        self.window = window
        self.gone_after_s = gone_after_s
        self.max_backoff_s = max_backoff_s
        self.state = CONNECTING
        self.dropped = 0
        self.received = 0
        self.error = ""
        self.replay: dict[str, Any] | None = None
        self._ws: Any = None
        self._frames: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="telemetry-stream", daemon=True)

    def start(self) -> "TelemetryStream":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.state = STOPPED

    def send(self, msg: dict[str, Any], clear: bool = False) -> bool:
        """Send a control message (replay: pause, resume, seek, speed); `clear` empties the
        buffer first (a seek). False when not connected."""
        ws = self._ws
        if ws is None:
            return False
        if clear:
            with self._lock:
                self._frames.clear()
                if self.window is not None:
                    self.window.clear()
        try:
            ws.send(json.dumps(msg))
        except (OSError, WebSocketException):
            return False
        return True

    def frames(self) -> list[dict[str, Any]]:
        """A copy of the buffered frames, oldest first."""
        with self._lock:
            return list(self._frames)

    def view(self, last: int | None = None) -> WindowView:
        """The window's last `last` steps (the stream must have a window)."""
        assert self.window is not None, "a stream without a window has no view"
        with self._lock:
            return self.window.view(last)

    def _run(self) -> None:
        lost_at = time.monotonic()
        backoff = 0.1
        while not self._stop.is_set():
            try:
                with connect(
                    self.ws_url, open_timeout=2, close_timeout=1, max_size=None, compression=None
                ) as ws:
                    self.state, self.error, backoff = CONNECTED, "", 0.1
                    self._ws = ws
                    try:
                        self._consume(ws)
                    finally:
                        self._ws = None
            except (OSError, WebSocketException, TimeoutError) as exc:
                self.error = f"{type(exc).__name__}: {exc}"
            if self._stop.is_set():
                return
            if self.state == CONNECTED:
                lost_at = time.monotonic()
            gone = time.monotonic() - lost_at > self.gone_after_s
            self.state = GONE if gone else RECONNECTING
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def _consume(self, ws: Any) -> None:
        while not self._stop.is_set():
            try:
                raw = ws.recv(timeout=0.5)
            except TimeoutError:
                continue
            msg = json.loads(raw)
            if isinstance(msg, list):
                self._add(msg)
            elif "error" in msg and "step" not in msg:
                self.error = msg["error"]
            elif "replay" in msg:
                self.replay = msg["replay"]
            else:
                self._add([msg])

    def _add(self, frames: list[dict[str, Any]]) -> None:
        for frame in frames:
            self.dropped += frame.pop("dropped", 0)
        with self._lock:
            self._frames.extend(frames)
            if self.window is not None:
                for frame in frames:
                    self.window.add(frame)
        self.received += len(frames)
