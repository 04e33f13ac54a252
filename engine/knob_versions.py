"""Knob versions: the knobs in force, accepted changes waiting for a step boundary, and the
recent history of applied changes (version, when, who, what)."""

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from engine.errors import InvalidInput
from engine.knobs import Knobs
from engine.telemetry import KnobChange

# applied changes kept in memory; every one is also in its step's telemetry, so the recorder
# keeps the whole history in the database
HISTORY = 4096


class KnobVersions:
    """Versions every accepted change; `propose` may run on any thread, the rest on the
    engine's. Applied changes wait in `unreported` until a step's telemetry carries them."""

    def __init__(self, knobs: Knobs) -> None:
        self.knobs = knobs
        self.version = 1  # the newest accepted
        self.applied_version = 1
        self.history: deque[KnobChange] = deque(maxlen=HISTORY)
        self._pending: list[tuple[Knobs, KnobChange]] = []
        self._unreported: list[KnobChange] = []
        self._lock = threading.Lock()

    @property
    def latest(self) -> Knobs:
        """The knobs in force once every accepted change has applied."""
        with self._lock:
            return self._latest()

    def _latest(self) -> Knobs:
        return self._pending[-1][0] if self._pending else self.knobs

    def propose(
        self,
        changes: dict[str, Any],
        origin: str,
        validate: Callable[[dict[str, Any]], Knobs],
        reason: str | None = None,
    ) -> int:
        """Accept `changes` over the latest knobs if `validate` passes the whole set; returns
        the new version, or the current one when nothing changes."""
        with self._lock:
            old = self._latest().model_dump()
            new = validate({**old, **changes})
            diff = {k: [old[k], v] for k, v in new.model_dump().items() if old[k] != v}
            if not diff:
                return self.version
            self.version += 1
            change = KnobChange(
                version=self.version, t=time.time(), origin=origin, changes=diff, reason=reason
            )
            self._pending.append((new, change))
            return self.version

    def apply_pending(self) -> Knobs | None:
        """Put every accepted change in force; the new knobs, or None when none waited."""
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return None
        self.knobs = pending[-1][0]
        self._applied([change for _, change in pending])
        return self.knobs

    def record(self, changes: dict[str, list[Any]], origin: str) -> KnobChange:
        """Version an action that applied at once (an expert placement switch)."""
        with self._lock:
            self.version += 1
            change = KnobChange(version=self.version, t=time.time(), origin=origin, changes=changes)
        self._applied([change])
        return change

    def _applied(self, changes: list[KnobChange]) -> None:
        self.applied_version = changes[-1].version
        self.history.extend(changes)
        self._unreported.extend(changes)

    def since(self, version: int) -> list[KnobChange]:
        """The applied changes newer than `version`; InvalidInput once some have been let go."""
        with self._lock:
            kept = list(self.history)
        if kept and kept[0].version > version + 1 and len(kept) == self.history.maxlen:
            raise InvalidInput(
                f"knob version {version} is older than the {len(kept)} changes kept in memory",
                "version",
            )
        return [c for c in kept if c.version > version]

    @property
    def waiting(self) -> bool:
        """Whether a change waits to apply or to be reported by a step."""
        return bool(self._pending or self._unreported)

    def take_unreported(self) -> list[KnobChange]:
        taken, self._unreported = self._unreported, []
        return taken
