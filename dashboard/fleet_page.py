"""The Fleet page (`moescope fleet`): a row per replica slot, the fleet's totals and restarts, the
routing policy, knob changes to one replica or to all, and a click into one replica's Live
page (the same page, pointed at the ingress's `/replicas/{id}` routes)."""

import json
import os
from typing import Any

import httpx
import streamlit as st

from dashboard import live

REFRESH_S = 2.0
TIMEOUT_S = 10.0
POLICIES = ("least_work", "round_robin", "power_of_two")
_http = httpx.Client(timeout=TIMEOUT_S)


def _headers() -> dict[str, str]:
    key = os.environ.get("MOESCOPE_ADMIN_KEY") or os.environ.get("MOESCOPE_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {resp.status_code}: {resp.text[:200]}"


def fleet_url() -> str:
    """The ingress's URL: the dashboard's server URL, kept while a replica's Live page is open."""
    if "fleet_url" not in st.session_state:
        st.session_state["fleet_url"] = st.session_state["url"].split("/replicas/")[0]
    url: str = st.session_state["fleet_url"]
    return url


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's rows: one per replica slot (its replica now, dead until replaced), with
    the slot's restarts and the ids its replacements took over from."""
    table = []
    for r in status["replicas"]:
        up = r["health"] == "ok"
        table.append(
            {
                "slot": r["slot"],
                "replica": r["replica"],
                "health": r["health"],
                "restarts": r["restarts"],
                "replaced": ", ".join(r["previous"]) or "–",
                "slots": f"{r['slots']['running']}/{r['slots']['max']}" if up else "–",
                "KV": f"{r['kv']['used']}/{r['kv']['usable']}" if up else "–",
                "queue": r["queue"]["waiting"] if up else None,
                "TTFT p90 ms": _ms(r.get("ttft_p90_ms")),
                "TPOT p90 ms": _ms(r.get("tpot_p90_ms")),
                "expert imbalance": _ms(r.get("expert_imbalance")),
                "knobs v": r.get("knobs_version"),
                "finished (1 min)": r.get("finished"),
            }
        )
    return table


def open_replica(replica: str) -> None:
    """Point the dashboard at one replica and show its Live page."""
    st.session_state["url"] = f"{fleet_url()}/replicas/{replica}"
    st.switch_page(st.Page(live.page, title="Live", default=True))


@st.fragment(run_every=REFRESH_S)
def status_panel() -> None:
    try:
        resp = _http.get(fleet_url() + "/fleet/status", headers=_headers())
    except httpx.HTTPError as exc:
        st.error(f"cannot reach the fleet: {exc}")
        return
    if resp.status_code == 404:
        st.info("this server is a single engine, not a fleet: start one with `moescope fleet`")
        return
    if resp.status_code != 200:
        st.error(_message(resp))
        return
    status = resp.json()
    totals = status["totals"]
    cols = st.columns(5)
    cols[0].metric("replicas", totals["replicas"])
    cols[1].metric("restarts", totals["restarts"])
    cols[2].metric("slots", f"{totals['running']}/{totals['slots']}")
    cols[3].metric("KV blocks", f"{totals['kv_used']}/{totals['kv_usable']}")
    cols[4].metric("waiting", totals["waiting"])
    st.table(rows(status))  # plain HTML: a few rows, each readable in the page itself
    knobs = status["fleet_knobs"]
    st.caption(f"routing policy {knobs['knobs']['routing_policy']} (version {knobs['version']})")
    live_ids = [r["replica"] for r in status["replicas"] if r["health"] == "ok"]
    st.session_state["fleet_replicas"] = live_ids
    for col, replica in zip(st.columns(max(len(live_ids), 1)), live_ids, strict=False):
        if col.button(f"Live: {replica}", key=f"open_{replica}"):
            open_replica(replica)


def patch(path: str, changes: dict[str, Any], replica: str | None = None) -> tuple[bool, str]:
    params = {"replica": replica} if replica else None
    try:
        resp = _http.patch(fleet_url() + path, json=changes, params=params, headers=_headers())
    except httpx.HTTPError as exc:
        return False, f"fleet unreachable: {exc}"
    if resp.status_code != 200:
        return False, _message(resp)
    body = resp.json()
    if "applied" in body:
        applied = ", ".join(f"{r} → v{v}" for r, v in body["applied"].items())
        failed = "; ".join(f"{r}: {m}" for r, m in body["failed"].items())
        return True, f"applied by {applied}" + (f"; refused by {failed}" if failed else "")
    return True, f"routing policy {body['knobs']['routing_policy']} (version {body['version']})"


def knobs_panel() -> None:
    st.header("Routing")
    with st.form("fleet_policy"):
        policy = st.selectbox("routing policy", POLICIES, key="fleet_policy_choice")
        if st.form_submit_button("Apply policy", key="fleet_policy_apply"):
            st.session_state["fleet_msg"] = patch("/fleet/knobs", {"routing_policy": policy})
    st.header("Engine knobs")
    targets = ["all", *st.session_state.get("fleet_replicas", [])]
    with st.form("fleet_knobs"):
        target = st.selectbox("replicas", targets, key="fleet_knob_target")
        text = st.text_input(
            "changes (JSON)", value='{"max_num_seqs": 32}', key="fleet_knob_changes"
        )
        if st.form_submit_button("Apply knobs", key="fleet_knob_apply"):
            try:
                changes = json.loads(text)
            except ValueError as exc:
                st.session_state["fleet_msg"] = (False, f"changes: not JSON ({exc})")
            else:
                st.session_state["fleet_msg"] = patch(
                    "/api/knobs", changes, None if target == "all" else target
                )
    msg = st.session_state.get("fleet_msg")
    if msg is not None:
        (st.success if msg[0] else st.error)(msg[1])


def page() -> None:
    st.session_state["url"] = fleet_url()  # back from a replica's Live page
    st.title("Fleet")
    status_panel()
    with st.sidebar:
        knobs_panel()
