"""The dashboard (streamlit run this file): the live, replay, compare and fleet pages.

The server URL comes from `--url` after `--` on the streamlit command line, the
MOESCOPE_URL environment variable, or the `url` session-state entry (tests).
"""

import argparse
import os
import sys

import streamlit as st

from dashboard import compare_page, fleet_page, live, replay

DEFAULT_URL = "http://127.0.0.1:8000"


def server_url() -> str:
    if "url" not in st.session_state:
        parser = argparse.ArgumentParser(add_help=False)
        parser.add_argument("--url", default=os.environ.get("MOESCOPE_URL", DEFAULT_URL))
        st.session_state["url"] = parser.parse_known_args(sys.argv[1:])[0].url
    return st.session_state["url"]


def main() -> None:
    st.set_page_config(page_title="moescope", layout="wide")
    pages = st.navigation(
        [
            st.Page(live.page, title="Live", default=True),
            st.Page(replay.page, title="Replay", url_path="replay"),
            st.Page(compare_page.page, title="Compare", url_path="compare"),
            st.Page(fleet_page.page, title="Fleet", url_path="fleet"),
        ]
    )
    with st.sidebar:
        st.title("moescope")
        st.caption(server_url())
    pages.run()


main()
