"""Per-request sampling parameters (vLLM-like)."""

from pydantic import BaseModel, ConfigDict, Field, field_validator

GREEDY_BELOW = 1e-5  # as vLLM's sampling epsilon
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts


class SamplingParams(BaseModel):
    """How to pick each generated token and when to stop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(
        1.0, ge=0.0, le=100.0, description="0 = greedy, as is anything under GREEDY_BELOW"
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = no top-k cut")
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX, description="per-request generator")
    stop: tuple[str, ...] = Field(
        (), description="strings that end the request; the text is cut before the first one"
    )
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = Field(None, ge=0, le=20, description="top-N log-probabilities")
    priority: int = Field(0, description="lower runs first under the priority policy")

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, v: object) -> object:
        return (v,) if isinstance(v, str) else v

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if "" in v:
            raise ValueError("stop strings must not be empty")
        return v

    @property
    def greedy(self) -> bool:
        """Temperatures under GREEDY_BELOW pick the argmax (dividing by them would overflow)."""
        return self.temperature < GREEDY_BELOW
