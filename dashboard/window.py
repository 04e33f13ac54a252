"""Steps of a recorded session as chart-ready columns for the Compare page.

`StepWindow.add` turns one StepTelemetry frame into one row of numbers (KV blocks, stage
times, queues, dropped tokens, rolling TTFT/TPOT percentiles and tokens/s) and one per-layer
imbalance row, and keeps the knob changes' markers (step, label, reason); `view` stacks them.
The live charts compute the same columns in the browser (live_charts_web/window.js, tested
against this).
Fields that older recordings lack count as absent.
"""

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dashboard.rolling import RollingPercentiles, RollingRate

Frame = dict[str, Any]
Marker = tuple[int, str, str | None]  # step, label, reason in words (None: none given)
STAGES = ("schedule", "prepare", "forward", "sample", "moe")
QUEUES = ("waiting", "running", "swapped", "preempted")
COLUMNS = (
    "step",
    "kv.used",
    "kv.cached",
    "kv.free",
    "kv.usable",
    "kv.watermark",
    *(f"dur.{s}" for s in STAGES),
    *(f"queue.{q}" for q in QUEUES),
    "dropped",
    "ttft.p50",
    "ttft.p99",
    "tpot.p50",
    "tpot.p99",
    "tok_s",
    "decode_tok_s",
)
AUTOPILOT = "autopilot"  # the origin of the SLO autopilot's knob changes
LATENCY_WINDOW = 64  # finished requests
RATE_WINDOW = 20  # steps


def marker_label(change: dict[str, Any]) -> str:
    """`v5: max_num_seqs 16→32`; the autopilot's changes say so (`v5 autopilot: ...`)."""
    who = " autopilot" if change.get("origin") == AUTOPILOT else ""
    return f"v{change['version']}{who}: {knob_label(change['changes'])}"


def knob_label(changes: dict[str, list[Any]]) -> str:
    """`{"max_num_seqs": [8, 4]}` -> `max_num_seqs 8→4`."""
    return ", ".join(f"{name} {old}→{new}" for name, (old, new) in changes.items())


def layer_imbalance(counts: np.ndarray) -> np.ndarray:
    """max/mean expert load per layer (NaN for a layer that routed nothing)."""
    if counts.size == 0:
        return np.zeros(0)
    mean = counts.mean(axis=1)
    out = np.full(len(mean), math.nan)
    np.divide(counts.max(axis=1), mean, out=out, where=mean > 0)
    return out


@dataclass(frozen=True)
class WindowView:
    """A snapshot of the last n steps, oldest first; `col(name)` is one of COLUMNS."""

    columns: np.ndarray  # [n, len(COLUMNS)]
    imbalance: np.ndarray  # [n, layers]
    markers: list[Marker]  # (step, label, reason) of knob changes

    def col(self, name: str) -> np.ndarray:
        return self.columns[:, COLUMNS.index(name)]

    @property
    def steps(self) -> np.ndarray:
        return self.col("step").astype(int)

    def __len__(self) -> int:
        return len(self.columns)


class StepWindow:
    """The last `maxlen` steps; `add` a frame at a time, then `view`."""

    def __init__(self, maxlen: int = 600) -> None:
        self.maxlen = maxlen
        self.clear()

    def clear(self) -> None:
        self._rows: deque[tuple[float, ...]] = deque(maxlen=self.maxlen)
        self._imbalance: deque[np.ndarray] = deque(maxlen=self.maxlen)
        self._markers: deque[Marker] = deque()
        self._ttft = RollingPercentiles(LATENCY_WINDOW)
        self._tpot = RollingPercentiles(LATENCY_WINDOW)
        self._rate = RollingRate(RATE_WINDOW, 2)
        self._session: object = None

    @classmethod
    def of(cls, frames: Iterable[Frame]) -> WindowView:
        """The view of all `frames` (a recorded session, a test's frames)."""
        frames = list(frames)
        window = cls(max(len(frames), 1))
        for frame in frames:
            window.add(frame)
        return window.view()

    def add(self, frame: Frame) -> None:
        """One step; a frame of another session (a restarted server) starts the window over."""
        if self._rows and frame.get("session") != self._session:
            self.clear()
        self._session = frame.get("session")
        row = self._row(frame)
        self._rows.append(tuple(row[c] for c in COLUMNS))
        self._imbalance.append(layer_imbalance(np.asarray(frame["experts"]["counts"])))
        for change in frame.get("knob_changes") or []:
            marker = (frame["step"], marker_label(change), change.get("reason") or None)
            self._markers.append(marker)
        while self._markers and self._markers[0][0] < self._rows[0][0]:
            self._markers.popleft()

    def _row(self, frame: Frame) -> dict[str, float]:
        """The frame's value of every column (the rolling ones advanced by this step)."""
        batch, kv, latency = frame["batch"], frame["kv"], frame["latency"]
        decode, prefill = batch["num_decode_tokens"], batch["num_prefill_tokens"]
        row = {
            "step": frame["step"],
            **{f"kv.{k}": kv[k] for k in ("used", "cached", "free", "usable")},
            "kv.watermark": kv["usable"] - kv.get("watermark_blocks", 0),
            **{f"dur.{s}": frame["dur_ms"][s] for s in STAGES},
            **{f"queue.{q}": frame["queue"][q] for q in QUEUES},
            "dropped": sum(frame["experts"]["dropped"]),
        }
        row["ttft.p50"], row["ttft.p99"] = self._ttft.add(latency["ttft_ms"])
        row["tpot.p50"], row["tpot.p99"] = self._tpot.add(latency["tpot_ms"])
        row["tok_s"], row["decode_tok_s"] = self._rate.add(
            frame["t"], np.array([prefill + decode, decode])
        )
        return row

    def view(self, last: int | None = None) -> WindowView:
        """The last `last` steps (all when None) as arrays."""
        n = len(self._rows) if last is None else min(last, len(self._rows))
        start = len(self._rows) - n
        rows = list(self._rows)[start:]
        columns = np.array(rows, dtype=float).reshape(n, len(COLUMNS))
        first = rows[0][0] if rows else math.inf
        return WindowView(
            columns,
            _stack(list(self._imbalance)[start:]),
            [m for m in self._markers if m[0] >= first],
        )


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    """Rows of possibly different lengths as one [n, longest] array padded with NaN."""
    widths = {len(r) for r in rows}
    if len(widths) == 1:
        return np.array(rows, dtype=float)
    out = np.full((len(rows), max(widths, default=0)), math.nan)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out
