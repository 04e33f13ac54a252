"""The "Why slow?" panel: on the Live page the live window, asked for every few seconds on a
background thread; on the Replay page the replayed session, asked for once."""

import math
from typing import Any

import streamlit as st

from dashboard import why_slow
from dashboard.client import get_attribution, get_session_attribution
from dashboard.poller import Poller

WINDOW_S = 60.0
BUCKET_S = 5.0
RECENT = 50  # requests in the waterfall
POLL_S = 10.0  # the server attributes the whole minute per call, and Streamlit redraws it all
IDLE_S = 30.0  # unread this long (tab closed, another page), the poller stops
SESSION_BUCKETS = 40  # bars over a recorded session, whatever its length

Answer = tuple[bool, Any]  # (True, the report) or (False, the server's message)


def draw(answer: Answer | None, key: str, scope: str) -> None:
    """The dominant causes in words, TTFT and TPOT by cause over time, and the waterfall, in
    a container keyed `key` (its charts' keys start with it); `scope` says which requests
    count. None: no answer yet."""
    with st.container(key=key):
        st.subheader("Why slow?")
        if answer is None:
            st.caption("asking the server…")
            return
        ok, report = answer
        if not ok:
            st.warning(report)
            return
        st.caption(f"{report['requests']} requests {scope}")
        if not report["requests"]:
            return
        for text in why_slow.headline(report):
            st.markdown(f"**{text}**")
        for col, metric in zip(st.columns(2), why_slow.METRICS, strict=True):
            col.plotly_chart(why_slow.cause_bars(report, metric), key=f"{key}_{metric}")
        st.plotly_chart(why_slow.waterfall(report), key=f"{key}_waterfall")


def poller_for(url: str) -> Poller[Answer]:
    """One poller of the live route per browser session, replaced when the URL changes or
    when it stopped for want of readers."""
    poller: Poller[Answer] | None = st.session_state.get("attribution_poller")
    if poller is None or not poller.alive or st.session_state.get("attribution_url") != url:
        if poller is not None:
            poller.stop()
        poller = Poller(
            lambda: get_attribution(url, WINDOW_S, BUCKET_S, RECENT),
            POLL_S,
            IDLE_S,
            "attribution",
        ).start()
        st.session_state["attribution_poller"] = poller
        st.session_state["attribution_url"] = url
    return poller


@st.fragment(run_every=POLL_S)
def live(url: str) -> None:
    """The live window's panel, redrawn from the poller's latest answer."""
    draw(poller_for(url).read(), "why_live", f"ended in the last {WINDOW_S:g} s")


@st.cache_data(ttl=30, show_spinner="attributing the session…")
def session_answer(url: str, session_id: str, bucket_s: float) -> Answer:
    """A recorded session's report, kept a while: the replay page redraws on every click."""
    return get_session_attribution(url, session_id, bucket_s, RECENT)


def recorded(url: str, session: dict[str, Any]) -> None:
    """The panel for a recorded session (a GET /api/sessions entry), its buckets fitted to
    its length."""
    bucket_s = max(1.0, math.ceil((session.get("duration_s") or 0.0) / SESSION_BUCKETS))
    draw(session_answer(url, session["id"], bucket_s), "why_replay", "in the session")
