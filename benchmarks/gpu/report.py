"""One table from the GPU measurements (roofline, MoE kernels, engine), with the targets.

    python -m benchmarks.gpu.report --roofline r.json --moe m.json [--engine e.json] \
        [--out table.md] [--results benchmarks/RESULTS.md]

--results replaces (or appends) the gpu_kernels section of RESULTS.md, leaving the others;
run it here on the files that run_all.sh left in $OUT. The section's machine is the one
roofline.py measured on.
"""

import argparse
from pathlib import Path
from typing import Any

from benchmarks.gpu.bench_util import load
from benchmarks.harness.results_md import header, publish
from benchmarks.harness.targets import Target

SECTION = "gpu_kernels"
TARGETS = {
    "prefill": Target("prefill at its largest token count, share of measured bf16 peak", 0.6),
    "decode": Target("decode, share of measured copy bandwidth", 0.6),
    "fine_grained": Target("fine-grained rows: slowest speedup over grouped_mm", 1.0),
}
BASELINE_TOK_S = 6624  # the triton engine run on the H200, 2026-12-04 (issue 47)
ENGINE_TARGETS = {  # issue 47, per engine run
    "ceiling": Target("forward time over wall time (the forward-only ceiling)", 0.8),
    "speed": Target(f"tok/s over the {BASELINE_TOK_S:,} of 2026-12-04", 3.0),
}


def ratio(base: float | None, ours: float) -> str:
    return "n/a" if base is None else f"{base / ours:.2f}x"


def tflops(row: dict[str, Any]) -> float:
    return row["flop"] / row["ms"]["ours"] / 1e9


def gbps(row: dict[str, Any]) -> float:
    return row["weight_bytes"] / row["ms"]["ours"] / 1e6


def kernel_row(row: dict[str, Any], roof: dict[str, Any]) -> str:
    ms = row["ms"]
    prefill = row["phase"] == "prefill"
    compute = (
        f"{tflops(row):.1f} | {tflops(row) / roof['matmul_tflops']:.0%}" if prefill else "– | –"
    )
    memory = "– | –" if prefill else f"{gbps(row):.0f} | {gbps(row) / roof['copy_gbps']:.0%}"
    return (
        f"| {row['name']} (E{row['experts']} top-{row['top_k']} H{row['hidden']} "
        f"I{row['inter']}) | {row['phase']} | {row['tokens']} | {row['active']} | "
        f"{ms['ours']:.3f} | {compute} | {memory} | {ratio(ms['grouped_mm'], ms['ours'])} | "
        f"{ratio(ms['loop'], ms['ours'])} | {row['rel_err']:.1e} |"
    )


def check(key: str, subject: str, value: float) -> dict[str, Any]:
    return {"target": key, "subject": subject, "value": value, "met": TARGETS[key].met(value)}


def check_targets(rows: list[dict[str, Any]], roof: dict[str, Any]) -> list[dict[str, Any]]:
    """Per shape: its largest prefill against the peak and every decode row against the
    bandwidth; then the fine-grained rows against grouped_mm."""
    checks = []
    for name in dict.fromkeys(r["name"] for r in rows):
        prefill = [r for r in rows if r["name"] == name and r["phase"] == "prefill"]
        if prefill:
            big = max(prefill, key=lambda r: r["tokens"])
            subject = f"{name} prefill {big['tokens']} tokens"
            checks.append(check("prefill", subject, tflops(big) / roof["matmul_tflops"]))
        for r in rows:
            if r["name"] == name and r["phase"] == "decode":
                subject = f"{name} decode {r['tokens']} tokens"
                checks.append(check("decode", subject, gbps(r) / roof["copy_gbps"]))
    fine = [r for r in rows if r["name"] == "fine-grained" and r["ms"]["grouped_mm"]]
    if fine:
        worst = min(r["ms"]["grouped_mm"] / r["ms"]["ours"] for r in fine)
        checks.append(check("fine_grained", "every fine-grained row", worst))
    return checks


