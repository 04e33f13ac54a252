"""Fleet: 1 vs 2 replicas, and the least-work routing policy against round-robin.

A local Ray, replicas of synthetic:tiny (1 torch thread, 1 Ray CPU each), one seeded open-loop
load of streaming completions with mixed prompt lengths (a quarter long, the rest short;
`--long`/`--short` prompt tokens, `--max-tokens` output tokens each, all generated:
ignore_eos), sent through the ingress at `--rate` requests/s. Measured per run: output
tokens/s over the run, TTFT p50/p90 (first streamed chunk) and end-to-end p90.

Side by side: the 2-replica fleet runs the load four times in one session, switching the
routing policy (a live fleet knob) between runs: least_work, round_robin, least_work,
round_robin; the two least_work runs are the A/A control (their ratio is the noise). The
1-replica fleet runs it twice (its own A/A). Writes its section of benchmarks/RESULTS.md.

    python -m benchmarks.fleet.replicas            # --quick: fewer requests, no RESULTS.md
"""

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import machine
from benchmarks.harness.results_md import (
    add_results_arguments,
    header,
    percentiles_cell,
    publish,
    results_path,
)
from engine.ep.ranks import free_port
from server.settings import ServerSettings
from stats import percentile, summary

SECTION = "fleet_replicas"
MODEL = "synthetic:tiny"


def workload(n: int, long: int, short: int, seed: int) -> list[tuple[float, str]]:
    """`n` (arrival offset s, prompt) pairs at rate 1/s: Poisson gaps, 1 in 4 prompts long.
    The synthetic tokenizer is byte-level: a prompt of k letters is k tokens."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(1.0)
        length = long if rng.random() < 0.25 else short
        out.append((t, "".join(rng.choice("abcdefgh ") for _ in range(length))))
    return out


async def one(
    client: httpx.AsyncClient, at: float, prompt: str, max_tokens: int, t0: float
) -> tuple[float, float, int]:
    """(TTFT s, E2E s, output tokens) of one streamed completion sent at t0 + `at`."""
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    sent = time.perf_counter()
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    ttft = None
    async with client.stream("POST", "/v1/completions", json=body) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"HTTP {reply.status_code}: {(await reply.aread())[:200]!r}")
        async for line in reply.aiter_lines():
            if ttft is None and line.startswith("data: {"):
                ttft = time.perf_counter() - sent
    return ttft or float("nan"), time.perf_counter() - sent, max_tokens


async def run_load(url: str, load: list[tuple[float, str]], rate: float, max_tokens: int) -> dict:
    limits = httpx.Limits(max_connections=len(load))
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(one(client, at / rate, prompt, max_tokens, t0) for at, prompt in load)
        )
        wall = time.perf_counter() - t0
    ttft = [r[0] * 1000 for r in results]
    return {
        "tok_s": sum(r[2] for r in results) / wall,
        "ttft": summary(ttft),
        "e2e_p90": percentile([r[1] * 1000 for r in results], 90),
        "wall_s": wall,
    }


def fleet_runs(
    replicas: int, policies: list[str], args: argparse.Namespace, db: Path
) -> list[dict[str, Any]]:
    """Start a fleet of `replicas`, run the load once per entry of `policies`, stop it."""
    import ray

    from fleet.app import FleetSpec, start

    spec = FleetSpec(
        model=MODEL,
        engine_args={"threads": 1, "num_kv_blocks": 1024, "max_num_seqs": 32},
        settings=ServerSettings(model_name=MODEL, db_url=f"sqlite:///{db}"),
        replicas=replicas,
        cpus_per_replica=1.0,
        port=free_port(),
    )
    fleet = start(spec)
    load = workload(args.requests, args.long, args.short, args.seed)
    runs = []
    try:
        # a fresh replica's first requests pay one-off costs (kernel selection, allocator
        # growth): measured once, they made the first run of a fleet an outlier (A/A x0.27)
        asyncio.run(run_load(fleet.url, load[: max(8, len(load) // 5)], args.rate, args.max_tokens))
        for policy in policies:
            httpx.patch(
                fleet.url + "/fleet/knobs", json={"routing_policy": policy}
            ).raise_for_status()
            result = asyncio.run(run_load(fleet.url, load, args.rate, args.max_tokens))
            runs.append({"replicas": replicas, "policy": policy, **result})
            print(runs[-1], file=sys.stderr, flush=True)
    finally:
        fleet.stop()
        ray.shutdown()
    return runs


def render(args: argparse.Namespace, argv: list[str], runs: list[dict], runtime_s: float) -> str:
    one = [r for r in runs if r["replicas"] == 1]
    two = [r for r in runs if r["replicas"] == 2]
    lw = [r for r in two if r["policy"] == "least_work"]
    rr = [r for r in two if r["policy"] == "round_robin"]

    def mean(rs: list[dict], key: str) -> float:
        return sum(r[key] if key != "ttft_p90" else r["ttft"]["p90"] for r in rs) / len(rs)

    lines = [
        header(
            "Fleet: replicas and routing",
            ["python", "-m", __spec__.name, *argv],
            runtime_s,
            machine.measure(),
        ),
        f"- Commit: {machine.engine_revision()}",
        f"- Load: {args.requests} streamed completions, Poisson at {args.rate}/s, 1 in 4 "
        f"prompts {args.long} tokens, the rest {args.short}; {args.max_tokens} output tokens "
        "each; synthetic:tiny replicas, 1 thread and 1 Ray CPU each, local Ray",
        "",
        "| run | replicas | policy | output tok/s | TTFT ms p50 / p90 / p99 | E2E p90 ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(runs, 1):
        lines.append(
            f"| {i} | {r['replicas']} | {r['policy']} | {r['tok_s']:.0f} | "
            f"{percentiles_cell(r['ttft'], 0)} | {r['e2e_p90']:.0f} |"
        )
    lines += [
        "",
        f"- 2 vs 1 replica: throughput x{mean(two, 'tok_s') / mean(one, 'tok_s'):.2f}, "
        f"TTFT p90 x{mean(two, 'ttft_p90') / mean(one, 'ttft_p90'):.2f} (all runs of each)",
        f"- least_work vs round_robin (2 replicas): TTFT p90 "
        f"x{mean(lw, 'ttft_p90') / mean(rr, 'ttft_p90'):.2f}, throughput "
        f"x{mean(lw, 'tok_s') / mean(rr, 'tok_s'):.2f}",
        f"- A/A controls (same setup twice): 1 replica TTFT p90 "
        f"x{one[1]['ttft']['p90'] / one[0]['ttft']['p90']:.2f}, throughput "
        f"x{one[1]['tok_s'] / one[0]['tok_s']:.2f}; 2 replicas least_work TTFT p90 "
        f"x{lw[1]['ttft']['p90'] / lw[0]['ttft']['p90']:.2f}, throughput "
        f"x{lw[1]['tok_s'] / lw[0]['tok_s']:.2f}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--rate", type=float, default=12.0, help="requests per second")
    p.add_argument("--long", type=int, default=600, help="tokens of a long prompt")
    p.add_argument("--short", type=int, default=16, help="tokens of a short prompt")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="30 requests, RESULTS.md untouched")
    add_results_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.requests = 30
    start = time.perf_counter()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "fleet.db"
        runs = fleet_runs(1, ["least_work", "least_work"], args, db)
        runs += fleet_runs(2, ["least_work", "round_robin", "least_work", "round_robin"], args, db)
    text = render(args, argv, runs, time.perf_counter() - start)
    publish(SECTION, text, results_path(args))


if __name__ == "__main__":
    main()
