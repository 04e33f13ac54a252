"""WS /ws/replay/{id}: a recorded session's steps, in the /ws/telemetry format, paced.

Query: `speed` (recorded spacing divided by it; 0 = as fast as possible; default 1),
`from` (first step), and `every` / `fields` as on /ws/telemetry. The client steers with
JSON messages `{"op": "pause"}`, `{"op": "resume"}`, `{"op": "seek", "step": N}` and
`{"op": "speed", "speed": X}`; each is answered by `{"replay": {state, speed, next}}` (`next`:
the step sent next, null at the end), and the end of the recording by state `ended` (the
socket stays open for seeks). A bad request gets `{"error", "code"}` (404 unknown session,
422 bad parameter) and close code 1008; a bad control message gets `{"error"}` and the
replay goes on.
"""

import asyncio
import json
import math
import time
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.datastructures import QueryParams

from api.telemetry_ws import parse_query
from server.state import state_of
from storage import SessionNotFound, Store
from storage.queries import require_session
from storage.replay import Pacer, StepCursor

router = APIRouter()
MAX_SPEED = 1000.0


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _speed(raw: Any, name: str = "speed") -> float:
    try:
        speed = float(raw)
    except (TypeError, ValueError):
        raise _Refused(
            422, f"{name}: expected a number in [0, {MAX_SPEED:g}], got {raw!r}"
        ) from None
    if isinstance(raw, bool) or not math.isfinite(speed) or not 0 <= speed <= MAX_SPEED:
        raise _Refused(422, f"{name}: expected a number in [0, {MAX_SPEED:g}], got {raw!r}")
    return speed


def _step(raw: Any, name: str) -> int:
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise _Refused(422, f"{name}: expected an integer >= 0, got {raw!r}")
    return raw


def parse_replay_query(query: QueryParams) -> tuple[float, int, int, list[str] | None]:
    """speed, from, every, fields; _Refused names the bad parameter."""
    try:
        every, fields = parse_query(query)
    except ValueError as exc:
        raise _Refused(422, str(exc)) from None
    return _speed(query.get("speed", "1.0")), _step(query.get("from", "0"), "from"), every, fields


def parse_control(text: str) -> dict[str, Any]:
    """A validated control message; _Refused names what is wrong with it."""
    try:
        msg = json.loads(text)
    except ValueError:
        raise _Refused(422, 'control message: expected JSON like {"op": "pause"}') from None
    op = msg.get("op") if isinstance(msg, dict) else None
    if op in ("pause", "resume"):
        return {"op": op}
    if op == "seek":
        return {"op": op, "step": _step(msg.get("step"), "step")}
    if op == "speed":
        return {"op": op, "speed": _speed(msg.get("speed"))}
    raise _Refused(422, f"op: expected one of pause, resume, seek, speed, got {op!r}")


class _Player:
    """Sends steps when due and applies control messages between them."""

    def __init__(
        self, ws: WebSocket, cursor: StepCursor, speed: float, fields: list[str] | None
    ) -> None:
        self.ws = ws
        self.cursor = cursor
        self.pacer = Pacer(speed)
        self.fields = fields
        self.controls: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.paused = False
        self.ended = False
        self.next: dict[str, Any] | None = None

    async def state(self) -> None:
        state = "ended" if self.ended else "paused" if self.paused else "playing"
        nxt = self.next["step"] if self.next else None
        await self.ws.send_text(
            json.dumps(
                {
                    "replay": {
                        "session": self.cursor.session_id,
                        "state": state,
                        "speed": self.pacer.speed,
                        "next": nxt,
                    }
                }
            )
        )

    async def apply(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        if op == "error":
            await self.ws.send_text(json.dumps({"error": msg["error"], "code": 422}))
            return
        if op == "pause":
            self.paused = True
        elif op == "resume":
            self.paused = False
        elif op == "seek":
            self.cursor.seek(msg["step"])
            self.next, self.ended = None, False
        else:
            self.pacer.set_speed(msg["speed"])
        self.pacer.rebase()
        await self.load_next()
        await self.state()

    async def load_next(self) -> None:
        """Fetch the step to send next unless it is fetched already; none left: ended."""
        if self.next is not None or self.ended:
            return
        if self.cursor.needs_fill:
            await asyncio.to_thread(self.cursor.fill)
        self.next = self.cursor.pop()
        self.ended = self.next is None

    async def run(self) -> None:
        while True:
            if self.paused or self.ended:
                await self.apply(await self.controls.get())
                continue
            if not self.controls.empty():
                await self.apply(self.controls.get_nowait())
                continue
            await self.load_next()
            if self.next is None:  # the end of the recording
                await self.state()
                continue
            wait = self.pacer.delay(self.next["t"], time.monotonic())
            if wait > 0:
                try:
                    await self.apply(await asyncio.wait_for(self.controls.get(), wait))
                    continue
                except TimeoutError:
                    pass
            record, self.next = self.next, None
            msg = {k: record[k] for k in self.fields if k in record} if self.fields else record
            await self.ws.send_text(json.dumps(msg))

    async def receive(self) -> None:
        while True:
            event = await self.ws.receive()
            if event["type"] == "websocket.disconnect":
                return
            try:
                await self.controls.put(parse_control(event.get("text") or ""))
            except _Refused as exc:
                await self.controls.put({"op": "error", "error": str(exc)})


@router.websocket("/ws/replay/{session_id}")
async def replay(ws: WebSocket, session_id: str) -> None:
    """A recorded session's steps at their pace (`speed`, `from`, `every`, `fields` in the query;
    pause, resume, seek and speed ops)."""
    await ws.accept()
    store: Store | None = state_of(ws.app).store
    try:
        if store is None:
            raise _Refused(503, "no session database: start the server with --db URL")
        speed, start, every, fields = parse_replay_query(ws.query_params)
        await asyncio.to_thread(require_session, store, session_id)
    except _Refused as exc:
        await _refuse(ws, exc.code, str(exc))
        return
    except SessionNotFound:
        await _refuse(ws, 404, f"no session {session_id!r}")
        return
    player = _Player(ws, StepCursor(store, session_id, start, every), speed, fields)
    tasks = {asyncio.create_task(player.run()), asyncio.create_task(player.receive())}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _refuse(ws: WebSocket, code: int, message: str) -> None:
    await ws.send_text(json.dumps({"error": message, "code": code}))
    await ws.close(code=1008)
