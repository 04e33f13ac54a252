"""/metrics parses with prometheus-client's parser and its counters move with traffic."""

import httpx
from api_servers import MODEL, Served, wait_idle
from prometheus_client.parser import text_string_to_metric_families

NAMES = [
    "moescope:num_requests_running",
    "moescope:num_requests_waiting",
    "moescope:num_requests_swapped",
    "moescope:kv_cache_usage_perc",
    "moescope:prefix_cache_hit_rate",
    "moescope:prefix_cache_queries_total",
    "moescope:num_preemptions_total",
    "moescope:prompt_tokens_total",
    "moescope:generation_tokens_total",
    "moescope:num_steps_total",
    "moescope:time_to_first_token_seconds_count",
    "moescope:time_per_output_token_seconds_count",
    "moescope:e2e_request_latency_seconds_count",
    "moescope:step_duration_seconds_count",
    "moescope:expert_tokens_total",
    "moescope:a2a_bytes_total",
    "moescope:ep_rank_tokens_total",
    "moescope:request_success_total",
]


def _samples(http: httpx.Client) -> dict[str, float]:
    """Sample name (with labels other than model_name) -> value, summed over labels."""
    resp = http.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            assert s.labels.get("model_name") == MODEL
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_metrics_parse_and_move_with_traffic(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=30) as http:
        wait_idle(served.loop)
        before = _samples(http)
        body = {"model": MODEL, "prompt": "count me", "max_tokens": 7, "ignore_eos": True}
        for _ in range(2):
            assert http.post("/v1/completions", json=body).status_code == 200
        wait_idle(served.loop)
        after = _samples(http)
    for name in NAMES:
        assert name in after, name
    moved = {name: after[name] - before.get(name, 0.0) for name in NAMES}
    assert moved["moescope:generation_tokens_total"] == 14
    assert moved["moescope:prompt_tokens_total"] == 2 * (len("count me") + 1)
    assert moved["moescope:request_success_total"] == 2
    assert moved["moescope:e2e_request_latency_seconds_count"] == 2
    assert moved["moescope:time_to_first_token_seconds_count"] == 2
    assert moved["moescope:time_per_output_token_seconds_count"] == 2
    assert moved["moescope:num_steps_total"] >= 7
    assert moved["moescope:step_duration_seconds_count"] == moved["moescope:num_steps_total"]
    # every token passes through top_k experts in each layer
    assert moved["moescope:expert_tokens_total"] == 2 * (9 + 6) * 2 * 2
    assert moved["moescope:ep_rank_tokens_total"] == moved["moescope:expert_tokens_total"]
    assert moved["moescope:prefix_cache_queries_total"] > 0
    assert after["moescope:num_requests_running"] == 0
    assert after["moescope:kv_cache_usage_perc"] == 0
