"""The dashboard's HTTP calls to the server (knobs)."""

import os
from typing import Any

import httpx

TIMEOUT_S = 5.0


def ws_url(url: str, path: str = "/ws/telemetry") -> str:
    """`http://host:port` -> `ws://host:port/ws/telemetry` (https -> wss)."""
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
