"""A request's life in the engine: its tokens, progress, KV blocks and timings."""

import enum
import itertools
import time
from dataclasses import dataclass, field

from engine.detokenizer import OutputText
from engine.sampling_params import SamplingParams
from engine.telemetry import RequestRecord

_ids = itertools.count()


def auto_request_id() -> str:
    """A fresh `req-N` id (a caller may have taken one already: check before use)."""
    return f"req-{next(_ids)}"


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One sequence: prompt plus generated tokens, computed-token progress and block table."""

    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    arrival: float = field(default_factory=time.time)
    status: Status = Status.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0
    block_hashes: list[int] = field(default_factory=list)
    host_blocks: list[int] = field(default_factory=list)
    # the sliding layers' pool (engine.window_pool), by the same block positions: the first
    # `window_first` entries fell behind the window and were given back (placeholders)
    window_table: list[int] = field(default_factory=list)
    window_first: int = 0
    window_host: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    token_times: list[float] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    num_preemptions: int = 0
    slot: int | None = None
    seq: int = field(default_factory=lambda: next(_ids))
    all_token_ids: list[int] = field(default_factory=list)
    text: OutputText = field(default_factory=OutputText)  # of the output tokens
    stream_text: bool = False  # its deltas carry text as it settles, not all at the end
    # tokens that launched steps will sample, not known yet: the scheduler counts them, so
    # that the next step can be scheduled while this one runs (engine overlap)
    num_in_flight: int = 0
    sample_index: int = -1  # its row among the sampled tokens of the last launched step

    def __post_init__(self) -> None:
        if not self.request_id:
            self.request_id = f"req-{self.seq}"
        self.all_token_ids = list(self.prompt_token_ids)
        self.text = OutputText(self.params.stop)

    def append_token(self, token_id: int, now: float) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        self.token_times.append(now)

    @property
    def text_each_step(self) -> bool:
        """Whether its text is decoded every step: to stream it, or to find stop strings;
        else it is decoded once, at the end."""
        return self.stream_text or bool(self.params.stop)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids) + self.num_in_flight

    @property
    def num_pending_tokens(self) -> int:
        """Tokens whose KV is not computed yet."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def in_prefill(self) -> bool:
        return self.num_pending_tokens > 1 or not (self.output_token_ids or self.num_in_flight)

    @property
    def max_tokens_in_flight(self) -> bool:
        """Whether the tokens in flight bring it to max_tokens: it ends with them."""
        return (
            self.num_in_flight > 0
            and len(self.output_token_ids) + self.num_in_flight >= self.params.max_tokens
        )

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.params.max_tokens

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    def end_record(self, now: float, keep_prompt: bool = False) -> RequestRecord:
        """The one record of this request's end (it has a `finish_reason` by now), with its
        prompt's token ids if `keep_prompt`."""
        ttft = self.ttft_s
        return RequestRecord(
            req=self.request_id,
            arrival=self.arrival,
            finished_t=now,
            prompt_len=self.num_prompt_tokens,
            output_len=len(self.output_token_ids),
            max_tokens=self.params.max_tokens,
            ttft_ms=None if ttft is None else round(ttft * 1000, 3),
            finish_reason=self.finish_reason or "abort",
            preemptions=self.num_preemptions,
            e2e_ms=round((now - self.arrival) * 1000, 3),
            priority=self.params.priority,
            prompt_token_ids=list(self.prompt_token_ids) if keep_prompt else None,
        )
