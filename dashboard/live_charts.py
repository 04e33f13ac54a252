"""The live-charts component: the Live, Replay and Compare pages' panels, drawn in the browser.

A Streamlit custom component (components v1, plain files in `live_charts_web/`, no build
step). The browser opens the telemetry websocket itself (or, for Compare, reads recorded
sessions' steps from their HTTP route), keeps its own rolling window and redraws with
plotly.js; it also reads the reports below the charts (dashboard/reports.py) from the
server's HTTP routes. Python only sends the arguments once per page run, so no frame and no
report passes through the dashboard's server. plotly.js is the copy inside the
installed `plotly` package, served by Streamlit as a second component's folder, PLOTLY_JS
(nothing comes from a CDN); index.html names it.
"""

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import plotly
import streamlit.components.v1 as components

from dashboard.client import ws_url
from dashboard.reports import Report

WEB = Path(__file__).with_name("live_charts_web")
PLOTLY = Path(plotly.__file__).with_name("package_data")

_charts = components.declare_component("live_charts", path=str(WEB))
# never drawn: its folder is served, at /component/<its name>/
PLOTLY_JS = components.declare_component("plotly_js", path=str(PLOTLY)).name


def browser_token() -> str:
    """The key the browser's websocket sends: the API key, else the admin key (which the
    server accepts everywhere); empty when none is set."""
    return os.environ.get("MOESCOPE_API_KEY") or os.environ.get("MOESCOPE_ADMIN_KEY") or ""


def live_charts(
    url: str,
    path: str,
    key: str,
    max_steps: int,
    shown: int,
    reports: list[Report],
    **replay: Any,
) -> None:
    """The panels for the websocket at `url` + `path` (ws://, with the browser's token),
    keeping `max_steps` steps and showing the last `shown`, and below them `reports` (read
    from their routes with the same token). `replay` (speeds, speed, nonce) adds the replay
    controls; a new nonce starts the replay over."""
    _charts(
        source=ws_url(url, path),
        token=browser_token(),
        max_steps=max_steps,
        shown=shown,
        reports=reports,
        replay=bool(replay),
        **replay,
        key=key,
        default=None,
    )


def recorded_charts(
    url: str,
    sessions: Sequence[tuple[str, str]],
    key: str,
    max_steps: int,
    panels: Sequence[str],
) -> None:
    """The `panels` (names in live_charts_web/panels.js) of recorded sessions side by side, a
    column for each (session id, title) of `sessions`, over its first `max_steps` steps, which
    the browser reads page by page from GET /api/sessions/{id}/steps at `url` (with its
    token); no websocket, no controls but the steps shown. One component for all of them:
    plotly.js loads once."""
    root = url.rstrip("/")
    _charts(
        sources=[f"{root}/api/sessions/{quote(sid, safe='')}/steps" for sid, _ in sessions],
        titles=[title for _, title in sessions],
        recorded=True,
        token=browser_token(),
        max_steps=max_steps,
        shown=max_steps,
        reports=[],
        panels=list(panels),
        replay=False,
        key=key,
        default=None,
    )


def band_charts(rows: list[dict[str, Any]], key: str) -> None:
    """The what-if preview's bands (dashboard.whatif_view.band_rows), drawn in the browser."""
    _charts(bands=rows, reports=[], key=key, default=None)
