"""The live page: telemetry charts refreshed at ~2 Hz and a knob panel in the sidebar."""

from typing import Any

import streamlit as st

from dashboard import charts
from dashboard.client import get_knobs, patch_knobs, ws_url
from dashboard.stream import CONNECTED, TelemetryStream

REFRESH_S = 0.5
PANELS = (("batch", "usage"), ("kv", "queues"), ("experts", "imbalance"),
          ("latency", "throughput"), ("step_time", "a2a"))


def stream_for(url: str) -> TelemetryStream:
    """One stream per browser session, replaced when the URL changes."""
    stream: TelemetryStream | None = st.session_state.get("stream")
    target = ws_url(url)
    if stream is None or stream.ws_url != target:
        if stream is not None:
            stream.stop()
        stream = TelemetryStream(target).start()
        st.session_state["stream"] = stream
    return stream


def knob_input(name: str, entry: dict[str, Any], value: Any, key: str) -> Any:
    help_text = f"{entry['description']} — allowed {entry['allowed']}".lstrip(" —")
    if "enum" in entry:
        return st.selectbox(name, entry["enum"], index=entry["enum"].index(value), key=key,
                            help=help_text)
    if entry.get("type") == "boolean":
        return st.checkbox(name, value=bool(value), key=key, help=help_text)
    if entry.get("type") == "integer":
        return st.number_input(name, min_value=entry.get("minimum"),
                               max_value=entry.get("maximum"), value=value, step=1, key=key,
                               help=help_text, placeholder="null")
    low = entry.get("minimum", entry.get("exclusive_minimum"))
    return st.number_input(name, min_value=None if low is None else float(low),
                           max_value=entry.get("maximum"),
                           value=None if value is None else float(value), step=0.01,
                           format="%.3f", key=key, help=help_text, placeholder="null")


def knob_panel(url: str) -> None:
    st.header("Knobs")
    try:
        state = get_knobs(url)
    except Exception as exc:  # noqa: BLE001 - any failure is shown, the page keeps running
        st.error(f"cannot read knobs: {exc}")
        return
    knobs, version = state["knobs"], state["version"]
    st.caption(f"version {version} (applied {state['applied_version']})")
    with st.form("knobs"):
        values = {name: knob_input(name, entry, knobs[name], f"knob_{name}_v{version}")
                  for name, entry in state["schema"].items() if name in knobs}
        submitted = st.form_submit_button("Apply", key="apply", type="primary")
    if submitted:
        changes = {k: v for k, v in values.items() if v != knobs[k]}
        if not changes:
            st.session_state["knob_msg"] = (True, "nothing changed")
        else:
            st.session_state["knob_msg"] = patch_knobs(url, changes)
            if st.session_state["knob_msg"][0]:
                st.rerun()
    msg = st.session_state.get("knob_msg")
    if msg is not None:
        (st.success if msg[0] else st.error)(msg[1])


def draw_charts(frames: list[dict[str, Any]]) -> None:
    """Every panel, two a row."""
    figures = charts.live_figures(frames)
    for row in PANELS:
        for col, name in zip(st.columns(len(row)), row, strict=True):
            col.plotly_chart(figures[name], key=f"chart_{name}")


@st.fragment(run_every=REFRESH_S)
def live_view(stream: TelemetryStream, window: int) -> None:
    frames = stream.frames()[-window:]
    last = frames[-1] if frames else None
    cols = st.columns(4)
    cols[0].metric("connection", stream.state)
    cols[1].metric("step", last["step"] if last else "–")
    cols[2].metric("knobs version", last["knobs_version"] if last else "–")
    cols[3].metric("dropped steps", stream.dropped)
    if stream.state != CONNECTED and stream.error:
        st.caption(stream.error)
    if not frames:
        st.info("waiting for telemetry…")
        return
    draw_charts(frames)


def page() -> None:
    url = st.session_state["url"]
    with st.sidebar:
        window = st.slider("steps shown", 50, 600, 300, step=50)
        knob_panel(url)
    live_view(stream_for(url), window)
