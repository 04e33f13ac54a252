"""The fleet's one endpoint: a Ray Serve FastAPI ingress in front of the engine replicas.

- `/v1/*`: one replica, picked by the fleet's request router (`fleet/routing.py`).
- `/replicas/{id}/...` (HTTP and websockets): that replica's own server, unchanged (every
  single-server route; the dashboard's Live page points here for one replica).
- `GET /fleet/status`: a row per replica slot (health, slots, KV, queue, TTFT/TPOT p90, expert
  imbalance, knobs version, restarts), the totals.
- `GET`/`PATCH /fleet/knobs`, `GET /fleet/knobs/history`: the routing policy (versioned);
  the log of knob changes sent to several replicas (which applied them, at which version).
- `PATCH /api/knobs?replica=ID|all` (default all): engine knobs of one replica or all; each
  replica keeps its own version and history.
- `PUT /api/autopilot?replica=ID|all` (default all): the autopilot's settings; each replica
  runs its own on its own engine.
- `GET /api/status`, `GET /api/knobs`, `GET /api/autopilot`: with `?replica=ID` that
  replica's; without, the fleet's status / every replica's knobs / autopilot.
- `GET /fleet/sessions`: the recorded sessions grouped by fleet run, each naming its replica.
- `WS /ws/telemetry?replica=ID|all` (default all): steps tagged with their `replica`.
- `GET /metrics`: every replica's samples, labelled `replica`.
- anything else (`/api/sessions`, `/ws/replay/...`, `/api/whatif`): `?replica=ID`, else any
  live replica (every replica records into the one database); a rerun or a what-if runs on
  the engine of the replica it reaches.

A replica that dies with requests in flight fails them with 503 `replica_unavailable`
(a stream already started ends with that error as its last event); Ray Serve starts a
replacement under a new id in the dead one's slot: `/fleet/status` has a row per slot, `dead`
until the replacement registers, then the replacement's with the slot's `restarts` and the
`previous` ids.
"""

import asyncio
import hmac
import json
from typing import Any

import httpx
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle
from starlette.middleware.cors import CORSMiddleware

from fleet import state
from fleet.knobs import FleetKnobs
from fleet.metrics_text import merge_metrics
from fleet.registry import registry
from fleet.relay import (
    died,
    forwarded_headers,
    pipe,
    query_of,
    refused,
    relay,
    stream_wanted,
    token_of,
    unavailable,
    work_of,
    ws_url,
)

STATUS_TIMEOUT_S = 5.0
SESSION_FILTERS = ("fleet_run", "replica", "limit", "offset")  # of GET /fleet/sessions

