"""The load generator: seeded distributions and arrivals, traces, and a short run."""

import asyncio
import json
import random
from pathlib import Path

import pytest
from api_servers import Served, wait_idle

from cli.loadgen import (
    Arrival,
    load_trace,
    make_prompt,
    parse_dist,
    poisson_arrivals,
    run_load,
    trace_text,
)
from cli.main import main


def test_length_distributions() -> None:
    rng = random.Random(0)
    assert {parse_dist("fixed:64").sample(rng) for _ in range(5)} == {64}
    uniform = [parse_dist("uniform:16:32").sample(rng) for _ in range(500)]
    assert min(uniform) == 16 and max(uniform) == 32
    lognormal = [parse_dist("lognormal:64:0.5:100").sample(rng) for _ in range(500)]
    assert max(lognormal) <= 100 and min(lognormal) >= 1
    assert 50 < sorted(lognormal)[250] < 80
    for bad in ("fixed", "fixed:0", "uniform:9:3", "normal:1:2", "lognormal:x:1", "uniform:1"):
        with pytest.raises(ValueError, match="distribution"):
            parse_dist(bad)


def test_poisson_arrivals_are_seeded_and_open_loop() -> None:
    kw = {"prompt": parse_dist("uniform:8:64"), "output": parse_dist("fixed:4")}
    a = list(poisson_arrivals(50.0, 20.0, seed=3, **kw))
    assert a == list(poisson_arrivals(50.0, 20.0, seed=3, **kw))
    assert a != list(poisson_arrivals(50.0, 20.0, seed=4, **kw))
    assert 850 < len(a) < 1150
    assert all(x.t < y.t for x, y in zip(a, a[1:], strict=False)) and a[-1].t < 20.0
    forever = poisson_arrivals(5.0, 0.0, seed=0, **kw)
    assert len([next(forever) for _ in range(10)]) == 10


def test_trace_round_trip(tmp_path: Path) -> None:
    arrivals = [Arrival(0.5, 10, 4), Arrival(0.1, 20, 8)]
    path = tmp_path / "trace.jsonl"
    path.write_text(trace_text(arrivals))
    assert json.loads(path.read_text().splitlines()[0]) == {
        "t": 0.5,
        "prompt_len": 10,
        "output_len": 4,
    }
    assert load_trace(path) == sorted(arrivals, key=lambda a: a.t)
    path.write_text('{"t": 1}\n')
    with pytest.raises(ValueError, match="trace.jsonl:1"):
        load_trace(path)


def test_prompt_length_in_bytes() -> None:
    assert len(make_prompt(100, random.Random(0))) == 99


def test_short_run_against_the_server(served: Served) -> None:
    wait_idle(served.loop)
    arrivals = list(
        poisson_arrivals(20.0, 1.0, parse_dist("fixed:16"), parse_dist("fixed:8"), seed=1)
    )
    summary = asyncio.run(run_load(served.url, arrivals))
    assert summary["requests"] == summary["ok"] == len(arrivals) > 5
    assert summary["errors"] == 0
    assert summary["output_tokens"] == 8 * len(arrivals)
    assert summary["prompt_tokens"] == 16 * len(arrivals)
    assert 0 < summary["ttft_ms"]["p50"] <= summary["ttft_ms"]["p99"]
    assert summary["tpot_ms"]["p50"] > 0 and summary["output_throughput"] > 0


def test_cli_saves_and_replays_a_trace(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, summary = tmp_path / "t.jsonl", tmp_path / "s.json"
    args = [
        "load",
        "--url",
        served.url,
        "--no-progress",
        "--prompt-len",
        "fixed:8",
        "--output-len",
        "fixed:4",
    ]
    with pytest.raises(SystemExit) as done:
        main([*args, "--rate", "10", "--duration", "0.6", "--save-trace", str(trace)])
    assert done.value.code == 0
    sent = len(trace.read_text().splitlines())
    with pytest.raises(SystemExit) as done:
        main([*args, "--trace", str(trace), "--summary-json", str(summary)])
    assert done.value.code == 0
    assert json.loads(summary.read_text())["ok"] == sent
    out = capsys.readouterr().out
    assert "TTFT ms" in out and "TPOT ms" in out and f"{sent} sent, {sent} ok, 0 errors" in out


def test_cli_reports_errors(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(
            [
                "load",
                "--url",
                served.url,
                "--no-progress",
                "--model",
                "nope",
                "--rate",
                "20",
                "--duration",
                "0.3",
                "--seed",
                "2",
            ]
        )
    assert done.value.code == 1
    assert "HTTP 404" in capsys.readouterr().out
