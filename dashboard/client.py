"""The dashboard's HTTP calls to the server (knobs)."""

import os
from typing import Any

import httpx

TIMEOUT_S = 5.0


LIVE_PATH = "/ws/telemetry?bundle=1"


def ws_url(url: str, path: str = LIVE_PATH) -> str:
    """`http://host:port` -> `ws://host:port` + `path` (https -> wss); by default the live
    telemetry in bundles (one message per server burst rather than one per step)."""
    return url.rstrip("/").replace("http", "ws", 1) + path


def _headers() -> dict[str, str]:
    key = os.environ.get("MOESCOPE_ADMIN_KEY") or os.environ.get("MOESCOPE_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def get_knobs(url: str) -> dict[str, Any]:
    """GET /api/knobs: {knobs, version, applied_version, schema}."""
    resp = httpx.get(url.rstrip("/") + "/api/knobs", headers=_headers(), timeout=TIMEOUT_S)
    resp.raise_for_status()
    return resp.json()


def patch_knobs(url: str, changes: dict[str, Any]) -> tuple[bool, str]:
    """PATCH /api/knobs; (True, "applied as version N") or (False, the server's message)."""
    try:
        resp = httpx.patch(url.rstrip("/") + "/api/knobs", params={"origin": "dashboard"},
                           json=changes, headers=_headers(), timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        return False, f"server unreachable: {exc}"
    body = resp.json()
    if resp.status_code == 200:
        return True, f"accepted as version {body['version']}"
    error = body.get("error", {})
    return False, error.get("message") or str(body)


def list_sessions(url: str) -> list[dict[str, Any]]:
    """GET /api/sessions: recorded sessions, newest first."""
    resp = httpx.get(url.rstrip("/") + "/api/sessions", headers=_headers(), timeout=TIMEOUT_S)
    resp.raise_for_status()
    return resp.json()["sessions"]


def _get(url: str, path: str, **params: Any) -> dict[str, Any]:
    resp = httpx.get(url.rstrip("/") + path, params=params, headers=_headers(),
                     timeout=TIMEOUT_S)
    resp.raise_for_status()
    return resp.json()


def get_session(url: str, session_id: str) -> dict[str, Any]:
    """GET /api/sessions/{id}: the summary (mean step ms, request stats, ...)."""
    return _get(url, f"/api/sessions/{session_id}")


def get_steps(url: str, session_id: str, every: int = 1,
              max_steps: int = 20_000) -> list[dict[str, Any]]:
    """GET /api/sessions/{id}/steps, following `next` pages, at most `max_steps` records."""
    out: list[dict[str, Any]] = []
    start: int | None = None
    while len(out) < max_steps:
        params: dict[str, Any] = {"limit": min(10_000, max_steps - len(out)), "every": every}
        if start is not None:
            params["from"] = start
        body = _get(url, f"/api/sessions/{session_id}/steps", **params)
        out.extend(body["steps"])
        start = body["next"]
        if start is None:
            break
    return out


def get_requests(url: str, session_id: str) -> list[dict[str, Any]]:
    """GET /api/sessions/{id}/requests: request records in arrival order."""
    return _get(url, f"/api/sessions/{session_id}/requests")["requests"]
