"""Plain-text tables of what-if results for the command line."""

from typing import Any

from tuning.twin.outcome import METRICS

LABELS = {
    "goodput_rps": "goodput req/s",
    "slo_attainment": "SLO attainment",
    "throughput_tok_s": "throughput tok/s",
    "ttft_p50_ms": "TTFT p50 ms",
    "ttft_p90_ms": "TTFT p90 ms",
    "ttft_p99_ms": "TTFT p99 ms",
    "tpot_p50_ms": "TPOT p50 ms",
    "tpot_p90_ms": "TPOT p90 ms",
    "tpot_p99_ms": "TPOT p99 ms",
    "peak_kv_blocks": "peak KV blocks",
    "preemptions": "preemptions",
    "queue_at_end": "queue at end",
    "drop_rate": "expert drop rate",
    "unfinished": "unfinished",
}
SHARES = ("slo_attainment", "drop_rate")  # shown as percentages


def value_text(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if name in SHARES:
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def change_text(old: Any, new: Any) -> str:
    """The relative change from `old` to `new`, where both are numbers and `old` is not 0."""
    if not isinstance(old, int | float) or not isinstance(new, int | float) or not old:
        return ""
    return f"{100 * (new - old) / abs(old):+.1f}%"


def table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell: the first left-aligned, the others right-aligned."""
    cells = [header, *rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in cells
    )


def knob_rows(sides: list[dict[str, Any]], names: list[str]) -> list[list[str]]:
    """One row per knob in `names`: its value on each side (a dict of knob values)."""
    return [[name, *(str(side[name]) for side in sides)] for name in names]


def banded_text(name: str, side: dict[str, Any]) -> str:
    """A side's value of `name`: the median and, where the side has one, its 80% band,
    `120 [95-160]`."""
    value = value_text(name, side.get(name))
    band = (side.get("bands") or {}).get(name)
    if not band or band[0] is None or band[1] is None:
        return value
    return f"{value} [{value_text(name, band[0])}-{value_text(name, band[1])}]"


def metric_rows(sides: list[dict[str, Any]], names: tuple[str, ...]) -> list[list[str]]:
    """One row per metric in `names`: its value (and band) on each side."""
    return [[LABELS[name], *(banded_text(name, side) for side in sides)] for name in names]


def saturation_text(side: dict[str, Any]) -> str:
    sat = side.get("saturation")
    return "-" if sat is None else f"{sat['builds']}/{sat['draws']}"


def whatif_text(result: dict[str, Any]) -> str:
    """Current against candidate: the knobs that differ, then every metric as the median of
    the twin's simulations with its 80% band, and the change of the medians; then how often
    the queue built, in numbers and words."""
    cur, new = result["current"], result["candidate"]
    changed = [k for k in new["knobs"] if new["knobs"][k] != cur["knobs"][k]]
    rows = knob_rows([cur["knobs"], new["knobs"]], changed)
    names = (*METRICS, "unfinished")
    for row, name in zip(metric_rows([cur, new], names), names, strict=True):
        rows.append([*row, change_text(cur.get(name), new.get(name))])
    rows.append(["queue builds in", saturation_text(cur), saturation_text(new), ""])
    fit = result["fit"]
    horizon = result.get("horizon_s")
    sources = result["source"] if isinstance(result["source"], list) else [result["source"]]
    pooled = f" pooled over {len(sources)} sessions" if len(sources) > 1 else ""
    lines = [
        f"session {sources[0]}: {result['requests']} requests, "
        + (f"first {horizon:g} s" if horizon else "whole trace")
        + f"; cost model fitted on {fit['steps']} steps{pooled}, held-out error (MAPE) "
        f"{100 * fit['mape']:.1f}%; {result.get('draws', 1)} simulations each side, "
        f"in {result['wall_s']:.2f} s",
        "values: median of the simulations [80% band]",
        table(["", "current", "predicted", "change"], [r + [""] * (4 - len(r)) for r in rows]),
    ]
    for label, side in (("current", cur), ("predicted", new)):
        if sat := side.get("saturation"):
            lines.append(f"{label}: {sat['text']}")
    lines.append(f"note: {result['prefix_cache']}")
    return "\n".join(lines)
