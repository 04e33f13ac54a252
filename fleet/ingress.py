"""The fleet's one endpoint: a Ray Serve FastAPI ingress in front of the engine replicas.

- `/v1/*`: one replica, picked by the fleet's request router (`fleet/routing.py`).
- `/replicas/{id}/...` (HTTP and websockets): that replica's own server, unchanged (every
  single-server route; the dashboard's Live page points here for one replica).
- `GET /fleet/status`: a row per replica (health, slots, KV, queue, TTFT/TPOT p90, expert
  imbalance, knobs version), the totals and the restarts.
- `GET`/`PATCH /fleet/knobs`, `GET /fleet/knobs/history`: the routing policy (versioned);
  the log of knob changes sent to several replicas (which applied them, at which version).
- `PATCH /api/knobs?replica=ID|all` (default all): engine knobs of one replica or all; each
  replica keeps its own version and history.
- `GET /api/status`, `GET /api/knobs`: with `?replica=ID` that replica's; without, the
  fleet's status / every replica's knobs.
- `WS /ws/telemetry?replica=ID|all` (default all): steps tagged with their `replica`.
- `GET /metrics`: every replica's samples, labelled `replica`.
- anything else (`/api/sessions`, `/ws/replay/...`): `?replica=ID`, else any live replica
  (every replica records into the one database).

A replica that dies with requests in flight fails them with 503 `replica_unavailable`
(a stream already started ends with that error as its last event); Ray Serve starts a
replacement, which registers under a new id; the dead one stays in `/fleet/status` as `dead`.
"""

import asyncio
import hmac
import json
from typing import Any
from urllib.parse import urlencode

import httpx
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle
from starlette.middleware.cors import CORSMiddleware
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from api.errors import error_body
from fleet import state
from fleet.knobs import FleetKnobs
from fleet.metrics_text import merge_metrics
from fleet.registry import registry

STATUS_TIMEOUT_S = 5.0
FORWARDED_HEADERS = ("authorization", "content-type", "accept")

app = FastAPI(title="moescope fleet")
# as the single server: the dashboard's charts read the API from the browser (GET with the key)
app.add_middleware(
    CORSMiddleware, allow_origins=["*"], allow_methods=["GET"], allow_headers=["Authorization"]
)


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


def _stream_wanted(body: bytes) -> bool:
    try:
        request = json.loads(body or b"{}")
    except ValueError:
        return False
    return isinstance(request, dict) and request.get("stream") is True


def _headers(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}


def _query(request: Request) -> str:
    """The query string without `replica`, which the ingress reads."""
    return urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "replica"])


