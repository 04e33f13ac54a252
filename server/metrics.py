"""Prometheus metrics under vLLM's names with our `moescope:` prefix, fed off the engine thread.

Live state (queue lengths, KV usage, prefix cache) is read at scrape time; per-step
counters and histograms, and per-request ones, come from subscriptions to the loop's step and
request buses, drained by an asyncio task (and before each scrape).
"""

from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.loop import EngineLoop
from server.bus_reader import BusReader

PREFIX = "moescope:"
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
TPOT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
E2E_BUCKETS = (
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
)
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

disable_created_metrics()


class _LiveCollector(Collector):
    """Gauges and monotonic engine counters read from the loop's summary at scrape time."""

    def __init__(self, engine_loop: EngineLoop, model_name: str) -> None:
        self.engine_loop = engine_loop
        self.model_name = model_name

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
        g.add_metric([self.model_name], value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
        c.add_metric([self.model_name], value)
        return c

    def collect(self) -> Iterator[Metric]:
        s = self.engine_loop.summary()
        q, kv = s["queue"], s["kv"]
        yield self._gauge("num_requests_running", "Requests in the running batch.", q["running"])
        yield self._gauge("num_requests_waiting", "Requests waiting to be admitted.", q["waiting"])
        yield self._gauge(
            "num_requests_swapped", "Requests swapped out to the host pool.", q["swapped"]
        )
        yield self._gauge(
            "kv_cache_usage_perc", "Fraction of usable KV blocks in use (0-1).", kv["usage"]
        )
        blocks = GaugeMetricFamily(
            PREFIX + "kv_cache_blocks", "KV blocks by state.", labels=["model_name", "state"]
        )
        for state in ("used", "cached", "free", "usable", "total"):
            blocks.add_metric([self.model_name, state], kv[state])
        yield blocks
        yield self._counter(
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            kv["prefix_queries"],
        )
        yield self._counter(
            "prefix_cache_hits", "Prompt tokens found in the prefix cache.", kv["prefix_hits"]
        )
        rate = kv["prefix_hits"] / kv["prefix_queries"] if kv["prefix_queries"] else 0.0
        yield self._gauge("prefix_cache_hit_rate", "Prefix cache hits / queries since start.", rate)
        yield self._gauge("knobs_version", "Version of the accepted knob set.", s["knobs_version"])
        yield self._gauge(
            "engine_alive", "1 while the engine loop runs.", float(s["loop"]["alive"])
        )


class Metrics(BusReader):
    """The registry of one server and the code that feeds it."""

    def __init__(self, engine_loop: EngineLoop, model_name: str) -> None:
        super().__init__(engine_loop)
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(_LiveCollector(engine_loop, model_name))
        self._children: dict[tuple[str, ...], Any] = {}

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(PREFIX + name, doc, ["model_name", *labels], registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            h = Histogram(
                PREFIX + name, doc, ["model_name"], buckets=buckets, registry=self.registry
            )
            return h.labels(model_name)

        self.steps = counter("num_steps", "Engine steps.").labels(model_name)
        self.preemptions = counter("num_preemptions", "Preempted requests.").labels(model_name)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of served requests.").labels(
            model_name
        )
        self.generation_tokens = counter("generation_tokens", "Generated tokens.").labels(
            model_name
        )
        self.request_success = counter(
            "request_success", "Finished requests by reason.", "finished_reason"
        )
        self.telemetry_dropped = counter(
            "telemetry_dropped", "Step and request records the metrics consumer lost."
        ).labels(model_name)
        self.expert_tokens = counter(
            "expert_tokens", "Tokens routed to each expert.", "layer", "expert"
        )
        self.expert_dropped = counter(
            "expert_dropped_tokens", "Token-expert pairs dropped by the capacity factor.", "layer"
        )
        self.a2a_bytes = counter(
            "a2a_bytes", "All-to-all bytes between expert-parallel ranks.", "src", "dst"
        )
        self.gather_bytes = counter(
            "ep_gather_bytes",
            "Bytes of MoE output rows all-gathered between expert-parallel ranks.",
            "src",
            "dst",
        )
        self.rank_tokens = counter(
            "ep_rank_tokens", "Token-expert pairs computed by each expert-parallel rank.", "rank"
        )
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.tpot = histogram(
            "time_per_output_token_seconds", "Mean time per output token.", TPOT_BUCKETS
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds", "End-to-end request latency.", E2E_BUCKETS
        )
        self.step_duration = histogram(
            "step_duration_seconds", "Engine step duration.", STEP_BUCKETS
        )
        self.iteration_tokens = histogram(
            "iteration_tokens", "Tokens per engine step.", TOKEN_BUCKETS
        )
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Generated tokens per request.", TOKEN_BUCKETS
        )

    def _child(self, metric: Counter, *labels: Any) -> Any:
        key = (metric._name, *map(str, labels))
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.model_name, *map(str, labels))
        return child

    def observe_requests(self, records: list[dict[str, Any]]) -> None:
        """Count ended requests (RequestRecords); prompt tokens count as served only for a
        request that got its first token."""
        for r in records:
            if r["ttft_ms"] is not None:
                self.prompt_tokens.inc(r["prompt_len"])
            self.generation_tokens.inc(r["output_len"])
            self._child(self.request_success, r["finish_reason"]).inc()
            self.e2e.observe(r["e2e_ms"] / 1000)
            self.request_prompt_tokens.observe(r["prompt_len"])
            self.request_generation_tokens.observe(r["output_len"])

    def observe_steps(self, records: list[dict[str, Any]]) -> None:
        """Fold a batch of StepTelemetry records in (expert and a2a counts summed first)."""
        if not records:
            return
        experts: list[list[int]] | None = None
        a2a: list[list[int]] | None = None
        gather: list[list[int]] | None = None
        dropped: list[list[int]] | None = None
        ranks: list[list[int]] | None = None
        preempted = 0
        for r in records:
            self.step_duration.observe(r["dur_ms"]["total"] / 1000)
            batch = r["batch"]
            self.iteration_tokens.observe(batch["num_prefill_tokens"] + batch["num_decode_tokens"])
            for ms in r["latency"]["ttft_ms"]:
                self.ttft.observe(ms / 1000)
            for ms in r["latency"]["tpot_ms"]:
                self.tpot.observe(ms / 1000)
            preempted += r["queue"]["preempted"]
            experts = _add(experts, r["experts"]["counts"])
            a2a = _add(a2a, r["a2a"]["bytes"])
            gather = _add(gather, r["a2a"]["gather_bytes"])
            dropped = _add(dropped, [r["experts"]["dropped"]])
            ranks = _add(ranks, [r["a2a"].get("rank_tokens") or [0] * r["a2a"]["ep_size"]])
        self.steps.inc(len(records))
        if preempted:
            self.preemptions.inc(preempted)
        # expert rows are MoE layers, named by their real index (DeepSeek's first layers are dense)
        layers = records[-1]["experts"].get("moe_layers") or list(range(len(experts or [])))
        for metric, matrix in (
            (self.expert_tokens, experts),
            (self.a2a_bytes, a2a),
            (self.gather_bytes, gather),
        ):
            for i, row in enumerate(matrix or []):
                label = layers[i] if metric is self.expert_tokens else i
                for j, value in enumerate(row):
                    self._child(metric, label, j).inc(value)
        for metric, counts in ((self.expert_dropped, dropped), (self.rank_tokens, ranks)):
            for i, value in enumerate(counts[0] if counts else []):
                self._child(metric, layers[i] if metric is self.expert_dropped else i).inc(value)

    def drain(self) -> None:
        records, ended, dropped = self.take()
        if dropped:
            self.telemetry_dropped.inc(dropped)
        self.observe_steps(records)
        self.observe_requests(ended)

    def render(self) -> bytes:
        self.drain()
        return generate_latest(self.registry)


def _add(acc: list[list[int]] | None, matrix: list[list[int]]) -> list[list[int]]:
    if acc is None:
        return [list(row) for row in matrix]
    return [
        [a + b for a, b in zip(ra, rb, strict=True)] for ra, rb in zip(acc, matrix, strict=True)
    ]
