"""The expert loads of recent steps and a placement planned from them (rebalancing)."""

from collections import deque

import torch

from engine.ep.placement import Placement, max_replicas
from engine.ep.rebalance import predicted_imbalance, rebalance
from engine.errors import InvalidInput, Refused

LOAD_WINDOW = 4096  # steps of expert loads kept for rebalancing


class ExpertLoads:
    """Each step's expert token counts [layers, experts] over the last LOAD_WINDOW steps, and
    the steps since the last rebalance."""

    def __init__(self) -> None:
        self.steps: deque[torch.Tensor] = deque(maxlen=LOAD_WINDOW)
        self.since_rebalance = 0

    def plan(
        self, old: Placement, num_experts: int, window: int, replicas: int
    ) -> tuple[Placement, float, float, int]:
        """A placement for the last `window` steps' loads, the predicted imbalance before and
        after it, and the number of steps it saw."""
        if old.ep_size == 1:
            raise Refused("nothing to rebalance: ep_size is 1 (start with --ep N or --ep-size N)")
        most = max_replicas(num_experts, old.ep_size)
        if replicas > most:
            raise InvalidInput(f"replicas ({replicas}) must be at most {most}", "replicas")
        recent = list(self.steps)[-window:]
        if not recent:
            raise Refused("no expert load recorded yet: rebalance after some steps ran")
        loads = torch.stack(recent).sum(0)
        new = rebalance(loads, old, replicas)
        return new, predicted_imbalance(old, loads), predicted_imbalance(new, loads), len(recent)
