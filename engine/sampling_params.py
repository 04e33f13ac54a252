"""Per-request sampling parameters (vLLM-like)."""

from pydantic import BaseModel, ConfigDict, Field

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
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = Field(None, ge=0, le=20, description="top-N log-probabilities")
    priority: int = Field(0, description="lower runs first under the priority policy")

    @property
    def greedy(self) -> bool:
        """Temperatures under GREEDY_BELOW pick the argmax (dividing by them would overflow)."""
        return self.temperature < GREEDY_BELOW
