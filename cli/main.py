"""The `moescope` command line."""

import argparse
import contextlib
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import uvicorn
from uvicorn.config import LOG_LEVELS

from api.app import create_app
from api.launch import build_loop, config_from_args
from cli.args import (
    autopilot_targets,
    describe,
    int_at_least,
    kv_cache_args,
    non_negative,
    port,
    positive,
    serve_engine_args,
    server_settings,
    threads,
)
from cli.demo import run_demo
from cli.fleet import add_fleet_command
from cli.loadgen import add_load_arguments, main_load, percentiles_text
from cli.sessions import add_session_commands, default_db
from cli.whatif import add_whatif_commands
from dashboard.__main__ import main as dashboard_main
from engine import LLM, SamplingParams
from engine.ep.ranks import serve_rank, torchrun_rank
from engine.errors import InvalidInput
from engine.model.tokenizer import NoTokenizer
from engine.outputs import RequestOutput
from server.state import state_of
from stats import summary
from storage import SessionNotFound, StorageError

ENGINE_ERRORS = (ValueError, RuntimeError)
WORDS = ["expert", "token", "router", "batch", "cache", "step", "layer", "prefill"]


@contextlib.contextmanager
def failing_as(command: str, *errors: type[Exception]) -> Iterator[None]:
    """Exit with one line, `moescope COMMAND: message`, on any of `errors`."""
    try:
        yield
    except errors as exc:
        raise SystemExit(f"moescope {command}: {describe(exc)}") from None


def _device(text: str) -> str:
    """`cpu`, or `cuda` / `cuda:N` when this machine has that GPU."""
    try:
        dev = torch.device(text)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available on this machine")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(
            f"{text!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return text


def summarize(outputs: list[RequestOutput], wall_s: float) -> str:
    """Throughput and latency percentiles (`stats.summary`) of a finished offline run."""
    tokens = sum(len(o.token_ids) for o in outputs)
    ttft = summary(o.ttft_s * 1000 for o in outputs if o.ttft_s is not None)
    tpot = summary(o.tpot_s * 1000 for o in outputs if o.tpot_s is not None)
    lines = [
        f"requests        {len(outputs)}",
        f"output tokens   {tokens}",
        f"wall time       {wall_s:.2f} s",
        f"throughput      {tokens / wall_s:.1f} tok/s",
        f"TTFT ms         {percentiles_text(ttft, 1)}",
        f"TPOT ms         {percentiles_text(tpot, 2)}",
    ]
    return "\n".join(lines)


def workload(
    llm: LLM, num_prompts: int, max_tokens: int, seed: int
) -> tuple[list[list[int]], list[SamplingParams]]:
    """Seeded prompts of 4-60 words (random token ids, two per word, for a checkpoint without
    a tokenizer) and output lengths of 8 (or less) to `max_tokens`, each prompt cut so that it
    and its output fit the model's context."""
    context = llm.engine.model_config.max_model_len
    if max_tokens >= context:
        raise ValueError(
            f"--max-tokens {max_tokens} leaves no room for a prompt in the "
            f"model's context of {context} tokens; use at most {context - 1}"
        )
    rng = random.Random(seed)
    texts = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 60))) for _ in range(num_prompts)
    ]
    params = [
        SamplingParams(
            max_tokens=rng.randint(min(8, max_tokens), max_tokens), temperature=0.0, ignore_eos=True
        )
        for _ in texts
    ]
    vocab = llm.engine.model_config.vocab_size
    encoded = (
        [[rng.randrange(vocab) for _ in range(2 * len(text.split()))] for text in texts]
        if isinstance(llm.tokenizer, NoTokenizer)
        else map(llm.tokenizer.encode, texts)
    )
    prompts = [ids[: context - p.max_tokens] for ids, p in zip(encoded, params, strict=True)]
    return prompts, params


