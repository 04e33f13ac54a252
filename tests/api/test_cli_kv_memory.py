"""`--kv-cache-memory-mib` sizes the KV cache for `generate` and `serve`; `--kv-blocks` and it
exclude each other, and with neither the cache keeps its 2048 blocks."""

import pytest

from cli.args import kv_cache_args
from cli.main import build_parser, main
from engine import LLM


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_both_flags_are_a_usage_error_naming_both(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--kv-blocks", "2048", "--kv-cache-memory-mib", "64"])
    assert done.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"moescope {command}: error: argument ")
    assert "--kv-cache-memory-mib" in last and "--kv-blocks" in last


@pytest.mark.parametrize("command", ["generate", "serve", "fleet"])
def test_one_flag_or_neither(command: str) -> None:
    parse = build_parser().parse_args
    assert kv_cache_args(parse([command])) == {"num_kv_blocks": 2048}
    assert kv_cache_args(parse([command, "--kv-blocks", "8"])) == {"num_kv_blocks": 8}
    memory = parse([command, "--kv-cache-memory-mib", "1.5"])
    assert kv_cache_args(memory) == {"kv_cache_memory_mib": 1.5}


@pytest.mark.parametrize("value", ["0", "-1", "nan", "lots"])
def test_bad_memory_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["generate", "--kv-cache-memory-mib", value])
    assert done.value.code == 2
    assert "--kv-cache-memory-mib: must be a finite number > 0" in capsys.readouterr().err


def test_memory_decides_the_engine_blocks() -> None:
    """1 MiB buys 2^20 / (256 bytes per token x 2 layers x 16) blocks of synthetic:tiny."""
    args = build_parser().parse_args(
        ["generate", "--model", "synthetic:tiny", "--kv-cache-memory-mib", "1"]
    )
    with LLM(args.model, dtype=args.dtype, device=args.device, **kv_cache_args(args)) as llm:
        assert llm.engine.config.cache.num_blocks == 2**20 // (256 * 2 * 16)


def test_generate_runs_and_too_little_memory_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    small = ["--model", "synthetic:tiny", "--num-prompts", "2", "--max-tokens", "2"]
    main(["generate", *small, "--kv-cache-memory-mib", "1"])
    assert "tok/s" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["generate", *small, "--kv-cache-memory-mib", "0.001"])
    assert "holds no block" in str(done.value.code)


def test_fleet_replicas_get_the_memory() -> None:
    """`fleet` takes serve's arguments: its replicas' engines are sized by the MiB too."""
    from cli.fleet import spec_from_args

    args = build_parser().parse_args(["fleet", "--kv-cache-memory-mib", "64"])
    engine_args = spec_from_args(args).engine_args
    assert engine_args["kv_cache_memory_mib"] == 64.0 and "num_kv_blocks" not in engine_args
    default = spec_from_args(build_parser().parse_args(["fleet"])).engine_args
    assert default["num_kv_blocks"] == 2048
