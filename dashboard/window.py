"""The last steps of a telemetry stream as chart-ready columns, computed as each frame arrives.

`StepWindow.add` turns one StepTelemetry frame into one row of numbers (occupancy, KV blocks,
stage times, queues, rolling TTFT/TPOT percentiles and tokens/s, all-to-all volume, rank
imbalance, ...), one per-layer imbalance row, one batch-slot column and the rolling sum of
expert counts; a refresh then only stacks what is there (`view`), instead of recomputing
every statistic from the whole window. Fields that older recordings lack count as absent.
"""

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dashboard.rolling import RollingPercentiles, RollingRate, RollingSum

Frame = dict[str, Any]
STAGES = ("schedule", "prepare", "forward", "sample", "moe")
QUEUES = ("waiting", "running", "swapped", "preempted")
COLUMNS = (
    "step",
    "max_slots",
    "occupancy",
    "budget",
    "kv.used",
    "kv.cached",
    "kv.free",
    "kv.usable",
    "kv.watermark",
    *(f"dur.{s}" for s in STAGES),
    *(f"queue.{q}" for q in QUEUES),
    "dropped",
    "a2a.total",
    "a2a.gather",
    "a2a.measured",
    "rank.imbalance",
    "blocks.mean",
    "blocks.max",
    "ttft.p50",
    "ttft.p99",
    "tpot.p50",
    "tpot.p99",
    "tok_s",
    "decode_tok_s",
)
LATENCY_WINDOW = 64  # finished requests
RATE_WINDOW = 20  # steps
EXPERT_WINDOW = 100  # steps
COLOURS = 10
MAX_REQUESTS = 4096  # colour assignments kept for requests seen lately


def knob_label(changes: dict[str, list[Any]]) -> str:
    """`{"max_num_seqs": [8, 4]}` -> `max_num_seqs 8→4`."""
    return ", ".join(f"{name} {old}→{new}" for name, (old, new) in changes.items())


