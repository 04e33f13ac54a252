"""The dashboard's HTTP calls to the server (knobs, expert placement, sessions, what-if,
the autopilot's settings)."""

import os
from typing import Any

import httpx

TIMEOUT_S = 5.0
# one client for every call: httpx.get would build a new client, TLS context included, each
# time (tens of milliseconds of CPU, more than the call itself), and reconnect
_http = httpx.Client(timeout=TIMEOUT_S)

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
    resp = _http.get(url.rstrip("/") + "/api/knobs", headers=_headers(), timeout=TIMEOUT_S)
    resp.raise_for_status()
    return resp.json()


def patch_knobs(url: str, changes: dict[str, Any]) -> tuple[bool, str]:
    """PATCH /api/knobs; (True, "applied as version N") or (False, the server's message)."""
    try:
        resp = _http.patch(
            url.rstrip("/") + "/api/knobs",
            params={"origin": "dashboard"},
            json=changes,
            headers=_headers(),
            timeout=TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        return False, f"server unreachable: {exc}"
    if resp.status_code == 200:
        return True, f"accepted as version {resp.json()['version']}"
    return False, _error(resp)


def _error(resp: httpx.Response) -> str:
    """The server's message from an `{"error": {"message": ...}}` body, else the raw body."""
    try:
        body = resp.json()
    except ValueError:
        return f"HTTP {resp.status_code}: {resp.text[:200]}"
    error = body.get("error") if isinstance(body, dict) else None
    return (error.get("message") if isinstance(error, dict) else None) or str(body)


def get_experts(url: str) -> dict[str, Any]:
    """GET /api/experts: {ep_size, mode, version, placement[layer][rank] -> experts}."""
    resp = _http.get(url.rstrip("/") + "/api/experts", headers=_headers(), timeout=TIMEOUT_S)
    resp.raise_for_status()
    return resp.json()


def rebalance_experts(url: str, window: int, replicas: int) -> tuple[bool, str]:
    """POST /api/experts/rebalance; (True, what changed) or (False, the server's message)."""
    try:
        resp = _http.post(
            url.rstrip("/") + "/api/experts/rebalance",
            json={"window": window, "replicas": replicas},
            headers=_headers(),
            timeout=TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        return False, f"server unreachable: {exc}"
    if resp.status_code != 200:
        return False, _error(resp)
    body = resp.json()
    try:
        return True, (
            f"placement v{body['placement_version']}: predicted imbalance "
            f"{body['imbalance_before']:.2f} → {body['imbalance_after']:.2f} "
            f"(loads of {body['window_steps']} steps, {body['replicas']} replicas, "
            f"{body['moved_bytes']:,} bytes of weights moved)"
        )
    except (KeyError, TypeError, ValueError):
        return True, f"rebalanced: {body}"


def list_sessions(url: str) -> list[dict[str, Any]]:
    """GET /api/sessions: recorded sessions, newest first."""
    resp = _http.get(url.rstrip("/") + "/api/sessions", headers=_headers(), timeout=TIMEOUT_S)
    resp.raise_for_status()
    return resp.json()["sessions"]


def _get(url: str, path: str, **params: Any) -> dict[str, Any]:
    resp = _http.get(url.rstrip("/") + path, params=params, headers=_headers(), timeout=TIMEOUT_S)
    resp.raise_for_status()
    return resp.json()


def get_status(url: str) -> dict[str, Any]:
    """GET /api/status: the model and engine configs, KV bytes per token, knobs, limits."""
    return _get(url, "/api/status")


def get_session(url: str, session_id: str) -> dict[str, Any]:
    """GET /api/sessions/{id}: the summary (mean step ms, request stats, ...)."""
    return _get(url, f"/api/sessions/{session_id}")


def get_steps(
    url: str, session_id: str, every: int = 1, max_steps: int = 20_000
) -> list[dict[str, Any]]:
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


WHATIF_TIMEOUT_S = 30.0  # a simulation of the horizon runs on the server


def preview_knobs(url: str, changes: dict[str, Any], horizon_s: float) -> tuple[bool, Any]:
    """POST /api/whatif on the live engine: (True, the twin's answer: current and candidate
    side by side, with the fit error) or (False, the server's message)."""
    try:
        resp = _http.post(
            url.rstrip("/") + "/api/whatif",
            json={"knobs": changes, "source": "live", "horizon_s": horizon_s},
            headers=_headers(),
            timeout=WHATIF_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        return False, f"server unreachable: {exc}"
    return (True, resp.json()) if resp.status_code == 200 else (False, _error(resp))


def get_scorecard(url: str, limit: int = 20) -> list[dict[str, Any]]:
    """GET /api/whatif/scorecard: applied knob changes, each predicted then observed."""
    return _get(url, "/api/whatif/scorecard", limit=limit)["entries"]


def get_autopilot(url: str) -> tuple[bool, Any]:
    """GET /api/autopilot: (True, its settings, state and decisions) or (False, the server's
    message)."""
    try:
        resp = _http.get(
            url.rstrip("/") + "/api/autopilot",
            params={"history": 0},
            headers=_headers(),
            timeout=TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        return False, f"server unreachable: {exc}"
    return (True, resp.json()) if resp.status_code == 200 else (False, _error(resp))


def put_autopilot(url: str, changes: dict[str, Any]) -> tuple[bool, str]:
    """PUT /api/autopilot with some settings; (True, the state now) or (False, the message)."""
    try:
        resp = _http.put(
            url.rstrip("/") + "/api/autopilot", json=changes, headers=_headers(), timeout=TIMEOUT_S
        )
    except httpx.HTTPError as exc:
        return False, f"server unreachable: {exc}"
    if resp.status_code == 200:
        body = resp.json()
        on = "on" if body["settings"]["enabled"] else "off"
        return True, f"autopilot {on}: {body['state']}"
    return False, _error(resp)
