"""Persistent batch state: block tables live on the device from step to step and only rows
that changed are written; a step's inputs are one packed host tensor."""

import array
from typing import Any

import torch

from engine import LLMEngine, SamplingParams
from engine.block_tables import BlockTables
from engine.scheduler import SchedulerOutput
from engine.step_records import SEGMENTS, ModelInput, StepPlan
from tests.engine.workloads import make_prompts, run_staggered


def writes() -> tuple[array.array, array.array, array.array]:
    return array.array("q"), array.array("q"), array.array("q")


def test_block_tables_write_only_what_changed() -> None:
    tables = BlockTables(8, torch.device("cpu"))
    table = [5, 9]
    w = writes()
    tables.track(3, table, w)
    assert [list(x) for x in w] == [[3, 3], [0, 1], [5, 9]]  # a slot's first request
    w = writes()
    tables.track(3, table, w)
    assert not any(w)  # nothing changed
    table.append(4)
    tables.track(3, table, w)
    assert [list(x) for x in w] == [[3], [2], [4]]  # one new block
    w = writes()
    tables.track(3, [7], w)  # another request took the slot
    assert [list(x) for x in w] == [[3], [0], [7]]
    tables.apply(4, *(torch.tensor(list(x), dtype=torch.long) for x in w))
    assert tables.tables.shape == (4, 8) and tables.tables[3, 0] == 7


class Checker:
    """Records every plan and checks every step's device inputs against the requests'
    own block tables, as the batch was built before it was persistent."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.plans: list[StepPlan] = []
        self.sched: SchedulerOutput | None = None
        self.steps = 0
        runner, scheduler = engine.runner, engine.scheduler
        schedule, prepare, materialize = scheduler.schedule, runner.prepare, runner.materialize

        def recording_schedule() -> SchedulerOutput:
            self.sched = schedule()
            return self.sched

        def recording_prepare(*args: Any) -> StepPlan:
            plan = prepare(*args)
            self.plans.append(plan)
            return plan

        def checking_materialize(plan: StepPlan, previous: torch.Tensor | None) -> ModelInput:
            inp = materialize(plan, previous)
            self.check(inp)
            return inp

        scheduler.schedule = recording_schedule  # type: ignore[method-assign]
        runner.prepare = recording_prepare  # type: ignore[assignment, method-assign]
        runner.materialize = checking_materialize  # type: ignore[method-assign]

    def check(self, inp: ModelInput) -> None:
        assert self.sched is not None
        bs = self.engine.blocks.block_size
        kv_index, row = inp.ctx.kv_index.tolist(), 0
        positions = inp.positions.tolist()
        decode_tables, tables_at = {}, {}
        for group in inp.ctx.decodes:
            for r, table, n in zip(
                group.rows.tolist(),
                group.block_tables.tolist(),
                group.ctx_lens.tolist(),
                strict=True,
            ):
                decode_tables[r] = (table, n)
        for chunk in self.sched.chunks:
            table = chunk.req.block_table
            tables_at[row] = table
            for i in range(chunk.num_tokens):
                pos = chunk.start + i
                assert positions[row + i] == pos
                assert kv_index[row + i] == table[pos // bs] * bs + pos % bs
            if not chunk.is_prefill and chunk.num_tokens == 1:
                got, ctx_len = decode_tables[row]
                blocks = -(-ctx_len // bs)
                assert ctx_len == chunk.start + 1 and got[:blocks] == table[:blocks]
            row += chunk.num_tokens
        for p in inp.ctx.prefills:
            assert p.block_table.tolist() == tables_at[p.q_start][: -(-p.ctx_len // bs)]
        self.steps += 1


def test_inputs_match_the_request_tables_through_slot_reuse_and_preemption() -> None:
    engine = LLMEngine(
        model="synthetic:tiny",
        num_kv_blocks=16,
        max_num_seqs=6,
        preemption_mode="swap",
        num_host_blocks=64,
        threads=1,
    )
    checker = Checker(engine)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    outputs, records = run_staggered(engine, make_prompts(16, seed=2), params, per_step=2)
    assert len(outputs) == 16 and checker.steps > 20
    assert sum(r["queue"]["preempted"] for r in records) > 0


def test_table_writes_follow_new_blocks_not_steps() -> None:
    engine = LLMEngine(model="synthetic:tiny", block_size=4, threads=1)
    checker = Checker(engine)
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    for p in make_prompts(4, seed=4):
        engine.add_request(p, params)
    blocks = 0
    while engine.has_unfinished():
        result = engine.step()
        blocks = max(blocks, result.telemetry.kv.used)
    sizes = [dict(zip(SEGMENTS, plan.sizes, strict=True)) for plan in checker.plans]
    written = sum(s["write_blocks"] for s in sizes)
    assert written == blocks  # each block entered once, in the step that allocated it
    decode_steps = [s for s in sizes if s["decode_rows"] == s["ids"]]
    assert len(decode_steps) > 50
    # a decode step writes at most one entry per request (the block it just took), never
    # a whole table however long the requests grew
    assert all(s["write_blocks"] <= s["decode_rows"] for s in decode_steps)
    assert sum(not s["write_blocks"] for s in decode_steps) > 0
    for plan in checker.plans:
        assert plan.packed.numel() == sum(plan.sizes)  # one tensor to copy to the device
