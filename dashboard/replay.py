"""The replay page: play a recorded session through /ws/replay with the live page's charts."""

from typing import Any

import streamlit as st

from dashboard import why_slow_panel
from dashboard.client import ws_url
from dashboard.live import REFRESH_S, draw_charts
from dashboard.session_picker import recorded_sessions
from dashboard.stream import TelemetryStream
from dashboard.window import StepWindow

SPEEDS = (0.5, 1.0, 2.0, 5.0, 20.0, 0.0)
MAX_WINDOW = 2000


def _label(s: dict[str, Any]) -> str:
    return f"{s['id']} · {s.get('label') or s.get('kind', '')} · {s.get('steps', '?')} steps"


def _open(url: str, session: str, speed: float) -> TelemetryStream:
    old: TelemetryStream | None = st.session_state.get("replay_stream")
    if old is not None:
        old.stop()
    stream = TelemetryStream(
        ws_url(url, f"/ws/replay/{session}?speed={speed}"),
        maxlen=MAX_WINDOW,
        window=StepWindow(MAX_WINDOW),
    ).start()
    st.session_state["replay_stream"] = stream
    return stream


def controls(stream: TelemetryStream) -> None:
    cols = st.columns(4)
    if cols[0].button("Pause", key="replay_pause"):
        stream.send({"op": "pause"})
    if cols[1].button("Resume", key="replay_resume"):
        stream.send({"op": "resume"})
    step = cols[2].number_input("seek to step", min_value=0, value=0, step=1, key="replay_step")
    if cols[3].button("Seek", key="replay_seek"):
        stream.send({"op": "seek", "step": int(step)}, clear=True)


@st.fragment(run_every=REFRESH_S)
def replay_view(stream: TelemetryStream, window: int) -> None:
    view = stream.view(window)
    state = (stream.replay or {}).get("state", "playing" if len(view) else stream.state)
    cols = st.columns(3)
    cols[0].metric("replay", state)
    cols[1].metric("step", view.latest["step"] if view.latest else "–")
    cols[2].metric("steps received", stream.received)
    if stream.error:
        st.error(stream.error)
    if len(view):
        draw_charts(view)


def page() -> None:
    url = st.session_state["url"]
    sessions = recorded_sessions(url)
    if sessions is None:
        return
    with st.sidebar:
        chosen = st.selectbox("session", sessions, format_func=_label, key="replay_session")
        speed = st.selectbox(
            "speed",
            SPEEDS,
            index=1,
            key="replay_speed",
            format_func=lambda s: f"{s:g}x" if s else "as fast as possible",
        )
        window = st.slider("steps shown", 50, MAX_WINDOW, 600, step=50, key="replay_window")
        play = st.button("Play", type="primary", key="replay_play")
    stream: TelemetryStream | None = st.session_state.get("replay_stream")
    if play:
        stream = _open(url, chosen["id"], speed)
        st.session_state["replayed"] = chosen
    if stream is None:
        st.info("choose a session and press Play")
        return
    controls(stream)
    replay_view(stream, window)
    why_slow_panel.recorded(url, st.session_state["replayed"])