def blocks(frame: Frame) -> list[tuple[int, str, int, int]]:
    """(slot, request, KV blocks, context tokens) of each request in the frame's batch."""
    size = max(frame["kv"]["block_size"], 1)
    return [(s["slot"], s["req"], -(-s["ctx"] // size), s["ctx"]) for s in frame["batch"]["slots"]]


def layer_imbalance(counts: np.ndarray) -> np.ndarray:
    """max/mean expert load per layer (NaN for a layer that routed nothing)."""
    if counts.size == 0:
        return np.zeros(0)
    mean = counts.mean(axis=1)
    out = np.full(len(mean), math.nan)
    np.divide(counts.max(axis=1), mean, out=out, where=mean > 0)
    return out


@dataclass(frozen=True)
class SlotColumn:
    """One step's batch: occupied slots, their colours (by request), hover texts, prefills."""

    slots: np.ndarray
    colours: np.ndarray
    texts: list[str]
    prefill: list[int]


@dataclass(frozen=True)
class WindowView:
    """A snapshot of the last n steps, oldest first; `col(name)` is one of COLUMNS."""

    columns: np.ndarray  # [n, len(COLUMNS)]
    imbalance: np.ndarray  # [n, layers]
    slots: list[SlotColumn]
    markers: list[tuple[int, str]]  # (step, label) of knob changes
    expert_sum: np.ndarray | None  # counts summed over the last `expert_steps` steps
    expert_steps: int
    latest: Frame | None

    def col(self, name: str) -> np.ndarray:
        return self.columns[:, COLUMNS.index(name)]

    @property
    def steps(self) -> np.ndarray:
        return self.col("step").astype(int)

    def __len__(self) -> int:
        return len(self.columns)


class StepWindow:
    """The last `maxlen` steps; `add` a frame as it arrives, `view` at refresh time."""

    def __init__(self, maxlen: int = 600) -> None:
        self.maxlen = maxlen
        self.clear()

    def clear(self) -> None:
        self._rows: deque[tuple[float, ...]] = deque(maxlen=self.maxlen)
        self._imbalance: deque[np.ndarray] = deque(maxlen=self.maxlen)
        self._slots: deque[SlotColumn] = deque(maxlen=self.maxlen)
        self._markers: deque[tuple[int, str]] = deque()
        self._ttft = RollingPercentiles(LATENCY_WINDOW)
        self._tpot = RollingPercentiles(LATENCY_WINDOW)
        self._rate = RollingRate(RATE_WINDOW, 2)
        self._experts = RollingSum(EXPERT_WINDOW)
        self._colours: dict[str, int] = {}
        self._next_colour = 0
        self._latest: Frame | None = None

    @classmethod
    def of(cls, frames: Iterable[Frame]) -> WindowView:
        """The view of all `frames` (a recorded session, a test's frames)."""
        frames = list(frames)
        window = cls(max(len(frames), 1))
        for frame in frames:
            window.add(frame)
        return window.view()

    def add(self, frame: Frame) -> None:
        """One step, as it arrives; a frame of another session (a restarted server) starts
        the window over."""
        if self._latest is not None and frame.get("session") != self._latest.get("session"):
            self.clear()
        counts = np.asarray(frame["experts"]["counts"])
        self._experts.add(counts)
        row = self._row(frame)
        self._rows.append(tuple(row[c] for c in COLUMNS))
        self._imbalance.append(layer_imbalance(counts))
        self._slots.append(self._slot_column(frame["batch"]["slots"]))
        for change in frame.get("knob_changes") or []:
            self._markers.append(
                (frame["step"], f"v{change['version']}: {knob_label(change['changes'])}")
            )
        while self._markers and self._markers[0][0] < self._rows[0][0]:
            self._markers.popleft()
        self._latest = frame

    def _row(self, frame: Frame) -> dict[str, float]:
        """The frame's value of every column (the rolling ones advanced by this step)."""
        batch, kv, a2a, latency = frame["batch"], frame["kv"], frame["a2a"], frame["latency"]
        decode, prefill = batch["num_decode_tokens"], batch["num_prefill_tokens"]
        sizes = [b for _, _, b, _ in blocks(frame)]
        row = {
            "step": frame["step"],
            "max_slots": batch["max_slots"],
            "occupancy": len(batch["slots"]) / max(batch["max_slots"], 1),
            "budget": (prefill + decode) / max(batch["token_budget"], 1),
            **{f"kv.{k}": kv[k] for k in ("used", "cached", "free", "usable")},
            "kv.watermark": kv["usable"] - kv.get("watermark_blocks", 0),
            **{f"dur.{s}": frame["dur_ms"][s] for s in STAGES},
            **{f"queue.{q}": frame["queue"][q] for q in QUEUES},
            "dropped": sum(frame["experts"]["dropped"]),
            "a2a.total": sum(map(sum, a2a["bytes"])),
            "a2a.gather": sum(map(sum, a2a.get("gather_bytes") or [])),
            "a2a.measured": a2a["mode"] == "measured",
            "rank.imbalance": a2a.get("imbalance", math.nan)
            if a2a.get("rank_tokens")
            else math.nan,
            "blocks.mean": sum(sizes) / len(sizes) if sizes else math.nan,
            "blocks.max": max(sizes, default=math.nan),
        }
        row["ttft.p50"], row["ttft.p99"] = self._ttft.add(latency["ttft_ms"])
        row["tpot.p50"], row["tpot.p99"] = self._tpot.add(latency["tpot_ms"])
        row["tok_s"], row["decode_tok_s"] = self._rate.add(
            frame["t"], np.array([prefill + decode, decode])
        )
        return row

    def _colour(self, req: str) -> int:
        """A colour per request, in order of first sight, kept while it is seen lately."""
        colour = self._colours.pop(req, None)
        if colour is None:
            colour, self._next_colour = self._next_colour, (self._next_colour + 1) % COLOURS
        self._colours[req] = colour
        if len(self._colours) > MAX_REQUESTS:
            del self._colours[next(iter(self._colours))]
        return colour

    def _slot_column(self, slots: list[dict[str, Any]]) -> SlotColumn:
        return SlotColumn(
            np.array([s["slot"] for s in slots], dtype=int),
            np.array([self._colour(s["req"]) for s in slots], dtype=float),
            [f"{s['req']} {s['phase']} {s['tokens']} tok, ctx {s['ctx']}" for s in slots],
            [s["slot"] for s in slots if s["phase"] == "prefill"],
        )

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
            list(self._slots)[start:],
            [m for m in self._markers if m[0] >= first],
            self._experts.total,
            self._experts.count,
            self._latest,
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
