"""What a step's duration depends on, read the same way from a recorded StepTelemetry and from
a simulated step: its batch composition and its experts' (and ranks') loads."""

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.scheduler import ScheduledChunk

BATCH = (  # what the dense part of a step (attention, norms, projections) and the loop cost
    "const",  # per-step overhead
    "prefill_tokens",
    "prefill_seqs",  # each prefill chunk runs its own attention call
    "prefill_attn_k",  # sum of chunk tokens x context, in thousands
    "decode_seqs",
    "decode_ctx_k",  # sum of decode contexts, in thousands
)
MOE = (  # what the MoE layers cost (telemetry times them apart: dur_ms.moe)
    "expert_pairs_k",  # kept token-expert pairs over all layers, in thousands
    "expert_peak",  # sum over layers of the most-loaded expert's kept pairs
    "experts_active",  # sum over layers of experts with any kept pair
    "rank_peak",  # the busiest rank's kept pairs over all layers (expert parallel)
    "a2a_mb",  # all-to-all and all-gather megabytes (expert parallel)
)
FEATURES = BATCH + MOE


def capacity(factor: float | None, tokens: int, top_k: int, num_experts: int) -> int | None:
    """Pairs an expert keeps per layer and step, as the MoE layer computes it (None = dropless)."""
    if factor is None:
        return None
    return max(1, math.ceil(factor * tokens * top_k / num_experts))


def kept(counts: np.ndarray, cap: int | None) -> np.ndarray:
    """Routed pairs [layers, experts] left after the capacity cut."""
    return counts if cap is None else np.minimum(counts, cap)


def step_features(
    slots: list[dict[str, Any]],
    kept_counts: np.ndarray,
    rank_pairs: np.ndarray | None,
    a2a_bytes: int,
) -> np.ndarray:
    """One row of FEATURES. `slots` as in StepTelemetry's batch.slots; `rank_pairs` the kept
    pairs each rank computed over all layers (as telemetry's a2a.rank_tokens), None with one."""
    return np.array(batch_features(slots) + moe_features(kept_counts, rank_pairs, a2a_bytes))


def batch_features(slots: list[dict[str, Any]]) -> list[float]:
    """The BATCH part of a step's FEATURES."""
    prefill = [s for s in slots if s["phase"] == "prefill"]
    decode = [s for s in slots if s["phase"] == "decode"]
    return [
        1.0,
        sum(s["tokens"] for s in prefill),
        len(prefill),
        sum(s["tokens"] * s["ctx"] for s in prefill) / 1000,
        len(decode),
        sum(s["ctx"] for s in decode) / 1000,
    ]


def chunk_features(chunks: Sequence[ScheduledChunk]) -> list[float]:
    """`batch_features` of a step scheduled as `chunks` (the simulator's steps, read without
    building their telemetry)."""
    prefill_tokens = prefill_seqs = decode_seqs = 0
    prefill_attn = decode_ctx = 0
    for c in chunks:
        ctx = c.start + c.num_tokens
        if c.is_prefill:
            prefill_tokens += c.num_tokens
            prefill_seqs += 1
            prefill_attn += c.num_tokens * ctx
        else:
            decode_seqs += 1
            decode_ctx += ctx
    return [
        1.0,
        prefill_tokens,
        prefill_seqs,
        prefill_attn / 1000,
        decode_seqs,
        decode_ctx / 1000,
    ]


def moe_features(
    kept_counts: np.ndarray, rank_pairs: np.ndarray | None, a2a_bytes: int
) -> list[float]:
    """The MOE part of a step's FEATURES (see `step_features`)."""
    return [
        float(kept_counts.sum()) / 1000,
        float(kept_counts.max(axis=1).sum()) if kept_counts.size else 0.0,
        float((kept_counts > 0).sum()),
        0.0 if rank_pairs is None else float(rank_pairs.max()),
        a2a_bytes / 1e6,
    ]


def recorded_features(step: dict[str, Any], factor: float | None) -> np.ndarray:
    """FEATURES of a recorded StepTelemetry run under capacity factor `factor`."""
    batch, experts, a2a = step["batch"], step["experts"], step["a2a"]
    counts = np.asarray(experts["counts"], dtype=np.int64)
    tokens = batch["num_prefill_tokens"] + batch["num_decode_tokens"]
    cap = capacity(factor, tokens, experts["top_k"], experts["experts"])
    ranks = None
    if a2a["ep_size"] > 1:
        ranks = np.asarray(a2a.get("rank_tokens") or [0] * a2a["ep_size"], dtype=np.float64)
    moved = sum(map(sum, a2a["bytes"])) + sum(map(sum, a2a.get("gather_bytes") or []))
    return step_features(batch["slots"], kept(counts, cap), ranks, moved)
