"""The `moescope` command line: bad values are one-line errors, and `demo` guards its ports
and its children."""

import importlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from cli import demo
from cli.loadgen import parse_dist, poisson_arrivals
from cli.main import build_parser, main, workload
from engine import LLM

MOESCOPE = [sys.executable, "-m", "cli.main"]
TIMEOUT = 60.0  # for a wait on a condition: generous, since only a hang should ever reach it
ENGINE_TESTS = Path(__file__).parents[1] / "engine"
NO_CUDA = (
    []
    if torch.cuda.is_available()
    else [
        (["serve", "--device", "cuda"], "--device: 'cuda': CUDA is not available"),
        (["generate", "--device", "cuda:0"], "--device: 'cuda:0': CUDA is not available"),
    ]
)

USAGE_ERRORS = [
    (["load", "--rate", "nan"], "--rate: must be a finite number > 0, got 'nan'"),
    (["load", "--rate", "inf"], "--rate: must be a finite number > 0, got 'inf'"),
    (["load", "--rate", "0"], "--rate: must be a finite number > 0, got '0'"),
    (["load", "--rate", "-1"], "--rate: must be a finite number > 0, got '-1'"),
    (["load", "--rate", "fast"], "--rate: must be a finite number > 0, got 'fast'"),
    (["load", "--duration", "-1"], "--duration: must be a finite number >= 0, got '-1'"),
    (["load", "--duration", "nan"], "--duration: must be a finite number >= 0, got 'nan'"),
    (["load", "--timeout", "0"], "--timeout: must be a finite number > 0, got '0'"),
    (["serve", "--port", "99999"], "--port: must be a port number from 1 to 65535"),
    (["serve", "--port", "0"], "--port: must be a port number from 1 to 65535, got '0'"),
    (["serve", "--threads", "-1"], "--threads: must be 'auto' or an integer >= 1, got '-1'"),
    (["serve", "--threads", "0"], "--threads: must be 'auto' or an integer >= 1, got '0'"),
    (["generate", "--threads", "all"], "--threads: must be 'auto' or an integer >= 1"),
    (["serve", "--log-level", "loud"], "--log-level: invalid choice: 'loud'"),
    (["serve", "--max-num-seqs", "0"], "--max-num-seqs: must be an integer >= 1"),
    (["serve", "--device", "tpu"], "--device: must be cpu, cuda or cuda:N, got 'tpu'"),
    (["serve", "--autopilot", "ttft_p90_ms=0"], "--autopilot: ttft_p90_ms: Input should be"),
    (["serve", "--autopilot", "ttft=5"], "--autopilot: ttft: Extra inputs are not permitted"),
    (["serve", "--autopilot", "tpot_p90_ms"], "--autopilot: 'tpot_p90_ms': expected name=value"),
    (["demo", "--port", "-5"], "--port: must be a port number from 1 to 65535"),
    (["demo", "--dashboard-port", "65536"], "--dashboard-port: must be a port number"),
    (["demo", "--rate", "nan"], "--rate: must be a finite number > 0"),
    (["demo", "--duration", "-1"], "--duration: must be a finite number >= 0"),
    (["dashboard", "--port", "99999"], "--port: must be a port number from 1 to 65535"),
    (["generate", "--num-prompts", "-3"], "--num-prompts: must be an integer >= 1, got '-3'"),
    (["generate", "--max-tokens", "0"], "--max-tokens: must be an integer >= 1, got '0'"),
    (["generate", "--max-num-seqs", "0"], "--max-num-seqs: must be an integer >= 1"),
    (["generate", "--kv-blocks", "0"], "--kv-blocks: must be an integer >= 1, got '0'"),
    (["generate", "--device", "tpu"], "--device: must be cpu, cuda or cuda:N, got 'tpu'"),
    *NO_CUDA,
]


@pytest.mark.parametrize(("argv", "message"), USAGE_ERRORS)
def test_bad_values_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"moescope {argv[0]}: error: argument ") and message in last


def test_good_values_still_parse() -> None:
    args = build_parser().parse_args(
        ["serve", "--port", "65535", "--threads", "1", "--log-level", "INFO", "--device", "cpu"]
    )
    assert (args.port, args.threads, args.log_level, args.device) == (65535, 1, "info", "cpu")
    assert build_parser().parse_args(["serve"]).threads == "auto"
    assert build_parser().parse_args(["generate", "--threads", "auto"]).threads == "auto"
    pilot = build_parser().parse_args(["serve", "--autopilot", "ttft_p90_ms=800,tpot_p90_ms=60"])
    assert pilot.autopilot.enabled and pilot.autopilot.ttft_p90_ms == 800.0
    args = build_parser().parse_args(["load", "--rate", "0.5", "--duration", "0"])
    assert (args.rate, args.duration) == (0.5, 0.0)


