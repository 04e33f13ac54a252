"""What the SLO autopilot aims for and what it may touch: targets, knobs with bounds, pacing."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import stats
from engine.errors import InvalidInput
from engine.knobs import Knobs

MOVABLE = ("max_num_seqs", "max_num_batched_tokens", "prefill_chunk_size")


class Bounds(BaseModel):
    """The range the autopilot may move one knob within (inclusive)."""

    model_config = ConfigDict(extra="forbid")

    lo: int = Field(ge=0)
    hi: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> "Bounds":
        if self.lo > self.hi:
            raise InvalidInput(f"lo ({self.lo}) must not exceed hi ({self.hi})", "lo")
        return self


DEFAULT_BOUNDS = {
    "max_num_seqs": Bounds(lo=1, hi=256),
    "max_num_batched_tokens": Bounds(lo=64, hi=8192),
    "prefill_chunk_size": Bounds(lo=16, hi=4096),
}


class AutopilotSettings(BaseModel):
    """Targets are p90 latencies in ms; a knob left out of `knobs` is never moved."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    ttft_p90_ms: float = Field(1000.0, gt=0)
    tpot_p90_ms: float = Field(100.0, gt=0)
    goodput_weight: float = Field(0.0, ge=0, description="score = attainment + weight x goodput")
    knobs: dict[str, Bounds] = Field(default_factory=lambda: dict(DEFAULT_BOUNDS))
    allow_policy: bool = False  # also try fcfs <-> shortest_first
    interval_s: float = Field(2.0, ge=0.2, le=600)
    max_factor: float = Field(2.0, gt=1, le=16, description="one change moves a knob at most x")
    min_gap_s: float = Field(6.0, ge=0, le=3600, description="between two changes")
    gain: float = Field(0.05, ge=0, le=1, description="predicted score gain a change must clear")
    observe_s: float = Field(10.0, gt=0, le=3600, description="after a change, before judging it")
    pause_s: float = Field(
        60.0, ge=0, le=86400, description="a person's change pauses it this long"
    )
    horizon_s: float = Field(10.0, gt=0, le=600, description="what the twin simulates ahead")
    arrivals_s: float = Field(
        20.0, gt=0, le=3600, description="the recent arrivals the twin repeats over the horizon"
    )
    look_s: float = Field(5.0, gt=0, le=3600, description="ask the twin at most this often")
    explore_s: float = Field(30.0, gt=0, le=3600, description="look for gains this often when met")

    @model_validator(mode="after")
    def _knobs_in_range(self) -> "AutopilotSettings":
        for name, bounds in self.knobs.items():
            if name not in MOVABLE:
                raise InvalidInput(
                    f"knobs.{name}: the autopilot moves only {', '.join(MOVABLE)}", f"knobs.{name}"
                )
            low, high = knob_range(name)
            if bounds.lo < low or bounds.hi > high:
                raise InvalidInput(
                    f"knobs.{name}: bounds must lie within [{low}, {high}]", f"knobs.{name}"
                )
        return self

    @property
    def slo(self) -> stats.SLO:
        return stats.SLO(ttft=self.ttft_p90_ms, tpot=self.tpot_p90_ms)


def knob_range(name: str) -> tuple[int, int]:
    """The knob's own allowed range (its Field's ge and le)."""
    low, high = 0, 1 << 30
    for rule in Knobs.model_fields[name].metadata:
        low = getattr(rule, "ge", low)
        high = getattr(rule, "le", high)
    return low, high


def parse_targets(text: str) -> AutopilotSettings:
    """`ttft_p90_ms=800,tpot_p90_ms=60` (as `moescope serve --autopilot` takes it) as enabled
    settings; ValueError naming a bad entry."""
    out: dict[str, Any] = {"enabled": True}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"{part!r}: expected name=value")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"{name.strip()}: {value!r} is not a number") from None
    try:
        return AutopilotSettings.model_validate(out)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise ValueError(f"{where}: {first['msg']}" if where else first["msg"]) from None
