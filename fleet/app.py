"""Starting a fleet: Ray (local or `address`), the registry, N engine replicas and the ingress
as one Ray Serve application; and stopping it."""

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import serve

from fleet.ingress import FleetIngress
from fleet.registry import NAME, NAMESPACE, Registry
from fleet.replica import EngineReplica
from fleet.routing import FleetRouter
from server.settings import ServerSettings

APP = "moescope"
ROOT = Path(__file__).resolve().parents[1]  # the project, on the workers' path
HEALTH_PERIOD_S = 2.0
# an engine step can hold the replica's GIL for a while on a busy machine
HEALTH_TIMEOUT_S = 60.0
ROUTING_STATS_PERIOD_S = 1.0
MAX_ONGOING = 1024  # per replica; the engine queues what it cannot run yet


# Ray Serve kills an HTTP proxy that is not ready within 3 checks of 5 s; on a loaded 2-core
# machine the proxy's worker took longer to start, was killed, and serve.start failed (CI)
PROXY_ENV = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30"}


@dataclass
class FleetSpec:
    """What to start. `engine_args` and `settings` are those of `moescope serve`."""

    model: str
    engine_args: dict[str, Any]
    settings: ServerSettings
    replicas: int = 2
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    policy: str = "least_work"
    address: str | None = None  # an existing Ray cluster; None starts a local one
    host: str = "127.0.0.1"
    port: int = 8000
    num_cpus: int | None = None  # the local Ray's CPUs (default: what the replicas ask)


@dataclass
class Fleet:
    fleet_run: str
    url: str
    registry: Any

    def replicas(self) -> dict[str, dict[str, Any]]:
        entries: dict[str, dict[str, Any]] = ray.get(self.registry.entries.remote())
        return entries

    def stop(self) -> None:
        serve.shutdown()
        ray.kill(self.registry)


def start(spec: FleetSpec) -> Fleet:
    """Start the fleet and return once every replica serves (Ray Serve waits for them)."""
    if not ray.is_initialized():
        ray.init(
            address=spec.address,
            namespace=NAMESPACE,
            num_cpus=None if spec.address else (spec.num_cpus or _cpus_needed(spec)),
            include_dashboard=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
            log_to_driver=False,
        )
    fleet_run = time.strftime("fleet-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    registry = Registry.options(name=NAME, namespace=NAMESPACE).remote(fleet_run)  # type: ignore[attr-defined]
    serve.start(
        http_options={"host": spec.host, "port": spec.port},
        controller_options={"runtime_env": {"env_vars": PROXY_ENV}},
    )
    replica = serve.deployment(
        name="EngineReplica",
        num_replicas=spec.replicas,
        ray_actor_options={"num_cpus": spec.cpus_per_replica, "num_gpus": spec.gpus_per_replica},
        max_ongoing_requests=MAX_ONGOING,
        health_check_period_s=HEALTH_PERIOD_S,
        health_check_timeout_s=HEALTH_TIMEOUT_S,
        graceful_shutdown_timeout_s=5,
        request_router_config={
            "request_router_class": FleetRouter,
            "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S,
        },
    )(EngineReplica)
    ingress = FleetIngress.options(max_ongoing_requests=MAX_ONGOING * spec.replicas).bind(  # type: ignore[attr-defined]
        replica.bind(spec.model, spec.engine_args, spec.settings, fleet_run),
        spec.policy,
        spec.settings.api_key,
        spec.settings.admin_key,
    )
    serve.run(ingress, name=APP, route_prefix="/")
    return Fleet(fleet_run, f"http://{spec.host}:{spec.port}", registry)


def _cpus_needed(spec: FleetSpec) -> int:
    """CPUs the local Ray is told it has: every replica's share, rounded up, plus one."""
    return int(-(-spec.replicas * spec.cpus_per_replica // 1)) + 1
