"""The autopilot's switch and targets in the Live page's sidebar (PUT /api/autopilot). Its
state, SLO chart and decisions are a report below the charts, drawn in the browser
(dashboard/reports.py)."""

import streamlit as st

from dashboard.client import get_autopilot, put_autopilot


def apply(url: str) -> None:
    """The form's callback: send the switch and the targets as they stand."""
    st.session_state["autopilot_msg"] = put_autopilot(
        url,
        {
            "enabled": st.session_state["autopilot_enabled"],
            "ttft_p90_ms": st.session_state["autopilot_ttft"],
            "tpot_p90_ms": st.session_state["autopilot_tpot"],
        },
    )


def sidebar(url: str) -> None:
    st.header("Autopilot")
    ok, status = get_autopilot(url)
    if not ok:
        st.caption(f"cannot read the autopilot: {status}")
        return
    settings = status["settings"]
    with st.form("autopilot"):
        st.toggle("hold the targets", value=settings["enabled"], key="autopilot_enabled")
        st.number_input(
            "p90 TTFT target, ms",
            min_value=1.0,
            value=float(settings["ttft_p90_ms"]),
            key="autopilot_ttft",
        )
        st.number_input(
            "p90 TPOT target, ms",
            min_value=1.0,
            value=float(settings["tpot_p90_ms"]),
            key="autopilot_tpot",
        )
        st.form_submit_button("Set", key="autopilot_set", on_click=apply, args=(url,))
    msg = st.session_state.get("autopilot_msg")
    if msg is not None:
        (st.success if msg[0] else st.error)(msg[1])
