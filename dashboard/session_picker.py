"""The recorded sessions a page can pick from, or a notice on the page when there are none."""

from typing import Any

import streamlit as st

from dashboard.client import list_sessions


def recorded_sessions(url: str) -> list[dict[str, Any]] | None:
    """GET /api/sessions; None (with an error or info shown) when there is nothing to pick."""
    try:
        sessions = list_sessions(url)
    except Exception as exc:  # noqa: BLE001 - shown on the page
        st.error(f"cannot list sessions: {exc}")
        return None
    if not sessions:
        st.info("no recorded sessions")
        return None
    return sessions
