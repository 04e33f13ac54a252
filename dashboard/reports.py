"""The reports the live-charts component reads from the server's HTTP routes in the browser
(live_charts_web/reports.js): the "Why slow?" attribution and the autopilot's state, each
with its URL, how often to ask, and the words around it."""

import math
from typing import Any
from urllib.parse import urlencode

WINDOW_S = 60.0  # the live attribution's window
BUCKET_S = 5.0
RECENT = 50  # requests in the waterfall
ATTRIBUTION_S = 10.0  # the server attributes the whole window on every call
SESSION_BUCKETS = 40  # bars over a recorded session, whatever its length
AUTOPILOT_S = 2.0  # the autopilot itself looks every 2 s by default
AUTOPILOT_HISTORY = 300  # measurements on its SLO chart

Report = dict[str, Any]


def route(url: str, path: str, **params: Any) -> str:
    return f"{url.rstrip('/')}{path}?{urlencode(params)}"


def why_slow_live(url: str) -> Report:
    """The live window's causes, asked for every ATTRIBUTION_S."""
    return {
        "name": "why_slow",
        "title": "Why slow?",
        "url": route(url, "/api/attribution", window_s=WINDOW_S, bucket_s=BUCKET_S, recent=RECENT),
        "every_s": ATTRIBUTION_S,
        "scope": f"ended in the last {WINDOW_S:g} s",
    }


def why_slow_session(url: str, session: dict[str, Any]) -> Report:
    """A recorded session's causes (a GET /api/sessions entry), asked for once, its buckets
    fitted to its length."""
    bucket_s = max(1.0, math.ceil((session.get("duration_s") or 0.0) / SESSION_BUCKETS))
    path = f"/api/sessions/{session['id']}/attribution"
    return {
        "name": "why_slow",
        "title": "Why slow?",
        "url": route(url, path, bucket_s=bucket_s, recent=RECENT),
        "every_s": 0,
        "scope": "in the session",
    }


def autopilot(url: str) -> Report:
    """The autopilot's state, SLO chart and decisions, asked for every AUTOPILOT_S."""
    return {
        "name": "autopilot",
        "title": "Autopilot",
        "url": route(url, "/api/autopilot", history=AUTOPILOT_HISTORY),
        "every_s": AUTOPILOT_S,
        "scope": "",
    }
