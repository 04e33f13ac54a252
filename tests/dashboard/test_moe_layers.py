"""The dashboard on the newer families (issue 46): expert views name MoE layers by their real
index (DeepSeek's first layers are dense), the group-skew panel of group-limited routing, and
the Live page's line on KV bytes per token; last, a served DeepSeek-V3-shaped model in the
browser."""

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_servers import Served, serve, stop, wait_idle
from browser import CHROMIUM, VIEWPORT, WAIT_MS, charts, chromium, dashboard
from frames import frame, frames
from js_modules import blank_page, js_panel
from playwright.sync_api import Browser, Frame, Page, expect

from dashboard.live import model_lines
from dashboard.placement import placement_map
from engine import SamplingParams
from server.settings import ServerSettings

ENGINE_TESTS = Path(__file__).parents[1] / "engine"


def deepseek_frame(step: int) -> dict[str, Any]:
    """A frame of a three-layer model whose layer 0 is dense: MoE layers 1 and 2, each token
    picking 2 of 4 expert groups (18 tokens: 36 choices a layer); layer 1's groups skewed."""
    f = frame(step)
    f["experts"]["moe_layers"] = [1, 2]
    f["experts"]["groups"] = [[18, 9, 9, 0], [9, 9, 9, 9]]
    return f


def status(**model: Any) -> dict[str, Any]:
    """An /api/status of the fields model_lines reads: a Mixtral-shaped model unless changed."""
    config = {
        "num_layers": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
        "kv_lora_rank": 0,
        "qk_rope_head_dim": 0,
        "num_experts": 8,
        "top_k": 2,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 0,
        "sliding_window": 0,
        "layer_types": [],
        **model,
    }
    latent = config["kv_lora_rank"] > 0
    per_layer = 2 * (config["kv_lora_rank"] + config["qk_rope_head_dim"])
    per_layer = per_layer if latent else 2 * 2 * config["num_kv_heads"] * config["head_dim"]
    return {
        "model_config": config,
        "kv_bytes_per_token": {
            "per_layer": per_layer,
            "all_layers": per_layer * config["num_layers"],
            "layout": "latent" if latent else "kv",
        },
    }


def test_model_lines_say_what_a_token_costs_and_which_layers_are_moe() -> None:
    assert model_lines(status()) == [
        "KV cache: 128 B per token per layer (K and V: 2 heads of 16), 512 B per token over 4 "
        "layers",
        "MoE layers 0–3, 8 experts, top 2",
    ]
    deepseek = status(
        num_layers=27, kv_lora_rank=512, qk_rope_head_dim=64, first_k_dense_replace=1,
        n_group=8, topk_group=3, num_experts=64, top_k=6,
    )  # fmt: skip
    assert model_lines(deepseek) == [
        "KV cache: 1,152 B per token per layer (latent: 512 + 64 values), 31,104 B per token "
        "over 27 layers",
        "MoE layers 1–26 (dense: 0), 64 experts, top 6, each token's from 3 of 8 groups",
    ]
    sliding = ["sliding_attention", "full_attention"] * 2
    gpt_oss = status(sliding_window=128, layer_types=sliding, first_k_dense_replace=3)
    assert model_lines(gpt_oss) == [
        "KV cache: 128 B per token per layer (K and V: 2 heads of 16), 512 B per token over 4 "
        "layers; 2 of them attend to the last 128 tokens",
        "MoE layer 3 (dense: 0–2), 8 experts, top 2",
    ]


