"""The fleet's own knobs (the routing policy), versioned like the engine's, and the log of
knob changes sent to several replicas at once."""

import time
from collections import deque
from typing import Any

from fleet import POLICIES, state

HISTORY = 256  # fleet changes kept in memory, per log


class FleetKnobs:
    """`routing_policy`, with a version bumped by every change and a bounded history."""

    def __init__(self, policy: str = "least_work") -> None:
        self.version = 0
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.replica_changes: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        validate({"routing_policy": policy})
        state.STATE.policy = policy

    def current(self) -> dict[str, Any]:
        return {"knobs": {"routing_policy": state.STATE.policy}, "version": self.version}

    def update(self, changes: dict[str, Any], origin: str = "api") -> dict[str, Any]:
        """Validate and apply at once (the next request is routed by it); ValueError names
        the field."""
        validate(changes)
        before = state.STATE.policy
        state.STATE.policy = changes["routing_policy"]
        self.version += 1
        self.history.append(
            {
                "version": self.version,
                "t": time.time(),
                "origin": origin,
                "changes": {"routing_policy": [before, state.STATE.policy]},
            }
        )
        return self.current()

    def record_replica_change(
        self, changes: dict[str, Any], applied: dict[str, int], failed: dict[str, str]
    ) -> dict[str, Any]:
        """One change sent to many replicas: which applied it (at which of their versions)."""
        entry = {
            "t": time.time(),
            "changes": changes,
            "applied": applied,
            "failed": failed,
        }
        self.replica_changes.append(entry)
        return entry


def validate(changes: dict[str, Any]) -> None:
    unknown = sorted(set(changes) - {"routing_policy"})
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown fleet knob; known: routing_policy")
    if "routing_policy" not in changes:
        raise ValueError("routing_policy: required")
    if changes["routing_policy"] not in POLICIES:
        raise ValueError(
            f"routing_policy: must be one of {', '.join(POLICIES)}, "
            f"got {changes['routing_policy']!r}"
        )
