"""`moescope sessions list|show|export|delete|label` and `moescope replay`, on the database."""

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from cli.args import describe, int_at_least, non_negative
from cli.attribution_text import attribution_table
from server.session_attribution import session_report
from storage import DEFAULT_URL, SessionNotFound, SessionOpen, StorageError, Store
from storage import queries as q
from storage.export import TABLES, write_jsonl, write_parquet
from storage.replay import replay


class CommandError(Exception):
    """A command that cannot go on: its message is the whole error line."""


def default_db() -> str:
    return os.environ.get("MOESCOPE_DB") or DEFAULT_URL


def db_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--db", default=default_db(), help="SQLAlchemy URL (default: $MOESCOPE_DB or %(default)s)"
    )


def _when(t: float | None) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def cmd_list(store: Store, args: argparse.Namespace) -> None:
    rows = q.list_sessions(store, args.limit, replica=args.replica, fleet_run=args.fleet_run)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"{'id':<13} {'started':<19} {'kind':<6} {'duration':>9} {'steps':>7} {'reqs':>6} "
        f"{'dropped':>7}  model / label"
    )
    for s in rows:
        name = s["model"] + (f'  "{s["label"]}"' if s["label"] else "")
        print(
            f"{s['id']:<13} {_when(s['started_t']):<19} {s['kind']:<6} "
            f"{s['duration_s']:>8.1f}s {s['steps']:>7} {s['requests']:>6} {s['dropped']:>7}"
            f"  {name}"
        )


def cmd_show(store: Store, args: argparse.Namespace) -> None:
    if args.attribution:
        show_attribution(store, args)
        return
    s = q.get_session(store, args.id)
    if args.json:
        print(json.dumps(s, indent=2))
        return
    for key in ("id", "label", "kind", "parent", "model", "engine_session"):
        print(f"{key:<16}{s[key] if s[key] is not None else '-'}")
    print(
        f"{'started':<16}{_when(s['started_t'])}   ended {_when(s['ended_t'])}   "
        f"duration {s['duration_s']:.1f} s"
    )
    print(
        f"{'steps':<16}{s['steps']} (from {s['first_step']} to {s['last_step']}), "
        f"{s['dropped']} dropped, mean {s['mean_step_ms']} ms"
    )
    stats = s["request_stats"]
    print(
        f"{'requests':<16}{s['requests']}  {stats['finish_reasons']}  prompt tokens "
        f"{stats['prompt_tokens']}, output tokens {stats['output_tokens']}, TTFT ms p50 "
        f"{stats['ttft_ms_p50']} p90 {stats['ttft_ms_p90']} p99 {stats['ttft_ms_p99']}"
    )
    print(f"{'knob changes':<16}{s['knob_changes']}")
    print(f"{'knobs at start':<16}{json.dumps(s['knobs'])}")
    if s["reruns"]:
        print(f"{'reruns':<16}{', '.join(s['reruns'])}")


def show_attribution(store: Store, args: argparse.Namespace) -> None:
    """The whole session's attribution report (InvalidInput for an old recording)."""
    report = session_report(store, args.id)
    print(json.dumps(report, indent=2) if args.json else attribution_table(report))


def cmd_export(store: Store, args: argparse.Namespace) -> None:
    q.require_session(store, args.id)
    if args.format == "jsonl":
        out = args.output or f"moescope-{args.id}.jsonl"
        what = "lines"
    else:
        out = args.output or f"moescope-{args.id}-{args.table}.parquet"
        what = f"rows ({args.table})"
    try:
        n = _export(store, args, out)
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {describe(exc)}") from None
    print(f"wrote {n} {what} to {out}", file=sys.stderr)


def _export(store: Store, args: argparse.Namespace, out: str) -> int:
    """Write the export to `out` ('-' = stdout for JSONL); the number of lines or rows."""
    if args.format == "parquet":
        return write_parquet(store, args.id, out, args.table)
    if out == "-":
        return write_jsonl(store, args.id, sys.stdout)
    with open(out, "w", encoding="utf-8") as f:
        return write_jsonl(store, args.id, f)


def cmd_delete(store: Store, args: argparse.Namespace) -> None:
    try:
        q.delete_session(store, args.id, only_ended=not args.force)
    except SessionOpen as exc:
        raise CommandError(f"{exc}; --force deletes it anyway") from None
    print(f"deleted session {args.id}")


