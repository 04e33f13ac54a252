"""The live page: the telemetry panels, drawn in the browser from /ws/telemetry (the
live-charts component) with the "Why slow?" and autopilot reports below them; knobs, the
autopilot's switch and expert rebalancing in the sidebar, the knobs and rebalancing each a
fragment, so that Apply redraws its own form and nothing else (the charts show the new
version and its marker from the telemetry itself)."""

from typing import Any

import streamlit as st

from dashboard import autopilot_panel, reports
from dashboard.client import (
    LIVE_PATH,
    get_experts,
    get_knobs,
    get_scorecard,
    get_status,
    patch_knobs,
    preview_knobs,
    rebalance_experts,
)
from dashboard.live_charts import band_charts, live_charts
from dashboard.placement import placement_map
from dashboard.whatif_view import (
    band_rows,
    preview_caption,
    preview_rows,
    saturation_lines,
    scorecard_rows,
)

MAX_WINDOW = 600  # steps the browser keeps
SHOWN = 300  # steps shown at first
PREVIEW_HORIZON_S = 60.0


def knob_input(name: str, entry: dict[str, Any], value: Any, key: str) -> None:
    """Draw one knob's input; Apply reads its value from st.session_state[key]."""
    help_text = f"{entry['description']} — allowed {entry['allowed']}".lstrip(" —")
    if "enum" in entry:
        st.selectbox(name, entry["enum"], index=entry["enum"].index(value), key=key, help=help_text)
    elif entry.get("type") == "boolean":
        st.checkbox(name, value=bool(value), key=key, help=help_text)
    elif entry.get("type") == "integer":
        st.number_input(
            name,
            min_value=entry.get("minimum"),
            max_value=entry.get("maximum"),
            value=value,
            step=1,
            key=key,
            help=help_text,
            placeholder="null",
        )
    else:
        low = entry.get("minimum", entry.get("exclusive_minimum"))
        st.number_input(
            name,
            min_value=None if low is None else float(low),
            max_value=entry.get("maximum"),
            value=None if value is None else float(value),
            step=0.01,
            format="%.3f",
            key=key,
            help=help_text,
            placeholder="null",
        )


def edited(shown: dict[str, Any], keys: dict[str, str]) -> dict[str, Any]:
    """The knobs whose inputs differ from the values shown."""
    return {
        name: st.session_state[key]
        for name, key in keys.items()
        if st.session_state[key] != shown[name]
    }


def apply_knobs(url: str, shown: dict[str, Any], keys: dict[str, str]) -> None:
    """Apply's callback (it runs before the page is drawn again, which then reads the new
    version): PATCH the edited knobs. A preview stays on screen, to compare with what follows."""
    changes = edited(shown, keys)
    st.session_state["knob_msg"] = (
        patch_knobs(url, changes) if changes else (True, "nothing changed")
    )


def preview(url: str, shown: dict[str, Any], keys: dict[str, str]) -> None:
    """Preview's callback: ask the twin what the edited knobs would do, applying nothing."""
    changes = edited(shown, keys)
    if not changes:
        st.session_state["twin_preview"] = (False, "edit a knob to preview it", {})
        return
    ok, answer = preview_knobs(url, changes, PREVIEW_HORIZON_S)
    st.session_state["twin_preview"] = (ok, answer, changes)


def preview_panel() -> None:
    shown = st.session_state.get("twin_preview")
    if shown is None:
        return
    ok, answer, changes = shown
    if not ok:
        st.warning(answer)
        return
    st.caption("preview of " + ", ".join(f"{k} = {v}" for k, v in changes.items()))
    st.table(preview_rows(answer))
    band_charts(band_rows(answer), key="twin_preview_bands")
    for line in saturation_lines(answer):
        (st.warning if "builds in" in line else st.caption)(line)
    st.caption(preview_caption(answer))


def scorecard_panel(url: str) -> None:
    """Applied changes as the twin predicted them and as they turned out."""
    with st.expander("Twin scorecard"):
        try:
            entries = get_scorecard(url)
        except Exception as exc:  # noqa: BLE001 - any failure is shown, the page keeps running
            st.caption(f"cannot read the scorecard: {exc}")
            return
        if not entries:
            st.caption("no knob change applied yet")
            return
        st.caption("predicted / observed (error)")
        st.table(scorecard_rows(entries))


