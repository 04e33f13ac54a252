"""Where each replica's own server listens: a named Ray actor the replicas register with.

Ray Serve routes a handle call to some replica, never to one named; the per-replica routes
of the ingress (`/replicas/{id}/...`) and the Fleet page's rows need each replica's address,
which the replica writes here when it starts.

One entry per slot: Ray Serve gives each replica a rank in [0, replicas) and a replacement
the rank of the replica it replaces, so a restart takes over its slot (the slot's `restarts`
counted, the last replaced ids kept) rather than adding a row. A replica that died and is not
yet replaced stays its slot's entry, marked dead.
"""

import time
from typing import Any

import ray

NAME = "moescope_fleet_registry"
NAMESPACE = "moescope"
PREVIOUS_KEPT = 8  # replaced replica ids kept per slot


@ray.remote(num_cpus=0)
class Registry:
    def __init__(self, fleet_run: str) -> None:
        self.fleet_run = fleet_run
        self.slots: dict[int, dict[str, Any]] = {}

    def register(self, replica: str, slot: int, info: dict[str, Any]) -> str:
        """Record a started replica in `slot` (its rank); returns the fleet run it belongs to."""
        before = self.slots.get(slot, {"replica": replica, "restarts": 0, "previous": []})
        restarts, previous = before["restarts"], before["previous"]
        if before["replica"] != replica:  # a replacement
            restarts += 1
            previous = [*previous, before["replica"]][-PREVIOUS_KEPT:]
        self.slots[slot] = {
            **info,
            "replica": replica,
            "slot": slot,
            "registered_t": time.time(),
            "restarts": restarts,
            "previous": previous,
        }
        return self.fleet_run

    def mark_dead(self, replica: str) -> None:
        for entry in self.slots.values():
            if entry["replica"] == replica and "dead_t" not in entry:
                entry["dead_t"] = time.time()

    def run(self) -> str:
        return self.fleet_run

    def entries(self) -> dict[str, dict[str, Any]]:
        """Each slot's replica (live, or dead and not yet replaced), by replica id."""
        return {e["replica"]: e for _, e in sorted(self.slots.items())}


def registry() -> Any:
    """The running fleet's registry (an actor handle)."""
    return ray.get_actor(NAME, namespace=NAMESPACE)
