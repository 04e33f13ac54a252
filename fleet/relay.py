"""How the ingress passes requests on to a replica's own server: the forwarded headers and
query, the work a completion asks (for the router), its stream relayed in whole events, and
websockets piped both ways (tagged with their replica when several are merged)."""

import asyncio
import json
from typing import Any
from urllib.parse import urlencode

import httpx
from fastapi import Request, WebSocket
from fastapi.responses import JSONResponse
from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from api.errors import error_body

FORWARDED_HEADERS = ("authorization", "content-type", "accept")


def unavailable(message: str) -> JSONResponse:
    return JSONResponse(error_body(503, message) | {"replica_unavailable": True}, status_code=503)


def refused(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)


def work_of(body: bytes) -> int:
    """The tokens a completion asks of its replica, for the router: its prompt (token ids
    counted, text by its UTF-8 length, a byte-level tokenizer's count) plus max_tokens."""
    try:
        request = json.loads(body or b"{}")
    except ValueError:
        return 1
    if not isinstance(request, dict):
        return 1
    prompt: Any = request.get("prompt") or [
        m.get("content") for m in request.get("messages") or [] if isinstance(m, dict)
    ]
    max_tokens = request.get("max_tokens") or request.get("max_completion_tokens") or 16
    return _length(prompt) + (max_tokens if isinstance(max_tokens, int) else 16)


def _length(prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(prompt.encode())
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        return sum(_length(p) for p in prompt)
    return 0


def stream_wanted(body: bytes) -> bool:
    try:
        request = json.loads(body or b"{}")
    except ValueError:
        return False
    return isinstance(request, dict) and request.get("stream") is True


def forwarded_headers(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}


def query_of(request: Request) -> str:
    """The query string without `replica`, which the ingress reads."""
    return urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "replica"])


def token_of(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token else None


def died(exc: BaseException) -> str:
    return (
        "the replica serving this request died or became unavailable "
        f"({type(exc).__name__}); Ray Serve restarts it: retry"
    )


async def relay(gen: Any) -> Any:
    """A replica's stream, passed on in whole SSE events; if the replica dies midway, the event
    it had begun is dropped and one last event says so."""
    pending = b""
    try:
        async for chunk in gen:
            pending += chunk
            end = pending.rfind(b"\n\n") + 2
            if end > 1:
                yield pending[:end]
                pending = pending[end:]
        if pending:  # not an event stream (an error's JSON body)
            yield pending
    except (RayError, RayServeException, httpx.HTTPError) as exc:
        error = error_body(503, died(exc)) | {"replica_unavailable": True}
        yield f"data: {json.dumps(error)}\n\n".encode()


def ws_url(http_url: str, path: str, ws: WebSocket) -> str:
    query = urlencode([(k, v) for k, v in ws.query_params.multi_items() if k != "replica"])
    return "ws" + http_url.removeprefix("http") + path + (f"?{query}" if query else "")


async def pipe(ws: WebSocket, urls: dict[str, str], tag: bool) -> None:
    """Relay each replica websocket's messages to `ws` (with `replica` added when `tag`) until
    the client leaves; messages the client sends go to every replica."""
    headers = {k: v for k, v in ws.headers.items() if k.lower() == "authorization"}
    upstreams = []
    try:
        for rid, url in urls.items():
            upstreams.append((rid, await connect(url, additional_headers=headers)))
    except (OSError, WebSocketException) as exc:
        await ws.send_text(json.dumps({"error": f"replica unreachable: {type(exc).__name__}"}))
        await ws.close(code=1011)
        for _, up in upstreams:
            await up.close()
        return

    async def down(rid: str, up: Any) -> None:
        async for message in up:
            if tag:
                message = _tagged(message, rid)
            await ws.send_text(message if isinstance(message, str) else message.decode())

    async def upward() -> None:
        while (msg := await ws.receive())["type"] != "websocket.disconnect":
            if msg.get("text") is not None:
                for _, up in upstreams:
                    await up.send(msg["text"])

    client = asyncio.create_task(upward())
    tasks = [client, *(asyncio.create_task(down(rid, up)) for rid, up in upstreams)]
    pending = set(tasks)
    try:
        # until the client leaves or every replica's stream ended (one that dies leaves the
        # others streaming; its replacement joins a new connection)
        while client in pending and len(pending) > 1:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, up in upstreams:
            await up.close()


def _tagged(message: str | bytes, rid: str) -> str:
    data = json.loads(message)
    if isinstance(data, list):
        for record in data:
            record["replica"] = rid
    elif isinstance(data, dict):
        data["replica"] = rid
    return json.dumps(data)