def target_line(c: dict[str, Any]) -> str:
    shown = f"{c['value']:.2f}x" if c["target"] == "fine_grained" else f"{c['value']:.0%}"
    return TARGETS[c["target"]].line(c["value"], f"{c['subject']}: {shown}")


def engine_checks(run: dict[str, Any]) -> dict[str, bool]:
    """Issue 47's targets for one engine run: met or not."""
    values = {"ceiling": run["forward_share"], "speed": run["tok_per_s"] / BASELINE_TOK_S}
    return {k: ENGINE_TARGETS[k].met(v) for k, v in values.items()}


def mark(met: bool) -> str:
    return "met" if met else "MISSED"


def engine_lines(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| engine backend | overlap | model | requests | output tokens | wall s | tok/s | "
        "steps | forward s | forward / wall | decode-only step: forward ms | host ms | "
        f"hidden ms | forward / wall >= 80% | tok/s >= 3x {BASELINE_TOK_S:,} |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- |",
    ]
    for r in runs:
        met = engine_checks(r)
        lines.append(
            f"| {r['backend']} | {'on' if r['overlap'] else 'off'} | {r['model']} | "
            f"{r['requests']} | {r['output_tokens']} | {r['wall_s']:.1f} | "
            f"{r['tok_per_s']:.0f} | {r['steps']} | {r['forward_s']:.2f} | "
            f"{r['forward_share']:.0%} | {r['decode_forward_ms']:.2f} | "
            f"{r['decode_host_ms']:.2f} | {r['decode_hidden_ms']:.2f} | "
            f"{mark(met['ceiling'])} | {mark(met['speed'])} "
            f"({r['tok_per_s'] / BASELINE_TOK_S:.2f}x) |"
        )
    return lines


def render(
    roof: dict[str, Any],
    rows: list[dict[str, Any]],
    runs: list[dict[str, Any]] | None,
    checks: list[dict[str, Any]],
) -> str:
    lines = [
        f"Device: {roof['device']}; measured copy bandwidth {roof['copy_gbps']:.0f} GB/s (read "
        f"+ written), bf16 matmul {roof['matmul_tflops']:.1f} TFLOP/s.",
        "",
        "| shape | phase | tokens | experts hit | ours ms | TFLOP/s | of peak | weight GB/s | "
        "of bandwidth | vs grouped_mm | vs loop | rel err vs loop |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *(kernel_row(r, roof) for r in rows),
        "",
        "Targets:",
        "",
        *map(target_line, checks),
    ]
    if runs:
        lines += ["", *engine_lines(runs)]
    return "\n".join(lines) + "\n"


def section(table: str, machine: dict[str, Any]) -> str:
    """The gpu_kernels section of RESULTS.md around `table`."""
    title = "GPU kernels and engine (`benchmarks/gpu/run_all.sh`)"
    return "\n".join(
        [
            header(title, ["bash", "benchmarks/gpu/run_all.sh"], None, machine),
            "- Report: `python -m benchmarks.gpu.report ... --results benchmarks/RESULTS.md` "
            "here on the files run_all.sh left on the device machine (carry `.whl` there)",
            "- Times: triton.testing.do_bench (L2 flushed between calls); bf16; uniform random "
            "routing; each implementation computes gather, both projections, weighting and scatter",
            "",
            table,
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the table (and write it with --out, its section with --results); returns the
    target checks: target, subject, value, met."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--roofline", type=Path, required=True)
    p.add_argument("--moe", type=Path, required=True)
    p.add_argument("--engine", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    p.add_argument("--results", type=Path, default=None, help="RESULTS.md to update")
    args = p.parse_args(argv)
    roof, rows = load(args.roofline), load(args.moe)
    runs = load(args.engine) if args.engine and args.engine.exists() else None
    checks = check_targets(rows, roof)
    table = render(roof, rows, runs, checks)
    print(table, end="")
    if args.out is not None:
        args.out.write_text(table)
    if args.results is not None:
        publish(SECTION, section(table, roof["machine"]), args.results)
    return {"targets": checks}


if __name__ == "__main__":
    main()
