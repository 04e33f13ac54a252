"""The block-size table: buckets, nearest-bucket lookup, heuristic fallback, autotune."""

import json
from pathlib import Path

import pytest
import torch
from kernel_inputs import DEVICE, nonzero_randn, rel_err, routing

from kernels import autotune, combine_experts
from kernels.gemm_configs import (
    TABLE_PATH,
    GemmConfig,
    MoEConfig,
    default_config,
    device_name,
    load_table,
    lookup,
    save_table,
    shape_key,
    token_bucket,
)
from kernels.triton_moe import fused_moe


def test_token_bucket_rounds_up_to_a_power_of_two() -> None:
    assert [token_bucket(n) for n in (1, 2, 3, 16, 17, 1000)] == [1, 2, 4, 16, 32, 1024]


def test_committed_table_parses() -> None:
    table = load_table(TABLE_PATH)
    for shapes in table["devices"].values():
        for buckets in shapes.values():
            for bucket, cfg in buckets.items():
                assert token_bucket(int(bucket)) == int(bucket)
                MoEConfig.from_json(cfg)


def test_lookup_takes_the_nearest_bucket(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    monkeypatch.setenv("MOESCOPE_GEMM_CONFIGS", str(path))
    small, large = GemmConfig(16, 32, 32), GemmConfig(64, 128, 64, 8, 8, 3)
    assert lookup(DEVICE, 8, 64, 96, 10, torch.bfloat16) == default_config(
        10, 8, torch.bfloat16, DEVICE.type != "cuda"
    )
    save_table(
        path,
        {
            "devices": {
                device_name(DEVICE): {
                    shape_key(8, 64, 96): {
                        "8": MoEConfig(small, small).to_json(),
                        "1024": MoEConfig(large, small).to_json(),
                    }
                }
            }
        },
    )
    assert lookup(DEVICE, 8, 64, 96, 3, torch.bfloat16).gate_up == small
    assert lookup(DEVICE, 8, 64, 96, 60, torch.bfloat16).gate_up == small
    assert lookup(DEVICE, 8, 64, 96, 200, torch.bfloat16).gate_up == large
    assert lookup(DEVICE, 8, 64, 96, 99999, torch.bfloat16).gate_up == large
    assert lookup(DEVICE, 8, 64, 128, 200, torch.bfloat16).gate_up != large


@pytest.mark.slow
def test_autotune_fills_the_table_and_the_kernel_uses_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "table.json"
    monkeypatch.setenv("MOESCOPE_GEMM_CONFIGS", str(path))
    entries = autotune.main(
        [
            "--experts",
            "4",
            "--hidden",
            "24",
            "--inter",
            "40",
            "--top-k",
            "2",
            "--tokens",
            "3",
            "--dtype",
            "float32",
            "--max-candidates",
            "2",
        ]
    )
    assert list(entries) == ["8"]
    stored = json.loads(path.read_text())["devices"][device_name(DEVICE)][shape_key(4, 24, 40)]
    assert stored == entries
    cfg = lookup(DEVICE, 4, 24, 40, 6, torch.float32)
    assert cfg == MoEConfig.from_json(entries["8"])
    gen = torch.Generator().manual_seed(0)
    x = nonzero_randn(3, 24, gen=gen)
    w_gate_up = nonzero_randn(4, 24, 80, gen=gen, scale=0.2)
    w_down = nonzero_randn(4, 40, 24, gen=gen, scale=0.2)
    order, per_expert, w = routing(3, 4, 2, gen)
    out = fused_moe(x, w_gate_up, w_down, order, per_expert, w)
    assert rel_err(out, combine_experts(x, w_gate_up, w_down, order, per_expert, w)) < 1e-5
