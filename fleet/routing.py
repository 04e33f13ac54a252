"""Which replica takes a request: a Ray Serve `RequestRouter` with three policies.

Ray Serve builds the router inside the handle the ingress calls replicas through and asks
it, for each request, to rank the live replicas; the request goes to the first that has
room. The router puts one replica first and counts the request against it until Ray Serve
reports it ended.

- `least_work`: the fewest tokens ahead: the prompt + max_tokens of the requests sent to
  the replica that have not ended (exact and current, unlike a polled figure), replicas
  short of KV headroom (their routing stats, polled each second) after the others, ties to
  the replica sent the fewest requests so far.
- `round_robin`: replicas in turn.
- `power_of_two`: two replicas at random, the one with fewer requests in flight first.

The policy is a fleet knob (`fleet/knobs.py`), read from `fleet.state` on every request.
"""

import itertools
import random

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from fleet import state

# below this free fraction of its KV cache a replica is ranked after the rest
MIN_KV_FREE = 0.05


def request_work(pending: PendingRequest | None) -> int:
    """Tokens a request adds to its replica: the `work` keyword the ingress passes."""
    return int(pending.kwargs.get("work", 1)) if pending is not None else 1


class FleetRouter(RequestRouter):
    """The fleet's request router (the replicas' `request_router_config`)."""

    def initialize_state(self, **kwargs: object) -> None:
        self._turn = itertools.count()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        ranked = self.rank(sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id))
        if pending_request is not None:
            state.STATE.sent(
                pending_request.metadata.internal_request_id,
                ranked[0].replica_id.unique_id,
                request_work(pending_request),
            )
        return [[r] for r in ranked]

    def rank(self, replicas: list[RunningReplica]) -> list[RunningReplica]:
        policy = state.STATE.policy
        load = state.STATE.snapshot()
        if policy == "round_robin":
            i = next(self._turn) % len(replicas)
            return replicas[i:] + replicas[:i]
        if policy == "power_of_two":
            two = random.sample(replicas, min(2, len(replicas)))
            return sorted(two, key=lambda r: load["in_flight"].get(r.replica_id.unique_id, 0))

        def least_work(replica: RunningReplica) -> tuple[bool, int, int, int]:
            stats = replica.routing_stats or {}
            rid = replica.replica_id.unique_id
            return (
                float(stats.get("kv_free", 1.0)) < MIN_KV_FREE,
                load["work"].get(rid, 0),
                load["in_flight"].get(rid, 0),
                load["routed"].get(rid, 0),
            )

        return sorted(replicas, key=least_work)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        state.STATE.ended(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        state.STATE.replica_gone(replica_id.unique_id)
