"""Rerun: a recorded session's request trace played against the live engine as a new session.

Each recorded request is sent again at its arrival offset (divided by `speed`) with its
recorded prompt tokens (a session served with `--record-prompts`), else a synthesized prompt
of the recorded length (seeded random token ids), and max_tokens equal to its recorded output
length, greedy with ignore_eos, under the engine's current knobs. With the recorded tokens of
greedy requests the experts see what they saw, so the rerun's expert loads are the original's
(less what prefix caching spares: the original's blocks may still be cached).
"""

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from engine.errors import InvalidInput
from engine.loop import EngineDead, EngineLoop
from engine.outputs import RequestDelta
from engine.sampling_params import SamplingParams
from storage import Recorder
from tuning.twin.trace import TraceItem


def synth_prompt(seed: str, length: int, vocab_size: int) -> list[int]:
    """`length` seeded random token ids (distinct per request, so no accidental prefix hits)."""
    rng = random.Random(seed)
    return [rng.randrange(vocab_size) for _ in range(max(1, length))]


@dataclass
class Rerun:
    """Progress of one rerun; `task` runs it on the server's event loop."""

    session: str
    parent: str
    trace: list[TraceItem]
    speed: float
    submitted: int = 0
    finished: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    task: "asyncio.Task[None] | None" = None

    @property
    def done(self) -> bool:
        return self.task is not None and self.task.done()

    def progress(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "parent": self.parent,
            "requests": len(self.trace),
            "submitted": self.submitted,
            "finished": self.finished,
            "failed": self.failed,
            "speed": self.speed,
            "recorded_prompts": sum(1 for item in self.trace if item.prompt_token_ids),
            "done": self.done,
            "errors": self.errors[:5],
        }


async def run_rerun(rerun: Rerun, engine_loop: EngineLoop, recorder: Recorder) -> None:
    """Submit the trace at its offsets, wait for every request, then end the session."""
    aloop = asyncio.get_running_loop()
    all_done = asyncio.Event()
    vocab = engine_loop.engine.model_config.vocab_size

    def settle() -> None:
        if rerun.finished + rerun.failed >= len(rerun.trace):
            all_done.set()

    def finished_one() -> None:
        rerun.finished += 1
        settle()

    def on_output(delta: RequestDelta) -> None:
        if delta.finished:
            aloop.call_soon_threadsafe(finished_one)

    start = time.monotonic()
    try:
        for i, item in enumerate(rerun.trace):
            wait = item.offset_s / rerun.speed - (time.monotonic() - start)
            if wait > 0:
                await asyncio.sleep(wait)
            params = SamplingParams(
                max_tokens=max(1, item.output_len),
                temperature=0.0,
                ignore_eos=True,
                priority=item.priority,
            )
            prompt = (
                list(item.prompt_token_ids)
                if item.prompt_token_ids
                else synth_prompt(f"{rerun.session}:{i}", item.prompt_len, vocab)
            )
            try:
                engine_loop.submit(prompt, params, on_output)
                rerun.submitted += 1
            except (InvalidInput, EngineDead) as exc:
                rerun.failed += 1
                rerun.errors.append(f"request {i}: {exc}")
        settle()
        await all_done.wait()
    finally:
        recorder.end_session(rerun.session)
