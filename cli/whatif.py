"""`moescope whatif` and `moescope tune`: the what-if twin on a recorded session, read from the
database with no server (`tune --verify URL` then checks the best setting on a server)."""

import argparse
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

import stats
from cli.args import int_at_least, positive
from cli.sessions import CommandError, db_argument, with_store
from cli.tune_verify import VerifyError, verify
from cli.whatif_text import knob_rows, metric_rows, saturation_text, table, whatif_text
from storage import Store
from storage import queries as q
from tuning.twin.outcome import METRICS
from tuning.twin.tune import DEFAULT_KNOBS, Trial, best, candidates, evaluate
from tuning.twin.whatif import Twin, twin_from_recordings

SLO_KEY = re.compile(r"(ttft|tpot)_p(\d+(?:\.\d+)?)_ms")
SCORES = ("goodput_rps", "slo_attainment")


def knob_setting(text: str) -> tuple[str, Any]:
    """--set KNOB=VALUE: the value as JSON where it parses (32, 0.5, null), else as text."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"must be KNOB=VALUE, got {text!r}")
    try:
        return name.strip(), json.loads(value)
    except ValueError:
        return name.strip(), value.strip()


@dataclass(frozen=True)
class Target:
    """Per-request latency bounds (`slo`), the share of requests that should meet them, and
    both in words."""

    slo: stats.SLO
    share: float
    text: str


def slo_target(text: str) -> Target:
    """--slo ttft_p90_ms=800,tpot_p90_ms=60: a request meets the SLO with its TTFT and TPOT
    within the bounds, and p90 asks that 90% of requests do (one percentile for both)."""
    bounds: dict[str, float] = {}
    shares = set()
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        match = SLO_KEY.fullmatch(key)
        if not sep or match is None:
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r}: expected ttft_pNN_ms=MS or tpot_pNN_ms=MS"
            )
        try:
            bounds[match[1]] = positive(value)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{key}: {exc}") from None
        shares.add(float(match[2]))
    if len(shares) > 1 or not 0 < (share := shares.pop()) <= 100:
        raise argparse.ArgumentTypeError(f"one percentile from p0 to p100 for both, got {text!r}")
    words = " and ".join(f"{k.upper()} <= {v:g} ms" for k, v in bounds.items())
    slo = stats.SLO(bounds.get("ttft", math.inf), bounds.get("tpot", math.inf))
    return Target(slo, share / 100, f"{words} per request, for {share:g}% of requests")


def knob_list(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def session_twin(store: Store, sessions: list[str]) -> Twin:
    """The twin of the first session's trace, its cost model pooled over all of them."""
    return twin_from_recordings([q.recording(store, sid) for sid in sessions])


def cmd_whatif(store: Store, args: argparse.Namespace) -> None:
    start = time.perf_counter()
    twin = session_twin(store, args.session)
    result = twin.compare(dict(args.set), args.horizon)
    result = {
        "source": args.session[0] if len(args.session) == 1 else args.session,
        "horizon_s": args.horizon,
        **result,
        "wall_s": round(time.perf_counter() - start, 4),
    }
    print(json.dumps(result, indent=2) if args.json else whatif_text(result))


def cmd_tune(store: Store, args: argparse.Namespace) -> None:
    twin = session_twin(store, args.session)
    session = args.session[0]
    settings = candidates(twin, args.knobs, args.trials, args.seed)
    print(
        f"tune {session}: {len(twin.trace)} requests; SLO {args.slo.text}; "
        f"{len(settings)} settings of {', '.join(args.knobs)}",
        file=sys.stderr,
    )
    trials = [
        evaluate(twin, changes, args.slo.slo)
        for changes in tqdm(settings, desc="simulating", unit="setting", file=sys.stderr)
    ]
    by_goodput, by_attainment = best(trials, "goodput_rps"), best(trials, "slo_attainment")
    if by_goodput is None or by_attainment is None:
        raise CommandError(f"no setting could be predicted: {trials[0].refused}")
    refused = sum(t.refused is not None for t in trials)
    report: dict[str, Any] = {
        "session": session,
        "pooled": args.session,
        "slo": {
            "ttft_ms": args.slo.slo.ttft,
            "tpot_ms": args.slo.slo.tpot,
            "share": args.slo.share,
        },
        "settings": len(trials),
        "refused": refused,
        "current": _trial(trials[0]),
        "best_goodput": _trial(by_goodput),
        "best_attainment": _trial(by_attainment),
    }
    if args.verify:
        span = twin.trace[-1].offset_s if twin.trace else 0.0
        knobs = report["best_goodput"]["knobs"]
        try:
            report["verify"] = verify(args.verify, session, knobs, args.slo.slo, 60 + 3 * span)
        except VerifyError as exc:
            raise CommandError(f"--verify {args.verify}: {exc}") from None
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(_tune_text(report, args.knobs, args.slo))