@st.fragment
def knob_panel(url: str) -> None:
    st.header("Knobs")
    try:
        state = get_knobs(url)
    except Exception as exc:  # noqa: BLE001 - any failure is shown, the page keeps running
        st.error(f"cannot read knobs: {exc}")
        return
    knobs, version = state["knobs"], state["version"]
    st.caption(f"version {version} (applied {state['applied_version']})")
    keys = {name: f"knob_{name}_v{version}" for name in state["schema"] if name in knobs}
    with st.form("knobs"):
        for name, key in keys.items():
            knob_input(name, state["schema"][name], knobs[name], key)
        apply_col, preview_col = st.columns(2)
        with apply_col:
            st.form_submit_button(
                "Apply", key="apply", type="primary", on_click=apply_knobs, args=(url, knobs, keys)
            )
        with preview_col:
            st.form_submit_button(
                "Preview", key="preview", on_click=preview, args=(url, knobs, keys)
            )
    msg = st.session_state.get("knob_msg")
    if msg is not None:
        (st.success if msg[0] else st.error)(msg[1])
    preview_panel()
    scorecard_panel(url)


@st.fragment
def rebalance_panel(url: str) -> None:
    """Re-place experts from recent loads (POST /api/experts/rebalance); shows the answer."""
    st.header("Expert placement")
    with st.form("rebalance"):
        window = st.number_input(
            "window (steps)",
            min_value=1,
            max_value=4096,
            value=64,
            step=1,
            key="rebalance_window",
            help="recent steps whose expert loads count",
        )
        replicas = st.number_input(
            "replicas",
            min_value=0,
            value=0,
            step=1,
            key="rebalance_replicas",
            help="redundant copies of the hottest experts",
        )
        submitted = st.form_submit_button("Rebalance experts", key="rebalance")
    if submitted:
        st.session_state["rebalance_msg"] = rebalance_experts(url, int(window), int(replicas))
    msg = st.session_state.get("rebalance_msg")
    if msg is not None:
        (st.success if msg[0] else st.error)(msg[1])
    try:
        info = get_experts(url)
    except Exception as exc:  # noqa: BLE001 - any failure is shown, the page keeps running
        st.caption(f"cannot read the placement: {exc}")
        return
    if info["ep_size"] == 1:
        st.caption("one rank: nothing to place (serve with --ep N or --ep-size N)")
        return
    st.plotly_chart(placement_map(info), key="placement")


def model_lines(status: dict[str, Any]) -> list[str]:
    """What the served model's layers are and cost, from /api/status: KV bytes per token per
    layer (a latent MLA cache against K and V), sliding layers, which layers are MoE (dense
    first layers have no expert row in the charts) and group-limited routing."""
    model, kv = status["model_config"], status["kv_bytes_per_token"]
    layers = model["num_layers"]
    if kv["layout"] == "latent":
        kind = f"latent: {model['kv_lora_rank']} + {model['qk_rope_head_dim']} values"
    else:
        kind = f"K and V: {model['num_kv_heads']} heads of {model['head_dim']}"
    cost = f"KV cache: {kv['per_layer']:,} B per token per layer ({kind}), "
    cost += f"{kv['all_layers']:,} B per token over {layers} layers"
    sliding = model["layer_types"].count("sliding_attention")
    if model["sliding_window"] and sliding:
        cost += f"; {sliding} of them attend to the last {model['sliding_window']} tokens"
    dense = model["first_k_dense_replace"]
    moe = f"MoE layers {dense}–{layers - 1}" if layers - dense > 1 else f"MoE layer {dense}"
    if dense:
        moe += f" (dense: {'0' if dense == 1 else f'0–{dense - 1}'})"
    moe += f", {model['num_experts']} experts, top {model['top_k']}"
    if model["n_group"] > 1:
        moe += f", each token's from {model['topk_group']} of {model['n_group']} groups"
    return [cost, moe]


def model_caption(url: str) -> None:
    try:
        lines = model_lines(get_status(url))
    except Exception as exc:  # noqa: BLE001 - any failure is shown, the page keeps running
        st.caption(f"cannot read the server's status: {exc}")
        return
    for line in lines:
        st.caption(line)


def page() -> None:
    url = st.session_state["url"]
    model_caption(url)
    live_charts(
        url,
        LIVE_PATH,
        key="live_charts",
        max_steps=MAX_WINDOW,
        shown=SHOWN,
        reports=[reports.why_slow_live(url), reports.autopilot(url)],
    )
    with st.sidebar:
        knob_panel(url)
        autopilot_panel.sidebar(url)
        rebalance_panel(url)
