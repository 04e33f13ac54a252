"""An attribution report as text, for `moescope sessions show ID --attribution`."""

from typing import Any

from tuning.attribution.summary import TAIL_Q

COLUMNS = {  # report key: column heading
    "ttft": "TTFT",
    f"ttft_p{TAIL_Q}": f"TTFT p{TAIL_Q}",
    "tpot": "TPOT",
    f"tpot_p{TAIL_Q}": f"TPOT p{TAIL_Q}",
}


def percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def attribution_table(report: dict[str, Any]) -> str:
    """Each cause's share of TTFT and of TPOT, over every request and over those at or above
    the tail percentile, then the dominant causes in words."""
    if not report["requests"]:
        return "no ended requests to attribute"
    lines = [
        f"{report['requests']} requests: each cause's share of the time, over all of them and "
        f"over those at or above p{TAIL_Q}",
        f"{'cause':<16}{''.join(f'{h:>10}' for h in COLUMNS.values())}  what it is",
    ]
    for cause, words in report["causes"].items():
        shares = [report[key].get(cause) for key in COLUMNS]
        if any(s is not None for s in shares):
            cells = "".join(f"{percent(s):>10}" for s in shares)
            lines.append(f"{cause:<16}{cells}  {words}")
    for metric in ("ttft", "tpot"):
        if (top := report["dominant"][metric]) is not None:
            lines.append(f"dominant {metric.upper()} cause: {top['text']}")
    return "\n".join(lines)