def _token(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token else None


def _died(exc: BaseException) -> str:
    return (
        "the replica serving this request died or became unavailable "
        f"({type(exc).__name__}); Ray Serve restarts it: retry"
    )


async def _relay(gen: Any) -> Any:
    """A replica's stream; if it dies midway, one last SSE event says so."""
    try:
        async for chunk in gen:
            yield chunk
    except (RayError, RayServeException, httpx.HTTPError) as exc:
        yield f"data: {json.dumps(error_body(503, _died(exc)))}\n\n".encode()


def _ws_url(http_url: str, path: str, ws: WebSocket) -> str:
    query = urlencode([(k, v) for k, v in ws.query_params.multi_items() if k != "replica"])
    return "ws" + http_url.removeprefix("http") + path + (f"?{query}" if query else "")


async def _pipe(ws: WebSocket, urls: dict[str, str], tag: bool) -> None:
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


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
@serve.ingress(app)
class FleetIngress:
    def __init__(
        self,
        replicas: DeploymentHandle,
        policy: str = "least_work",
        api_key: str | None = None,
        admin_key: str | None = None,
    ) -> None:
        self.replicas = replicas
        self.knobs = FleetKnobs(policy)
        self.api_key, self.admin_key = api_key, admin_key
        self.client = httpx.AsyncClient(timeout=None)

    # keys: the replicas check their own routes; these guard the fleet's

    def _refusal(self, token: str | None, admin: bool = False) -> JSONResponse | None:
        key = self.admin_key if admin else self.api_key
        accepted = [k for k in (key, None if admin else self.admin_key) if k is not None]
        if key is None or any(token and hmac.compare_digest(token, k) for k in accepted):
            return None
        return refused(401, f"missing or invalid {'admin' if admin else 'API'} key")

    # the replicas

    async def live_replicas(self) -> dict[str, dict[str, Any]]:
        entries: dict[str, dict[str, Any]] = await registry().entries.remote()
        return {rid: e for rid, e in entries.items() if "dead_t" not in e}

    async def replica_url(self, rid: str | None) -> str | JSONResponse:
        live = await self.live_replicas()
        if rid is None:
            if not live:
                return unavailable("no replica is running yet")
            return next(iter(live.values()))["url"]
        if rid not in live:
            known = ", ".join(live) or "none"
            return refused(404, f"replica: no live replica {rid!r}; live: {known}", "replica")
        return str(live[rid]["url"])

    async def _row(self, rid: str, entry: dict[str, Any]) -> dict[str, Any]:
        base = {"replica": rid, "url": entry["url"], "started_t": entry["started_t"]}
        if "dead_t" in entry:
            return {**base, "health": "dead", "dead_t": entry["dead_t"]}
        try:
            reply = await self.client.get(entry["url"] + "/fleet/replica", timeout=STATUS_TIMEOUT_S)
        except httpx.ConnectError:
            await registry().mark_dead.remote(rid)
            return {**base, "health": "dead"}
        except httpx.HTTPError:
            return {**base, "health": "unresponsive"}
        row = reply.json()
        return {**base, **row, "health": "ok" if row["alive"] else "failed"}

    # fleet routes

    @app.get("/fleet/status")
    async def fleet_status(self, request: Request) -> Response:
        """A row per replica (dead ones too), the fleet's totals and its knobs."""
        if (refusal := self._refusal(_token(request))) is not None:
            return refusal
        return JSONResponse(await self.status())

    async def status(self) -> dict[str, Any]:
        entries: dict[str, dict[str, Any]] = await registry().entries.remote()
        rows = await asyncio.gather(*(self._row(rid, e) for rid, e in entries.items()))
        ok = [r for r in rows if r["health"] == "ok"]
        return {
            "replicas": rows,
            "totals": {
                "replicas": len(ok),
                "restarts": sum(r["health"] == "dead" for r in rows),
                "running": sum(r["slots"]["running"] for r in ok),
                "slots": sum(r["slots"]["max"] for r in ok),
                "kv_used": sum(r["kv"]["used"] for r in ok),
                "kv_usable": sum(r["kv"]["usable"] for r in ok),
                "waiting": sum(r["queue"]["waiting"] for r in ok),
                "finished": sum(r["finished"] for r in ok),
            },
            "routing": state.STATE.snapshot(),
            "fleet_knobs": self.knobs.current(),
        }

    @app.get("/fleet/knobs")
    async def get_fleet_knobs(self, request: Request) -> Response:
        """The fleet's knobs (the routing policy) and their version."""
        if (refusal := self._refusal(_token(request))) is not None:
            return refusal
        return JSONResponse(self.knobs.current())

    @app.patch("/fleet/knobs")
    async def patch_fleet_knobs(self, request: Request) -> Response:
        """Change the routing policy: `least_work`, `round_robin` or `power_of_two`."""
        if (refusal := self._refusal(_token(request), admin=True)) is not None:
            return refusal
        try:
            changes = json.loads(await request.body())
            if not isinstance(changes, dict):
                raise ValueError("body: expected a JSON object")
            return JSONResponse(self.knobs.update(changes))
        except ValueError as exc:
            field = str(exc).split(":")[0]
            return refused(422, str(exc), field)

    @app.get("/fleet/knobs/history")
    async def fleet_knob_history(self, request: Request) -> Response:
        """The fleet knobs' changes, and the knob changes sent to several replicas."""
        if (refusal := self._refusal(_token(request))) is not None:
            return refusal
        return JSONResponse(
            {
                "history": list(self.knobs.history),
                "replica_changes": list(self.knobs.replica_changes),
            }
        )

    @app.patch("/api/knobs")
    async def patch_knobs(self, request: Request) -> Response:
        """Engine knobs of `?replica=ID`, or of all replicas (`all`, the default)."""
        target = request.query_params.get("replica", "all")
        live = await self.live_replicas()
        if target != "all" and target not in live:
            return refused(404, f"replica: no live replica {target!r}", "replica")
        chosen = live if target == "all" else {target: live[target]}
        body = await request.body()
        replies = await asyncio.gather(
            *(
                self.client.patch(
                    e["url"] + "/api/knobs",
                    params=_query(request) or None,  # origin, reason
                    content=body,
                    headers=_headers(request),
                )
                for e in chosen.values()
            ),
            return_exceptions=True,
        )
        applied: dict[str, int] = {}
        failed: dict[str, str] = {}
        answers: dict[str, Any] = {}
        for rid, reply in zip(chosen, replies, strict=True):
            if isinstance(reply, BaseException):
                failed[rid] = f"unreachable: {type(reply).__name__}"
                continue
            answers[rid] = reply.json()
            if reply.status_code == 200:
                applied[rid] = answers[rid]["version"]
            else:
                failed[rid] = answers[rid]["error"]["message"]
        if not applied:  # refused everywhere: the replicas' own status and message
            first = next(iter(replies))
            if isinstance(first, httpx.Response):
                return JSONResponse(first.json(), status_code=first.status_code)
            return unavailable("no replica took the change")
        changes = json.loads(body)
        entry = self.knobs.record_replica_change(changes, applied, failed)
        return JSONResponse({**entry, "replicas": answers})

    @app.get("/api/knobs")
    async def get_knobs(self, request: Request) -> Response:
        """`?replica=ID`: that replica's knobs; without: every live replica's that answers."""
        if "replica" in request.query_params:
            return await self.forward(request, "/api/knobs")
        live = await self.live_replicas()
        replies = await asyncio.gather(
            *(
                self.client.get(e["url"] + "/api/knobs", headers=_headers(request))
                for e in live.values()
            ),
            return_exceptions=True,
        )
        answers = {
            rid: r.json()
            for rid, r in zip(live, replies, strict=True)
            if isinstance(r, httpx.Response) and r.status_code == 200
        }
        return JSONResponse({"replicas": answers})

    @app.get("/api/status")
    async def api_status(self, request: Request) -> Response:
        """`?replica=ID`: that replica's status; without: the fleet's (as /fleet/status)."""
        if "replica" in request.query_params:
            return await self.forward(request, "/api/status")
        return await self.fleet_status(request)

    @app.get("/metrics")
    async def metrics(self, request: Request) -> Response:
        """Every live replica's metrics, each sample labelled with its replica."""
        if (refusal := self._refusal(_token(request))) is not None:
            return refusal
        live = await self.live_replicas()
        replies = await asyncio.gather(
            *(
                self.client.get(e["url"] + "/metrics", headers=_headers(request))
                for e in live.values()
            ),
            return_exceptions=True,
        )
        texts = {
            rid: r.text
            for rid, r in zip(live, replies, strict=True)
            if isinstance(r, httpx.Response) and r.status_code == 200
        }
        return PlainTextResponse(merge_metrics(texts), media_type="text/plain; version=0.0.4")

    # the OpenAI routes: through the handle, so the router picks the replica

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"])
    async def openai(self, request: Request, path: str) -> Response:
        body = await request.body()
        args = (request.method, "/v1/" + path, _query(request), _headers(request), body)
        work = work_of(body)
        try:
            if _stream_wanted(body):
                gen: Any = self.replicas.options(stream=True).stream.remote(*args, work=work)
                status, headers = await gen.__anext__()
                return StreamingResponse(_relay(gen), status_code=status, headers=headers)
            status, headers, content = await self.replicas.call.remote(*args, work=work)
        except (RayError, RayServeException, httpx.HTTPError, StopAsyncIteration) as exc:
            return unavailable(_died(exc))
        return Response(content, status_code=status, headers=headers)

    # one replica's own server

    @app.api_route("/replicas/{rid}/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def one_replica(self, request: Request, rid: str, path: str) -> Response:
        url = await self.replica_url(rid)
        if isinstance(url, JSONResponse):
            return url
        return await self._proxy(request, url + "/" + path)

    @app.websocket("/replicas/{rid}/{path:path}")
    async def one_replica_ws(self, ws: WebSocket, rid: str, path: str) -> None:
        url = await self.replica_url(rid)
        await ws.accept()
        if isinstance(url, JSONResponse):
            await ws.send_text(
                json.dumps({"error": json.loads(bytes(url.body))["error"]["message"]})
            )
            await ws.close(code=1008)
            return
        await _pipe(ws, {rid: _ws_url(url, "/" + path, ws)}, tag=False)

    @app.websocket("/ws/telemetry")
    async def telemetry(self, ws: WebSocket) -> None:
        """`?replica=ID|all` (default all): steps tagged with their replica."""
        await ws.accept()
        target = ws.query_params.get("replica", "all")
        live = await self.live_replicas()
        if target != "all" and target not in live:
            await ws.send_text(json.dumps({"error": f"replica: no live replica {target!r}"}))
            await ws.close(code=1008)
            return
        chosen = live if target == "all" else {target: live[target]}
        urls = {rid: _ws_url(e["url"], "/ws/telemetry", ws) for rid, e in chosen.items()}
        await _pipe(ws, urls, tag=True)

    @app.websocket("/ws/{path:path}")
    async def other_ws(self, ws: WebSocket, path: str) -> None:
        url = await self.replica_url(ws.query_params.get("replica"))
        await ws.accept()
        if isinstance(url, JSONResponse):
            await ws.send_text(
                json.dumps({"error": json.loads(bytes(url.body))["error"]["message"]})
            )
            await ws.close(code=1008)
            return
        await _pipe(ws, {"": _ws_url(url, "/ws/" + path, ws)}, tag=False)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def anything_else(self, request: Request, path: str) -> Response:
        return await self.forward(request, "/" + path)

    async def forward(self, request: Request, path: str) -> Response:
        url = await self.replica_url(request.query_params.get("replica"))
        if isinstance(url, JSONResponse):
            return url
        return await self._proxy(request, url + path)

    async def _proxy(self, request: Request, url: str) -> Response:
        try:
            reply = await self.client.request(
                request.method,
                url,
                params=_query(request) or None,
                headers=_headers(request),
                content=await request.body(),
            )
        except httpx.HTTPError as exc:
            return unavailable(f"replica unreachable: {type(exc).__name__}")
        headers = {
            k: v
            for k, v in reply.headers.items()
            if k.lower()
            not in ("content-length", "transfer-encoding", "content-encoding", "connection")
        }
        return Response(reply.content, status_code=reply.status_code, headers=headers)
