"""The Compare page: two recorded sessions (e.g. an original and its rerun) side by side.

The table compares their summaries (dashboard/compare.py); below it, the live-charts
component draws the same panels for each session, A's column left of B's, over its first
MAX_CHART_STEPS steps, which the browser reads from the server itself."""

from typing import Any

import streamlit as st

from dashboard.client import get_requests, get_session, get_steps
from dashboard.compare import delta_rows, summarize
from dashboard.live_charts import recorded_charts
from dashboard.session_picker import recorded_sessions

MAX_CHART_STEPS = 3000
# the component's panels (live_charts_web/panels.js), one a row in each session's column
CHARTS = ("throughput", "latency", "step_time", "queues", "imbalance", "kv")


def _label(s: dict[str, Any]) -> str:
    name = s.get("label") or s.get("kind", "")
    return f"{s['id']} · {name} · {s.get('steps', '?')} steps · {s.get('requests', '?')} req"


@st.cache_data(ttl=5, show_spinner="loading session…")
def load(
    url: str, session_id: str
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The session's summary, its first MAX_CHART_STEPS steps and its requests."""
    return (
        get_session(url, session_id),
        get_steps(url, session_id, max_steps=MAX_CHART_STEPS),
        get_requests(url, session_id),
    )


def default_pair(sessions: list[dict[str, Any]]) -> tuple[int, int]:
    """Indices of A and B: the newest rerun and its parent, else the two newest sessions."""
    ids = [s["id"] for s in sessions]
    for i, s in enumerate(sessions):
        if s.get("parent") in ids:
            return ids.index(s["parent"]), i
    return (1, 0) if len(sessions) > 1 else (0, 0)


def page() -> None:
    url = st.session_state["url"]
    sessions = recorded_sessions(url)
    if sessions is None:
        return
    a_idx, b_idx = default_pair(sessions)
    with st.sidebar:
        a = st.selectbox("session A", sessions, index=a_idx, format_func=_label, key="cmp_a")
        b = st.selectbox("session B", sessions, index=b_idx, format_func=_label, key="cmp_b")
    try:
        sess_a, steps_a, reqs_a = load(url, a["id"])
        sess_b, steps_b, reqs_b = load(url, b["id"])
    except Exception as exc:  # noqa: BLE001 - shown on the page
        st.error(f"cannot load sessions: {exc}")
        return
    sum_a, sum_b = summarize(sess_a, steps_a, reqs_a), summarize(sess_b, steps_b, reqs_b)
    st.subheader(f"A: {_label(a)}  vs  B: {_label(b)}")
    st.dataframe(delta_rows(sum_a, sum_b), hide_index=True, key="cmp_table")
    for side, s in (("A", sess_a), ("B", sess_b)):
        if s.get("steps", 0) > MAX_CHART_STEPS:
            st.caption(
                f"{side}: charts and imbalance show the first {MAX_CHART_STEPS} of "
                f"{s['steps']} steps"
            )
    for side, steps in (("A", steps_a), ("B", steps_b)):
        if not steps:
            st.info(f"{side}: no steps recorded")
    recorded_charts(
        url,
        [(a["id"], f"A: {a['id']}"), (b["id"], f"B: {b['id']}")],
        key="cmp_charts",
        max_steps=MAX_CHART_STEPS,
        panels=CHARTS,
    )
