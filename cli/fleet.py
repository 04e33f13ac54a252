"""`moescope fleet`: N engine replicas on Ray Serve behind one endpoint (fleet/).

It takes `moescope serve`'s arguments (each replica is such a server) plus the fleet's own:
how many replicas, the CPUs/GPUs each holds, the routing policy, and a Ray cluster to join.
"""

import argparse
import signal
import sys
import threading
from typing import TYPE_CHECKING

from cli.args import int_at_least, positive, serve_engine_args, server_settings
from fleet import POLICIES

if TYPE_CHECKING:
    from fleet.app import FleetSpec


def add_fleet_command(sub: argparse._SubParsersAction, serve: argparse.ArgumentParser) -> None:
    """`fleet`, with every argument of the `serve` parser and the fleet's own."""
    p = sub.add_parser(
        "fleet",
        parents=[serve],
        conflict_handler="resolve",
        help="N engine replicas on Ray Serve behind one OpenAI-compatible endpoint",
    )
    p.add_argument("--replicas", type=int_at_least(1), default=2, help="engine replicas")
    p.add_argument(
        "--cpus-per-replica",
        type=positive,
        default=1.0,
        help="Ray CPUs each replica holds (its torch threads are --threads)",
    )
    p.add_argument(
        "--gpus-per-replica", type=float, default=0.0, help="Ray GPUs each replica holds"
    )
    p.add_argument(
        "--routing-policy",
        choices=POLICIES,
        default="least_work",
        help="which replica takes a request (a live fleet knob: PATCH /fleet/knobs)",
    )
    p.add_argument(
        "--address",
        default=None,
        help="join a running Ray cluster (`ray start --head` prints it) instead of "
        "starting a local one",
    )
    p.set_defaults(func=cmd_fleet)


def spec_from_args(args: argparse.Namespace) -> "FleetSpec":
    """The fleet `args` describe; SystemExit for what a replica cannot do."""
    from fleet.app import FleetSpec

    if args.ep is not None:
        raise SystemExit(
            "moescope fleet: --ep runs expert-parallel processes per server; inside a fleet "
            "replica use --ep-size (modeled)"
        )
    if args.fit_from is not None:
        raise SystemExit("moescope fleet: --fit-from is per server; not supported in a fleet")
    settings = server_settings(args)
    engine_args = serve_engine_args(args)
    return FleetSpec(
        model=args.model,
        engine_args=engine_args,
        settings=settings,
        replicas=args.replicas,
        cpus_per_replica=args.cpus_per_replica,
        gpus_per_replica=args.gpus_per_replica,
        policy=args.routing_policy,
        address=args.address,
        host=args.host,
        port=args.port,
    )


def cmd_fleet(args: argparse.Namespace) -> None:
    from fleet.app import start  # Ray is imported by this command only

    spec = spec_from_args(args)
    try:
        fleet = start(spec)
    except KeyboardInterrupt:  # Ray's exit hook stops what had started
        raise SystemExit("moescope fleet: interrupted while starting") from None
    print(
        f"moescope: fleet {fleet.fleet_run} of {spec.replicas} replicas of {spec.model} on "
        f"{fleet.url} (status {fleet.url}/fleet/status; telemetry "
        f"ws://{spec.host}:{spec.port}/ws/telemetry)",
        file=sys.stderr,
        flush=True,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        fleet.stop()