def cmd_generate(args: argparse.Namespace) -> None:
    with failing_as("generate", *ENGINE_ERRORS):
        llm = LLM(
            args.model,
            dtype=args.dtype,
            device=args.device,
            max_num_seqs=args.max_num_seqs,
            threads=args.threads,
            overlap=args.overlap,
            **kv_cache_args(args),
        )
        prompts, params = workload(llm, args.num_prompts, args.max_tokens, args.seed)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
    print(summarize(outputs, time.perf_counter() - start))


def cmd_serve(args: argparse.Namespace) -> None:
    if args.threads != "auto":
        torch.set_num_threads(args.threads)  # also the expert-parallel ranks' count
    settings = server_settings(args)
    if args.host not in ("127.0.0.1", "localhost", "::1") and settings.api_key is None:
        print(f"warning: serving on {args.host} without an API key", file=sys.stderr)
    rank = torchrun_rank()
    if rank is not None and args.ep is None:
        args.ep = int(os.environ["WORLD_SIZE"])
    engine_args = serve_engine_args(args)
    if rank:
        serve_rank(config_from_args(args.model, **engine_args))
        return
    with failing_as("serve", *ENGINE_ERRORS):
        engine_loop = build_loop(args.model, **engine_args)
    with failing_as("serve", StorageError, SessionNotFound, InvalidInput):
        try:
            app = create_app(engine_loop, settings)
        except BaseException:
            engine_loop.stop()
            raise
    store = state_of(app).store
    recording = "off" if store is None else store.display_url
    print(
        f"moescope: serving {settings.model_name} on http://{args.host}:{args.port} "
        f"(telemetry ws://{args.host}:{args.port}/ws/telemetry; session "
        f"{engine_loop.engine.session}, recording {recording}{_seeded(state_of(app).fit_from)})",
        file=sys.stderr,
        flush=True,
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine_loop.stop()


def _seeded(fit_from: dict[str, Any] | None) -> str:
    if fit_from is None:
        return ""
    return f"; twin fitted from {fit_from['rows']} steps of session {fit_from['session']}"


def cmd_load(args: argparse.Namespace) -> None:
    sys.exit(main_load(args))


def cmd_demo(args: argparse.Namespace) -> None:
    sys.exit(run_demo(args))


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible server with live telemetry and knobs")
    p.add_argument(
        "--model", default="synthetic:small", help="synthetic:<preset>, demo or a directory"
    )
    p.add_argument("--served-model-name", default=None, help="name in /v1/models (--model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--api-key", default=None, help="required as Bearer (or MOESCOPE_API_KEY)")
    p.add_argument(
        "--admin-key", default=None, help="required for PATCH /api/knobs (or MOESCOPE_ADMIN_KEY)"
    )
    _model_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=None,
        help="longest prompt accepted (default: the model's context - 1)",
    )
    p.add_argument(
        "--max-tokens-limit",
        type=int,
        default=None,
        help="largest max_tokens accepted (default: the model's context)",
    )
    p.add_argument(
        "--ws-buffer",
        type=int,
        default=256,
        help="telemetry steps buffered per websocket client before dropping",
    )
    p.add_argument("--no-metrics", action="store_true", help="turn /metrics off")
    p.add_argument(
        "--db",
        default=default_db(),
        help="session database, any SQLAlchemy URL ($MOESCOPE_DB or %(default)s)",
    )
    p.add_argument("--no-record", action="store_true", help="do not record this run")
    p.add_argument(
        "--record-prompts",
        action="store_true",
        help="keep each request's prompt token ids, so a rerun replays the same tokens",
    )
    p.add_argument(
        "--record-buffer",
        type=int,
        default=2048,
        help="steps buffered while the database is slow or gone, then dropped",
    )
    p.add_argument(
        "--whatif-horizon",
        type=positive,
        default=60.0,
        metavar="S",
        help="seconds after a knob change at which the what-if scorecard observes it",
    )
    p.add_argument(
        "--autopilot",
        type=autopilot_targets,
        default=None,
        metavar="TARGETS",
        help="hold SLO targets by retuning knobs live, e.g. ttft_p90_ms=800,tpot_p90_ms=60 "
        "(any GET/PUT /api/autopilot setting may be given)",
    )
    p.add_argument(
        "--fit-from",
        default=None,
        metavar="SESSION",
        help="seed the live twin's cost model with the steps of a session in --db recorded "
        "by this engine on this machine, so it predicts shapes this run has not shown yet",
    )
    p.add_argument("--log-level", type=str.lower, default="warning", choices=list(LOG_LEVELS))
    ep = p.add_mutually_exclusive_group()
    ep.add_argument(
        "--ep",
        type=int,
        default=None,
        metavar="N",
        help="expert parallel over N processes (gloo/NCCL); measured all-to-all",
    )
    ep.add_argument(
        "--ep-size",
        type=int,
        default=None,
        metavar="N",
        help="model N expert-parallel ranks in this one process",
    )
    p.add_argument(
        "--router-skew",
        type=float,
        default=None,
        help="synthetic models: how uneven expert popularity is (0 = even)",
    )
    p.set_defaults(func=cmd_serve)


