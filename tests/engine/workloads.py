"""Workloads shared by engine tests: prompts with shared prefixes, staggered arrivals."""

import random
from typing import Any

from engine import LLMEngine, RequestOutput, SamplingParams


def make_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """n prompts of 1-30 random tokens; every other one starts with the same 9 tokens."""
    rng = random.Random(seed)
    shared = [rng.randrange(256) for _ in range(9)]
    out = []
    for i in range(n):
        tail = [rng.randrange(256) for _ in range(rng.randrange(1, 30))]
        out.append(shared + tail if i % 2 else tail)
    return out


def run_staggered(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, per_step: int = 3
) -> tuple[list[RequestOutput], list[dict[str, Any]]]:
    """Add `per_step` requests before each step and run to the end: (outputs, telemetry)."""
    ids: list[str] = []
    done: dict[str, RequestOutput] = {}
    telemetry = []
    pending = list(prompts)
    while pending or engine.has_unfinished():
        for p in pending[:per_step]:
            ids.append(engine.add_request(p, params))
        pending = pending[per_step:]
        result = engine.step()
        telemetry.append(result.telemetry.model_dump())
        done.update({out.request_id: out for out in result.outputs if out.finished})
    return [done[i] for i in ids], telemetry


def tokens(outputs: list[RequestOutput]) -> list[list[int]]:
    return [o.token_ids for o in outputs]