def test_the_placement_map_names_moe_layers_by_their_real_index() -> None:
    info = {"ep_size": 2, "mode": "modeled", "version": 1, "moe_layers": [1, 2]}
    info["placement"] = [[[0, 1], [2, 3]], [[0, 1], [2, 3]]]
    fig = placement_map(info)
    assert list(fig.data[0].y) == [1, 2] and fig.layout.yaxis.type == "category"
    del info["moe_layers"]  # a server from before it was sent
    assert list(placement_map(info).data[0].y) == [0, 1]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def page(browser: Browser) -> Page:
    return blank_page(browser)


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")
def test_expert_views_name_moe_layers_by_their_real_index(page: Page) -> None:
    steps = [deepseek_frame(i) for i in range(5)]
    fig = js_panel(page, "experts", steps)
    latest, rolling = fig["data"]
    assert latest["y"] == rolling["y"] == [1, 2]
    assert latest["z"] == [[6, 2, 2, 2], [3, 3, 3, 3]] and rolling["z"][0] == [30, 10, 10, 10]
    assert fig["layout"]["yaxis"]["type"] == fig["layout"]["yaxis2"]["type"] == "category"
    imbalance = js_panel(page, "imbalance", steps)
    assert [t["name"] for t in imbalance["data"]] == ["layer 1", "layer 2"]
    # records from before moe_layers: rows 0..layers-1
    assert js_panel(page, "experts", frames(3))["data"][0]["y"] == [0, 1]


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")
def test_the_kv_panel_says_what_a_token_costs_per_layer(page: Page) -> None:
    steps = [deepseek_frame(i) for i in range(3)]
    for f in steps:
        f["kv"]["bytes_per_token_layer"] = 1152
    title = js_panel(page, "kv", steps)["layout"]["title"]["text"]
    assert title == "KV cache blocks (1,152 B per token per layer)"
    assert js_panel(page, "kv", frames(3))["layout"]["title"]["text"] == "KV cache blocks"
    windowed = frames(3)
    for i, f in enumerate(windowed):  # gpt-oss: the sliding layers' pool gave blocks back
        f["kv"].update(behind_window=5 + i, window_total=40, window_used=3)
    fig = js_panel(page, "kv", windowed)
    assert fig["layout"]["title"]["text"] == "KV cache blocks; 7 saved by the window (pool 3/40)"
    assert fig["data"][-1]["name"] == "window pool used" and fig["data"][-1]["y"] == [3] * 3


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")
def test_group_skew_per_layer_from_group_counts(page: Page) -> None:
    steps = [deepseek_frame(i) for i in range(6)]
    steps[3]["knob_changes"] = [
        {"version": 2, "t": 0.0, "origin": "dashboard", "changes": {"max_num_seqs": [8, 4]}}
    ]
    fig = js_panel(page, "groups", steps)
    assert fig["layout"]["title"]["text"] == "Expert group skew"
    heat, *skew = fig["data"]
    assert heat["y"] == [1, 2] and heat["z"] == [[108, 54, 54, 0], [54] * 4]
    assert [t["name"] for t in skew] == ["layer 1", "layer 2"]
    assert skew[0]["y"] == [2.0] * 6 and skew[1]["y"] == [1.0] * 6  # max / mean group load
    assert skew[0]["x"] == list(range(6)) and skew[0]["xaxis"] == "x2"
    assert [s["x0"] for s in fig["layout"]["shapes"]] == [3]  # the knob change's marker
    annotations = [a["text"] for a in fig["layout"]["annotations"]]
    assert annotations[0] == "tokens per group, last 6 steps"
    # routing without groups, and an empty window: a title that says so
    for window in (frames(3), []):
        title = js_panel(page, "groups", window)["layout"]["title"]["text"]
        assert title == "Expert group skew: no group-limited routing in these frames"


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A served DeepSeek-V3-shaped checkpoint (layer 0 dense, 2 of 4 groups, latent KV)."""
    sys.path.insert(0, str(ENGINE_TESTS))
    try:
        checkpoints = importlib.import_module("hf_checkpoints")
    finally:
        sys.path.remove(str(ENGINE_TESTS))
    path = checkpoints.make_deepseek_checkpoint(tmp_path_factory.mktemp("ckpt"), "deepseek_v3")
    s = serve(ServerSettings(model_name="deepseek_v3"), model=str(path), ep_size=2)
    yield s
    stop(s)


def drawn(frame: Frame, panel: str) -> list[dict[str, Any]]:
    """The name and y of each trace `panel` draws, once it draws more than one."""
    script = "panel => document.querySelector(`[data-panel='${panel}']`).data"
    frame.wait_for_function(
        f"panel => (({script})(panel) || []).length > 1", arg=panel, timeout=WAIT_MS
    )
    return list(
        frame.evaluate(f"panel => ({script})(panel).map((t) => ({{name: t.name, y: t.y}}))", panel)
    )


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no /usr/bin/chromium")
def test_a_served_deepseek_model_shows_its_layers_groups_and_latent_kv(
    deepseek: Served, browser: Browser, tmp_path: Path
) -> None:
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    with dashboard(deepseek.url, tmp_path / "streamlit.log") as url:
        page = browser.new_page(viewport={"width": VIEWPORT["width"], "height": VIEWPORT["height"]})
        page.goto(url)
        expect(page.get_by_text("(latent: 16 + 4 values)")).to_be_visible(timeout=WAIT_MS)
        expect(page.get_by_text("MoE layers 1–2 (dense: 0)")).to_be_visible(timeout=WAIT_MS)
        frame = charts(page)
        expect(frame.locator("#status .state")).to_have_text("connected", timeout=WAIT_MS)
        deepseek.loop.submit([0, *range(3, 20)], params, lambda _: None)  # steps to watch
        expect(frame.get_by_text("Expert group skew").first).to_be_visible(timeout=WAIT_MS)
        kv = "KV cache blocks (80 B per token per layer)"  # float32: (16 + 4) x 4 bytes
        expect(frame.get_by_text(kv).first).to_be_visible(timeout=WAIT_MS)
        imbalance, groups = (drawn(frame, panel) for panel in ("imbalance", "groups"))
        assert [t["name"] for t in imbalance] == ["layer 1", "layer 2"]
        assert groups[0]["y"] == [1, 2]
        assert [t["name"] for t in groups[1:]] == ["layer 1", "layer 2"]
    wait_idle(deepseek.loop)
