"""Where each replica's own server listens: a named Ray actor the replicas register with.

Ray Serve routes a handle call to some replica, never to one named; the per-replica routes
of the ingress (`/replicas/{id}/...`) and the Fleet page's rows need each replica's address,
which the replica writes here when it starts. An entry stays after its replica dies (Ray
Serve starts a replacement under a new id), so the fleet can show the restart.
"""

import time
from typing import Any

import ray

NAME = "moescope_fleet_registry"
NAMESPACE = "moescope"


@ray.remote(num_cpus=0)
class Registry:
    def __init__(self, fleet_run: str) -> None:
        self.fleet_run = fleet_run
        self.replicas: dict[str, dict[str, Any]] = {}

    def register(self, replica: str, info: dict[str, Any]) -> str:
        """Record a started replica; returns the fleet run it belongs to."""
        self.replicas[replica] = {**info, "replica": replica, "registered_t": time.time()}
        return self.fleet_run

    def mark_dead(self, replica: str) -> None:
        entry = self.replicas.get(replica)
        if entry is not None and "dead_t" not in entry:
            entry["dead_t"] = time.time()

    def entries(self) -> dict[str, dict[str, Any]]:
        return self.replicas


def registry() -> Any:
    """The running fleet's registry (an actor handle)."""
    return ray.get_actor(NAME, namespace=NAMESPACE)