def _trial(trial: Trial) -> dict[str, Any]:
    """A trial as the report shows it: its changes, scores and outcome (no per-request list)."""
    out = trial.outcome or {}
    return {
        "changes": trial.changes,
        "refused": trial.refused,
        "goodput_rps": trial.goodput_rps,
        "slo_attainment": trial.slo_attainment,
        **{k: out.get(k) for k in ("knobs", *METRICS, "unfinished", "bands", "saturation")},
    }


def _tune_text(report: dict[str, Any], names: list[str], target: Target) -> str:
    sides = [report["current"], report["best_goodput"], report["best_attainment"]]
    rows = knob_rows([side["changes"] for side in sides], names)
    rows += metric_rows(sides, SCORES)
    meets = [s["slo_attainment"] is not None and s["slo_attainment"] >= target.share for s in sides]
    rows.append([f"meets {100 * target.share:g}% target", *("yes" if m else "no" for m in meets)])
    rows += metric_rows(sides, (*METRICS, "unfinished"))
    rows.append(["queue builds in", *(saturation_text(side) for side in sides)])
    lines = [
        f"{report['settings']} settings simulated"
        + (
            f" ({report['refused']} beyond the recorded steps, not scored)"
            if report["refused"]
            else ""
        ),
        "values: median of the twin's simulations [80% band]",
        table(["", "current", "best goodput", "best attainment"], rows),
    ]
    if "verify" in report:
        measured = report["verify"]
        rows = metric_rows([sides[1], measured], (*SCORES, *METRICS))
        lines += [
            "",
            f"verified on the server: rerun {measured['session']} under knobs version "
            f"{measured['knobs_version']}",
            table(["", "predicted", "measured"], rows),
        ]
    return "\n".join(lines)


def add_whatif_commands(sub: argparse._SubParsersAction) -> None:
    """The `whatif` and `tune` subcommands."""
    pooled = "(several: the first's requests, a cost model pooled over all, one engine)"
    p = sub.add_parser("whatif", help="a recorded session under other knobs, in simulation")
    p.add_argument("session", nargs="+", help=f"recorded session id {pooled}")
    p.add_argument(
        "--set",
        type=knob_setting,
        action="append",
        required=True,
        metavar="KNOB=VALUE",
        help="a knob's candidate value (repeat for more)",
    )
    p.add_argument("--horizon", type=positive, default=None, help="simulate the first S seconds")
    p.add_argument("--json", action="store_true", help="the raw result")
    db_argument(p)
    p.set_defaults(func=with_store(cmd_whatif))
    p = sub.add_parser("tune", help="search knob settings for an SLO, in simulation")
    p.add_argument("session", nargs="+", help=f"recorded session id {pooled}")
    p.add_argument(
        "--slo", type=slo_target, required=True, help="e.g. ttft_p90_ms=800,tpot_p90_ms=60"
    )
    p.add_argument(
        "--knobs",
        type=knob_list,
        default=list(DEFAULT_KNOBS),
        help=f"knobs to search (default {','.join(DEFAULT_KNOBS)})",
    )
    p.add_argument("--trials", type=int_at_least(1), default=60, help="settings simulated at most")
    p.add_argument("--seed", type=int, default=0, help="which settings, when the grid is larger")
    p.add_argument(
        "--verify",
        metavar="URL",
        default=None,
        help="apply the best on this server, rerun, measure",
    )
    p.add_argument("--json", action="store_true", help="the report as JSON")
    db_argument(p)
    p.set_defaults(func=with_store(cmd_tune))
