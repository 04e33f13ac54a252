"""One table from the GPU measurements (roofline, MoE kernels, engine), with the targets.

    python benchmarks/gpu/report.py --roofline r.json --moe m.json [--engine e.json] \
        [--out table.md] [--results benchmarks/RESULTS.md]

--results replaces (or appends) the gpu_kernels section of RESULTS.md, leaving the others;
run it here on the files that run_all.sh left in $OUT.
"""

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for results_md

from bench_util import load
from results_md import write_section

TARGET = 0.6
BEGIN, END = "<!-- gpu_kernels:begin -->", "<!-- gpu_kernels:end -->"


def ratio(base: float | None, ours: float) -> str:
    return "n/a" if base is None else f"{base / ours:.2f}x"


def kernel_row(row: dict[str, Any], roof: dict[str, Any]) -> str:
    ms = row["ms"]
    tflops = row["flop"] / ms["ours"] / 1e9
    gbps = row["weight_bytes"] / ms["ours"] / 1e6
    prefill = row["phase"] == "prefill"
    compute = f"{tflops:.1f} | {tflops / roof['matmul_tflops']:.0%}" if prefill else "– | –"
    memory = "– | –" if prefill else f"{gbps:.0f} | {gbps / roof['copy_gbps']:.0%}"
    return (
        f"| {row['name']} (E{row['experts']} top-{row['top_k']} H{row['hidden']} "
        f"I{row['inter']}) | {row['phase']} | {row['tokens']} | {row['active']} | "
        f"{ms['ours']:.3f} | {compute} | {memory} | {ratio(ms['grouped_mm'], ms['ours'])} | "
        f"{ratio(ms['loop'], ms['ours'])} | {row['rel_err']:.1e} |"
    )


def targets(rows: list[dict[str, Any]], roof: dict[str, Any]) -> list[str]:
    """One line per target, met or missed."""
    lines = []
    for name in dict.fromkeys(r["name"] for r in rows):
        prefill = [r for r in rows if r["name"] == name and r["phase"] == "prefill"]
        if prefill:
            big = max(prefill, key=lambda r: r["tokens"])
            frac = big["flop"] / big["ms"]["ours"] / 1e9 / roof["matmul_tflops"]
            lines.append(
                f"- [{'x' if frac >= TARGET else ' '}] {name} prefill "
                f"{big['tokens']} tokens at {frac:.0%} of measured bf16 peak "
                f"(target {TARGET:.0%})"
            )
        for r in rows:
            if r["name"] == name and r["phase"] == "decode":
                frac = r["weight_bytes"] / r["ms"]["ours"] / 1e6 / roof["copy_gbps"]
                lines.append(
                    f"- [{'x' if frac >= TARGET else ' '}] {name} decode "
                    f"{r['tokens']} tokens at {frac:.0%} of measured bandwidth "
                    f"(target {TARGET:.0%})"
                )
    fine = [r for r in rows if r["name"] == "fine-grained" and r["ms"]["grouped_mm"]]
    if fine:
        worst = min(r["ms"]["grouped_mm"] / r["ms"]["ours"] for r in fine)
        lines.append(
            f"- [{'x' if worst > 1 else ' '}] faster than grouped_mm on every "
            f"fine-grained row (worst {worst:.2f}x)"
        )
    return lines


def engine_lines(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| engine backend | model | requests | output tokens | wall s | tok/s | steps | "
        "decode-only step forward ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['backend']} | {r['model']} | {r['requests']} | {r['output_tokens']} | "
        f"{r['wall_s']:.1f} | {r['tok_per_s']:.0f} | {r['steps']} | "
        f"{r['decode_forward_ms']:.2f} |"
        for r in runs
    ]
    return lines


def render(
    roof: dict[str, Any], rows: list[dict[str, Any]], runs: list[dict[str, Any]] | None
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
        *targets(rows, roof),
    ]
    if runs:
        lines += ["", *engine_lines(runs)]
    return "\n".join(lines) + "\n"


def write_results(path: Path, table: str) -> None:
    """Replace the gpu_kernels section of RESULTS.md with this table, or append it."""
    section = "\n".join(
        [
            BEGIN,
            "## GPU kernels and engine (`benchmarks/gpu/run_all.sh`)",
            "",
            "- Command: `bash benchmarks/gpu/run_all.sh` on the device machine (carry `.whl`), "
            "then `python benchmarks/gpu/report.py ... --results benchmarks/RESULTS.md` "
            "on its files",
            "- Times: triton.testing.do_bench (L2 flushed between calls); bf16; uniform random "
            "routing; each implementation computes gather, both projections, weighting and scatter",
            "",
            table.rstrip("\n"),
            END,
        ]
    )
    write_section(path, section, BEGIN, END)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--roofline", type=Path, required=True)
    p.add_argument("--moe", type=Path, required=True)
    p.add_argument("--engine", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    p.add_argument("--results", type=Path, default=None, help="RESULTS.md to update")
    args = p.parse_args(argv)
    runs = load(args.engine) if args.engine and args.engine.exists() else None
    text = render(load(args.roofline), load(args.moe), runs)
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    if args.results is not None:
        write_results(args.results, text)
    return text


if __name__ == "__main__":
    main()
