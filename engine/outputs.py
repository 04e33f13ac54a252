"""What the engine hands back for a request: tokens, text, finish reason and timings."""

from dataclasses import dataclass, field

from stats import tpot


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    ttft_s: float | None
    token_times_s: list[float] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    num_preemptions: int = 0
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        return tpot(self.token_times_s)
