"""The replay page: a recorded session played through /ws/replay into the live page's
charts (the live-charts component); its pause / resume / seek / speed controls send the
websocket's ops from the browser."""

from typing import Any

import streamlit as st

from dashboard import reports
from dashboard.live_charts import live_charts
from dashboard.session_picker import recorded_sessions

SPEEDS = (0.5, 1.0, 2.0, 5.0, 20.0, 0.0)
MAX_WINDOW = 2000  # steps the browser keeps
SHOWN = 600  # steps shown at first


def _label(s: dict[str, Any]) -> str:
    return f"{s['id']} · {s.get('label') or s.get('kind', '')} · {s.get('steps', '?')} steps"


def _speed(s: float) -> str:
    return f"{s:g}x" if s else "as fast as possible"


def page() -> None:
    url = st.session_state["url"]
    sessions = recorded_sessions(url)
    if sessions is None:
        return
    with st.sidebar:
        chosen = st.selectbox("session", sessions, format_func=_label, key="replay_session")
        speed = st.selectbox("speed", SPEEDS, index=1, key="replay_speed", format_func=_speed)
        if st.button("Play", type="primary", key="replay_play"):
            # a new play: the component starts over even on the same session and speed
            st.session_state["replayed"] = (chosen, speed)
            st.session_state["replay_plays"] = st.session_state.get("replay_plays", 0) + 1
    if "replayed" not in st.session_state:
        st.info("choose a session and press Play")
        return
    session, played_speed = st.session_state["replayed"]
    live_charts(
        url,
        f"/ws/replay/{session['id']}?speed={played_speed}",
        key="replay_charts",
        max_steps=MAX_WINDOW,
        shown=SHOWN,
        speeds=SPEEDS,
        speed=played_speed,
        reports=[reports.why_slow_session(url, session)],
        nonce=st.session_state["replay_plays"],
    )