def _model_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments shared by `generate` and `serve`."""
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--device", type=_device, default="cpu", help="cpu or cuda (Triton kernels on cuda)"
    )
    kv = p.add_mutually_exclusive_group()  # argparse's error names both flags
    kv.add_argument("--kv-blocks", type=int_at_least(1), default=2048, help="device KV blocks")
    kv.add_argument(
        "--kv-cache-memory-mib",
        type=positive,
        default=None,
        metavar="MIB",
        help="instead, the device KV cache's size: blocks follow from the model's bytes per "
        "token (an MLA latent cache holds more tokens than a GQA cache in the same memory)",
    )
    p.add_argument("--max-num-seqs", type=int_at_least(1), default=64)
    p.add_argument(
        "--threads",
        type=threads,
        default="auto",
        help="the engine's torch threads: a number, or auto (the cores other processes leave "
        "free, measured each second)",
    )
    p.add_argument(
        "--overlap",
        action="store_true",
        help="plan each step while the step before runs on a compute thread (off by default; "
        "not with --ep)",
    )


def cmd_dashboard(args: argparse.Namespace) -> None:
    sys.exit(dashboard_main(["--url", args.url, "--port", str(args.port)]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moescope", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="offline generation run with a throughput summary")
    gen.add_argument("--model", default="synthetic:small")
    _model_arguments(gen)
    gen.add_argument("--num-prompts", type=int_at_least(1), default=64)
    gen.add_argument("--max-tokens", type=int_at_least(1), default=96)
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(func=cmd_generate)
    _serve_parser(sub)
    add_fleet_command(sub, sub.choices["serve"])  # a fleet replica takes serve's arguments
    load = sub.add_parser("load", help="open-loop load generator (OpenAI API)")
    add_load_arguments(load)
    load.set_defaults(func=cmd_load)
    demo = sub.add_parser("demo", help="server on the demo model with a load running against it")
    demo.add_argument("--port", type=port, default=8000)
    demo.add_argument("--rate", type=positive, default=3.0, help="requests per second")
    demo.add_argument(
        "--duration", type=non_negative, default=0.0, help="seconds; 0 = until Ctrl-C"
    )
    demo.add_argument("--dashboard-port", type=port, default=8501)
    demo.add_argument(
        "--ep-size",
        type=int,
        default=4,
        help="expert-parallel ranks modeled in the server's one process",
    )
    demo.add_argument(
        "--ep",
        type=int,
        default=None,
        metavar="N",
        help="instead, shard the experts over N processes (measured all-to-all)",
    )
    demo.set_defaults(func=cmd_demo)
    dash = sub.add_parser("dashboard", help="the Streamlit dashboard for a running server")
    dash.add_argument("--url", default="http://127.0.0.1:8000", help="moescope server URL")
    dash.add_argument("--port", type=port, default=8501)
    dash.set_defaults(func=cmd_dashboard)
    add_session_commands(sub)
    add_whatif_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    # A command started in the background by a non-interactive shell inherits SIGINT ignored;
    # every moescope command stops on SIGINT all the same (the demo stops its children so).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
