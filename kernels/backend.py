"""Backend selection for the expert computation, in one place."""

import os
from typing import Literal

MoEBackend = Literal["torch", "loop"]
MOE_BACKENDS: tuple[str, ...] = ("torch", "loop")


def moe_backend() -> MoEBackend:
    """The MoE backend from MOESCOPE_MOE_BACKEND (default: torch grouped_mm)."""
    name = os.environ.get("MOESCOPE_MOE_BACKEND", "torch")
    if name not in MOE_BACKENDS:
        raise ValueError(f"MOESCOPE_MOE_BACKEND={name!r}; expected one of {MOE_BACKENDS}")
    return name  # type: ignore[return-value]
