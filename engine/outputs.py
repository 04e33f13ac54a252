"""What the engine hands back for a request: each step's delta, and the whole output once at
the end (tokens, text, finish reason and timings); and for a step, its `StepResult`."""

from dataclasses import dataclass, field

from engine.telemetry import RequestRecord, StepTelemetry
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


@dataclass(slots=True)
class RequestDelta:
    """What one step added to a request: only what is new, so a step's cost does not grow with
    a request's length. Concatenating a request's deltas gives its whole output's `token_ids`,
    `token_times_s` (seconds since arrival), `text` and `logprobs`; the last delta
    (`finished`) carries that whole output too.

    Text arrives as it settles for requests made with `stream_text` or stop strings (empty
    while held back); for the others it all comes with the last delta."""

    request_id: str
    token_ids: list[int]
    token_times_s: list[float]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    logprobs: list[dict[int, float]] | None = None
    output: RequestOutput | None = None  # the whole output, on the last delta only
    error: str | None = None


def error_delta(request_id: str, message: str) -> RequestDelta:
    """The last delta of a request that failed (its whole output holds no tokens)."""
    output = RequestOutput(request_id, [], [], "", True, "error", None, error=message)
    return RequestDelta(request_id, [], [], "", True, "error", output=output, error=message)


@dataclass
class StepResult:
    """A delta for every request that sampled a token, the whole output of each request that
    finished, the step's record, and the end records of the requests that finished in it."""

    deltas: list[RequestDelta]
    outputs: list[RequestOutput]
    telemetry: StepTelemetry
    ended: list[RequestRecord]