@pytest.mark.slow
def test_nan_rate_exits_at_once_from_the_real_command() -> None:
    done = subprocess.run(
        [*MOESCOPE, "load", "--url", "http://127.0.0.1:9", "--rate", "nan", "--duration", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith("must be a finite number > 0, got 'nan'")


@pytest.mark.slow
def test_sigint_stops_a_command_that_inherited_it_ignored() -> None:
    """As a background job of a non-interactive shell (or the demo's child) would."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        silent.settimeout(TIMEOUT)
        load = subprocess.Popen(
            [
                *MOESCOPE,
                "load",
                "--url",
                f"http://127.0.0.1:{silent.getsockname()[1]}",
                "--model",
                "m",
                "--rate",
                "2",
                "--duration",
                "0",
                "--no-progress",
            ],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        try:
            conn, _ = silent.accept()  # the first request: it is sending
            conn.close()
            assert load.poll() is None
            load.send_signal(signal.SIGINT)
            out, _ = load.communicate(timeout=TIMEOUT)
        finally:
            load.kill()
    assert re.search(r"^requests +\d+ sent", out, re.M)


@pytest.mark.parametrize("rate", [float("nan"), float("inf"), 0.0, -1.0])
def test_poisson_arrivals_refuse_a_rate_that_never_ends(rate: float) -> None:
    with pytest.raises(ValueError, match="rate must be a finite number > 0"):
        next(poisson_arrivals(rate, 2.0, parse_dist("fixed:4"), parse_dist("fixed:4"), 0))


def _exit_line(argv: list[str]) -> str:
    """The one-line message a command exits with."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert isinstance(done.value.code, str) and "\n" not in done.value.code
    return done.value.code


def test_trace_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    assert _exit_line(["load", "--trace", str(missing)]) == (
        f"moescope load: cannot read {missing}: No such file or directory"
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t": 0.1, "prompt_len": 4, "output_len": 4}\n{"t": 1}\n')
    assert _exit_line(["load", "--trace", str(bad)]) == (
        f"moescope load: {bad}:2: bad trace line ('prompt_len')"
    )
    bad.write_text('{"t": Infinity, "prompt_len": 4, "output_len": 4}\n')
    assert _exit_line(["load", "--trace", str(bad)]).startswith(f"moescope load: {bad}:1: bad")
    out = tmp_path / "no-such-dir" / "t.jsonl"
    assert _exit_line(["load", "--save-trace", str(out), "--duration", "1"]) == (
        f"moescope load: cannot write {out}: No such file or directory"
    )


def test_an_error_without_a_message_shows_its_type(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(SystemExit) as done:
            main(["load", "--url", url, "--timeout", "0.2", "--no-progress"])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip() == f"moescope load: cannot reach {url}: ReadTimeout"


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("/nonexistent/model", "moescope generate: unknown model '/nonexistent/model'"),
        ("synthetic:huge", "moescope generate: unknown synthetic preset 'huge'"),
    ],
)
def test_generate_engine_errors_are_one_line(model: str, message: str) -> None:
    assert _exit_line(["generate", "--model", model]).startswith(message)


def test_generate_with_few_max_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    main(
        [
            "generate",
            "--model",
            "synthetic:tiny",
            "--num-prompts",
            "3",
            "--max-tokens",
            "5",
            "--kv-blocks",
            "256",
        ]
    )
    out = capsys.readouterr().out
    assert re.search(r"^requests +3$", out, re.M)
    tokens = int(re.search(r"^output tokens +(\d+)$", out, re.M).group(1))
    assert 3 <= tokens <= 15


def test_overlap_is_an_engine_argument_of_serve_generate_and_fleet(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--overlap` (off by default) reaches the engine from `generate` and `serve`, and
    `fleet` hands it to its replicas."""
    from cli.fleet import spec_from_args

    parse = build_parser().parse_args
    assert not any(parse([command]).overlap for command in ("serve", "generate", "fleet"))
    assert all(parse([command, "--overlap"]).overlap for command in ("serve", "generate", "fleet"))
    assert spec_from_args(parse(["fleet", "--overlap"])).engine_args["overlap"] is True
    assert spec_from_args(parse(["fleet"])).engine_args["overlap"] is False

    class Stop(Exception):
        pass

    def build_loop(model: str, **engine_args: object) -> None:
        raise Stop(engine_args["overlap"])

    monkeypatch.setattr("cli.main.build_loop", build_loop)
    with pytest.raises(Stop, match="True"):
        main(["serve", "--overlap", "--no-record"])
    seen: list[bool] = []

    class Recording(LLM):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            seen.append(self.engine.overlap)

    monkeypatch.setattr("cli.main.LLM", Recording)
    main(["generate", "--num-prompts", "2", "--max-tokens", "4", "--kv-blocks", "256", "--overlap"])
    assert seen == [True] and re.search(r"^requests +2$", capsys.readouterr().out, re.M)


@pytest.fixture(scope="module")
def short_context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint whose context (max_position_embeddings) is 256 tokens."""
    sys.path.insert(0, str(ENGINE_TESTS))
    try:
        checkpoints = importlib.import_module("hf_checkpoints")
    finally:
        sys.path.remove(str(ENGINE_TESTS))
    return checkpoints.make_checkpoint(tmp_path_factory.mktemp("ckpt"), "mixtral")


def test_generate_prompts_fit_a_short_context(
    short_context: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    llm = LLM(str(short_context), num_kv_blocks=256)
    assert llm.engine.model_config.max_model_len == 256
    prompts, params = workload(llm, 16, 250, seed=0)
    assert all(len(p) + sp.max_tokens <= 256 for p, sp in zip(prompts, params, strict=True))
    main(
        [
            "generate",
            "--model",
            str(short_context),
            "--num-prompts",
            "16",
            "--max-tokens",
            "250",
            "--kv-blocks",
            "512",
        ]
    )
    out = capsys.readouterr().out
    expected = sum(sp.max_tokens for sp in params)  # every request got all it asked for
    assert re.search(rf"^output tokens +{expected}$", out, re.M)
    assert _exit_line(["generate", "--model", str(short_context), "--max-tokens", "256"]) == (
        "moescope generate: --max-tokens 256 leaves no room for a prompt in the model's "
        "context of 256 tokens; use at most 255"
    )


def test_generate_without_a_tokenizer_uses_token_ids(
    short_context: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(short_context, bare)
    (bare / "tokenizer.json").unlink()
    main(["generate", "--model", str(bare), "--num-prompts", "4", "--max-tokens", "8"])
    assert re.search(r"^requests +4$", capsys.readouterr().out, re.M)


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]


def _mentioning(port: int) -> list[psutil.Process]:
    """Processes other than this one whose command line names `port`."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid != os.getpid() and str(port) in (proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("busy_flag", ["--port", "--dashboard-port"])
def test_demo_refuses_a_busy_port(busy_flag: str, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as other:
        busy, free = other.getsockname()[1], _free_port()
        ports = {"--port": free, "--dashboard-port": free, busy_flag: busy}
        argv = [arg for flag, port in ports.items() for arg in (flag, str(port))]
        done = subprocess.run(
            [*MOESCOPE, "demo", "--rate", "1", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert done.returncode == 1
        assert done.stderr == (
            f"moescope demo: port {busy} ({busy_flag}) is already in use on 127.0.0.1\n"
        )
        assert not _mentioning(free) and not _mentioning(busy)


@pytest.mark.slow
def test_demo_refuses_one_port_for_both(tmp_path: Path) -> None:
    port = str(_free_port())
    done = subprocess.run(
        [*MOESCOPE, "demo", "--port", port, "--dashboard-port", port],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert done.stderr == "moescope demo: --port and --dashboard-port must differ\n"


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text():
        assert proc.poll() is None, path.read_text()
        assert time.monotonic() < deadline, f"no {text!r} in {path.read_text()!r}"
        time.sleep(0.2)


@pytest.mark.slow
def test_demo_stops_everything_when_a_child_dies(tmp_path: Path) -> None:
    port, dash_port = _free_port(), _free_port()
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    env = {**os.environ, "MOESCOPE_DB": f"sqlite:///{tmp_path / 'demo.db'}"}
    with out.open("w") as stdout, err.open("w") as stderr:
        demo = subprocess.Popen(
            [
                *MOESCOPE,
                "demo",
                "--rate",
                "1",
                "--duration",
                "300",
                "--ep-size",
                "1",
                "--port",
                str(port),
                "--dashboard-port",
                str(dash_port),
            ],
            stdout=stdout,
            stderr=stderr,
            cwd=tmp_path,
            env=env,
        )
    try:
        _wait_for(out, "<- open this", demo, 180)
        family = psutil.Process(demo.pid).children(recursive=True)
        dashboard = next(p for p in family if "dashboard" in p.cmdline()[1:3])
        dashboard.send_signal(signal.SIGKILL)
        assert demo.wait(60) == 1
        assert (
            "moescope demo: the dashboard stopped unexpectedly (killed by SIGKILL); "
            "stopping the rest"
        ) in err.read_text()
        _, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if demo.poll() is None:
            demo.terminate()
            demo.wait(30)
    assert not _mentioning(port) and not _mentioning(dash_port)


def test_the_demos_first_signal_stops_it_and_later_ones_are_ignored() -> None:
    """`timeout 60 make demo` delivers SIGTERM twice (to the group, then from make): the
    second, arriving while the demo stops, printed a KeyboardInterrupt traceback."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(KeyboardInterrupt):
            demo._interrupt(signal.SIGTERM, None)
        assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in saved)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