def cmd_label(store: Store, args: argparse.Namespace) -> None:
    q.set_label(store, args.id, args.label or None)
    print(f"session {args.id} labelled {args.label!r}")


def step_line(r: dict[str, Any], t0: float) -> str:
    """One compact line per replayed step."""
    b, qu, kv = r["batch"], r["queue"], r["kv"]
    balance = r["experts"]["balance"]
    line = (
        f"step {r['step']:>6} +{r['t'] - t0:8.3f}s  run {qu['running']:>3} "
        f"wait {qu['waiting']:>3} swap {qu['swapped']:>2}  tok {b['num_prefill_tokens']:>5}p "
        f"{b['num_decode_tokens']:>4}d  kv {kv['used']}/{kv['usable']}  "
        f"bal {sum(balance) / max(1, len(balance)):.2f}  {r['dur_ms']['total']:8.2f} ms"
    )
    for change in r.get("knob_changes") or ():
        line += f"  knobs v{change['version']} {change['changes']}"
    return line


def cmd_replay(store: Store, args: argparse.Namespace) -> None:
    q.require_session(store, args.id)
    t0 = None
    try:
        for record in replay(store, args.id, args.speed, getattr(args, "from")):
            t0 = record["t"] if t0 is None else t0
            print(step_line(record, t0), flush=True)
    except KeyboardInterrupt:
        pass


def with_store(
    func: Callable[[Store, argparse.Namespace], None],
) -> Callable[[argparse.Namespace], None]:
    """A command on the `--db` database (which must exist); its errors as one line."""

    def run(args: argparse.Namespace) -> None:
        name = " ".join(filter(None, ("moescope", args.command, getattr(args, "action", None))))
        try:
            store = Store(args.db, create=False)
        except StorageError as exc:
            raise SystemExit(f"{name}: {exc}") from None
        try:
            func(store, args)
        except SessionNotFound as exc:
            raise SystemExit(f"{name}: {exc} in {store.display_url}") from None
        except (CommandError, StorageError, ValueError) as exc:
            raise SystemExit(f"{name}: {exc}") from None
        finally:
            store.close()

    return run


def add_session_commands(sub: argparse._SubParsersAction) -> None:
    """The `sessions` and `replay` subcommands."""
    sessions = sub.add_parser("sessions", help="recorded sessions in the database (no server)")
    actions = sessions.add_subparsers(dest="action", required=True)
    p = actions.add_parser("list", help="sessions, newest first")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--replica", default=None, help="only this fleet replica's sessions")
    p.add_argument("--fleet-run", default=None, help="only the sessions of this fleet run")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=with_store(cmd_list))
    p = actions.add_parser("show", help="one session's summary")
    p.add_argument("id")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--attribution",
        action="store_true",
        help="why requests were slow: each cause's share of TTFT and TPOT, overall and at p90",
    )
    p.set_defaults(func=with_store(cmd_show))
    p = actions.add_parser("export", help="a session to JSONL (everything) or Parquet (a table)")
    p.add_argument("id")
    p.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    p.add_argument("--table", choices=TABLES, default="steps", help="Parquet only")
    p.add_argument(
        "-o",
        "--output",
        default=None,
        help="file (default moescope-ID.jsonl / moescope-ID-TABLE.parquet; '-' = stdout for JSONL)",
    )
    p.set_defaults(func=with_store(cmd_export))
    p = actions.add_parser("delete", help="remove a session and its records")
    p.add_argument("id")
    p.add_argument(
        "--force",
        action="store_true",
        help="delete it even if it is still open (a server may be recording it)",
    )
    p.set_defaults(func=with_store(cmd_delete))
    p = actions.add_parser("label", help="name a session ('' clears the name)")
    p.add_argument("id")
    p.add_argument("label")
    p.set_defaults(func=with_store(cmd_label))
    for p in actions.choices.values():
        db_argument(p)
    p = sub.add_parser("replay", help="print a recorded session's steps at their pace")
    p.add_argument("id")
    p.add_argument("--speed", type=non_negative, default=1.0, help="0 = as fast as possible")
    p.add_argument("--from", type=int_at_least(0), default=0, help="first step")
    db_argument(p)
    p.set_defaults(func=with_store(cmd_replay))