app = FastAPI(title="moescope fleet")
# as the single server: the dashboard's charts read the API from the browser (GET with the key)
app.add_middleware(
    CORSMiddleware, allow_origins=["*"], allow_methods=["GET"], allow_headers=["Authorization"]
)


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
        base = {
            "replica": rid,
            **{k: entry[k] for k in ("slot", "restarts", "previous", "url", "started_t")},
        }
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
        """A row per replica slot (dead until replaced), the fleet's totals and its knobs."""
        if (refusal := self._refusal(token_of(request))) is not None:
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
                "restarts": sum(r["restarts"] for r in rows),
                "dead": sum(r["health"] == "dead" for r in rows),
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
        if (refusal := self._refusal(token_of(request))) is not None:
            return refusal
        return JSONResponse(self.knobs.current())

    @app.patch("/fleet/knobs")
    async def patch_fleet_knobs(self, request: Request) -> Response:
        """Change the routing policy: `least_work`, `round_robin` or `power_of_two`."""
        if (refusal := self._refusal(token_of(request), admin=True)) is not None:
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
        if (refusal := self._refusal(token_of(request))) is not None:
            return refusal
        return JSONResponse(
            {
                "history": list(self.knobs.history),
                "replica_changes": list(self.knobs.replica_changes),
            }
        )

    async def chosen(self, request: Request) -> dict[str, dict[str, Any]] | JSONResponse:
        """The live replicas `?replica=ID|all` (default all) names; 404 for an unknown one."""
        target = request.query_params.get("replica", "all")
        live = await self.live_replicas()
        if target != "all" and target not in live:
            return refused(404, f"replica: no live replica {target!r}", "replica")
        return live if target == "all" else {target: live[target]}

    async def each(
        self, request: Request, path: str, chosen: dict[str, dict[str, Any]], body: bytes = b""
    ) -> dict[str, httpx.Response | BaseException]:
        """`request`'s method on `path` of every chosen replica at once: each one's reply."""
        replies = await asyncio.gather(
            *(
                self.client.request(
                    request.method,
                    e["url"] + path,
                    params=query_of(request) or None,
                    content=body,
                    headers=forwarded_headers(request),
                )
                for e in chosen.values()
            ),
            return_exceptions=True,
        )
        return dict(zip(chosen, replies, strict=True))

    async def change_each(
        self, request: Request, path: str
    ) -> tuple[dict[str, Any], dict[str, str]] | Response:
        """Send `request` (a change) to `?replica=ID|all`: the answers of the replicas that
        took it and the reasons of those that did not; refused by all, the first refusal."""
        chosen = await self.chosen(request)
        if isinstance(chosen, JSONResponse):
            return chosen
        replies = await self.each(request, path, chosen, await request.body())
        answers: dict[str, Any] = {}
        failed: dict[str, str] = {}
        for rid, reply in replies.items():
            if isinstance(reply, BaseException):
                failed[rid] = f"unreachable: {type(reply).__name__}"
            elif reply.status_code == 200:
                answers[rid] = reply.json()
            else:
                failed[rid] = reply.json()["error"]["message"]
        if not answers:  # refused everywhere: the replicas' own status and message
            first = next(iter(replies.values()), None)
            if isinstance(first, httpx.Response):
                return JSONResponse(first.json(), status_code=first.status_code)
            return unavailable("no replica took the change")
        return answers, failed

    async def get_each(self, request: Request, path: str) -> Response:
        """`?replica=ID`: that replica's `path`; without: every live replica's that answers."""
        if "replica" in request.query_params:
            return await self.forward(request, path)
        replies = await self.each(request, path, await self.live_replicas())
        answers = {
            rid: r.json()
            for rid, r in replies.items()
            if isinstance(r, httpx.Response) and r.status_code == 200
        }
        return JSONResponse({"replicas": answers})

    @app.patch("/api/knobs")
    async def patch_knobs(self, request: Request) -> Response:
        """Engine knobs of `?replica=ID`, or of all replicas (`all`, the default)."""
        outcome = await self.change_each(request, "/api/knobs")
        if isinstance(outcome, Response):
            return outcome
        answers, failed = outcome
        applied = {rid: answer["version"] for rid, answer in answers.items()}
        changes = json.loads(await request.body())
        entry = self.knobs.record_replica_change(changes, applied, failed)
        return JSONResponse({**entry, "replicas": answers})

    @app.get("/api/knobs")
    async def get_knobs(self, request: Request) -> Response:
        """`?replica=ID`: that replica's knobs; without: every live replica's that answers."""
        return await self.get_each(request, "/api/knobs")

    @app.put("/api/autopilot")
    async def put_autopilot(self, request: Request) -> Response:
        """Autopilot settings of `?replica=ID`, or of all replicas (`all`, the default): each
        replica runs its own autopilot on its own engine."""
        outcome = await self.change_each(request, "/api/autopilot")
        if isinstance(outcome, Response):
            return outcome
        answers, failed = outcome
        return JSONResponse({"replicas": answers, "failed": failed})

    @app.get("/api/autopilot")
    async def get_autopilot(self, request: Request) -> Response:
        """`?replica=ID`: that replica's autopilot; without: every live replica's."""
        return await self.get_each(request, "/api/autopilot")

    @app.get("/fleet/sessions")
    async def fleet_sessions(self, request: Request) -> Response:
        """The recorded sessions in the one database grouped by fleet run (newest first), each
        naming its replica; `fleet_run`, `replica`, `limit` and `offset` as on /api/sessions."""
        if (refusal := self._refusal(token_of(request))) is not None:
            return refusal
        url = await self.replica_url(None)
        if isinstance(url, JSONResponse):
            return url
        params = {k: v for k, v in request.query_params.items() if k in SESSION_FILTERS}
        try:
            reply = await self.client.get(
                url + "/api/sessions", params=params, headers=forwarded_headers(request)
            )
        except httpx.HTTPError as exc:
            return unavailable(f"replica unreachable: {type(exc).__name__}")
        if reply.status_code != 200:
            return JSONResponse(reply.json(), status_code=reply.status_code)
        runs: dict[str | None, list[dict[str, Any]]] = {}
        for session in reply.json()["sessions"]:
            runs.setdefault(session["fleet_run"], []).append(session)
        return JSONResponse(
            {
                "fleet_run": await registry().run.remote(),
                "runs": [
                    {
                        "fleet_run": run,
                        "replicas": sorted({s["replica"] for s in sessions if s["replica"]}),
                        "sessions": sessions,
                    }
                    for run, sessions in runs.items()
                ],
            }
        )

    @app.get("/api/status")
    async def api_status(self, request: Request) -> Response:
        """`?replica=ID`: that replica's status; without: the fleet's (as /fleet/status)."""
        if "replica" in request.query_params:
            return await self.forward(request, "/api/status")
        return await self.fleet_status(request)

    @app.get("/metrics")
    async def metrics(self, request: Request) -> Response:
        """Every live replica's metrics, each sample labelled with its replica."""
        if (refusal := self._refusal(token_of(request))) is not None:
            return refusal
        replies = await self.each(request, "/metrics", await self.live_replicas())
        texts = {
            rid: r.text
            for rid, r in replies.items()
            if isinstance(r, httpx.Response) and r.status_code == 200
        }
        return PlainTextResponse(merge_metrics(texts), media_type="text/plain; version=0.0.4")

    # the OpenAI routes: through the handle, so the router picks the replica

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"])
    async def openai(self, request: Request, path: str) -> Response:
        body = await request.body()
        args = (request.method, "/v1/" + path, query_of(request), forwarded_headers(request), body)
        work = work_of(body)
        try:
            if stream_wanted(body):
                gen: Any = self.replicas.options(stream=True).stream.remote(*args, work=work)
                status, headers = await gen.__anext__()
                return StreamingResponse(relay(gen), status_code=status, headers=headers)
            status, headers, content = await self.replicas.call.remote(*args, work=work)
        except (RayError, RayServeException, httpx.HTTPError, StopAsyncIteration) as exc:
            return unavailable(died(exc))
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
        await pipe(ws, {rid: ws_url(url, "/" + path, ws)}, tag=False)

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
        urls = {rid: ws_url(e["url"], "/ws/telemetry", ws) for rid, e in chosen.items()}
        await pipe(ws, urls, tag=True)

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
        await pipe(ws, {"": ws_url(url, "/ws/" + path, ws)}, tag=False)

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
                params=query_of(request) or None,
                headers=forwarded_headers(request),
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
