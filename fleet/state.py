"""The routing state of the ingress's process: the policy in force and each replica's work in
flight. Its own module because Ray Serve ships the router's module to the ingress by value (a
copy): the router reaches this one through the module, so the ingress's policy changes and
the router's counts meet here. The router runs on Ray Serve's router loop, the ingress on its
own: one lock."""

import threading
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RoutingState:
    policy: str = "least_work"
    # internal request id -> (replica unique id, tokens of work)
    in_flight: dict[str, tuple[str, int]] = field(default_factory=dict)
    work: Counter[str] = field(default_factory=Counter)  # replica -> tokens in flight
    requests: Counter[str] = field(default_factory=Counter)  # replica -> requests in flight
    routed: Counter[str] = field(default_factory=Counter)  # replica -> requests sent so far
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sent(self, request_id: str, replica: str, work: int) -> None:
        """`request_id` goes to `replica` (again, if it was routed before: counted once)."""
        with self.lock:
            self._drop(request_id)
            self.in_flight[request_id] = (replica, work)
            self.work[replica] += work
            self.requests[replica] += 1
            self.routed[replica] += 1

    def ended(self, request_id: str) -> None:
        with self.lock:
            self._drop(request_id)

    def replica_gone(self, replica: str) -> None:
        with self.lock:
            for rid in [k for k, (r, _) in self.in_flight.items() if r == replica]:
                self._drop(rid)

    def _drop(self, request_id: str) -> None:
        entry = self.in_flight.pop(request_id, None)
        if entry is not None:
            replica, work = entry
            self.work[replica] -= work
            self.requests[replica] -= 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {
                "work": dict(self.work),
                "in_flight": dict(self.requests),
                "routed": dict(self.routed),
            }


STATE = RoutingState()
