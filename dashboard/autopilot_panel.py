"""The autopilot on the Live page: in the sidebar an on/off switch and the targets (PUT
/api/autopilot) with its state and why; beside the charts its SLO chart and last decisions.
Both refresh on their own every few seconds, apart from the rest of the page."""

import streamlit as st

from dashboard.autopilot_view import decision_rows, slo_figure
from dashboard.client import get_autopilot, put_autopilot

REFRESH_S = 2.0  # the autopilot itself looks every 2 s by default


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
    ok, status = get_autopilot(url, history=0)
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
    state_line(url)


@st.fragment(run_every=REFRESH_S)
def state_line(url: str) -> None:
    ok, status = get_autopilot(url, history=0)
    if ok:
        st.caption(f"**{status['state']}**: {status['note'] or '–'}")


@st.fragment(run_every=REFRESH_S)
def main(url: str) -> None:
    """The SLO chart and the last decisions, while the autopilot is on and has measured."""
    ok, status = get_autopilot(url)
    if not ok or not status["settings"]["enabled"] or not status["history"]:
        return
    with st.container(key="autopilot_main"):
        st.subheader("Autopilot")
        st.plotly_chart(slo_figure(status), key="autopilot_slo")
        rows = decision_rows(status)
        if rows:
            st.table(rows)
